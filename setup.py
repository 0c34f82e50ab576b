"""Build gputrain._C (and gputrain._C_testing, its test-only bindings, linked with _C's objects): C
sources with setuptools, CUDA sources with nvcc (cupy's pattern).

Environment:
  GPUTRAIN_CUDA=0/1/wheels  CUDA backend off / required / built from NVIDIA's registry wheels
                            (default: a toolkit if found, else the wheels when a driver for
                            CUDA 13+ is present; _build/gputrain_cuda.py)
  GPUTRAIN_SANITIZE=1       build with -fsanitize=address,undefined
  GPUTRAIN_SANITIZE=thread  build with -fsanitize=thread (.ci/sanitizers.sh runs both)
  GPUTRAIN_CUDA_ARCHS=90    the sm_XX targets, comma-separated (default 80,86,89,90); PTX of the
                            last is embedded too. One target builds for the GPU at hand only
                            (.ci/gpu_check.sh passes the device's compute capability)
  CUDA_HOME / CUDA_PATH     the toolkit (default: the directory of nvcc on PATH, /usr/local/cuda)

The CPU GEMM library is oneDNN (onednn-cpu-gomp) on x86-64 and OpenBLAS (scipy-openblas32)
elsewhere, both build requirements found through their installed files. oneDNN's library is
copied into the package (gputrain/lib/, found through the rpath $ORIGIN/lib), so an install holds
one copy of it and needs no oneDNN wheel at run time (that wheel carries three full copies, as a
wheel cannot hold symlinks); OpenBLAS comes from its wheel at run time.

gputrain builds on Linux x86-64 and aarch64 (on Windows inside WSL2); elsewhere the build stops
before compiling anything (_build/gputrain_platform.py).
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
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "_build"))
import gputrain_platform  # noqa: E402

gputrain_platform.check()  # before anything is looked for or compiled

import gputrain_cuda  # noqa: E402

VERSION = "0.1.0"
CUDA_ARCHS = gputrain_cuda.cuda_archs()  # sm_XX targets; PTX of the last is embedded for newer GPUs


class Blas(NamedTuple):
    """The CPU GEMM library gputrain._C links against."""

    name: str                 # "onednn" or "openblas"
    source: str               # the csrc file that calls it
    include_dir: str          # its headers
    library_dir: str          # its shared library
    library: str              # the -l name
    rpath: str                # where the installed extension finds it, relative to $ORIGIN
    bundled: list[str]        # files copied into gputrain/lib/: the library by its soname, its licences


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
        # the extension's DT_NEEDED is the soname, libdnnl.so.3: that one file goes into gputrain/lib/
        bundled = [installed_file("onednn-cpu-gomp", "/libdnnl.so.3"),
                   installed_file("onednn-cpu-gomp", "share/doc/onednn/LICENSE"),
                   installed_file("onednn-cpu-gomp", "share/doc/onednn/THIRD-PARTY-PROGRAMS")]
        return Blas("onednn", "csrc/ops/cpu_blas_onednn.c",
                    os.path.dirname(os.path.dirname(os.path.dirname(header))),
                    os.path.dirname(library), "dnnl", "$ORIGIN/lib", bundled)
    header = installed_file("scipy-openblas32", "scipy_openblas32/include/cblas.h")
    library = installed_file("scipy-openblas32", "scipy_openblas32/lib/libscipy_openblas.so")
    return Blas("openblas", "csrc/ops/cpu_blas_openblas.c", os.path.dirname(header),
                os.path.dirname(library), "scipy_openblas", "$ORIGIN/../scipy_openblas32/lib", [])


class Cuda(NamedTuple):
    """Where the CUDA backend is compiled and linked from."""

    home: str                 # directory with bin/nvcc, include and the CUDA libraries
    include_dirs: list[str]   # the CUDA headers, then cuDNN's and NCCL's
    library_dirs: list[str]   # the CUDA libraries, then cuDNN's and NCCL's
    libraries: list[str]      # -l names: the static CUDA runtime and what it needs (cuBLAS(Lt), cuDNN
                              # and NCCL are not linked: cuda/cuda_libs.cu opens them when first needed)


CUDART_STATIC = [":" + gputrain_cuda.STATIC_CUDART, "rt", "pthread", "dl"]


def find_cuda(source):
    if source.kind == "toolkit":
        home = gputrain_cuda.toolkit_home()
        cudnn, nccl = gputrain_cuda.cudnn_home(home), gputrain_cuda.nccl_home(home)
        dirs = list(dict.fromkeys([os.path.join(root, lib) for root in (home, cudnn, nccl) for lib in ("lib64", "lib")]))
        dirs = [d for d in dirs if os.path.isdir(d)]
        includes = list(dict.fromkeys([os.path.join(root, "include") for root in (home, cudnn, nccl)]))
        return Cuda(home, includes, dirs, CUDART_STATIC)
    if source.kind == "wheels":
        home, cudnn = gputrain_cuda.wheels_home(), gputrain_cuda.wheels_cudnn_home()
        nccl = gputrain_cuda.wheels_nccl_home()
        # nvidia-cuda-runtime ships libcudart_static.a in nvidia/cu13/lib beside libcudart.so
        return Cuda(home, [os.path.join(root, "include") for root in (home, cudnn, nccl)],
                    [os.path.join(home, "lib")], CUDART_STATIC)
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
# csrc/py_testing/: gputrain._C_testing, the test-only bindings (linked with _C's other objects)
TESTING_SOURCES = sorted(glob.glob("csrc/py_testing/*.c"))
C_SOURCES = sorted(s for s in glob.glob("csrc/**/*.c", recursive=True)
                   if s not in OTHER_BLAS_SOURCES and s not in TESTING_SOURCES)


def add_cuda(ext, cuda):
    """Compiles and links `ext` with the CUDA backend."""
    ext.define_macros.append(("GT_WITH_CUDA", "1"))
    ext.libraries += cuda.libraries + ["stdc++"]
    ext.library_dirs += cuda.library_dirs
    ext.include_dirs += cuda.include_dirs
    # the static runtime's symbols stay inside _C (PyTorch's own runtime is not interposed)
    ext.extra_link_args += [f"-Wl,--exclude-libs,{gputrain_cuda.STATIC_CUDART}"]


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
                  f"sm_{', sm_'.join(CUDA_ARCHS)} + PTX; libraries {' '.join(cuda.libraries)} from "
                  f"{' '.join(cuda.library_dirs)}", flush=True)
        else:
            print(f"gputrain: CPU-only build ({CUDA_SOURCE.why})", flush=True)
        main, testing = self.extensions
        if cuda:
            for ext in self.extensions:
                add_cuda(ext, cuda)
            main.extra_objects += self.compile_cuda(cuda, sorted(glob.glob("cuda/*.cu")))
        self.extensions = [main]
        super().build_extensions()
        self.extensions = [main, testing]
        self.build_testing(main, testing)
        self.copy_bundled_libraries()

    def build_testing(self, main, testing):
        """Links gputrain._C_testing with _C's objects (an archive of all but csrc/py/module.c's, so
        only the needed ones are pulled in), after _C is built (nothing is compiled twice)."""
        objects = [o for s, o in zip(main.sources, self.compiler.object_filenames(main.sources,
                                                                                  output_dir=self.build_temp))
                   if s != "csrc/py/module.c"] + main.extra_objects
        archive = self.compiler.library_filename("gputrain_core", output_dir=self.build_temp)
        if os.path.exists(archive):  # ar adds to an archive: a renamed or deleted source's object would stay
            os.remove(archive)
        self.compiler.create_static_lib(objects, "gputrain_core", output_dir=self.build_temp)
        testing.extra_objects = [archive]
        testing.depends = list(testing.depends) + [archive]
        self.build_extension(testing)

    def copy_bundled_libraries(self):
        """Copies BLAS.bundled next to the extension (gputrain/lib/), where its rpath looks."""
        target = os.path.join(os.path.dirname(self.get_ext_fullpath("gputrain._C")), "lib")
        os.makedirs(target, exist_ok=True)
        for source in BLAS.bundled:
            name = os.path.basename(source)
            if name in ("LICENSE", "THIRD-PARTY-PROGRAMS"):
                name = f"{BLAS.name}-{name}"
            destination = os.path.join(target, name)
            if not os.path.exists(destination) or os.path.getsize(destination) != os.path.getsize(source) \
                    or os.path.getmtime(destination) < os.path.getmtime(source):
                shutil.copy2(source, destination)

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
        """Compiles the stale .cu files, as many nvcc processes at a time as build_ext's parallel
        (all cores by default); returns every object."""
        jobs = [(source, os.path.join(self.build_temp, source + ".o")) for source in sources]
        stale = [(source, obj) for source, obj in jobs if self.cuda_object_stale(source, obj)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.parallel, len(stale) or 1))) as pool:
            failures = [f for f in pool.map(lambda job: run_nvcc(cuda, *job), stale) if f]
        if failures:
            raise RuntimeError("nvcc failed:\n" + "\n".join(failures))
        return [obj for _, obj in jobs]

    def cuda_object_stale(self, source, obj):
        deps = [source] + glob.glob("cuda/*.h") + glob.glob("cuda/*.cuh") + glob.glob("csrc/**/*.h", recursive=True)
        return self.force or not os.path.exists(obj) or any(os.path.getmtime(d) > os.path.getmtime(obj) for d in deps)


def run_nvcc(cuda, source, obj):
    """Compiles one .cu file; "" on success, else the command and nvcc's output."""
    os.makedirs(os.path.dirname(obj), exist_ok=True)
    cmd = [os.path.join(cuda.home, "bin", "nvcc"), *nvcc_flags(cuda), "-c", source, "-o", obj]
    line = " ".join(shlex.quote(c) for c in cmd)
    print(line, flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"gputrain: nvcc {source}: {time.perf_counter() - start:.1f} s\n{done.stdout}", end="", flush=True)
    return "" if done.returncode == 0 else f"{line}\n{done.stdout}"


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

