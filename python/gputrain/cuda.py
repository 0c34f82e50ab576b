"""gputrain.cuda: CUDA devices, streams, events and copies (TF32: gputrain.backends.tf32).

Importing this module never needs a GPU. Without a driver or device, `is_available()` is
False, `unavailable_reason()` says why, and calls that need a device raise
`gputrain.CudaError` (a `RuntimeError`) with that reason. In a build without CUDA the same
calls raise `CudaError` saying CUDA was not compiled in.

No CUDA library is loaded at import: the CUDA runtime is linked into gputrain statically, and
cuBLAS(Lt), cuDNN and NCCL are opened when first needed (gputrain/_cuda_libs.py says which copy).

Devices are named by an int ordinal, "cuda" (device 0) or "cuda:N"; None means the device
current on the calling thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from gputrain import _C
from gputrain import memory as _memory

Stream = _C.CudaStream
"""A non-blocking CUDA stream: `Stream(device=0)`, `.synchronize()`, `.query()`, `.wait_event(e)`."""

Event = _C.CudaEvent
"""A CUDA event: `Event(device=0, timing=True)`, `.record(stream)`, `.synchronize()`, `.query()`,
`.elapsed_time(end)` in milliseconds."""


@dataclass(frozen=True)
class DeviceProperties:
    """What `get_device_properties` reports about one device."""

    name: str  # product name, e.g. "NVIDIA GeForce RTX 3090"
    total_memory: int  # bytes of device memory
    major: int  # compute capability, major
    minor: int  # compute capability, minor
    multi_processor_count: int  # streaming multiprocessors
    max_threads_per_block: int  # threads one block may hold
    warp_size: int  # threads per warp
    shared_memory_per_block: int  # bytes of shared memory a block may opt in to
    l2_cache_bytes: int  # bytes of L2 cache


def is_compiled() -> bool:
    """True when this build of gputrain contains the CUDA backend."""
    return bool(_C.build_info()["cuda_compiled"])


def is_available() -> bool:
    """True when CUDA is compiled in and at least one device is usable."""
    return _C.cuda_device_count() > 0


def device_count() -> int:
    """Number of usable CUDA devices (0 without a driver or without CUDA compiled in)."""
    return _C.cuda_device_count()


def unavailable_reason() -> str:
    """Why no CUDA device can be used, e.g. "no NVIDIA driver (...)"; "" when one can."""
    return _C.cuda_unavailable_reason()


def runtime_version() -> int:
    """The CUDA runtime version compiled in, as an int such as 13000 (0 without CUDA)."""
    return _C.cuda_runtime_version()


def driver_version() -> int:
    """The CUDA version the installed driver supports, such as 13000 (0 without a driver)."""
    return _C.cuda_driver_version()


def _libraries(load: bool = True) -> dict[str, dict[str, object]]:
    """The libraries the CUDA backend opens when first needed ("cublasLt", "cublas", "cudnn",
    "nccl"), each as {"soname", "path", "loaded", "version", "min_version", "built_with"}; with
    `load` (the default) each is opened first, which needs no GPU (`CudaError` names a library
    that cannot be found or whose version does not fit). Versions read major*10000 + minor*100 +
    patch. For checks and diagnostics: the backend opens them on its own when it needs them."""
    if not isinstance(load, bool):
        raise TypeError(f"load must be a bool, not {type(load).__name__}")
    return _C.cuda_libraries(load)


def _device_index(device: int | str | None) -> int:
    """The ordinal of a device argument (see the module docstring)."""
    if device is None:
        return _C.cuda_current_device()
    if isinstance(device, bool) or not isinstance(device, (int, str)):
        raise TypeError(f"device must be an int, 'cuda', 'cuda:N' or None, not {type(device).__name__}")
    if isinstance(device, int):
        return device
    if device == "cuda":
        return 0
    prefix, _, digits = device.partition(":")
    if prefix != "cuda" or not digits.isdigit():
        raise ValueError(f"device must be 'cuda' or 'cuda:N', got {device!r}")
    return int(digits)


def current_device() -> int:
    """The ordinal of the device current on the calling thread."""
    return _C.cuda_current_device()


def set_device(device: int | str) -> None:
    """Make `device` current on the calling thread."""
    if device is None:
        raise TypeError("device must be an int, 'cuda' or 'cuda:N', not None")
    _C.cuda_set_device(_device_index(device))


def get_device_properties(device: int | str | None = None) -> DeviceProperties:
    """Name, memory, compute capability and SM count of `device`."""
    return DeviceProperties(**_C.cuda_get_device_properties(_device_index(device)))


def get_device_name(device: int | str | None = None) -> str:
    """The product name of `device`."""
    return get_device_properties(device).name


def get_device_capability(device: int | str | None = None) -> tuple[int, int]:
    """The compute capability of `device` as (major, minor), e.g. (8, 6) for an RTX 3090."""
    props = get_device_properties(device)
    return props.major, props.minor


def synchronize(device: int | str | None = None) -> None:
    """Wait until all work queued on `device`, on every stream, has finished."""
    _C.cuda_synchronize(_device_index(device))


def memory_stats(device: int | str = 0) -> dict[str, int | None]:
    """gputrain's allocator statistics for a CUDA device (see `gputrain.memory_stats`)."""
    return _memory.memory_stats(f"cuda:{_device_index(device)}")


def copy(dst: _C.Buffer, src: _C.Buffer, nbytes: int | None = None, stream: Stream | None = None) -> None:
    """Copy `nbytes` (default: all of `src`) between Buffers, at least one on a CUDA device.

    With `stream` the copy is queued and returns at once; both Buffers stay alive until the
    stream has been synchronized (only pinned host Buffers overlap with computation)."""
    _C.cuda_copy(dst, src, nbytes, stream)


def memset(dst: _C.Buffer, value: int, nbytes: int | None = None, stream: Stream | None = None) -> None:
    """Set `nbytes` (default: all) of a CUDA Buffer to the byte `value`, queued on `stream` if given."""
    _C.cuda_memset(dst, value, nbytes, stream)


__all__ = [
    "DeviceProperties",
    "Event",
    "Stream",
    "copy",
    "current_device",
    "device_count",
    "driver_version",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "is_available",
    "is_compiled",
    "memory_stats",
    "memset",
    "runtime_version",
    "set_device",
    "synchronize",
    "unavailable_reason",
]
