"""Loads the shared libraries that gputrain._C links against from the wheels that ship them.

The extension's rpath finds them in a virtual environment or a system prefix; when it does not
(user installs, --target installs and other layouts), gputrain/__init__.py calls preload() and
imports the extension again, so no LD_LIBRARY_PATH is ever needed. It is not imported otherwise:
importlib.metadata alone costs `import gputrain` tens of milliseconds.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import platform

# (distribution, file the extension needs): the CPU GEMM library of this architecture. oneDNN
# (x86-64) is inside the package (gputrain/lib/, setup.py), where the extension's rpath finds it.
_CPU_LIBRARIES: dict[str, list[tuple[str, str]]] = {
    "x86_64": [],
}
_OTHER_CPU_LIBRARIES = [("scipy-openblas32", "libscipy_openblas.so")]
# The CUDA libraries of a CUDA backend built from NVIDIA's wheels (_build/gputrain_cuda.py), in
# load order; needed only when this gputrain's metadata requires those wheels.
_CUDA_WHEEL_LIBRARIES = [("nvidia-cuda-runtime", "libcudart.so.13"),
                         ("nvidia-cublas", "libcublasLt.so.13"),
                         ("nvidia-cublas", "libcublas.so.13")]


def installed_file(distribution: str, name: str) -> str | None:
    """The path of the file called `name` that `distribution` installed, if it is installed."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == name:
            return str(dist.locate_file(file))
    return None


def built_with_cuda_wheels() -> bool:
    """Whether the installed gputrain links the CUDA libraries of NVIDIA's wheels."""
    try:
        requirements = importlib.metadata.requires("gputrain") or []
    except importlib.metadata.PackageNotFoundError:  # an uninstalled build (tests of a tree)
        return False
    return any(r.startswith("nvidia-cuda-runtime") for r in requirements)


def preload() -> list[str]:
    """Loads the CPU library (and the CUDA wheels' libraries when gputrain was built with them),
    returning the paths loaded (a library not found is left to the rpath)."""
    wanted = list(_CPU_LIBRARIES.get(platform.machine().lower(), _OTHER_CPU_LIBRARIES))
    if built_with_cuda_wheels():
        wanted += _CUDA_WHEEL_LIBRARIES
    loaded = []
    for distribution, name in wanted:
        path = installed_file(distribution, name)
        if path is not None:
            ctypes.CDLL(path)
            loaded.append(path)
    return loaded
