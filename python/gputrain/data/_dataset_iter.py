"""Iteration over Dataset objects: batches fetched in the calling thread (num_workers=0) or by
worker processes into shared-memory slots (gputrain.data._procs), delivered in batch order.

Map-style: batch b's indices come from the loader's sampler exactly as on the array path, and
batch b goes to worker b % num_workers (counting the batches this run fetches), so the batches
and their order do not depend on num_workers or prefetch_factor. Iterable: tasks go round-robin
to the workers that are not exhausted, and batches come back in task order, as in PyTorch.
With pin_memory=True each batch is copied on delivery into a pinned slot (gputrain.data._pinned).
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from gputrain.data._errors import WorkerError
from gputrain.data._fetch import Fetcher
from gputrain.data._pinned import PinnedRing

if TYPE_CHECKING:  # _procs (multiprocessing) is imported when a pool starts, not by `import gputrain`
    from gputrain.data._procs import WorkerPool

UNKNOWN_BATCHES = sys.maxsize  # an iterable dataset's batches per epoch, until it ends


class _Failed(Exception):
    """Carries a worker's error out of the fetching code; `fatal`: the worker is gone."""

    def __init__(self, error: WorkerError, fatal: bool) -> None:
        super().__init__(error.text)
        self.error = error
        self.fatal = fatal


class EpochBatches:
    """The batches of one map-style epoch: batch b is rows[offsets[b]:offsets[b + 1]]."""

    def __init__(self, rows: np.ndarray, offsets: np.ndarray) -> None:
        self.rows = rows
        self.offsets = offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def indices(self, batch: int) -> np.ndarray:
        return self.rows[self.offsets[batch]:self.offsets[batch + 1]]


