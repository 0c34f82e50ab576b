"""A DLPack producer written with ctypes, for tests: any device, dtype, strides or version, and
counts of how its tensor was freed (by the consumer's deleter call or by the capsule's destructor
when no consumer took it)."""

from __future__ import annotations

import ctypes
from typing import Any

c = ctypes


class DLDevice(c.Structure):
    _fields_ = [("device_type", c.c_int32), ("device_id", c.c_int32)]


class DLDataType(c.Structure):
    _fields_ = [("code", c.c_uint8), ("bits", c.c_uint8), ("lanes", c.c_uint16)]


class DLTensor(c.Structure):
    _fields_ = [("data", c.c_void_p), ("device", DLDevice), ("ndim", c.c_int32), ("dtype", DLDataType),
                ("shape", c.POINTER(c.c_int64)), ("strides", c.POINTER(c.c_int64)), ("byte_offset", c.c_uint64)]


DELETER = c.CFUNCTYPE(None, c.c_void_p)
DESTRUCTOR = c.CFUNCTYPE(None, c.c_void_p)


class DLManagedTensor(c.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c.c_void_p), ("deleter", DELETER)]


class DLPackVersion(c.Structure):
    _fields_ = [("major", c.c_uint32), ("minor", c.c_uint32)]


class DLManagedTensorVersioned(c.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c.c_void_p), ("deleter", DELETER),
                ("flags", c.c_uint64), ("dl_tensor", DLTensor)]


_new = c.pythonapi.PyCapsule_New
_new.restype, _new.argtypes = c.py_object, [c.c_void_p, c.c_char_p, DESTRUCTOR]
_name = c.pythonapi.PyCapsule_GetName
_name.restype, _name.argtypes = c.c_char_p, [c.c_void_p]
_NAMES = {False: c.create_string_buffer(b"dltensor"), True: c.create_string_buffer(b"dltensor_versioned")}

F32, I64, F64, BF16 = (2, 32, 1), (0, 64, 1), (2, 64, 1), (4, 16, 1)
CPU, EXT_DEV = 1, 12


def capsule_name(capsule: Any) -> str:
    return _name(id(capsule)).decode()


class Producer:
    """Exports `shape` elements at `address` on `device`; `deleted` counts deleter calls."""

    def __init__(self, address: int, shape: tuple[int, ...], device: tuple[int, int] = (CPU, 0),
                 dtype: tuple[int, int, int] = F32, strides: tuple[int, ...] | None = None,
                 version: tuple[int, int] | None = (1, 0), tensor_device: tuple[int, int] | None = None,
                 keep: Any = None) -> None:
        self.address, self.shape, self.device, self.dtype = address, shape, device, dtype
        self.strides, self.version, self.keep = strides, version, keep
        self.tensor_device = tensor_device or device
        self.deleted = 0           # deleter calls
        self.unused_destroyed = 0  # capsules destroyed without a consumer (their destructor freed them)
        self.streams: list[Any] = []  # the stream argument of every __dlpack__ call
        self._alive: list[Any] = []   # ctypes objects the capsules point into
        self._deleter = DELETER(self._delete)
        self._destructor = DESTRUCTOR(self._destroy)

    def _delete(self, _managed: int) -> None:
        self.deleted += 1

    def _destroy(self, capsule: int) -> None:
        if _name(capsule) in (b"dltensor", b"dltensor_versioned"):
            self.unused_destroyed += 1
            self._delete(0)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, stream: Any = None, max_version: tuple[int, int] | None = None) -> Any:
        self.streams.append(stream)
        shape = (c.c_int64 * len(self.shape))(*self.shape)
        strides = (c.c_int64 * len(self.strides))(*self.strides) if self.strides is not None else None
        tensor = DLTensor(self.address, DLDevice(*self.tensor_device), len(self.shape), DLDataType(*self.dtype),
                          shape, strides, 0)
        versioned = self.version is not None and max_version is not None
        if versioned:
            managed = DLManagedTensorVersioned(DLPackVersion(*self.version), None, self._deleter, 0, tensor)
        else:
            managed = DLManagedTensor(tensor, None, self._deleter)
        self._alive += [shape, strides, managed]
        return _new(c.addressof(managed), _NAMES[versioned], self._destructor)
