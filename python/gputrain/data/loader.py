"""gputrain.DataLoader: PyTorch's DataLoader arguments over in-memory or memory-mapped arrays,
with C worker threads gathering whole batches into a ring of slots (csrc/data/loader.c), and
over Dataset objects (PyTorch's map-style and iterable protocols), fetched in the calling thread
or in worker processes that collate into shared-memory slots (gputrain.data._dataset_iter).

    loader = gt.DataLoader((X, y), batch_size=256, shuffle=True, num_workers=2,
                           pin_memory=True, persistent_workers=True, seed=0)
    for epoch in range(10):
        for xb, yb in loader:     # NumPy views of a slot: no copy, no per-sample Python
            ...

Differences from PyTorch, by design: over arrays, workers are threads, not processes
(gathering is C code that does not hold the GIL) and `collate_fn` receives the gathered batch
(the same structure as `dataset`, each array with a leading batch dimension) instead of a list
of samples. Over Dataset objects, workers are processes and `collate_fn` receives the list of
samples, as in PyTorch; batches hold NumPy arrays (gputrain.data.default_collate), and
`device=` is not supported. Either way the order is a pure function of (seed, epoch), so it does
not depend on num_workers, prefetch_factor, in_order or persistent_workers, and `state_dict()`
resumes mid-epoch exactly (an iterable dataset's resume replays the batches before the saved
one).
"""

from __future__ import annotations

import atexit
import math
import numbers
import os
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from gputrain import _C, distributed
from gputrain._state_checks import check_keys, check_mapping, integer
from gputrain._vocab import parse_device
from gputrain.data._dataset_iter import UNKNOWN_BATCHES, DatasetIter, EpochBatches
from gputrain.data._errors import WorkerError, raise_delivered_error
from gputrain.data._ragged import RaggedArray
from gputrain.data._structure import num_samples
from gputrain.data._worker import make_worker_start, make_worker_transform
from gputrain.data.arrow import arrow_columns, arrow_table
from gputrain.data.dataset import ARRAYS, ITERABLE, MAP, classify
from gputrain.data.transfer import DeviceStage
from gputrain.data.sampler import (
    ORDER_ARRAY,
    BatchSampler,
    DistributedSampler,
    OrderSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    make_order,
    seed_from,
)

_STATE_VERSION = 1
MAX_NUM_WORKERS = 256  # worker threads per loader: far past the point where gathering is memory-bound
_SLOT_ALIGN = 64  # bytes; each field of a slot starts on this boundary (GT_ALIGN in csrc/core/alloc.h)
_DETACH_S = 0.25  # seconds a stopped engine's shutdown waits before detaching a worker stuck in a hook
MAX_TIMEOUT_S = 2_147_483  # the longest wait the workers' result poll takes (epoll: 2**31 - 1 ms)
_FROZEN_ATTRIBUTES = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers",
                      "columns")


class _Engine:
    """A C LoaderEngine, weakly tracked so that interpreter exit can stop its threads."""

    __slots__ = ("engine", "max_rows", "config", "stopped", "__weakref__")

    def __init__(self, engine: _C.LoaderEngine, max_rows: int, config: tuple[Any, ...]) -> None:
        self.engine = engine
        self.max_rows = max_rows
        self.config = config  # the loader settings it was built with (DataLoader._engine_config)
        self.stopped = False
        _LIVE_ENGINES.add(self)

    def stop(self) -> None:
        """Asks the workers to stop without waiting (after an error or Ctrl-C: a worker stuck in
        a hook is detached at shutdown, or when the engine is dropped, instead of joined)."""
        self.stopped = True
        self.engine.stop()

    def shutdown(self) -> None:
        """Stops and joins the workers: until they stop or Ctrl-C (KeyboardInterrupt, the rest
        detached), or _DETACH_S once stopped after an error or Ctrl-C (one stuck in a hook may
        never return)."""
        timeout = _DETACH_S if self.stopped else None
        self.stopped = True
        self.engine.shutdown(timeout)


_LIVE_ENGINES: "weakref.WeakSet[_Engine]" = weakref.WeakSet()
_EXITING = [False]  # set once the interpreter exits: no new worker threads after that


@atexit.register
def _shutdown_all_engines() -> None:
    """Joins every worker thread before the interpreter tears down the arrays they read."""
    _EXITING[0] = True
    engines = list(_LIVE_ENGINES)
    try:
        for engine in engines:
            engine.shutdown()
    except KeyboardInterrupt:  # Ctrl-C while a worker is stuck in a hook: exit without waiting
        for engine in engines:
            engine.stopped = True
            engine.engine.shutdown(0.0)
        raise