class DatasetIter(Iterator[Any]):
    """One epoch at a time over a Dataset object (see the module docstring)."""

    def __init__(self, loader: Any, persistent: bool) -> None:
        self._loader_ref = weakref.ref(loader)
        self._persistent = persistent
        self._config = loader._dataset_config()
        auto_collation = loader.batch_sampler is not None or loader.batch_size is not None
        self._fetcher = Fetcher(loader.dataset, loader._kind, loader.batch_size, loader.drop_last, auto_collation,
                                loader.collate_fn, loader.transform)
        self.pool: WorkerPool | None = None
        if loader.num_workers > 0:
            from gputrain.data._procs import WorkerPool

            self.pool = WorkerPool(self._fetcher, loader.num_workers, loader._order_seed(), loader.worker_init_fn,
                                   loader.multiprocessing_context)
            weakref.finalize(self, self.pool.shutdown)
        self._num_workers = loader.num_workers
        self._in_flight = loader.num_workers * (loader.prefetch_factor or 0)
        self._timeout = loader.timeout
        self._in_order = loader.in_order
        self._lock = threading.Lock()  # next() and reset() one thread at a time
        self._generation = 0
        self._outstanding = 0  # tasks sent and not answered, all generations
        self._finished = True
        self._progress: Any = None
        self._pinned: PinnedRing | None = None  # pin_memory=True: the slots batches are copied into
        self._unpinned: tuple[int, Any] | None = None  # a batch whose pinning failed, delivered next

    @property
    def config(self) -> tuple[Any, ...]:
        return self._config

    def reset(self, batches: EpochBatches | None, progress: Any, skip: int) -> None:
        """Starts an epoch: map-style `batches` from progress.low on (without progress.above);
        an iterable dataset from its start, dropping its first `skip` batches (a resume)."""
        with self._lock:
            loader = self._loader_ref()
            if loader is not None:
                self._timeout = loader.timeout
                self._pinned = (self._pinned or PinnedRing()) if loader.pin_memory else None
            self._generation += 1
            self._unpinned = None
            self._batches = batches
            self._progress = progress
            self._skip = skip
            if batches is not None:  # the batches still to fetch, in order
                self._order: range | list[int] = range(progress.low, len(batches))
                if progress.above:
                    self._order = [b for b in self._order if b not in progress.above]
            self._sent = 0  # tasks of this epoch sent (map: positions in _order; iterable: seq)
            self._delivered = 0  # next position / seq to deliver
            self._arrived: dict[int, tuple[Any, ...]] = {}
            self._exhausted: set[int] = set()
            self._seq_worker: dict[int, int] = {}  # iterable: the worker each task went to
            self._count = 0  # iterable: batches delivered this epoch
            self._turn = 0  # iterable: the worker whose turn is next
            self._finished = False
            if self.pool is None and batches is None:
                self._fetcher.restart()

    def __iter__(self) -> "DatasetIter":
        return self

    def __len__(self) -> int:
        """len(loader), as PyTorch's iterators (a TypeError for an iterable dataset without len)."""
        loader = self._loader_ref()
        return len(loader) if loader is not None else 0

    def __next__(self) -> Any:
        with self._lock:
            while True:
                batch, value = self._unpinned or self._next()
                self._unpinned = None
                if self._batches is None and self._skip > 0:  # an iterable's resume replays
                    self._skip -= 1
                    continue
                if self._pinned is not None:
                    self._unpinned = (batch, value)  # kept for the next call if pinning fails
                    value = self._pinned.pin(value)
                    self._unpinned = None
                self._progress.mark(batch)
                return value

    def _next(self) -> tuple[int, Any]:
        if self._finished:
            raise StopIteration
        try:
            return self._next_inline() if self.pool is None else self._next_pooled()
        except StopIteration:
            self._end_epoch()
            raise
        except _Failed as caught:  # raised in a worker: re-raised below, outside this handler
            failed = caught
        except BaseException:  # Ctrl-C, a dead worker, a timeout: the workers go
            self._finished = True
            self.shutdown(after_error=True)
            raise
        if failed.fatal:  # worker_init_fn failed: the workers are gone
            self._finished = True
            self.shutdown(after_error=True)
        else:  # the dataset or collate_fn raised: the epoch ends, persistent workers live on
            self._end_epoch()
        failed.error.reraise()

    def _end_epoch(self) -> None:
        self._finished = True
        if self._batches is None and self._progress is not None:
            self._progress.num_batches = self._progress.low
        if not self._persistent:
            self.shutdown()

    def shutdown(self, after_error: bool = False) -> None:
        """Stops the workers, waiting less for them to exit after an error (a timeout, Ctrl-C)."""
        if self.pool is not None:
            from gputrain.data import _procs  # imported already: it made the pool

            self.pool.shutdown(_procs._ERROR_JOIN_S if after_error else _procs._JOIN_S)

    @property
    def closed(self) -> bool:
        return self.pool is not None and self.pool.closed

    # ---- num_workers=0 ---------------------------------------------------------------------

    def _next_inline(self) -> tuple[int, Any]:
        if self._batches is None:
            more, value = self._fetcher.batch(None)
            if not more:
                raise StopIteration
            self._delivered += 1
            return self._delivered - 1, value
        if self._delivered >= len(self._order):
            raise StopIteration
        batch = self._order[self._delivered]
        _, value = self._fetcher.batch(self._batches.indices(batch))
        self._delivered += 1
        return batch, value

    # ---- worker processes --------------------------------------------------------------------

    def _dispatch(self) -> None:
        pool = self.pool
        assert pool is not None
        while self._outstanding < self._in_flight:
            if self._batches is not None:
                if self._sent >= len(self._order):
                    return
                worker, indices = self._sent % self._num_workers, self._batches.indices(self._order[self._sent])
            else:
                worker, indices = self._next_worker(), None
                if worker < 0:
                    return
                self._seq_worker[self._sent] = worker
            pool.submit(worker, self._generation, self._sent, pool.ring.acquire(), indices)
            self._sent += 1
            self._outstanding += 1

    def _next_worker(self) -> int:
        """The next worker in turn that is not exhausted (PyTorch's cycle), or -1."""
        for _ in range(self._num_workers):
            worker = self._turn % self._num_workers
            self._turn += 1
            if worker not in self._exhausted:
                return worker
        return -1

    def _accept(self, message: tuple[Any, ...]) -> None:
        kind, generation, seq, slot_id, payload, created, capacity = message
        if kind == "init_error":
            raise _Failed(payload, fatal=True)
        assert self.pool is not None
        self._outstanding -= 1
        slot = self.pool.slot(slot_id)
        if created is not None:
            self.pool.ring.adopt(slot, created, capacity)
        if generation != self._generation:  # answered after its epoch ended: dropped
            self.pool.ring.release_unfilled(slot)
            return
        self._arrived[seq] = message

    def _take(self) -> tuple[int, Any] | None:
        """The next deliverable batch among those arrived, or None."""
        if self._in_order or self._batches is None:
            seq = self._delivered if self._delivered in self._arrived else None
        else:
            seq = next(iter(self._arrived), None)
        if seq is None:
            return None
        kind, _, _, slot_id, payload, _, _ = self._arrived.pop(seq)
        assert self.pool is not None
        slot = self.pool.slot(slot_id)
        self._delivered += 1
        worker = self._seq_worker.pop(seq, -1)
        if kind == "error":
            self.pool.ring.release_unfilled(slot)
            raise _Failed(payload, fatal=False)
        if kind == "end":
            self.pool.ring.release_unfilled(slot)
            self._exhausted.add(worker)
            return -1, None
        if self._batches is not None:
            return self._order[seq], self.pool.ring.deliver(slot, payload)
        self._count += 1
        return self._count - 1, self.pool.ring.deliver(slot, payload)

    def _epoch_done(self) -> bool:
        if self._batches is not None:
            return self._delivered >= len(self._order)
        return len(self._exhausted) == self._num_workers and self._delivered >= self._sent

    def _next_pooled(self) -> tuple[int, Any]:
        assert self.pool is not None
        while True:
            self._dispatch()
            taken = self._take()
            if taken is not None:
                if taken[0] < 0:  # an iterable worker ran out
                    continue
                return taken
            if self._epoch_done():
                raise StopIteration
            for message in self._receive():
                self._accept(message)

    def _receive(self) -> list[tuple[Any, ...]]:
        """The next results; a RuntimeError after `timeout` seconds without any."""
        assert self.pool is not None
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:  # a pipe may close just before its dead worker's sentinel fires: wait again
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            messages = self.pool.receive(left)
            if messages:
                return messages
