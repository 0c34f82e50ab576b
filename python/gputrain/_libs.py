"""Loads the CPU GEMM library that gputrain._C links against from the wheel that ships it.

The extension's rpath finds them in a virtual environment or a system prefix; when it does not
(user installs, --target installs and other layouts), gputrain/__init__.py calls preload() and
imports the extension again, so no LD_LIBRARY_PATH is ever needed. It is not imported otherwise:
importlib.metadata alone costs `import gputrain` tens of milliseconds.

No CUDA library is loaded here: the CUDA runtime is linked statically, and cuBLAS(Lt), cuDNN and
NCCL are opened when first needed (gputrain/_cuda_libs.py), so `import gputrain` maps none of them.
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


def preload() -> list[str]:
    """Loads the CPU library, returning the paths loaded (a library not found is left to the rpath)."""
    wanted = _CPU_LIBRARIES.get(platform.machine().lower(), _OTHER_CPU_LIBRARIES)
    loaded = []
    for distribution, name in wanted:
        path = installed_file(distribution, name)
        if path is not None:
            ctypes.CDLL(path)
            loaded.append(path)
    return loaded