def _park_daemon_thread_at_exit() -> None:
    """Blocks a thread other than the main one for good once the interpreter exits. Only daemon
    threads still run then (non-daemon ones were joined before the exit handlers), and Python
    freezes them at finalization anyway; but while `_shutdown_all_engines` joins the workers
    without the GIL, a daemon thread may run on and find its engine shut down. It waits for
    finalization here instead of dying with a stray RuntimeError on stderr."""
    if _EXITING[0] and threading.current_thread() is not threading.main_thread():
        threading.Event().wait()


@dataclass
class _Plan:
    """One epoch as the C engine takes it."""

    order: dict[str, Any]  # the order description (gputrain.data.sampler.make_order)
    batch_size: int  # rows per batch, or 0 when `offsets` gives the batches
    drop_last: bool  # drop the last partial batch
    offsets: np.ndarray | None  # (num_batches + 1,) batch boundaries of a batch_sampler
    max_rows: int  # rows of the largest batch


class _Progress:
    """Which batches of an epoch were yielded: all below `low`, and those in `above`."""

    __slots__ = ("epoch", "num_batches", "low", "above")

    def __init__(self, epoch: int, num_batches: int, start: int, done: list[int]) -> None:
        self.epoch = epoch
        self.num_batches = num_batches
        self.low = start
        self.above = set(done)
        self._advance()

    def _advance(self) -> None:
        while self.low in self.above:
            self.above.remove(self.low)
            self.low += 1

    def mark(self, batch: int) -> None:
        """Records that `batch` was yielded."""
        if batch == self.low:
            self.low += 1
            self._advance()
        else:
            self.above.add(batch)

    @property
    def yielded(self) -> int:
        return self.low + len(self.above)

    @property
    def complete(self) -> bool:
        return self.yielded >= self.num_batches


