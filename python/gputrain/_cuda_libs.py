"""Which copy of cuBLAS(Lt), cuDNN and NCCL the CUDA backend opens when it first needs one.

Nothing here runs at `import gputrain`: the C loader (cuda/cuda_libs.cu) calls `find` the first
time a library is needed (cuBLAS when a device is first used, cuDNN at the first Conv2d, NCCL
when a NCCL communicator is made), unless a copy with the library's soname is already loaded in
the process (PyTorch's, for instance), which it then shares. `find` asks NVIDIA's cuda.pathfinder,
whose order is: a copy already loaded, NVIDIA's wheels in this environment, conda, then the
system's search (LD_LIBRARY_PATH, ld.so.conf: a CUDA toolkit) and CUDA_HOME/CUDA_PATH. The C
loader checks the version of what it opened and says which library and versions do not fit.
"""

from __future__ import annotations


def find(name: str, soname: str) -> str:
    """The absolute path of library `name` ("cublasLt", "cublas", "cudnn", "nccl") to open,
    loaded by cuda.pathfinder with its dependencies. Raises with a message saying why none was
    found (the C loader then tries `soname` through the system's search)."""
    try:
        from cuda import pathfinder
    except ImportError:
        raise ImportError("cuda.pathfinder is not installed (pip install cuda-pathfinder), so only "
                          f"the system's search for {soname} was tried") from None
    loaded = pathfinder.load_nvidia_dynamic_lib(name)
    if not loaded.abs_path:
        raise LookupError(f"cuda.pathfinder loaded {name} but cannot say from where")
    return str(loaded.abs_path)
