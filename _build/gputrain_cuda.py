"""Where the CUDA backend is built from: a CUDA toolkit, NVIDIA's registry wheels, or nowhere.

Used by setup.py (paths) and by backend.py (build requirements). GPUTRAIN_CUDA:
  0       CPU-only build
  1       CUDA build required: the toolkit if one is found, else the wheels
  wheels  CUDA build from the nvidia-* wheels (installed as build requirements)
  unset   the toolkit if one is found; else the wheels when an NVIDIA driver for CUDA 13 or
          newer is present; else CPU-only
GPUTRAIN_CUDA_ARCHS ("90", "86,90") replaces the default sm_XX targets (cuda_archs).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import shutil
from typing import NamedTuple

CUDA_MAJOR = 13  # the CUDA generation of the registry wheels gputrain builds against
WHEELS_FOR_BUILD = [f"nvidia-cuda-nvcc>={CUDA_MAJOR},<{CUDA_MAJOR + 1}",
                    f"nvidia-cuda-runtime>={CUDA_MAJOR},<{CUDA_MAJOR + 1}",
                    f"nvidia-cublas>={CUDA_MAJOR},<{CUDA_MAJOR + 1}",
                    f"nvidia-cudnn-cu{CUDA_MAJOR}>=9,<10",
                    f"nvidia-nccl-cu{CUDA_MAJOR}>=2.27,<3"]
# The CUDA runtime is linked statically (libcudart_static.a, in the toolkit and in the
# nvidia-cuda-runtime wheel); cuBLAS(Lt), cuDNN and NCCL are opened with dlopen when first needed
# (cuda/cuda_libs.cu), found by NVIDIA's cuda.pathfinder (gputrain/_cuda_libs.py): wherever they
# are, wheels, conda or a toolkit. Every CUDA build therefore needs cuda-pathfinder at run time
# (1.8 is the newest that still installs on Python 3.10, which gputrain supports), and one built
# from the wheels needs the wheels of the libraries it opens.
PATHFINDER_REQUIREMENT = "cuda-pathfinder>=1.8,<2"
WHEELS_AT_RUN_TIME = WHEELS_FOR_BUILD[2:]
STATIC_CUDART = "libcudart_static.a"
# (distribution, library) for each CUDA library opened at run time, in load order
WHEEL_LIBRARIES = [("nvidia-cublas", f"libcublasLt.so.{CUDA_MAJOR}"),
                   ("nvidia-cublas", f"libcublas.so.{CUDA_MAJOR}"),
                   (f"nvidia-cudnn-cu{CUDA_MAJOR}", "libcudnn.so.9"),
                   (f"nvidia-nccl-cu{CUDA_MAJOR}", "libnccl.so.2")]
CUDNN_HEADER = "include/cudnn.h"
NCCL_HEADER = "include/nccl.h"


DEFAULT_CUDA_ARCHS = ["80", "86", "89", "90"]


def cuda_archs() -> list[str]:
    """The sm_XX targets: GPUTRAIN_CUDA_ARCHS ("90", "86,90", "90a") or the default ones."""
    value = os.environ.get("GPUTRAIN_CUDA_ARCHS", "").strip()
    if not value:
        return list(DEFAULT_CUDA_ARCHS)
    archs = [a.strip() for a in value.replace(";", ",").split(",") if a.strip()]
    bad = [a for a in archs if not re.fullmatch(r"[0-9]{2,3}[af]?", a)]
    if not archs or bad:
        raise RuntimeError(f"GPUTRAIN_CUDA_ARCHS={value!r}: give compute capabilities as digits, "
                           f"comma-separated, e.g. 90 or 86,90 (not {', '.join(bad) or 'nothing'})")
    return list(dict.fromkeys(archs))


def link_name(dirs: list[str], name: str, soname: str) -> str:
    """The -l name of a library in `dirs`: `name` when lib<name>.so is there, else ":<soname>"
    (NVIDIA's wheels, e.g. cuDNN's and NCCL's beside a toolkit, ship only the versioned file)."""
    if any(os.path.exists(os.path.join(d, f"lib{name}.so")) for d in dirs):
        return name
    return f":{soname}" if any(os.path.exists(os.path.join(d, soname)) for d in dirs) else name


class CudaSource(NamedTuple):
    kind: str  # "toolkit", "wheels" or "none"
    why: str   # how the choice was made, for the build log


def toolkit_home() -> str | None:
    """A CUDA toolkit directory with bin/nvcc (CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
    return home if os.path.exists(os.path.join(home, "bin", "nvcc")) else None


def installed_home(distribution: str, header: str) -> str | None:
    """The directory (include, lib) holding `header` in an installed wheel, or None."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if str(file).replace("\\", "/").endswith(header):
            return os.path.normpath(str(dist.locate_file(file)) + "/../..")
    return None


def installed_cudnn_home() -> str | None:
    """The nvidia/cudnn directory (include, lib) of an installed nvidia-cudnn wheel, or None."""
    return installed_home(f"nvidia-cudnn-cu{CUDA_MAJOR}", CUDNN_HEADER)


def nccl_home(toolkit: str) -> str:
    """Where NCCL's include/nccl.h and libnccl are for a toolkit build (the device collectives,
    cuda/comm_nccl.cu): NCCL_HOME, the toolkit itself (NCCL installed into it), or an installed
    nvidia-nccl wheel."""
    for home in (os.environ.get("NCCL_HOME"), toolkit, installed_home(f"nvidia-nccl-cu{CUDA_MAJOR}", NCCL_HEADER)):
        if home and os.path.exists(os.path.join(home, NCCL_HEADER)):
            return home
    raise RuntimeError(f"the CUDA backend needs NCCL 2 (data parallelism): no {NCCL_HEADER} under NCCL_HOME or "
                       f"{toolkit}; install NCCL into the toolkit, set NCCL_HOME, or "
                       f"pip install 'nvidia-nccl-cu{CUDA_MAJOR}>=2.27,<3'")


def cudnn_home(toolkit: str) -> str:
    """Where cuDNN's include/cudnn.h and its library are for a toolkit build: CUDNN_HOME, the
    toolkit itself (cuDNN installed into it), or an installed nvidia-cudnn wheel."""
    for home in (os.environ.get("CUDNN_HOME"), toolkit, installed_cudnn_home()):
        if home and os.path.exists(os.path.join(home, CUDNN_HEADER)):
            return home
    raise RuntimeError(f"the CUDA backend needs cuDNN 9 (Conv2d): no {CUDNN_HEADER} under CUDNN_HOME or "
                       f"{toolkit}; install cuDNN into the toolkit, set CUDNN_HOME, or "
                       f"pip install 'nvidia-cudnn-cu{CUDA_MAJOR}>=9,<10'")


def driver_cuda_version() -> int:
    """The CUDA version the NVIDIA driver supports (e.g. 12040), 0 without a driver."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    version = ctypes.c_int(0)
    return version.value if libcuda.cuDriverGetVersion(ctypes.byref(version)) == 0 else 0


def choose() -> CudaSource:
    switch = os.environ.get("GPUTRAIN_CUDA", "").strip().lower()
    if switch == "0":
        return CudaSource("none", "GPUTRAIN_CUDA=0")
    if switch == "wheels":
        return CudaSource("wheels", "GPUTRAIN_CUDA=wheels")
    home = toolkit_home()
    if home:
        return CudaSource("toolkit", f"toolkit at {home}")
    if switch == "1":
        return CudaSource("wheels", "GPUTRAIN_CUDA=1 and no toolkit found")
    driver = driver_cuda_version()
    if driver >= CUDA_MAJOR * 1000:
        return CudaSource("wheels", f"no toolkit; the NVIDIA driver supports CUDA "
                                    f"{driver // 1000}.{driver % 1000 // 10}")
    if driver:
        return CudaSource("none", f"no toolkit, and the NVIDIA driver supports CUDA "
                                  f"{driver // 1000}.{driver % 1000 // 10} only: the registry "
                                  f"wheels are CUDA {CUDA_MAJOR} (update the driver, or install a "
                                  f"CUDA toolkit matching it and set CUDA_HOME)")
    return CudaSource("none", "no CUDA toolkit and no NVIDIA driver")


def wheels_cudnn_home() -> str:
    """The nvidia/cudnn directory of the installed nvidia-cudnn wheel (a build requirement)."""
    home = installed_cudnn_home()
    if not home:
        raise RuntimeError("a CUDA build from the registry wheels needs cuDNN's: pip install "
                           f"'nvidia-cudnn-cu{CUDA_MAJOR}>=9,<10'")
    return home


def wheels_nccl_home() -> str:
    """The directory (include, lib) of the installed nvidia-nccl wheel (a build requirement)."""
    home = installed_home(f"nvidia-nccl-cu{CUDA_MAJOR}", NCCL_HEADER)
    if not home:
        raise RuntimeError("a CUDA build from the registry wheels needs NCCL's: pip install "
                           f"'nvidia-nccl-cu{CUDA_MAJOR}>=2.27,<3'")
    return home


def wheels_home() -> str:
    """The nvidia/cu13 directory the installed wheels share (bin/nvcc, include, lib)."""
    try:
        dist = importlib.metadata.distribution("nvidia-cuda-nvcc")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("a CUDA build from the registry wheels needs them installed: "
                           "pip install " + " ".join(f"'{w}'" for w in WHEELS_FOR_BUILD)) from None
    for file in dist.files or []:
        if str(file).replace("\\", "/").endswith("/bin/nvcc"):
            return os.path.normpath(str(dist.locate_file(file)) + "/../..")
    raise RuntimeError("nvidia-cuda-nvcc has no bin/nvcc")
