"""gputrain: a training engine whose whole step runs in C (CPU) or CUDA (GPU)."""

from __future__ import annotations

from gputrain import _libs

_libs.preload()

from gputrain import _C  # noqa: E402  (after the libraries it links against are loaded)
from gputrain import cuda, monitor
from gputrain import amp, backends
from gputrain import functional
from gputrain import nn, random
from gputrain import optim
from gputrain.step import StepOutput, TrainStep
from gputrain._C import Buffer, CudaError, OutOfMemoryError
from gputrain.data import DataLoader
from gputrain._cast import cast
from gputrain._info import info
from gputrain.memory import (
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
    set_memory_fraction,
    set_memory_limit,
)


def set_num_threads(num_threads: int) -> None:
    """Set the threads used by gputrain's parallel loops and by the BLAS library."""
    _C.set_num_threads(num_threads)


def get_num_threads() -> int:
    """Threads used by gputrain's parallel loops."""
    return _C.get_num_threads()


__version__ = _C.build_info()["version"]

__all__ = [
    "StepOutput",
    "TrainStep",
    "nn",
    "optim",
    "random",
    "Buffer",
    "DataLoader",
    "CudaError",
    "OutOfMemoryError",
    "cast",
    "get_num_threads",
    "info",
    "memory_stats",
    "memory_summary",
    "reset_peak_memory_stats",
    "set_memory_fraction",
    "set_memory_limit",
    "set_num_threads",
]