testing_extension = Extension(
    "gputrain._C_testing",
    sources=TESTING_SOURCES,
    depends=glob.glob("csrc/**/*.h", recursive=True),
    include_dirs=include_dirs,
    define_macros=list(macros),
    libraries=list(libraries),
    library_dirs=list(library_dirs),
    extra_compile_args=C_FLAGS,
    # without its debug information (a second copy of the core's: the install stays under CI's
    # size ceiling, .ci/installed_size.py), except in sanitizer builds, whose reports name lines
    extra_link_args=LINK_FLAGS + ([] if SANITIZE not in ("", "0") else ["-Wl,--strip-debug"]),
)

# Runtime requirements: NumPy, safetensors, the CPU GEMM library where it is not bundled (oneDNN is,
# in gputrain/lib/); for a CUDA build, cuda-pathfinder (finds the CUDA libraries opened when first
# needed) and, when built from the wheels, the wheels of those libraries (pyproject.toml declares
# them dynamic).
INSTALL_REQUIRES = [
    "numpy>=1.25",
    "safetensors>=0.4",  # the Trainer's checkpoint format (gputrain/checkpoint.py)
    "tqdm>=4.62",  # the Trainer's progress bars (imported lazily, by ProgressCallback)
    "scipy-openblas32>=0.3.30,<0.4; platform_machine != 'x86_64'",
] + ([gputrain_cuda.PATHFINDER_REQUIREMENT] if CUDA_SOURCE.kind != "none" else []) \
  + (gputrain_cuda.WHEELS_AT_RUN_TIME if CUDA_SOURCE.kind == "wheels" else [])

setup(ext_modules=[extension, testing_extension], cmdclass={"build_ext": BuildExt}, install_requires=INSTALL_REQUIRES)
