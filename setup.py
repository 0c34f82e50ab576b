"""Build gputrain._C: C sources with setuptools, CUDA sources with nvcc (cupy's pattern).

Environment:
  GPUTRAIN_CUDA=0/1/wheels  CUDA backend off / required / built from NVIDIA's registry wheels
                            (default: a toolkit if found, else the wheels when a driver for
                            CUDA 13+ is present; _build/gputrain_cuda.py)
  GPUTRAIN_SANITIZE=1       build with -fsanitize=address,undefined
  GPUTRAIN_SANITIZE=thread  build with -fsanitize=thread (.ci/sanitizers.sh runs both)
  CUDA_HOME / CUDA_PATH     the toolkit (default: the directory of nvcc on PATH, /usr/local/cuda)

The CPU GEMM library is oneDNN (onednn-cpu-gomp) on x86-64 and OpenBLAS (scipy-openblas32)
elsewhere, both build requirements found through their installed files.
"""

import glob
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from typing import NamedTuple

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build"))
import gputrain_cuda  # noqa: E402

VERSION = "0.1.0"
CUDA_ARCHS = ["80", "86", "89", "90"]  # sm_XX targets; PTX of the last is embedded for newer GPUs


class Blas(NamedTuple):
    """The CPU GEMM library gputrain._C links against."""

    name: str                 # "onednn" or "openblas"
    source: str               # the csrc file that calls it
    include_dir: str          # its headers
    library_dir: str          # its shared library
    library: str              # the -l name
    rpath: str                # where the installed extension finds it, relative to $ORIGIN


