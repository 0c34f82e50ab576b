"""Parameter: a named float32 array with an optional gradient, as optimizers see it.

Inside a model, `data` and the gradient storage are views into the model's parameter and
gradient arenas (one allocation each), and gradient validity is one flag of the model:
`zero_grad(set_to_none=True)` only clears that flag, so `.grad` reads None and the next
backward writes the gradients instead of accumulating, without touching their memory.
Standalone parameters (tests, user code) hold their own arrays.

A parameter of a model on a device (`model.to("sim")`, `"cuda"`) lives in device memory, which
NumPy cannot view. As with PyTorch's `p.detach().cpu().numpy()`, `.data` and `.grad` then read
as host copies, made read-only so that an in-place write (`p.data[...] = 0`) fails instead of
being silently lost; assign `p.data = array` to write the values into the device memory.
Optimizers and EMA built over such parameters run on the device (`p.device` says where).

A Parameter is one object wherever its module goes: when a container compiles a layer into
its arenas, the layer's Parameter objects are moved there (`_move_to_arena`), not replaced.
`Parameter.generation` changes whenever a parameter moves or its requires_grad changes, so an
optimizer re-checks what its C core points into only then.

A parameter of a model with requires_grad False is frozen once the model is next planned (a
TrainStep built or called, a memory plan made: Module._sync_frozen): it then has no gradient
storage at all (`.grad` reads None), and the model's gradient arena holds the trainable ones only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, ClassVar, Protocol

import numpy as np


class GradOwner(Protocol):
    """What a model offers its parameters: one validity flag for all gradients."""

    grads_valid: bool

    def zero_grads(self) -> None:
        """Write zeros into every gradient."""

    def values_written(self) -> None:
        """Told that parameter values were assigned (the half copy the GEMMs read is refreshed)."""


class DeviceSlot:
    """Where a parameter of a model on a device lives: entry `index` of its C model's
    parameter_layout(), `shape` at element `offset` of the parameter arena and `grad_offset` of the
    gradient arena (None: frozen, no gradient). One object per placement (a move or a change of
    the frozen parameters makes a new one), so optimizers compare them by identity."""

    __slots__ = ("compiled", "grad_offset", "index", "offset", "shape")

    def __init__(self, compiled: Any, index: int, offset: int, shape: tuple[int, ...],
                 grad_offset: int | None) -> None:
        self.compiled = compiled  # the module's _Compiled (its .model is the _C.Model)
        self.index = index
        self.offset = offset
        self.shape = shape
        self.grad_offset = grad_offset

    def read(self, flat: np.ndarray) -> np.ndarray:
        """This parameter's slice of a host copy of a flat arena, read-only."""
        array = flat[self.offset:self.offset + int(np.prod(self.shape))].reshape(self.shape)
        array.flags.writeable = False
        return array

    def read_grad(self, flat: np.ndarray) -> np.ndarray | None:
        """This parameter's slice of a host copy of the gradient arena, read-only; None when frozen."""
        if self.grad_offset is None:
            return None
        array = flat[self.grad_offset:self.grad_offset + int(np.prod(self.shape))].reshape(self.shape)
        array.flags.writeable = False
        return array


