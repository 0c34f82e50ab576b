"""Build gputrain._C: C sources with setuptools, CUDA sources with nvcc (cupy's pattern).

Environment:
  GPUTRAIN_CUDA=1/0      force the CUDA backend on/off (default: on when nvcc is found)
  GPUTRAIN_SANITIZE=1    build with -fsanitize=address,undefined
  CUDA_HOME / CUDA_PATH  the toolkit (default: the directory of nvcc on PATH, /usr/local/cuda)
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

VERSION = "0.1.0"
CUDA_ARCHS = ["80", "86", "89", "90"]  # sm_XX targets; PTX of the last is embedded for newer GPUs


def find_openblas():
    """The cmeel.prefix of cmeel-openblas, installed as a build requirement."""
    for entry in sys.path:
        prefix = os.path.join(entry, "cmeel.prefix")
        if os.path.exists(os.path.join(prefix, "include", "openblas", "cblas.h")):
            return prefix
    raise RuntimeError("cmeel-openblas not found: pip install cmeel-openblas (a build requirement)")


def find_cuda():
    """The CUDA toolkit directory, or None for a CPU-only build (benfred/implicit's order)."""
    switch = os.environ.get("GPUTRAIN_CUDA", "").strip()
    if switch == "0":
        return None
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home:
        nvcc = shutil.which("nvcc")
        home = os.path.dirname(os.path.dirname(nvcc)) if nvcc else "/usr/local/cuda"
    if os.path.exists(os.path.join(home, "bin", "nvcc")):
        return home
    if switch == "1":
        raise RuntimeError(f"GPUTRAIN_CUDA=1 but nvcc was not found under {home}")
    return None


SANITIZE = os.environ.get("GPUTRAIN_SANITIZE", "") == "1"
OPENBLAS = find_openblas()
CUDA_HOME = find_cuda()

C_FLAGS = ["-std=c11", "-O3", "-fopenmp", "-ffp-contract=off", "-fno-strict-aliasing",
           "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter",
           "-Wno-missing-field-initializers", "-Wno-cast-function-type"]
LINK_FLAGS = ["-fopenmp", f"-Wl,-rpath,$ORIGIN/../cmeel.prefix/lib", f"-Wl,-rpath,{OPENBLAS}/lib"]
if SANITIZE:
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-g"]
    C_FLAGS += san
    LINK_FLAGS += san

macros = [("GT_VERSION", f'"{VERSION}"'), ("_GNU_SOURCE", None)]
libraries = ["openblas", "m"]
library_dirs = [os.path.join(OPENBLAS, "lib")]
include_dirs = ["csrc", "cuda", numpy.get_include(), os.path.join(OPENBLAS, "include", "openblas")]
if CUDA_HOME:
    cuda_lib = os.path.join(CUDA_HOME, "lib64")
    macros.append(("GT_WITH_CUDA", "1"))
    libraries += ["cudart", "cublas", "cublasLt", "cudnn", "stdc++"]
    library_dirs.append(cuda_lib)
    include_dirs.append(os.path.join(CUDA_HOME, "include"))
    LINK_FLAGS.append(f"-Wl,-rpath,{cuda_lib}")
macros.append(("GT_BUILD_FLAGS", '"' + " ".join(C_FLAGS).replace('"', "") + (" +cuda" if CUDA_HOME else "") + '"'))


def nvcc_flags():
    flags = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Xcompiler", "-fvisibility=hidden",
             "--fmad=false", "-Icsrc", "-Icuda", "-DGT_WITH_CUDA=1"]
    for arch in CUDA_ARCHS:
        flags.append(f"--generate-code=arch=compute_{arch},code=sm_{arch}")
    flags.append(f"--generate-code=arch=compute_{CUDA_ARCHS[-1]},code=compute_{CUDA_ARCHS[-1]}")
    return flags


class BuildExt(build_ext):
    """Compiles cuda/*.cu with nvcc into objects linked with the C extension."""

    def build_extensions(self):
        self.parallel = self.parallel or os.cpu_count()
        for ext in self.extensions:
            if CUDA_HOME:
                ext.extra_objects += self.compile_cuda(sorted(glob.glob("cuda/*.cu")))
        super().build_extensions()

    def compile_cuda(self, sources):
        nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
        objects = []
        for source in sources:
            obj = os.path.join(self.build_temp, source + ".o")
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            deps = [source] + glob.glob("cuda/*.h") + glob.glob("cuda/*.cuh") + glob.glob("csrc/**/*.h", recursive=True)
            if self.force or not os.path.exists(obj) or any(os.path.getmtime(d) > os.path.getmtime(obj) for d in deps):
                cmd = [nvcc, *nvcc_flags(), "-c", source, "-o", obj]
                print(" ".join(shlex.quote(c) for c in cmd), flush=True)
                subprocess.check_call(cmd)
            objects.append(obj)
        return objects


extension = Extension(
    "gputrain._C",
    sources=sorted(glob.glob("csrc/**/*.c", recursive=True)),
    depends=glob.glob("csrc/**/*.h", recursive=True) + glob.glob("cuda/*.h"),
    include_dirs=include_dirs,
    define_macros=macros,
    libraries=libraries,
    library_dirs=library_dirs,
    extra_compile_args=C_FLAGS,
    extra_link_args=LINK_FLAGS,
)

setup(ext_modules=[extension], cmdclass={"build_ext": BuildExt})
