"""Shared-memory slots between worker processes and the main process.

A worker writes a batch's arrays into a slot (a multiprocessing.shared_memory segment) and sends
a skeleton: the batch structure with each array replaced by a Ref (offset, shape, dtype), a few
hundred bytes whatever the batch size. The main process turns the skeleton back into NumPy
arrays that view the slot (no copy). A slot is reused only once every view of its last batch is
gone (a finalizer on the Lease object that all the views share as their base), so a batch the
caller keeps is never overwritten. A batch that does not fit its slot makes the worker create a
bigger segment, which the main process adopts in place of the old one.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from gputrain.data._sigint import sigint_held
from gputrain.data.collate import build_batch, spec_arrays

if TYPE_CHECKING:
    from multiprocessing import shared_memory

ALIGN = 64  # bytes; every array in a slot starts on this boundary


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _grown(need: int) -> int:
    """A new segment's size: room for batches a quarter bigger, in whole pages."""
    return max(-(-(need + need // 4) // 4096) * 4096, 4096)


class Ref:
    """An array inside a slot, in a batch skeleton."""

    __slots__ = ("offset", "shape", "dtype")

    def __init__(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.offset = offset
        self.shape = shape
        self.dtype = dtype

    def __getstate__(self) -> tuple[int, tuple[int, ...], np.dtype]:
        return self.offset, self.shape, self.dtype

    def __setstate__(self, state: tuple[int, tuple[int, ...], np.dtype]) -> None:
        self.offset, self.shape, self.dtype = state


def _is_shared(array: Any) -> bool:
    return isinstance(array, np.ndarray) and not array.dtype.hasobject


def _map(batch: Any, leaf: Any) -> Any:
    """`batch` with each shareable array replaced by leaf(array), containers rebuilt."""
    if _is_shared(batch):
        return leaf(batch)
    if isinstance(batch, Mapping):
        items = [(k, _map(v, leaf)) for k, v in batch.items()]
        try:
            return type(batch)(items)
        except TypeError:
            return dict(items)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_map(v, leaf) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map(v, leaf) for v in batch)
    return batch


def _arrays(batch: Any) -> list[np.ndarray]:
    found: list[np.ndarray] = []
    _map(batch, found.append)
    return found


# Segments whose close() was refused because an array of a failed batch (a SIGTERM or an error
# inside the fill) still views them: held until the process ends, so that the array and the
# segment are never collected in the wrong order while the failure unwinds (SharedMemory.__del__
# would retry close() and print "Exception ignored ... BufferError: cannot close exported pointers
# exist" into the shared stderr).
_VIEWED: list[Any] = []


def _segment(name: str, create: bool = False, size: int = 0) -> shared_memory.SharedMemory:
    """A shared-memory segment (multiprocessing is imported here, when workers run, not by
    `import gputrain`)."""
    from multiprocessing import shared_memory

    return shared_memory.SharedMemory(name, create=create, size=size)


def segment_prefix(main_pid: int) -> str:
    """The start of the names of the segments made for the loaders of process `main_pid`."""
    return f"gtld{main_pid}_"


class SlotWriter:
    """The worker side: the segments of the slots it was asked to fill, by slot id. Segments it
    creates are named gtld<main pid>_<worker pid>_<n> (short enough for macOS's 31 bytes), so
    that they can be told apart in /dev/shm."""

    def __init__(self, main_pid: int) -> None:
        self._prefix = f"{segment_prefix(main_pid)}{os.getpid()}_"
        self._created = 0  # segments created so far (the <n> of the next name)
        self._segments: dict[int, shared_memory.SharedMemory] = {}
        self._unsent: set[str] = set()  # segments created here whose names the main process has not got

    def _segment(self, slot: int, name: str | None, capacity: int, need: int) -> tuple[Any, str | None, int]:
        """(segment, name of a segment created here or None, its capacity) for `need` bytes."""
        held = self._segments.get(slot)
        if need > capacity or name is None:
            if held is not None:
                self._drop(slot)
            created = self._create(_grown(need))
            self._segments[slot] = created
            self._unsent.add(created.name)
            return created, created.name, created.size
        if held is None or held.name != name:
            if held is not None:
                self._drop(slot)
            held = self._segments[slot] = _segment(name)
        return held, None, capacity

    def _create(self, size: int) -> shared_memory.SharedMemory:
        while True:
            self._created += 1
            try:
                return _segment(f"{self._prefix}{self._created}", create=True, size=size)
            except FileExistsError:  # left by an earlier process with the same pids: skip it
                continue

    def _drop(self, slot: int) -> None:
        segment = self._segments.pop(slot)
        try:
            segment.close()
        except BufferError:  # an array of a failed batch still views it: unmapped at exit
            _VIEWED.append(segment)

    def write(self, slot: int, name: str | None, capacity: int, form: str, value: Any) -> tuple[Any, str | None, int]:
        """Writes a batch (a plan_batch spec, or a built batch object) into the slot; returns
        (skeleton, name of a new segment or None, capacity)."""
        if form == "spec":
            sizes = spec_arrays(value)
        else:
            sizes = [(a.shape, a.dtype) for a in _arrays(value)]
        need = sum(_aligned(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize) for shape, dtype in sizes)
        segment, created, capacity = self._segment(slot, name, capacity, max(need, 1))
        try:
            return self._fill(segment, form, value), created, capacity
        except BaseException:  # the batch fails: a segment made for it is never announced
            if created is not None:
                self._drop(slot)
                self._unsent.discard(created)
                segment.unlink()
            raise

    @staticmethod
    def _fill(segment: shared_memory.SharedMemory, form: str, value: Any) -> Any:
        """Writes the batch's arrays into `segment`; returns the skeleton."""
        cursor = [0]
        refs: dict[int, Ref] = {}

        def place(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
            offset = cursor[0]
            out = np.ndarray(shape, dtype=dtype, buffer=segment.buf, offset=offset)
            cursor[0] += _aligned(out.nbytes)
            refs[id(out)] = Ref(offset, tuple(shape), dtype)
            return out

        if form == "spec":
            batch = build_batch(value, place)
            skeleton = _map(batch, lambda a: refs[id(a)])
        else:
            def copy(array: np.ndarray) -> Ref:
                out = place(array.shape, array.dtype)
                out[...] = array
                return refs[id(out)]

            skeleton = _map(value, copy)
        return skeleton

    def sent(self) -> None:
        """The main process got the last result, with the name of any segment created for it."""
        self._unsent.clear()

    def close(self) -> None:
        """Unmaps the segments; unlinks those the main process never heard of (the worker is
        stopped between creating one and sending its name)."""
        for slot in list(self._segments):
            segment = self._segments[slot]
            self._drop(slot)
            if segment.name in self._unsent:
                segment.unlink()


class Lease:
    """The base object of every array of one delivered batch; its death frees the slot."""

    __slots__ = ("__array_interface__", "__weakref__")

    def __init__(self, address: int, nbytes: int) -> None:
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3}


class Slot:
    """A slot in the main process: its segment and whether a batch of it is in use."""

    __slots__ = ("id", "segment", "capacity", "address", "busy", "leases", "retired")

    def __init__(self, slot_id: int) -> None:
        self.id = slot_id
        self.segment: shared_memory.SharedMemory | None = None  # None until a worker fills it
        self.capacity = 0  # bytes of the segment
        self.address = 0  # where the segment is mapped in this process
        self.busy = False  # a worker fills it, or its batch waits for delivery
        self.leases = 0  # delivered batches whose arrays are still alive (0 or 1)
        self.retired = False  # unlinked; unmapped when the last lease goes

    @property
    def name(self) -> str | None:
        return self.segment.name if self.segment is not None else None


class SlotRing:
    """The main process's slots: handed to workers when free, adopted when a worker grew one,
    turned into arrays on delivery, freed when the arrays die, unlinked at close."""

    def __init__(self) -> None:
        self._slots: list[Slot] = []
        self._lock = threading.RLock()  # finalizers run wherever the last view dies (a GC pass under it too)

    def acquire(self) -> Slot:
        """A free slot (a new one when every slot is in use), marked busy."""
        with self._lock:
            for slot in self._slots:
                if not slot.busy and slot.leases == 0:
                    slot.busy = True
                    return slot
            slot = Slot(len(self._slots))
            slot.busy = True
            self._slots.append(slot)
            return slot

    def release_unfilled(self, slot: Slot) -> None:
        """Frees a slot whose batch will not be delivered."""
        slot.busy = False

    def adopt(self, slot: Slot, name: str, capacity: int) -> None:
        """Takes the segment a worker created for `slot` in place of the old one."""
        self._retire(slot)
        segment = _segment(name)
        try:
            view = np.frombuffer(segment.buf, np.uint8)
            try:  # a C-level getter: no Python frame (a Ctrl-C's traceback) may hold the view
                slot.address = view.__array_interface__["data"][0]
            finally:
                del view  # no export may outlive this function (close() would fail)
        except BaseException:
            try:
                segment.close()
            except BufferError:  # the interrupted frame still views it: kept, never an error of its own
                _VIEWED.append(segment)
            raise
        slot.segment, slot.capacity, slot.retired = segment, capacity, False

    def _retire(self, slot: Slot) -> None:
        segment = slot.segment
        if segment is None or slot.retired:
            return
        slot.retired = True
        try:
            with sigint_held():  # shm_unlink, then the resource tracker's unregister: both or neither
                segment.unlink()
        except FileNotFoundError:
            pass
        if slot.leases == 0:
            segment.close()
            slot.segment = None

    def deliver(self, slot: Slot, skeleton: Any) -> Any:
        """The batch of a filled slot as arrays viewing it; the slot stays taken while they live."""
        if slot.segment is None:  # a batch without arrays: nothing to view
            slot.busy = False
            return skeleton
        lease = Lease(slot.address, slot.capacity)
        base = np.asarray(lease)
        with self._lock:
            slot.leases += 1
            slot.busy = False
        weakref.finalize(lease, self._release, slot).atexit = False
        return _map_refs(skeleton, base)

    def _release(self, slot: Slot) -> None:
        with self._lock:
            slot.leases -= 1
            if slot.leases == 0 and slot.retired and slot.segment is not None:
                slot.segment.close()
                slot.segment = None

    def close(self) -> None:
        """Unlinks every segment; those with live batches are unmapped when the batches die."""
        with self._lock:
            for slot in self._slots:
                self._retire(slot)


def _map_refs(skeleton: Any, base: np.ndarray) -> Any:
    if isinstance(skeleton, Ref):
        nbytes = int(np.prod(skeleton.shape, dtype=np.int64)) * skeleton.dtype.itemsize
        return base[skeleton.offset:skeleton.offset + nbytes].view(skeleton.dtype).reshape(skeleton.shape)
    if isinstance(skeleton, Mapping):
        items = [(k, _map_refs(v, base)) for k, v in skeleton.items()]
        try:
            return type(skeleton)(items)
        except TypeError:
            return dict(items)
    if isinstance(skeleton, tuple) and hasattr(skeleton, "_fields"):
        return type(skeleton)(*(_map_refs(v, base) for v in skeleton))
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_map_refs(v, base) for v in skeleton)
    return skeleton
