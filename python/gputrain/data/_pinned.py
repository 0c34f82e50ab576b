"""pin_memory=True for Dataset objects: each batch's arrays copied into a slot of pinned host
memory (gputrain._C.Buffer on the "pinned" pool, accounted there like the array path's slots),
as PyTorch's pin-memory step copies each batch into page-locked tensors.

A slot is one Buffer holding all the arrays of one batch, each on a 64-byte boundary. The arrays
of a delivered batch view the slot through a PinnedLease (their base, as a _LoaderSlot is on the
array path); the slot is reused once every view is gone, so a batch the caller keeps is never
overwritten, and a slot too small for a batch is replaced by a bigger one.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from gputrain import _C
from gputrain.data._shm import _aligned, _arrays, _grown, _map


class PinnedLease:
    """The base object of every array of one pinned batch; its death frees the slot."""

    __slots__ = ("__array_interface__", "buffer", "__weakref__")

    def __init__(self, buffer: _C.Buffer) -> None:
        self.buffer = buffer  # keeps the memory alive while any array views it
        self.__array_interface__ = {"shape": (buffer.nbytes,), "typestr": "|u1",
                                    "data": (buffer.address, False), "version": 3}

    @property
    def pinned(self) -> bool:
        """True when the slot's memory is page-locked (False when no accelerator is found)."""
        return bool(self.buffer.pinned)


class PinnedRing:
    """The pinned slots of one DatasetIter: free ones are reused, more are made as needed."""

    def __init__(self) -> None:
        self._free: list[_C.Buffer] = []
        self._lock = threading.Lock()  # finalizers run wherever the last view of a batch dies

    def _take(self, need: int) -> _C.Buffer:
        with self._lock:
            for i, buffer in enumerate(self._free):
                if buffer.nbytes >= need:
                    return self._free.pop(i)
            if self._free:  # a free slot too small for this batch: replaced, not kept beside it
                self._free.pop(0)
        return _C.Buffer(_grown(need), device="pinned")

    def _give_back(self, buffer: _C.Buffer) -> None:
        with self._lock:
            self._free.append(buffer)

    def pin(self, batch: Any) -> Any:
        """`batch` with each NumPy array (not of Python objects) replaced by a copy in a pinned slot."""
        arrays = _arrays(batch)
        if not arrays:
            return batch
        buffer = self._take(sum(_aligned(a.nbytes) for a in arrays))
        lease = PinnedLease(buffer)
        base = np.asarray(lease)
        cursor = [0]

        def copy(array: np.ndarray) -> np.ndarray:
            out = base[cursor[0]:cursor[0] + array.nbytes].view(array.dtype).reshape(array.shape)
            cursor[0] += _aligned(array.nbytes)
            np.copyto(out, array)
            return out

        pinned = _map(batch, copy)
        weakref.finalize(lease, self._give_back, buffer).atexit = False
        return pinned


__all__ = ["PinnedLease", "PinnedRing"]