def installed_file(distribution: str, suffix: str) -> str:
    """The path of the file ending in `suffix` that the installed `distribution` ships."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(f"{distribution} is not installed (a build requirement): "
                           f"pip install {distribution}") from None
    for file in dist.files or []:
        if str(file).replace("\\", "/").endswith(suffix):
            return os.path.normpath(str(dist.locate_file(file)))
    raise RuntimeError(f"{distribution} has no file ending in {suffix}")


def find_blas() -> Blas:
    if platform.machine().lower() in ("x86_64", "amd64"):
        header = installed_file("onednn-devel-cpu-gomp", "include/oneapi/dnnl/dnnl.h")
        library = installed_file("onednn-cpu-gomp", "/libdnnl.so")
        # site-packages/gputrain/_C.so -> <prefix>/lib, where the wheel puts libdnnl.so.3
        return Blas("onednn", "csrc/ops/cpu_blas_onednn.c",
                    os.path.dirname(os.path.dirname(os.path.dirname(header))),
                    os.path.dirname(library), "dnnl", "$ORIGIN/../../..")
    header = installed_file("scipy-openblas32", "scipy_openblas32/include/cblas.h")
    library = installed_file("scipy-openblas32", "scipy_openblas32/lib/libscipy_openblas.so")
    return Blas("openblas", "csrc/ops/cpu_blas_openblas.c", os.path.dirname(header),
                os.path.dirname(library), "scipy_openblas", "$ORIGIN/../scipy_openblas32/lib")


class Cuda(NamedTuple):
    """Where the CUDA backend is compiled and linked from."""

    home: str                 # directory with bin/nvcc, include and the CUDA libraries
    include_dirs: list[str]   # the CUDA headers, then cuDNN's and NCCL's
    library_dirs: list[str]   # the CUDA libraries, then cuDNN's and NCCL's
    libraries: list[str]      # -l names of cudart, cuBLASLt, cuBLAS, cuDNN, NCCL
    rpaths: list[str]         # where the installed extension finds them


def find_cuda(source):
    if source.kind == "toolkit":
        home = gputrain_cuda.toolkit_home()
        cudnn, nccl = gputrain_cuda.cudnn_home(home), gputrain_cuda.nccl_home(home)
        dirs = list(dict.fromkeys([os.path.join(root, lib) for root in (home, cudnn, nccl) for lib in ("lib64", "lib")]))
        dirs = [d for d in dirs if os.path.isdir(d)]
        includes = list(dict.fromkeys([os.path.join(root, "include") for root in (home, cudnn, nccl)]))
        return Cuda(home, includes, dirs, ["cudart", "cublasLt", "cublas", "cudnn", "nccl"], dirs)
    if source.kind == "wheels":
        home, cudnn = gputrain_cuda.wheels_home(), gputrain_cuda.wheels_cudnn_home()
        nccl = gputrain_cuda.wheels_nccl_home()
        names = [f":{name}" for _, name in gputrain_cuda.WHEEL_LIBRARIES]
        site = os.path.dirname(os.path.dirname(home))  # site-packages (home is nvidia/cu13)
        dirs = [os.path.join(root, "lib") for root in (home, cudnn, nccl)]
        rpaths = ["$ORIGIN/../" + os.path.relpath(d, site) for d in dirs]
        return Cuda(home, [os.path.join(root, "include") for root in (home, cudnn, nccl)], dirs, names, rpaths)
    return None


def nvcc_version(cuda_home):
    out = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


SANITIZE = os.environ.get("GPUTRAIN_SANITIZE", "")
BLAS = find_blas()
CUDA_SOURCE = gputrain_cuda.choose()  # the CUDA files are located in build_ext, once installed

C_FLAGS = ["-std=c11", "-O3", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing",
           "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter",
           "-Wno-missing-field-initializers", "-Wno-cast-function-type"]
LINK_FLAGS = ["-fopenmp", f"-Wl,-rpath,{BLAS.rpath}"]
if SANITIZE == "1":
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
    C_FLAGS += san
    LINK_FLAGS += san
elif SANITIZE == "thread":  # -O1 after -O3: TSan's reports keep the frames they name
    C_FLAGS += ["-fsanitize=thread", "-O1", "-fno-omit-frame-pointer", "-g"]
    LINK_FLAGS += ["-fsanitize=thread"]
elif SANITIZE not in ("", "0"):
    raise RuntimeError(f"GPUTRAIN_SANITIZE={SANITIZE!r}: use 1 (ASan+UBSan) or thread (TSan)")

macros = [("GT_VERSION", f'"{VERSION}"'), ("_GNU_SOURCE", None)]
libraries = [BLAS.library, "m", "dl"]  # dl: the MPI library is reached with dlopen (csrc/dist)
library_dirs = [BLAS.library_dir]
include_dirs = ["csrc", "cuda", numpy.get_include(), BLAS.include_dir]
macros.append(("GT_BUILD_FLAGS", '"' + " ".join(C_FLAGS).replace('"', "") +
               (" +cuda" if CUDA_SOURCE.kind != "none" else "") + '"'))

OTHER_BLAS_SOURCES = {"csrc/ops/cpu_blas_onednn.c", "csrc/ops/cpu_blas_openblas.c"} - {BLAS.source}
C_SOURCES = sorted(s for s in glob.glob("csrc/**/*.c", recursive=True) if s not in OTHER_BLAS_SOURCES)


def add_cuda(ext, cuda):
    """Compiles and links `ext` with the CUDA backend."""
    ext.define_macros.append(("GT_WITH_CUDA", "1"))
    ext.libraries += cuda.libraries + ["stdc++"]
    ext.library_dirs += cuda.library_dirs
    ext.include_dirs += cuda.include_dirs
    ext.extra_link_args += [f"-Wl,-rpath,{rpath}" for rpath in cuda.rpaths]


def nvcc_flags(cuda):
    flags = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
             "--fmad=false", "-Icsrc", "-Icuda", "-DGT_WITH_CUDA=1"]
    flags += [f"-I{d}" for d in cuda.include_dirs[1:]]  # cuDNN's and NCCL's headers (nvcc knows its own)
    for arch in CUDA_ARCHS:
        flags.append(f"--generate-code=arch=compute_{arch},code=sm_{arch}")
    flags.append(f"--generate-code=arch=compute_{CUDA_ARCHS[-1]},code=compute_{CUDA_ARCHS[-1]}")
    return flags


def build_settings(cuda):
    """Everything besides the sources that the compiled objects depend on."""
    return {
        "blas": BLAS._asdict(),
        "cuda": cuda and {**cuda._asdict(), "nvcc": nvcc_version(cuda.home),
                          "flags": nvcc_flags(cuda)},
        "c_flags": C_FLAGS, "link_flags": LINK_FLAGS, "macros": macros,
        "python": sys.version, "numpy": numpy.__version__,
    }


class BuildExt(build_ext):
    """Compiles cuda/*.cu with nvcc into objects linked with the C extension. A change of the
    build settings (GPUTRAIN_CUDA, the toolkit, the BLAS, sanitizers) rebuilds everything."""

    def build_extensions(self):
        self.parallel = self.parallel or os.cpu_count()
        cuda = find_cuda(CUDA_SOURCE)
        self.rebuild_if_settings_changed(cuda)
        print(f"gputrain: CPU GEMM library {BLAS.name} ({BLAS.library_dir})", flush=True)
        if cuda:
            print(f"gputrain: CUDA backend from the {CUDA_SOURCE.why} ({nvcc_version(cuda.home)}), "
                  f"sm_{', sm_'.join(CUDA_ARCHS)} + PTX", flush=True)
        else:
            print(f"gputrain: CPU-only build ({CUDA_SOURCE.why})", flush=True)
        for ext in self.extensions:
            if cuda:
                add_cuda(ext, cuda)
                ext.extra_objects += self.compile_cuda(cuda, sorted(glob.glob("cuda/*.cu")))
        super().build_extensions()

    def rebuild_if_settings_changed(self, cuda):
        os.makedirs(self.build_temp, exist_ok=True)
        stamp = os.path.join(self.build_temp, "gputrain-build-settings.json")
        settings = json.dumps(build_settings(cuda), sort_keys=True, indent=1)
        previous = open(stamp).read() if os.path.exists(stamp) else None
        if previous != settings:
            if previous is not None:
                print("gputrain: build settings changed since the last build: rebuilding all",
                      flush=True)
            self.force = True
            with open(stamp, "w") as f:
                f.write(settings)

    def compile_cuda(self, cuda, sources):
        nvcc = os.path.join(cuda.home, "bin", "nvcc")
        objects = []
        for source in sources:
            obj = os.path.join(self.build_temp, source + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            deps = [source] + glob.glob("cuda/*.h") + glob.glob("cuda/*.cuh") + glob.glob("csrc/**/*.h", recursive=True)
            if self.force or not os.path.exists(obj) or any(os.path.getmtime(d) > os.path.getmtime(obj) for d in deps):
                cmd = [nvcc, *nvcc_flags(cuda), "-c", source, "-o", obj]
                print(" ".join(shlex.quote(c) for c in cmd), flush=True)
                subprocess.check_call(cmd)
            objects.append(obj)
        return objects