def _check_int(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return int(value)


def _physical_memory() -> int | None:
    """Bytes of RAM in this machine, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _row_bytes(array: np.ndarray | RaggedArray) -> int:
    """Bytes one row of a field takes in a slot (a ragged field: its longest row)."""
    if isinstance(array, RaggedArray):
        longest = array.padded_width(int(array.lengths.max()) if len(array) else 0)
        return longest * array.values.dtype.itemsize * int(np.prod(array.values.shape[1:], dtype=np.int64))
    return array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))


def _check_worker_limit(num_workers: int) -> None:
    if num_workers > MAX_NUM_WORKERS:
        raise ValueError(f"num_workers={num_workers} is more than gputrain's limit of {MAX_NUM_WORKERS} worker "
                         "threads (each gathers whole batches; a few per CPU core already saturate memory)")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _parse_device(device: Any) -> str | None:
    """None for the CPU (zero-copy batches), "cuda:N", or "sim:N" (the simulated device)."""
    text = parse_device(device, none_ok=True, check=True)
    return None if text == "cpu" else text


def _from_arrow(dataset: Any, columns: list[str] | None) -> Any:
    """A pyarrow Table or `datasets.Dataset` as a dict of its columns' arrays; anything else as it is."""
    if arrow_table(dataset) is not None:
        return arrow_columns(dataset, columns)
    if columns is not None:
        raise TypeError("columns= selects columns of a pyarrow Table or datasets.Dataset, "
                        f"not of {type(dataset).__name__}")
    return dataset


class DataLoader:
    """Batches of `dataset`: a NumPy array, or a tuple/list/dict of arrays with the same first
    dimension (np.memmap works), gathered by C worker threads; a pyarrow Table or Hugging Face
    `datasets.Dataset`, its numeric columns (or those named in `columns`) converted once into
    such arrays (gputrain.data.arrow; batches are dicts by column name); or a Dataset object (map-style:
    __len__ and __getitem__; iterable: __iter__; a list of samples is map-style) fetched by
    worker processes. Arguments as PyTorch's DataLoader, plus: `seed` (the order's seed;
    default: drawn from `generator`, else random), `device` ("cuda[:N]" or "sim[:N]", arrays only: batches
    are copied to the device on a copy stream), `transform` (arrays: a callable applied to each
    gathered batch before `collate_fn`; Dataset objects: applied to each collated batch where
    it is collated) and `transform_in_workers` (arrays: run transform and collate_fn in the
    worker threads, with the GIL, instead of the caller). `pin_memory` pins the array path's
    slots; a Dataset object's batches are copied on delivery into slots of the pinned pool."""

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler[int] | Any = None,
        batch_sampler: Sampler[list[int]] | Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[Any], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], Any] | None = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        device: Any = None,
        transform: Callable[[Any], Any] | None = None,
        transform_in_workers: bool = False,
        columns: list[str] | None = None,
    ) -> None:
        num_workers = _check_int("num_workers", num_workers)
        prefetch_factor = self._check_options(num_workers, timeout, prefetch_factor, persistent_workers,
                                              multiprocessing_context, collate_fn, transform, worker_init_fn)
        self._kind, flat = classify(_from_arrow(dataset, columns))
        self._arrays: list[Any] = []
        self._rebuild: Any = None
        if flat is not None:
            self._arrays, self._rebuild = flat
            self._num_rows = num_samples(self._arrays)
        elif self._kind == MAP:
            self._num_rows = len(dataset)
        else:
            self._num_rows = 0
            self._check_iterable_options(shuffle, sampler, batch_sampler)
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        self.seed = seed_from(seed, generator)
        if self._kind == ITERABLE:
            pass  # the dataset gives the order; no sampler
        elif sampler is None and distributed.get_world_size() > 1:  # data parallelism: this rank's shard
            sampler = DistributedSampler(self._num_rows, shuffle=shuffle, seed=self.seed)
        elif sampler is None:
            sampler = (RandomSampler(self._num_rows, seed=self.seed) if shuffle
                       else SequentialSampler(self._num_rows))
        if batch_size is not None and batch_sampler is None and self._kind != ITERABLE:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset = dataset
        self.columns = None if columns is None else list(columns)  # of an Arrow table: those gathered
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = bool(pin_memory)
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.generator = generator
        self.collate_fn = collate_fn
        self.transform = transform
        self.transform_in_workers = bool(transform_in_workers)
        self.persistent_workers = bool(persistent_workers)
        self.in_order = bool(in_order)
        self.device = _parse_device(device)
        if self._kind != ARRAYS and num_workers > 0:
            from gputrain.data._procs import resolve_context  # multiprocessing: only with workers

            resolve_context(multiprocessing_context)  # a bad one fails here, not at the first epoch
        self._next_epoch = 0
        self._resume: tuple[int, list[int]] | None = None
        self._progress: _Progress | None = None
        self._iterator: _DataLoaderIter | DatasetIter | None = None
        self._spare_engine: _Engine | None = None  # num_workers=0: slots kept between epochs
        self._pin_warned = False
        self._iter_lock = threading.Lock()  # iter() from one thread at a time
        self._epoch_owner: tuple[threading.Thread, weakref.ref[Any]] | None = None  # the thread and
        # the iterator of the epoch in progress
        if self._kind != ARRAYS:
            self._check_dataset_device()
        elif batch_sampler is None or isinstance(batch_sampler, BatchSampler):  # the batch size is known now
            self._check_engine_size(batch_sampler.batch_size if batch_sampler is not None else 1)
        self._initialized = True
        self.check_worker_number_rationality()

    @staticmethod
    def _check_options(num_workers: int, timeout: float, prefetch_factor: int | None, persistent_workers: bool,
                       multiprocessing_context: Any, collate_fn: Any, transform: Any, worker_init_fn: Any) -> int | None:
        """PyTorch's checks, in PyTorch's order and words, and gputrain's bounds (num_workers at
        most MAX_NUM_WORKERS threads, a finite timeout); returns the prefetch factor."""
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable multiprocessing.")
        _check_worker_limit(num_workers)
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if not math.isfinite(timeout) or timeout > MAX_TIMEOUT_S:
            raise ValueError(f"timeout must be a finite number of seconds up to {MAX_TIMEOUT_S} (about 24 days; "
                             f"0: wait forever), got {timeout}")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None:
            prefetch_factor = _check_int("prefetch_factor", prefetch_factor)
            if prefetch_factor < 0:
                raise ValueError("prefetch_factor option should be non-negative")
            if prefetch_factor == 0:
                raise ValueError("prefetch_factor must be >= 1 with num_workers > 0 "
                                 "(batches each worker keeps in flight)")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if multiprocessing_context is not None and num_workers == 0:
            raise ValueError("multiprocessing_context can only be used with multi-process loading "
                             f"(num_workers > 0), but got num_workers={num_workers}")
        for name, hook in (("collate_fn", collate_fn), ("transform", transform), ("worker_init_fn", worker_init_fn)):
            if hook is not None and not callable(hook):
                raise TypeError(f"{name} must be callable or None, not {type(hook).__name__}")
        return prefetch_factor

    @staticmethod
    def _check_iterable_options(shuffle: Any, sampler: Any, batch_sampler: Any) -> None:
        """PyTorch's checks for an iterable dataset, in its words: it gives its own order."""
        for name, value in (("shuffle", shuffle if shuffle else None), ("sampler", sampler),
                            ("batch_sampler", batch_sampler)):
            if value is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified {name} option, "
                                 f"but got {name}={value}")

    def _check_dataset_device(self) -> None:
        if self.device is not None:
            raise ValueError(f"device={self.device!r}: batches of Dataset objects are delivered in host memory; "
                             "device= is supported for NumPy array datasets")

    def _check_engine_size(self, max_rows: int) -> None:
        """OutOfMemoryError, before anything is allocated, when the ring of slots an epoch needs
        (num_workers * prefetch_factor + 2 batches of `max_rows` rows) cannot fit what is left
        under the memory limit of its pool (gputrain.set_memory_limit), or the machine's RAM
        without one; ValueError for more than MAX_NUM_WORKERS workers (set after construction)."""
        _check_worker_limit(self.num_workers)
        slot = max(sum(-(-max_rows * _row_bytes(a) // _SLOT_ALIGN) * _SLOT_ALIGN for a in self._arrays),
                   _SLOT_ALIGN)
        needed = (self.num_workers * (self.prefetch_factor or 0) + 2) * slot
        pool = "pinned" if self.pin_memory else "cpu"
        stats = _C.memory_stats(device=pool)
        if stats["limit_bytes"] is not None:
            room, where = stats["limit_bytes"] - stats["reserved_bytes"], f"left under the {pool!r} pool's memory limit"
        else:
            room, where = _physical_memory(), "of memory in this machine"
        if room is not None and needed > room:
            raise _C.OutOfMemoryError(
                f"DataLoader: num_workers={self.num_workers} x prefetch_factor={self.prefetch_factor} (+2) slots "
                f"of {slot:,} bytes ({max_rows} rows) need {needed:,} bytes, more than the {max(room, 0):,} bytes "
                f"{where}; lower prefetch_factor, num_workers or batch_size")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _FROZEN_ATTRIBUTES and self.__dict__.get("_initialized", False):
            raise ValueError(f"{name} attribute should not be set after {type(self).__name__} is initialized")
        super().__setattr__(name, value)

    def check_worker_number_rationality(self) -> None:
        """Warns when there are more worker threads than CPUs this process may use."""
        cpus = _cpu_count()
        if self.num_workers > cpus:
            warnings.warn(
                f"This DataLoader will create {self.num_workers} worker "
                f"{'threads' if self._kind == ARRAYS else 'processes'} in total. Our suggested max "
                f"number of worker in current system is {cpus}, which is smaller than what this DataLoader "
                "is going to create. Please be aware that excessive worker creation might get DataLoader "
                "running slow or even freeze, lower the worker number to avoid potential slowness/freeze "
                "if necessary.",
                stacklevel=3,
            )

    # ---- length, epochs, state ---------------------------------------------------------

    def __len__(self) -> int:
        if self._kind == ITERABLE:  # PyTorch's estimate from len(dataset), when it has one
            length = len(self.dataset)
            if self.batch_size is None:
                return length
            return length // self.batch_size if self.drop_last else -(-length // self.batch_size)
        if self.batch_sampler is not None:
            return len(self.batch_sampler)
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration epoch `epoch` (its shuffle is a function of (seed, epoch)).
        Without calls, each iteration takes the next epoch number, starting at 0."""
        epoch = _check_int("epoch", epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self._next_epoch = epoch
        self._resume = None
        self._progress = None
        for sampler in (self.sampler, self.batch_sampler):
            if sampler is not None and not isinstance(sampler, OrderSampler) and hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)

    def _order_sampler(self) -> OrderSampler | None:
        sampler = self.batch_sampler.sampler if isinstance(self.batch_sampler, BatchSampler) else self.sampler
        return sampler if isinstance(sampler, OrderSampler) else None

    def _order_seed(self) -> int:
        order_sampler = self._order_sampler()
        return getattr(order_sampler, "seed", self.seed)

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: the epoch, the batches yielded in it, and the order's seed.
        O(1) in the dataset size (out-of-order delivery adds at most the batches in flight)."""
        progress = self._progress
        if progress is not None and not progress.complete:
            epoch, low, done = progress.epoch, progress.low, sorted(progress.above)
        elif self._resume is not None:
            epoch, (low, done) = self._next_epoch, self._resume
        else:
            epoch, low, done = self._next_epoch, 0, []
        return {"version": _STATE_VERSION, "seed": self._order_seed(), "epoch": epoch,
                "batches_yielded": low + len(done), "next_batch": low, "done": list(done),
                "num_batches": progress.num_batches if progress is not None else len(self)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from `state`: the next iteration yields exactly the batches of that epoch
        that were not yielded yet (without gathering the others), then epochs go on as before."""
        self._apply_staged(self._stage_state_dict(state))

    def _stage_state_dict(self, state: dict[str, Any]) -> tuple[int, int, tuple[int, list[int]] | None]:
        """load_state_dict's checks, changing nothing: (seed, next epoch, position in it)."""
        check_mapping(state, "state_dict")
        check_keys(state, "state_dict", ("version", "seed", "epoch", "next_batch", "done", "num_batches"),
                   ("batches_yielded",))
        if state["version"] != _STATE_VERSION:
            raise ValueError(f"state_dict: version {state['version']!r} is not {_STATE_VERSION}")
        num_batches = integer(state["num_batches"], "state_dict['num_batches']", 0)
        if hasattr(self.batch_sampler or self.sampler, "__len__") and num_batches != len(self):
            raise ValueError(f"state_dict: saved from a loader with {num_batches} batches per epoch; "
                             f"this one has {len(self)}")
        epoch = integer(state["epoch"], "state_dict['epoch']", 0)
        low = integer(state["next_batch"], "state_dict['next_batch']", 0)
        if not isinstance(state["done"], (list, tuple)):
            raise TypeError(f"state_dict['done'] must be a list of ints, not {type(state['done']).__name__}")
        done = sorted(integer(b, "state_dict['done'] entries", low + 1, num_batches - 1) for b in state["done"])
        if len(set(done)) != len(done) or ("batches_yielded" in state and integer(
                state["batches_yielded"], "state_dict['batches_yielded']", 0) != low + len(done)):
            raise ValueError("state_dict: next_batch/done/batches_yielded are inconsistent")
        seed = integer(state["seed"], "state_dict['seed']", 0, 2**64 - 1)
        if low + len(done) >= num_batches:
            return seed, epoch + 1, None
        return seed, epoch, (low, done)

    def _apply_staged(self, staged: tuple[int, int, tuple[int, list[int]] | None]) -> None:
        """Sets what _stage_state_dict checked."""
        seed, next_epoch, resume = staged
        order_sampler = self._order_sampler()
        if order_sampler is not None and hasattr(order_sampler, "seed"):
            order_sampler.seed = seed
        object.__setattr__(self, "seed", seed)
        self._progress = None
        self._next_epoch, self._resume = next_epoch, resume

    # ---- planning an epoch ---------------------------------------------------------------

    def _indices(self, sampler: Any) -> np.ndarray:
        """All indices of a foreign sampler for one epoch, negative ones counted from the end."""
        if isinstance(sampler, np.ndarray):
            indices = sampler.astype(np.int64, copy=False).ravel()
        else:
            indices = np.fromiter((int(i) for i in sampler), dtype=np.int64)
        return np.where(indices < 0, indices + self._num_rows, indices)

    def _order(self, sampler: Any, epoch: int) -> dict[str, Any]:
        if isinstance(sampler, OrderSampler):
            return sampler.order(epoch)
        indices = self._indices(sampler)
        return make_order(ORDER_ARRAY, len(indices), indices=indices)

    def _plan(self, epoch: int) -> _Plan:
        batch_sampler = self.batch_sampler
        if batch_sampler is None:  # batch_size=None: one sample at a time, no batch dimension
            return _Plan(self._order(self.sampler, epoch), 1, False, None, 1)
        if isinstance(batch_sampler, BatchSampler):
            order = self._order(batch_sampler.sampler, epoch)
            return _Plan(order, batch_sampler.batch_size, batch_sampler.drop_last, None, batch_sampler.batch_size)
        if hasattr(batch_sampler, "batch_arrays"):  # gputrain's bucket sampler: arrays, no lists
            indices, offsets = batch_sampler.batch_arrays(epoch)
        else:
            batches = [self._indices(b) for b in batch_sampler]
            lengths = [len(b) for b in batches]
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            indices = np.concatenate(batches) if batches else np.zeros(0, np.int64)
        order = make_order(ORDER_ARRAY, len(indices), indices=indices)
        max_rows = int(np.diff(offsets).max()) if len(offsets) > 1 else 1
        return _Plan(order, 0, False, offsets, max_rows)

    def _take_start(self) -> tuple[int, int, list[int]]:
        """The epoch the next iteration runs and where in it to start."""
        epoch = self._next_epoch
        order_sampler = self._order_sampler()
        start, done = self._resume if self._resume is not None else (0, [])
        self._next_epoch, self._resume = epoch + 1, None
        if order_sampler is not None and getattr(order_sampler, "_explicit_epoch", False):
            epoch = order_sampler.epoch  # set with sampler.set_epoch(), as PyTorch users do
        return epoch, start, done

    # ---- iteration ---------------------------------------------------------------------------

    def _new_engine(self, max_rows: int) -> _Engine:
        _park_daemon_thread_at_exit()
        if _EXITING[0]:
            raise RuntimeError("DataLoader: the interpreter is shutting down; no new epoch can start")
        hooks_in_workers = self.transform_in_workers and self.num_workers > 0
        needs_start = self.num_workers > 0 and (self.worker_init_fn is not None or hooks_in_workers)
        worker_start = (make_worker_start(self.num_workers, self._order_seed(), self.dataset, self.worker_init_fn)
                        if needs_start else None)
        worker_transform = make_worker_transform(self._batch_pipeline()) if hooks_in_workers else None
        self._check_engine_size(max(max_rows, 1))
        fields = [a.field() if isinstance(a, RaggedArray) else a for a in self._arrays]
        engine = _C.LoaderEngine(fields, max(max_rows, 1), self.num_workers, max(self.prefetch_factor or 0, 1),
                                 in_order=self.in_order, pin_memory=self.pin_memory, worker_start=worker_start,
                                 worker_transform=worker_transform)
        return _Engine(engine, max(max_rows, 1), self._engine_config())

    def _engine_config(self) -> tuple[Any, ...]:
        """The settings an engine is built from (they may be changed between epochs)."""
        return (self.num_workers, self.prefetch_factor, self.in_order, self.pin_memory, self.worker_init_fn,
                self.transform, self.collate_fn, self.transform_in_workers, self._order_seed())

    def _reusable(self, engine: _Engine | None, max_rows: int) -> bool:
        return (engine is not None and not engine.stopped and not engine.engine.closed
                and engine.max_rows >= max_rows and engine.config == self._engine_config())

    def _batch_pipeline(self) -> Callable[[tuple[np.ndarray, ...]], Any]:
        """views -> the batch the user sees: structure, then transform, then collate_fn."""
        rebuild, transform, collate_fn = self._rebuild, self.transform, self.collate_fn
        unbatched = self.batch_sampler is None

        def pipeline(views: tuple[np.ndarray, ...]) -> Any:
            batch = rebuild([v[0] for v in views] if unbatched else views)
            if transform is not None:
                batch = transform(batch)
            if collate_fn is not None:
                batch = collate_fn(batch)
            return batch

        return pipeline

    def _warn_pin_memory(self) -> None:
        """PyTorch's warning when pinned slots have no device to feed (the simulated device,
        named by `device` or `pin_memory_device`, is fed from them as a GPU would be)."""
        feeds_sim = any(str(d or "").startswith("sim") for d in (self.device, self.pin_memory_device))
        if self.pin_memory and not self._pin_warned and _C.cuda_device_count() == 0 and not feeds_sim:
            object.__setattr__(self, "_pin_warned", True)
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                          "then device pinned memory won't be used.", stacklevel=3)

    def _dataset_config(self) -> tuple[Any, ...]:
        """The settings a Dataset object's workers are started with."""
        return (self.num_workers, self.prefetch_factor, self.worker_init_fn, self.collate_fn, self.transform,
                self.multiprocessing_context, self.in_order, self.batch_size, self.drop_last, self._order_seed())

    def _epoch_batches(self, epoch: int) -> EpochBatches | None:
        """A map-style dataset's batches of `epoch` (the array path's plan, as indices)."""
        if self._kind == ITERABLE:
            return None
        plan = self._plan(epoch)
        rows = _C.sampler_rows(self._num_rows, plan.order)
        if plan.offsets is not None:
            return EpochBatches(rows, plan.offsets)
        size = plan.batch_size
        count = len(rows) // size if plan.drop_last else -(-len(rows) // size)
        step = min(size, len(rows))  # a batch_size beyond the rows (up to 2**63) is one batch of them all
        return EpochBatches(rows, np.minimum(np.arange(count + 1, dtype=np.int64) * step, len(rows)))

    def _iter_dataset(self) -> DatasetIter:
        self._check_dataset_device()
        epoch, start, done = self._take_start()
        batches = self._epoch_batches(epoch)
        iterator = self._iterator if self.persistent_workers else None
        if not isinstance(iterator, DatasetIter) or iterator.closed or iterator.config != self._dataset_config():
            if isinstance(iterator, DatasetIter):
                iterator.shutdown()
            iterator = DatasetIter(self, persistent=self.persistent_workers)
            if self.persistent_workers:
                self._iterator = iterator
        if batches is None:
            self._progress = _Progress(epoch, UNKNOWN_BATCHES, start, [])
            iterator.reset(None, self._progress, start)
        else:
            self._progress = _Progress(epoch, len(batches), start, done)
            iterator.reset(batches, self._progress, 0)
        return iterator

    def _in_use_by(self) -> threading.Thread | None:
        """The other thread whose epoch of this loader is in progress, or None. An epoch belongs
        to the thread that started it (iter()) until it is exhausted or fails, its iterator is
        dropped (persistent workers keep it), or that thread ends."""
        if self._epoch_owner is None:
            return None
        thread, iterator_ref = self._epoch_owner
        iterator = iterator_ref()
        if (thread is threading.current_thread() or not thread.is_alive() or iterator is None
                or getattr(iterator, "_finished", True)):
            return None
        return thread

    def __iter__(self) -> "_DataLoaderIter | DatasetIter":
        _park_daemon_thread_at_exit()
        self._warn_pin_memory()
        with self._iter_lock:
            other = self._in_use_by()
            if other is not None:
                raise RuntimeError(
                    f"the DataLoader is in use by another thread: an epoch that thread {other.name!r} started is in "
                    "progress (one epoch at a time: iterate a DataLoader from one thread, share its iterator, or "
                    "give each thread its own DataLoader)")
            iterator = self._start_epoch()
            self._epoch_owner = (threading.current_thread(), weakref.ref(iterator))
            return iterator

    def _start_epoch(self) -> "_DataLoaderIter | DatasetIter":
        if self._kind != ARRAYS:
            return self._iter_dataset()
        epoch, start, done = self._take_start()
        plan = self._plan(epoch)
        if not self.persistent_workers:
            spare, self._spare_engine = self._spare_engine, None
            engine = spare if self._reusable(spare, plan.max_rows) else self._new_engine(plan.max_rows)
            iterator = _DataLoaderIter(self, engine, persistent=False)
        else:
            if self._iterator is None:
                self._iterator = _DataLoaderIter(self, self._new_engine(plan.max_rows), persistent=True)
            elif not self._reusable(self._iterator.engine, plan.max_rows):
                self._iterator.replace_engine(self._new_engine(plan.max_rows))
            iterator = self._iterator
        self._progress = iterator.reset(plan, epoch, start, done)
        return iterator

    # ---- copy.deepcopy and pickle ---------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The options, dataset and samplers, and the position as state_dict(); not the
        threads and slots of a running iteration (a copy starts its own where this one is)."""
        transient = ("_arrays", "_rebuild", "_iterator", "_spare_engine", "_progress", "_resume", "_next_epoch",
                     "_iter_lock", "_epoch_owner")
        state = {k: v for k, v in self.__dict__.items() if k not in transient}
        state["_position"] = self.state_dict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        position = state.pop("_position")
        self.__dict__.update(state)
        dataset = _from_arrow(self.dataset, self.__dict__.get("columns"))
        arrays, rebuild = classify(dataset)[1] or ([], None)  # Dataset objects: no arrays
        self.__dict__.update(_arrays=arrays, _rebuild=rebuild, _iterator=None, _spare_engine=None, _progress=None,
                             _resume=None, _next_epoch=0, _iter_lock=threading.Lock(), _epoch_owner=None)
        self.load_state_dict(position)

    def to(self, device: Any) -> "DataLoader":
        """Delivers later batches on `device` (None or "cpu": zero-copy host batches)."""
        object.__setattr__(self, "device", _parse_device(device))
        return self

    def __repr__(self) -> str:
        return (f"DataLoader(samples={self._num_rows}, batch_size={self.batch_size}, num_workers={self.num_workers}, "
                f"prefetch_factor={self.prefetch_factor}, pin_memory={self.pin_memory}, "
                f"persistent_workers={self.persistent_workers}, in_order={self.in_order}, device={self.device})")


class _DataLoaderIter(Iterator[Any]):
    """One epoch at a time over a C engine. Non-persistent iterators shut their engine down
    at the end of the epoch (or when dropped); persistent ones are reset for the next.

    Thread-safe: threads sharing one iterator take turns in `next()` (a lock), so each batch of
    the epoch goes to exactly one of them, whole, and the progress that `state_dict()` saves
    counts every batch once. Which thread gets which batch depends on scheduling.
    """

    def __init__(self, loader: DataLoader, engine: _Engine, persistent: bool) -> None:
        self.engine = engine
        self._persistent = persistent
        self._pipeline = loader._batch_pipeline()
        self._worker_side = loader.transform_in_workers and loader.num_workers > 0
        self._timeout = loader.timeout
        self._loader_ref = weakref.ref(loader)
        self._progress: _Progress | None = None
        self._finished = True
        self._device_stage: DeviceStage | None = None
        self._device_engine: _Engine | None = None
        self._lock = threading.Lock()  # next() and reset() one thread at a time

    def replace_engine(self, engine: _Engine) -> None:
        """Uses `engine` from now on (a batch_sampler's epoch needs bigger slots)."""
        self.engine.shutdown()
        self.engine = engine

    def reset(self, plan: _Plan, epoch: int, start: int, done: list[int]) -> _Progress:
        """Starts epoch `epoch` of `plan` at batch `start`, skipping the batches in `done`."""
        with self._lock:
            return self._reset(plan, epoch, start, done)

    def _reset(self, plan: _Plan, epoch: int, start: int, done: list[int]) -> _Progress:
        loader = self._loader_ref()
        if loader is not None:  # settings may have changed since the last epoch
            self._timeout = loader.timeout
            self._pipeline = loader._batch_pipeline()
            self._worker_side = loader.transform_in_workers and loader.num_workers > 0
        try:
            num_batches = self.engine.engine.start_epoch(plan.order, plan.batch_size, plan.drop_last,
                                                         plan.offsets, start, done)
        except RuntimeError:  # shut down at exit since __iter__ found it usable
            _park_daemon_thread_at_exit()
            raise
        self._progress = _Progress(epoch, num_batches, start, done)
        self._finished = False
        device = loader.device if loader is not None else None
        if device is None:
            self._device_stage = None
        elif (self._device_stage is None or self._device_stage.device != device
              or self._device_engine is not self.engine):
            self._device_stage = DeviceStage(device, self.engine.engine)
            self._device_engine = self.engine
        else:
            self._device_stage.reset()
        return self._progress

    def __iter__(self) -> "_DataLoaderIter":
        return self

    def __len__(self) -> int:
        return self._progress.num_batches if self._progress is not None else 0

    def _close(self) -> None:
        """Ends the epoch. Worker threads of a non-persistent loader stop here; without workers
        the loader keeps the engine's two slots for its next epoch (no threads to stop, and a
        fresh slot would start every epoch with page faults)."""
        self._finished = True
        if self._persistent:
            return
        loader = self._loader_ref()
        if self.engine.config[0] == 0 and loader is not None:
            loader._spare_engine = self.engine
        else:
            self.engine.shutdown()

    def _next_host(self) -> tuple[int, Any]:
        """(batch index, the batch after the hooks) from the engine."""
        if self._finished:
            raise StopIteration
        try:
            item = self.engine.engine.next(float(self._timeout))
        except BaseException as error:  # a timeout, Ctrl-C, a C failure: end the epoch at once
            _park_daemon_thread_at_exit()
            self._finished = True
            self.engine.stop()  # a worker stuck in a hook is detached, not joined, at shutdown
            if isinstance(error, TimeoutError):
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None
            raise
        if item is None:
            self._close()
            raise StopIteration
        batch, result = item
        if batch < 0 or isinstance(result, (WorkerError, BaseException)):
            self._close()
            raise_delivered_error(result)
        return batch, result if self._worker_side else self._pipeline(result)

    def __next__(self) -> Any:
        with self._lock:
            return self._next()

    def _next(self) -> Any:
        if self._device_stage is None:
            batch, result = self._next_host()
        else:
            batch, result = self._device_stage.next(self._next_host)
        assert self._progress is not None
        self._progress.mark(batch)  # counted when the caller gets it, not when prefetched
        return result
