"""What runs in worker threads when Python is involved: worker_init_fn, the worker-side
transform, and `get_worker_info()` (None outside a worker thread)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable

from gputrain.data._errors import WorkerError

_local = threading.local()


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker thread knows about itself (PyTorch's WorkerInfo)."""

    id: int  # worker index in [0, num_workers)
    num_workers: int  # worker threads of the loader
    seed: int  # the loader's seed + id, for per-worker random state
    dataset: Any  # the loader's dataset


def get_worker_info() -> WorkerInfo | None:
    """The WorkerInfo of the calling worker thread, or None in any other thread."""
    return getattr(_local, "info", None)


def make_worker_start(num_workers: int, seed: int, dataset: Any,
                      worker_init_fn: Callable[[int], Any] | None) -> Callable[[int], WorkerError | None]:
    """The hook each worker thread runs first: records its WorkerInfo, calls worker_init_fn,
    and returns the error (for the caller to raise) instead of raising it."""

    def worker_start(worker_id: int) -> WorkerError | None:
        _local.info = WorkerInfo(worker_id, num_workers, (seed + worker_id) % (1 << 64), dataset)
        if worker_init_fn is None:
            return None
        try:
            worker_init_fn(worker_id)
        except BaseException:
            return WorkerError.current(f"in DataLoader worker thread {worker_id}")
        return None

    return worker_start


def make_worker_transform(pipeline: Callable[[tuple[Any, ...]], Any]) -> Callable[[int, tuple[Any, ...]], Any]:
    """The hook run on each gathered batch in its worker: the batch pipeline, whose
    exceptions are returned as WorkerError objects for the caller to raise."""

    def worker_transform(batch: int, views: tuple[Any, ...]) -> Any:
        try:
            return pipeline(views)
        except BaseException:
            info = get_worker_info()
            where = f"in DataLoader worker thread {info.id}" if info else "in a DataLoader worker thread"
            return WorkerError.current(where)

    return worker_transform
