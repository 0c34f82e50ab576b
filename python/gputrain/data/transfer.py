"""Device batches: `DataLoader(..., device="cuda")` copies each gathered slot to device memory
with asynchronous copies on a copy stream (csrc/data/transfer.c), one batch ahead of the
consumer, and yields DeviceArray objects in the batch's structure.

A DeviceArray on cuda:N exposes DLPack (`__dlpack__`/`__dlpack_device__`, so that
`torch.from_dlpack(xb)` or `cupy.from_dlpack(xb)` read it where it is) and
`__cuda_array_interface__` (v3, naming the copy stream), `.numpy()` for a host copy, and `.wait()`.
Through DLPack the consumer's stream waits for the copy (an event, not a host wait), and once the
consumer drops the tensor, the batch's next use waits for the work the consumer queued on that
stream so far.

On the simulated device "sim:N" there is no DLPack device type or CUDA interface: DLPack uses the
extension type kDLExtDev (12) with device_id N and gputrain's own stream handles (1: the default
stream), and `__sim_array_interface__` replaces `__cuda_array_interface__` (same layout), so
TrainStep reads a sim array through the code that reads CUDA ones (csrc/py/external.c); other
libraries do not recognise either, as sim memory is not GPU memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from gputrain import _C


_DL_CUDA, _DL_EXT_DEV = 2, 12  # DLPack device types (dlpack.h: kDLCUDA, kDLExtDev)


class DeviceArray:
    """An array in device memory (cuda:N or sim:N), one field of a device batch (or a copied array).

    Its ``shape`` (a tuple), ``dtype`` (a NumPy dtype) and ``device`` ("cuda:N" or "sim:N") are
    attributes; it exports DLPack and ``__cuda_array_interface__`` (``__sim_array_interface__`` on
    sim)."""

    __slots__ = ("_owner", "_offset", "shape", "dtype", "device", "_stream")

    def __init__(self, owner: Any, offset: int, shape: tuple[int, ...], dtype: np.dtype, device: str,
                 stream: int) -> None:
        self._owner = owner
        self._offset = offset
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self._stream = stream

    @property
    def address(self) -> int:
        """Device address of the first element."""
        return self._owner.address + self._offset

    @property
    def nbytes(self) -> int:
        """Bytes of the array's elements (its shape's product times its dtype's itemsize)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def _interface(self, kind: str) -> dict[str, Any]:
        if not self.device.startswith(kind):
            raise AttributeError(f"a DeviceArray on {self.device} has no __{kind}_array_interface__")
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.address, False), "version": 3,
                "strides": None, "stream": self._stream or None}

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._interface("cuda")

    @property
    def __sim_array_interface__(self) -> dict[str, Any]:
        """The CUDA array interface's dict for an array on sim (gputrain's own inputs read it)."""
        return self._interface("sim")

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCUDA, N) on cuda:N; (kDLExtDev, N) on sim:N."""
        kind, _, index = self.device.partition(":")
        return (_DL_CUDA if kind == "cuda" else _DL_EXT_DEV), int(index or 0)

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule of this array (versioned when max_version >= (1, 0)). `stream`: the
        consumer's stream (None or 1: the default stream, 2: the per-thread one, -1: the consumer
        orders its work itself); it waits for the copy into the batch."""
        if copy:
            raise BufferError("a DeviceArray is exported without a copy (copy=True is not supported)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"a DeviceArray on {self.device} cannot be exported to DLPack device {dl_device}")
        if stream is None:
            stream = 1
        if isinstance(stream, bool) or not isinstance(stream, int):
            raise TypeError(f"stream must be an int or None, not {type(stream).__name__}")
        versioned = max_version is not None and max_version[0] >= 1
        return self._owner.dlpack(self._offset, tuple(self.shape), self.dtype, stream, versioned)

    def wait(self) -> None:
        """Blocks until the copy that filled this array is done."""
        self._owner.wait()

    def numpy(self) -> np.ndarray:
        """A host copy (waits for the device copy first)."""
        out = np.empty(self.shape, dtype=self.dtype)
        self._owner.copy_to(self._offset, out)
        return out

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DeviceArray(shape={self.shape}, dtype={self.dtype}, device={self.device!r})"


def _map_arrays(batch: Any, move: Callable[[np.ndarray], Any]) -> Any:
    """`batch` with every NumPy array replaced by move(array), in the same structure."""
    if isinstance(batch, np.ndarray):
        return move(batch)
    if isinstance(batch, Mapping):
        return type(batch)((k, _map_arrays(v, move)) for k, v in batch.items())
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_map_arrays(v, move) for v in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_arrays(v, move) for v in batch)
    return batch


class DeviceStage:
    """Moves the host batches of one engine to `device`, keeping one copy in flight."""

    def __init__(self, device: str, engine: _C.LoaderEngine) -> None:
        self.device = device
        self._transfer = _C.LoaderTransfer(engine, device)
        self._pending: Any = None

    def _move(self, batch: Any) -> Any:
        device_slots: dict[int, Any] = {}

        def move(array: np.ndarray) -> DeviceArray:
            base = array.base
            if isinstance(base, _C._LoaderSlot) and array.flags.c_contiguous:
                owner = device_slots.get(id(base))
                if owner is None:  # one queued copy per slot, shared by its fields
                    owner = device_slots[id(base)] = self._transfer.submit(base)
                offset = array.ctypes.data - base.address
            else:  # a hook built this array: copy it on its own
                owner, offset = self._transfer.copy(np.ascontiguousarray(array)), 0
            return DeviceArray(owner, offset, array.shape, array.dtype, self.device, self._transfer.stream)

        return _map_arrays(batch, move)

    def reset(self) -> None:
        """Drops the batch copied ahead (a new epoch starts)."""
        self._pending = None

    def next(self, next_host: Callable[[], tuple[int, Any]]) -> tuple[int, Any]:
        """(batch index, the batch on the device); the copy of the next one is queued before
        returning, so it overlaps with the caller's work on this one."""
        if self._pending is None:
            batch, host = next_host()
            self._pending = (batch, self._move(host))
        current = self._pending
        try:
            batch, host = next_host()
            self._pending = (batch, self._move(host))
        except StopIteration:
            self._pending = None
        return current
