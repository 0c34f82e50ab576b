"""gputrain: a training engine whose whole step runs in C (CPU) or CUDA (GPU)."""

from __future__ import annotations

try:  # the extension's rpath finds the libraries it links (in the package or beside it)
    from gputrain import _C
except ImportError:  # another layout (--target, a user install): load them by their wheels' file lists
    from gputrain import _libs

    _libs.preload()
    from gputrain import _C
from gputrain import cuda, monitor
from gputrain import amp, backends
from gputrain import functional
from gputrain import models, nn, random
from gputrain import optim
from gputrain import peft
from gputrain.step import DeferredStepOutput, SpikeGuard, StepOutput, TrainStep
from gputrain._C import Buffer, CudaError, OutOfMemoryError
from gputrain.checkpoint import CheckpointError
from gputrain.data import DataLoader
from gputrain.text import tokenizer_from_pretrained
from gputrain._cast import cast
from gputrain._info import info
from gputrain import metrics
from gputrain.training_args import TrainingArguments
from gputrain.trainer_callback import (
    EarlyStoppingCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from gputrain.trainer import Trainer, TrainOutput
from gputrain.guards import GPUHealthCallback, LossSpikeCallback
from gputrain.memory import (
    device_counters,
    memory_stats,
    memory_summary,
    reset_peak_memory_stats,
    set_memory_fraction,
    set_memory_limit,
)


def set_num_threads(num_threads: int) -> None:
    """Set the threads used by gputrain's parallel loops and by the BLAS library.

    A process forked from one that had imported gputrain (a DataLoader worker with the default
    start method, a ``multiprocessing`` fork) runs gputrain on one thread: GNU OpenMP's thread
    pool does not survive fork. There ``num_threads > 1`` raises RuntimeError; use the
    ``"spawn"`` or ``"forkserver"`` start method for multi-threaded children."""
    _C.set_num_threads(num_threads)


def get_num_threads() -> int:
    """Threads used by gputrain's parallel loops."""
    return _C.get_num_threads()


def set_debug(enabled: bool) -> None:
    """Debug mode for error messages (process-wide; off by default).

    Errors raised from gputrain's C core say what went wrong, which argument, and how to fix it.
    With debug mode on, each message also ends with the C source location that raised it, e.g.
    ``"x: expected 64 features ..., got 60 (plan.c:71)"`` -- useful in a bug report. Setting
    the environment variable ``GPUTRAIN_DEBUG=1`` before the first error turns it on as well
    (the variable is read once); ``set_debug`` overrides it either way.
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, not {type(enabled).__name__}")
    _C.set_debug(enabled)


def get_debug() -> bool:
    """True when error messages end with their C source location (see :func:`set_debug`)."""
    return _C.get_debug()


__version__ = _C.build_info()["version"]

__all__ = [
    "SpikeGuard",
    "StepOutput",
    "DeferredStepOutput",
    "TrainStep",
    "EarlyStoppingCallback",
    "GPUHealthCallback",
    "LossSpikeCallback",
    "TrainOutput",
    "Trainer",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "TrainingArguments",
    "metrics",
    "models",
    "nn",
    "optim",
    "peft",
    "random",
    "Buffer",
    "CheckpointError",
    "DataLoader",
    "CudaError",
    "OutOfMemoryError",
    "cast",
    "get_debug",
    "get_num_threads",
    "info",
    "device_counters",
    "memory_stats",
    "memory_summary",
    "reset_peak_memory_stats",
    "set_memory_fraction",
    "set_debug",
    "set_memory_limit",
    "set_num_threads",
    "tokenizer_from_pretrained",
]