extension = Extension(
    "gputrain._C",
    sources=C_SOURCES,
    depends=glob.glob("csrc/**/*.h", recursive=True) + glob.glob("cuda/*.h"),
    include_dirs=include_dirs,
    define_macros=macros,
    libraries=libraries,
    library_dirs=library_dirs,
    extra_compile_args=C_FLAGS,
    extra_link_args=LINK_FLAGS,
)

# Runtime requirements: NumPy, safetensors, the CPU GEMM library, and the CUDA wheels a wheel-built CUDA
# backend links (pyproject.toml declares them dynamic).
INSTALL_REQUIRES = [
    "numpy>=1.25",
    "safetensors>=0.4",  # the Trainer's checkpoint format (gputrain/checkpoint.py)
    "tqdm>=4.62",  # the Trainer's progress bars (imported lazily, by ProgressCallback)
    "onednn-cpu-gomp~=2023.2.0; platform_machine == 'x86_64'",
    "scipy-openblas32>=0.3.30,<0.4; platform_machine != 'x86_64'",
] + (gputrain_cuda.WHEELS_AT_RUN_TIME if CUDA_SOURCE.kind == "wheels" else [])

setup(ext_modules=[extension], cmdclass={"build_ext": BuildExt}, install_requires=INSTALL_REQUIRES)