class Parameter:
    """A trainable float32 tensor; `.data` and `.grad` are NumPy arrays (or `.grad` is None)."""

    __slots__ = ("_data", "_device", "_grad_storage", "_grad_valid", "_owner", "_requires_grad", "name")

    generation: ClassVar[int] = 0  # a new value after every move or requires_grad change (any parameter)
    _generations: ClassVar[Iterator[int]] = itertools.count(1)  # unique values, atomic under threads

    def __init__(self, data: np.ndarray, name: str = "", requires_grad: bool = True) -> None:
        array = np.asarray(data)
        if array.dtype != np.float32:
            raise TypeError(f"data must be a float32 array, got dtype {array.dtype}")
        if not array.flags.c_contiguous:
            raise ValueError("data must be C-contiguous")
        self._data: np.ndarray | None = array  # None on a device (see _device)
        self._device: DeviceSlot | None = None  # set when the parameter lives in device memory
        self._grad_storage: np.ndarray | None = None
        self._grad_valid = False
        self._owner: GradOwner | None = None
        self.name = name
        self._requires_grad = bool(requires_grad)

    @classmethod
    def _in_arena(cls, data: np.ndarray, grad_storage: np.ndarray, name: str, owner: GradOwner) -> Parameter:
        """A parameter whose data and gradient live in a model's arenas."""
        parameter = cls(data, name=name)
        parameter._grad_storage = grad_storage
        parameter._owner = owner
        return parameter

    def _move_to_arena(self, data: np.ndarray, grad_storage: np.ndarray, name: str, owner: GradOwner) -> None:
        """Makes this parameter a view of another model's arenas (a container adopting its layer):
        the object stays the same, so optimizers and user code holding it follow it."""
        self._data = data
        self._device = None
        self._grad_storage = grad_storage
        self._grad_valid = False
        self._owner = owner
        self.name = name
        Parameter.generation = next(Parameter._generations)

    @classmethod
    def _in_device_arena(cls, slot: DeviceSlot, name: str) -> Parameter:
        """A parameter of a model on a device (its values and gradient in device memory)."""
        parameter = cls(np.zeros(0, np.float32), name=name)
        parameter._move_to_device(slot, name)
        return parameter

    def _move_to_device(self, slot: DeviceSlot, name: str) -> None:
        """Makes this parameter the one of a model on a device (the model moved there): the
        object stays the same, as with _move_to_arena."""
        self._data = None
        self._device = slot
        self._grad_storage = None
        self._grad_valid = False
        self._owner = slot.compiled
        self.name = name
        Parameter.generation = next(Parameter._generations)

    @property
    def device(self) -> str:
        """Where the values live: 'cpu', or the device of the model ('sim:0', 'cuda:0', ...)."""
        return "cpu" if self._device is None else self._device.compiled.model.device

    @property
    def requires_grad(self) -> bool:
        """False freezes the parameter: optimizers skip it (settable; requires_grad_() as in torch)."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self._requires_grad = bool(value)
        Parameter.generation = next(Parameter._generations)

    @property
    def data(self) -> np.ndarray:
        """The values; on a device a read-only host copy (see the module docstring)."""
        if self._device is not None:
            return self._device.read(self._device.compiled.model.read_parameters())
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        array = np.asarray(value, dtype=np.float32)
        if array.shape != self.shape:
            raise ValueError(f"data: expected shape {self.shape}, got {array.shape}")
        if self._device is None:
            self._data[...] = array
            if self._owner is not None:  # a bf16/f16 model's GEMMs read the half copy: refresh it
                self._owner.values_written()
            return
        model = self._device.compiled.model
        flat = model.read_parameters()
        flat[self._device.offset:self._device.offset + array.size] = array.reshape(-1)
        model.write_parameters(flat)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape as a tuple of ints (torch.Tensor.shape; `size()` gives the same)."""
        return self._device.shape if self._device is not None else self._data.shape

    @property
    def ndim(self) -> int:
        """The number of dimensions, as torch.Tensor.ndim (``p.ndim < 2`` picks biases and norms)."""
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        """The values' dtype: always float32 (fp32 master weights, whatever the compute precision)."""
        return np.dtype(np.float32)

    def dim(self) -> int:
        """The number of dimensions, as torch.Tensor.dim()."""
        return len(self.shape)

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        """The shape as a tuple, or with `dim` the size of that dimension (negative counts from
        the end), as torch.Tensor.size(); IndexError outside [-ndim, ndim - 1]."""
        shape = self.shape
        if dim is None:
            return tuple(shape)
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"size(): dim must be an int or None, not {type(dim).__name__}")
        if not -len(shape) <= dim < len(shape):
            raise IndexError(f"size(): dim {dim} is out of range for a parameter of {len(shape)} dimension(s) "
                             f"(expected to be in [{-len(shape)}, {len(shape) - 1}])")
        return int(shape[dim])

    def requires_grad_(self, requires_grad: bool = True) -> Parameter:
        """Set `requires_grad` in place and return this parameter, as torch.Tensor.requires_grad_()
        (``p.requires_grad_(False)`` freezes it: no gradient and no optimizer update)."""
        if not isinstance(requires_grad, (bool, np.bool_)):
            raise TypeError(f"requires_grad_(): requires_grad must be a bool, not {type(requires_grad).__name__}")
        self.requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> np.ndarray | None:
        """The gradient, or None; on a device a read-only host copy."""
        valid = self._owner.grads_valid if self._owner is not None else self._grad_valid
        if not valid:
            return None
        if self._device is not None:
            if self._device.grad_offset is None:  # frozen: no gradient (no copy of the arena made)
                return None
            return self._device.read_grad(self._device.compiled.model.read_gradients())
        return self._grad_storage

    @grad.setter
    def grad(self, value: np.ndarray | None) -> None:
        if value is None:
            if self._owner is not None:
                self._owner.grads_valid = False
            self._grad_valid = False
            return
        if self._device is not None:
            raise RuntimeError(f"grad: this parameter lives on '{self.device}', where the training step writes "
                               "its gradient; it can only be set to None")
        if self._owner is not None and self._grad_storage is None:
            raise RuntimeError(f"grad: parameter {self.name!r} is frozen (requires_grad=False): it has no gradient "
                               "storage; set requires_grad=True and run a step (or a memory plan) first")
        array = np.asarray(value)
        if array.shape != self._data.shape:
            raise ValueError(f"grad: expected shape {self._data.shape}, got {array.shape}")
        if array.dtype != np.float32:
            raise TypeError(f"grad must be a float32 array, got dtype {array.dtype}")
        if self._owner is None:
            self._grad_storage = np.ascontiguousarray(array)
            self._grad_valid = True
            return
        if not self._owner.grads_valid:  # the others read None: make them zeros, not stale values
            self._owner.zero_grads()
            self._owner.grads_valid = True
        if array is not self._grad_storage:
            self._grad_storage[...] = array

    def numel(self) -> int:
        """The number of elements, as torch.Tensor.numel()."""
        return int(np.prod(self.shape))

    # -- copy.deepcopy and pickle ---------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The values, gradient (None when not valid), name and requires_grad; not the model
        arenas it lives in (a copy is standalone until its copied module is rebuilt around it)."""
        data, grad = self.data, self.grad
        if self._device is not None:  # read-only host copies: writeable ones for the copy
            data, grad = np.array(data), None if grad is None else np.array(grad)
        return {"data": data, "grad": grad, "name": self.name, "requires_grad": self._requires_grad}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._data = np.ascontiguousarray(state["data"], dtype=np.float32)
        self._device = None
        grad = state["grad"]
        self._grad_storage = None if grad is None else np.ascontiguousarray(grad, dtype=np.float32)
        self._grad_valid = grad is not None
        self._owner = None
        self.name = state["name"]
        self._requires_grad = bool(state["requires_grad"])

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        state = "None" if self.grad is None else "set"
        where = "" if self._device is None else f", device={self.device!r}"
        return f"Parameter{label}(shape={self.shape}{where}, grad={state})"
