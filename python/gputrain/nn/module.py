"""Module: the Python face of a layer. A module with parameters is compiled when it is
constructed (so, as in PyTorch, initial values follow the global seed sequence in construction
order); a container compiles its whole tree into one gputrain._C.Model (parameter, gradient and
activation arenas in C), keeps the values its children already had, and hands every submodule
its Parameters as views into its arenas. A submodule then belongs to that model; a model whose
layer was since put in another model refuses to run or save (that layer's parameters left it).

A Parameter is one object wherever its module goes (PyTorch's semantics): compiling a container
moves its children's existing Parameter objects into the new arenas instead of replacing them,
so an optimizer built from a layer before the layer was put in a container trains it there.
A module used more than once in a model (weight sharing, e.g. one block applied twice) is
one set of parameters: the C model lays them out once, every use reads them and
their gradients are summed; parameters()/named_parameters()/modules() list them once (under
the first name), while state_dict() has every name, as PyTorch's.

Buffers (BatchNorm2d's running statistics) are state that is not a parameter: the C model keeps
them in a buffer arena of their own (not optimised, no gradient), named_buffers() lists them
(NumPy views of the arena on the CPU, copies on a device) and state_dict()/load_state_dict()
carry them under PyTorch's names ('0.running_mean', ...). A module not in a compiled model (a
copy being unpickled) holds its buffers' values itself until its model is compiled.

A model moved to a device (`.to("cuda")` or `.to("sim")`) keeps its arenas in device memory, which NumPy
cannot view: its Parameters (the same objects, moved) read as host copies (see Parameter), and
optimizers and EMA built over them run on the device; its weights are read and written as
copies through state_dict()/load_state_dict()."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np

from gputrain import _C, random
from gputrain._cast import bfloat16, cast, is_bfloat16
from gputrain._state_checks import check_keys, check_mapping, float32_array
from gputrain._vocab import c_dtype, is_dtype, parse_device, parse_precision
from gputrain.nn.parameter import DeviceSlot, Parameter


def _layout_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a buffer_layout() entry: 'bfloat16' is ml_dtypes' bfloat16, or uint16 bit
    patterns without ml_dtypes (as gputrain.cast returns bf16)."""
    if name == "bfloat16":
        return bfloat16() or np.dtype(np.uint16)
    return np.dtype(name)


def _half_value(value: Any, name: str, like: np.ndarray) -> np.ndarray:
    """A checked copy of `value` for a half weight `like` (bfloat16, its uint16 bits, or float16):
    an array of its dtype as it is, else finite float values of its shape rounded to nearest even
    (ValueError for a value beyond float16's range)."""
    array = np.asarray(value)
    if array.dtype == like.dtype and array.shape == like.shape:
        return np.ascontiguousarray(array).copy()
    target = "f16" if like.dtype == np.float16 else "bf16"
    values = float32_array(value, name, shape=like.shape)
    half = cast(values, target).view(like.dtype)
    if target == "f16" and not np.isfinite(half).all():
        raise ValueError(f"{name}: a value of {np.abs(values).max():g} is beyond float16's range (a float16 weight)")
    return half


def _buffer_value(value: Any, name: str, like: np.ndarray) -> np.ndarray:
    """A checked copy of `value` for the buffer `like`: float32 statistics (finite; a variance
    >= 0) of its shape, an integer count >= 0, a quantized weight's uint8/int8 codes (that
    dtype and shape exactly), or a half weight's values (_half_value)."""
    if like.dtype in (np.uint16, np.float16) or is_bfloat16(like.dtype):
        return _half_value(value, name, like)
    if like.dtype in (np.uint8, np.int8):
        array = np.asarray(value)
        if array.dtype != like.dtype or array.shape != like.shape:
            raise ValueError(f"{name} must be {like.dtype} of shape {like.shape} (quantized codes), got "
                             f"{array.dtype} of shape {array.shape}")
        return np.ascontiguousarray(array)
    if like.dtype != np.int64:
        return float32_array(value, name, shape=like.shape, nonnegative=name.endswith("running_var']"))
    array = np.asarray(value)
    if array.dtype.kind not in "iu" or array.size != 1:
        raise TypeError(f"{name} must be one integer count, got {array.dtype} of shape {array.shape}")
    count = int(array.reshape(()))
    if not 0 <= count < 2**63:
        raise ValueError(f"{name} must be a count >= 0, got {count}")
    return np.array(count, dtype=np.int64)


_planning = threading.local()  # .depth > 0 inside planning() in this thread


def planning_active() -> bool:
    """True inside gputrain.memory_plan.planning() (in this thread): models compile for planning only."""
    return getattr(_planning, "depth", 0) > 0


@contextmanager
def planning() -> Iterator[None]:
    """Inside it (this thread), every module compiles into a C model built for planning only: its
    parameters, gradients and buffers are laid out but never allocated, so a model larger than this
    machine's memory can be built and planned (gputrain.memory_plan.plan_training gives the bytes a
    built model's plan gives). Such a model keeps no values: running it, reading or writing its
    parameters, or building an optimizer or EMA over it raises ValueError; build it again outside
    to train it."""
    _planning.depth = getattr(_planning, "depth", 0) + 1
    try:
        yield
    finally:
        _planning.depth -= 1


class _Compiled:
    """A compiled model and the flat views of its arenas; the gradient owner of its Parameters."""

    def __init__(self, spec: list[tuple], seed: int, device: str, precision: str = "f32",
                 plan_only: bool = False) -> None:
        self.model = _C.Model(spec, seed, device=device, precision=precision, plan_only=plan_only)
        self.device = device
        # False: arenas in device memory (or none, planning only), no NumPy views
        self.on_host = self.model.device == "cpu" and not plan_only
        self.params_flat, self.grads_flat = self.model.parameter_arrays() if self.on_host else (None, None)
        self.buffer_slots: list[tuple[Module, str]] = []  # (module, buffer name) in buffer_layout()'s order
        self.frozen: list[bool] | None = None  # what set_frozen was last given (None: nothing frozen yet)

    @property
    def grads_valid(self) -> bool:
        return self.model.grads_valid

    @grads_valid.setter
    def grads_valid(self, value: bool) -> None:
        self.model.grads_valid = bool(value)

    def zero_grads(self) -> None:
        self.model.zero_gradients()  # in C on any device; refused while a step in another thread runs

    def values_written(self) -> None:
        self.model.refresh_half_parameters()


class Module:
    """Base class of layers and containers, with PyTorch's model methods."""

    _param_names: tuple[str, ...] = ()
    _buffer_names: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._compiled: _Compiled | None = None
        self._params: dict[str, Parameter] = {}
        self._buffer_values: dict[str, np.ndarray] = {}  # values held while in no compiled model
        self._owner: Module | None = None  # the compiled container this module belongs to
        self._lost: tuple[Module, Module] | None = None  # (a layer of this root, the model that took it)
        self.training = True

    # -- structure, overridden by layers -------------------------------------------------
    def _spec(self) -> tuple:
        raise NotImplementedError(f"{type(self).__name__} has no C layer")

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, module) of each direct child, in order (a layer without children yields none)."""
        return iter(())

    def _spec_in(self, tied: dict[int, int]) -> tuple:
        """This module's C spec inside a model being compiled. `tied` numbers the modules with
        parameters met so far (pre-order, as C lays them out); a module met again becomes
        ("tied", k), another use of the k-th one's parameters."""
        if not self._param_names:
            return self._spec()
        if id(self) in tied:
            return ("tied", tied[id(self)])
        tied[id(self)] = len(tied)
        return self._spec()

    def _spec_list(self, tied: dict[int, int] | None = None) -> list[tuple]:
        """The root's layers as the C spec of the top-level Sequential."""
        return [self._spec_in({} if tied is None else tied)]

    # -- compilation ---------------------------------------------------------------------
    def _named_param_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str]]:
        """(module, local name, full name) of every parameter use, a shared module's at each use."""
        for name in self._param_names:
            if self._has_param(name):
                yield self, name, prefix + name
        for child_name, child in self.named_children():
            yield from child._named_param_slots(prefix + child_name + ".")

    def _unique_param_slots(self) -> Iterator[tuple[Module, str, str]]:
        """_named_param_slots with a shared module's parameters at their first use only: one
        entry per parameter, in the order of the C model's parameter_layout()."""
        seen: set[tuple[int, str]] = set()
        for module, local, full in self._named_param_slots():
            if (id(module), local) not in seen:
                seen.add((id(module), local))
                yield module, local, full

    def _has_param(self, name: str) -> bool:
        return True

    def _has_buffer(self, name: str) -> bool:
        return True

    def _named_buffer_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str]]:
        """(module, local name, full name) of every buffer use, a shared module's at each use."""
        for name in self._buffer_names:
            if self._has_buffer(name):
                yield self, name, prefix + name
        for child_name, child in self.named_children():
            yield from child._named_buffer_slots(prefix + child_name + ".")

    def _unique_buffer_slots(self) -> Iterator[tuple[Module, str, str]]:
        """_named_buffer_slots with a shared module's buffers once, in the order of the C model's
        buffer_layout()."""
        seen: set[tuple[int, str]] = set()
        for module, local, full in self._named_buffer_slots():
            if (id(module), local) not in seen:
                seen.add((id(module), local))
                yield module, local, full

    def _named_state_slots(self, prefix: str = "") -> Iterator[tuple[Module, str, str, bool]]:
        """(module, local, full, is_buffer) in PyTorch's state_dict order: a module's parameters,
        then its buffers, then its children's."""
        for name in self._param_names:
            if self._has_param(name):
                yield self, name, prefix + name, False
        for name in self._buffer_names:
            if self._has_buffer(name):
                yield self, name, prefix + name, True
        for child_name, child in self.named_children():
            yield from child._named_state_slots(prefix + child_name + ".")

    def _buffer_arrays(self) -> dict[tuple[int, str], np.ndarray]:
        """This compiled root's buffers by (id(module), name): views of the arena on the CPU,
        copies on a device. The modules are those it was compiled with (a layer swapped into its
        tree since, as get_peft_model does before compiling anew, is not in its arena)."""
        model = self._compiled.model
        flat = model.buffer_bytes() if self._compiled.on_host else model.read_buffers()
        arrays = {}
        slots = ((id(module), local) for module, local in self._compiled.buffer_slots)
        for key, (offset, shape, dtype) in zip(slots, model.buffer_layout()):
            dtype = _layout_dtype(dtype)
            size = int(np.prod(shape)) * dtype.itemsize
            arrays[key] = flat[offset:offset + size].view(dtype).reshape(shape)
        return arrays

    def _buffer_copies(self) -> dict[tuple[int, str], np.ndarray]:
        """Copies of the current values of this tree's buffers by (id(module), name), wherever
        they live (a compiled model's arena, or a module's own values)."""
        values: dict[tuple[int, str], np.ndarray] = {}
        roots: dict[int, dict[tuple[int, str], np.ndarray]] = {}
        for module, local, _ in self._unique_buffer_slots():
            root = module._owner or module
            if root._compiled is not None:
                if id(root) not in roots:
                    roots[id(root)] = root._buffer_arrays()
                values[(id(module), local)] = roots[id(root)][(id(module), local)].copy()
            elif local in module._buffer_values:
                values[(id(module), local)] = module._buffer_values[local].copy()
        return values

    def _on_device(self) -> bool:
        """True when this module's parameters live in device memory (its model is on CUDA)."""
        compiled = (self._owner or self)._compiled
        return compiled is not None and not compiled.on_host

    def _device_layout(self) -> dict[tuple[int, str], tuple[int, tuple[int, ...]]]:
        """(offset, shape) in the flat arena of every parameter slot of this root, by (id(module), name)."""
        slots = ((id(module), local) for module, local, _ in self._unique_param_slots())
        return dict(zip(slots, self._compiled.model.parameter_layout()))

    def _device_arrays(self) -> dict[tuple[int, str], np.ndarray]:
        """Host copies of a device root's parameters, by (id(module), name)."""
        flat = self._compiled.model.read_parameters()
        return {key: flat[offset:offset + int(np.prod(shape))].reshape(shape)
                for key, (offset, shape) in self._device_layout().items()}

    def _current_values(self) -> dict[str, np.ndarray]:
        """Copies of the current parameter values by full name, wherever they live."""
        values: dict[str, np.ndarray] = {}
        device_arrays: dict[int, dict[tuple[int, str], np.ndarray]] = {}
        for module, local, full in self._named_param_slots():
            if module._on_device():  # one copy of the arena, not one per parameter
                root = module._owner or module
                if id(root) not in device_arrays:
                    device_arrays[id(root)] = root._device_arrays()
                values[full] = device_arrays[id(root)][(id(module), local)]
            elif local in module._params:
                values[full] = module._params[local].data.copy()
        return values

    def _compile(self, device: str = "cpu", seed: int | None = None, precision: str = "f32") -> _Compiled:
        plan_only = planning_active()  # no values to keep: a model built for planning holds none
        previous = {} if plan_only else self._current_values()
        previous_buffers = {} if plan_only else self._buffer_copies()
        compiled = _Compiled(self._spec_list(), random.next_seed() if seed is None else seed, device, precision,
                             plan_only=plan_only)
        self._keep_buffers(compiled, previous_buffers)
        layout = compiled.model.parameter_layout()
        grad_layout = compiled.model.gradient_layout()
        slots = list(self._unique_param_slots())
        if len(slots) != len(layout):
            raise RuntimeError(f"internal: {len(slots)} parameter names for {len(layout)} parameters")
        # Everything that can fail happens before a module is touched: a failure leaves them as they were.
        if not plan_only:
            flat = compiled.params_flat if compiled.on_host else compiled.model.read_parameters()
            for (_, _, full), (offset, shape) in zip(slots, layout):
                if full in previous:  # keep values a submodule already had as a root of its own
                    flat[offset:offset + int(np.prod(shape))] = previous[full].reshape(-1)
            if compiled.on_host:
                compiled.model.refresh_half_parameters()
            else:
                compiled.model.write_parameters(flat)  # refreshes the half copy too
        for index, ((module, local, full), (offset, shape)) in enumerate(zip(slots, layout)):
            if not compiled.on_host:  # device memory: Parameters that read copies
                slot = DeviceSlot(compiled, index, offset, tuple(shape), grad_layout[index])
                if local in module._params:
                    module._params[local]._move_to_device(slot, full)
                else:
                    module._params[local] = Parameter._in_device_arena(slot, full)
                continue
            count = int(np.prod(shape))
            data = compiled.params_flat[offset:offset + count].reshape(shape)
            grad = compiled.grads_flat[offset:offset + count].reshape(shape)
            if local in module._params:  # the same object, now in this model's arenas
                module._params[local]._move_to_arena(data, grad, full, compiled)
            else:
                module._params[local] = Parameter._in_arena(data, grad, full, compiled)
        self._mark_losers()
        for module in self.modules():
            module._compiled = None
            module._owner = self
            module._buffer_values = {}
        self._owner = None
        self._lost = None
        compiled.buffer_slots = [(module, local) for module, local, _ in self._unique_buffer_slots()]
        self._compiled = compiled
        self._apply_training(self.training)
        return compiled

    def _sync_frozen(self) -> None:
        """Freezes in the compiled model (this root's) the parameters whose requires_grad is False and
        unfreezes the others: a frozen one gets no gradient storage and no weight-gradient work
        (the gradient arena holds the trainable ones only). Run when a TrainStep is built or called
        and by the memory plans; free unless some requires_grad changed. A parameter that a layer
        which cannot skip its gradient reads (Conv2d, BatchNorm2d) raises ValueError naming it,
        changing nothing."""
        if self._owner is not None:  # a layer of a compiled container: its root's model
            self._owner._sync_frozen()
            return
        compiled = self._compiled
        if compiled is None:
            return
        slots = list(self._unique_param_slots())
        frozen = [not module._params[local].requires_grad for module, local, _ in slots]
        if frozen == (compiled.frozen or [False] * len(slots)):
            return
        for (module, local, full), freeze, ok in zip(slots, frozen, compiled.model.freezable()):
            if freeze and not ok:
                raise ValueError(f"{full}: requires_grad=False, but a {type(module).__name__} layer cannot skip the "
                                 "gradient of its parameters; keep them trainable (requires_grad=True)")
        compiled.model.set_frozen(frozen)
        compiled.frozen = frozen
        self._point_gradients(compiled, slots)

    def _point_gradients(self, compiled: _Compiled, slots: list[tuple[Module, str, str]]) -> None:
        """Re-points every Parameter at its place in the (re-laid-out) gradient arena."""
        grad_layout = compiled.model.gradient_layout()
        layout = compiled.model.parameter_layout()
        if compiled.on_host:
            compiled.params_flat, compiled.grads_flat = compiled.model.parameter_arrays()
        for index, ((module, local, _), (offset, shape), grad_offset) in enumerate(zip(slots, layout, grad_layout)):
            param = module._params[local]
            if not compiled.on_host:
                param._device = DeviceSlot(compiled, index, offset, tuple(shape), grad_offset)
            elif grad_offset is None:
                param._grad_storage = None
            else:
                param._grad_storage = compiled.grads_flat[grad_offset:grad_offset + int(np.prod(shape))].reshape(shape)
        Parameter.generation = next(Parameter._generations)  # optimizers re-point their C cores

    def _keep_buffers(self, compiled: _Compiled, values: dict[tuple[int, str], np.ndarray]) -> None:
        """Writes the buffers the modules already had into the new model `compiled`."""
        if not values:
            return
        flat = compiled.model.read_buffers()
        slots = ((id(module), local) for module, local, _ in self._unique_buffer_slots())
        for key, (offset, shape, dtype) in zip(slots, compiled.model.buffer_layout()):
            if key in values:
                dtype = _layout_dtype(dtype)
                size = int(np.prod(shape)) * dtype.itemsize
                flat[offset:offset + size] = np.ascontiguousarray(values[key], dtype=dtype).reshape(-1).view(np.uint8)
        compiled.model.write_buffers(flat)

    def _mark_losers(self) -> None:
        """Marks every compiled model outside this one that is losing one of its layers to it: that
        layer's parameters move into this model, so the other one can no longer run or save it."""
        members = {id(module) for module in self.modules()}
        for module in self.modules():
            former = module._owner if module._owner is not None else module  # its compiled root, if any
            if former._compiled is not None and id(former) not in members:
                former._lost = (module, self)

    def _check_intact(self) -> None:
        """Raises when one of this model's layers was put in another model since it was compiled."""
        if self._lost is not None:
            layer, taker = self._lost
            raise RuntimeError(f"this {type(self).__name__} no longer holds all its parameters: its "
                               f"{type(layer).__name__} layer was put in another model ({type(taker).__name__}), "
                               "which now holds that layer's parameters (a layer belongs to one compiled "
                               "model at a time): use the other model, or build this one again")

    @property
    def compiled(self) -> _C.Model:
        """The C model behind this module (compiled on first use)."""
        if self._owner is not None:
            raise RuntimeError(f"this {type(self).__name__} belongs to a compiled "
                               f"{type(self._owner).__name__}: run or train that model instead")
        self._check_intact()
        return (self._compiled or self._compile()).model

    def __getattr__(self, name: str) -> Any:
        if name in type(self)._param_names:
            if name not in self.__dict__.get("_params", {}):
                self.compiled  # compiling creates the parameters
            params = self.__dict__["_params"]
            if name in params:
                return params[name]
            return None
        if name in type(self)._buffer_names and self._has_buffer(name):
            return dict(self.named_buffers())[name]
        if name in type(self)._buffer_names:
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # -- PyTorch-style API ---------------------------------------------------------------
    def modules(self) -> Iterator[Module]:
        """This module and every submodule, each once (a module used twice is listed once)."""
        for _, module in self._named_modules():
            yield module

    def named_parameters(self, remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(full name, Parameter) pairs; a shared module's parameters once, under their first
        name, unless remove_duplicate is False (then under every name, as state_dict())."""
        if self._compiled is None and self._owner is None:
            self._compile()
        self._check_intact()
        slots = self._unique_param_slots() if remove_duplicate else self._named_param_slots()
        for module, local, full in slots:
            yield full, module._params[local]

    def parameters(self) -> Iterator[Parameter]:
        """Every Parameter of this module and its submodules, each once (see named_parameters)."""
        for _, parameter in self.named_parameters():
            yield parameter

    def named_buffers(self, remove_duplicate: bool = True) -> Iterator[tuple[str, np.ndarray]]:
        """(full name, array) of every buffer (BatchNorm2d's running_mean, running_var,
        num_batches_tracked): views into the model's buffer arena on the CPU (writes go into the
        model), copies on a device; a shared module's once unless remove_duplicate is False."""
        if self._compiled is None and self._owner is None:
            self._compile()
        self._check_intact()
        root = self._owner or self
        arrays = root._buffer_arrays()
        slots = self._unique_buffer_slots() if remove_duplicate else self._named_buffer_slots()
        for module, local, full in slots:
            yield full, arrays[(id(module), local)]

    def buffers(self) -> Iterator[np.ndarray]:
        """Every buffer array (BatchNorm2d's running statistics), each once (see named_buffers)."""
        for _, buffer in self.named_buffers():
            yield buffer

    def num_parameters(self) -> int:
        """Elements in the module's parameters, a shared parameter counted once."""
        if self._on_device():
            return sum(module._own_param_count() for module in self.modules())
        return sum(p.numel() for p in self.parameters())

    def _own_param_count(self) -> int:
        """Elements of this module's own parameters (not its children's)."""
        if self._on_device():
            layout = (self._owner or self)._device_layout()
            return sum(int(np.prod(layout[(id(self), local)][1]))
                       for local in self._param_names if self._has_param(local))
        return sum(p.numel() for p in self._params.values())

    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        """Copies of the parameters under PyTorch's names ('0.weight', '0.bias', ...)."""
        if self._compiled is None and self._owner is None:
            self._compile()
        self._check_intact()
        root = self._owner or self
        params = root._device_arrays() if self._on_device() else None
        buffers = root._buffer_arrays()
        state: OrderedDict[str, np.ndarray] = OrderedDict()
        for module, local, full, is_buffer in self._named_state_slots():
            if is_buffer:
                state[full] = buffers[(id(module), local)].copy()
            elif params is not None:
                state[full] = params[(id(module), local)]
            else:
                state[full] = module._params[local].data.copy()
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Copy arrays (NumPy, or anything np.asarray accepts, e.g. CPU torch tensors) in.

        Every entry is checked before any is copied, so a bad one changes nothing: KeyError for
        missing/unexpected names (strict), TypeError for a non-numeric value, ValueError for a
        wrong shape or a NaN/infinite value (one beyond float32 included).
        """
        self._apply_staged(self._stage_state_dict(state_dict, strict))

    def _stage_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> tuple[Any, ...]:
        """load_state_dict's checks, changing nothing: the checked copies that _apply_staged
        (called next, with nothing changing the model in between) writes."""
        check_mapping(state_dict, "state_dict")
        # Module's state_dict: the arena's layout, whatever a subclass's state_dict shows
        own = (Module.state_dict(self) if self._on_device()
               else {n: p.data for n, p in self.named_parameters(remove_duplicate=False)})
        root = self._owner or self
        buffer_arrays = root._buffer_arrays()
        buffers = {full: buffer_arrays[(id(module), local)] for module, local, full in self._named_buffer_slots()}
        if strict:
            check_keys(state_dict, "state_dict", [*own, *buffers] if not self._on_device() else own)
        staged = {name: float32_array(value, f"state_dict[{name!r}]", shape=own[name].shape)
                  for name, value in state_dict.items() if name in own and name not in buffers}
        staged_buffers = {name: _buffer_value(value, f"state_dict[{name!r}]", buffers[name])
                          for name, value in state_dict.items() if name in buffers}
        return own, buffers, staged, staged_buffers

    def _apply_staged(self, staged_state: tuple[Any, ...]) -> None:
        """Writes what _stage_state_dict checked (nothing here can refuse)."""
        own, buffers, staged, staged_buffers = staged_state
        root = self._owner or self
        for name, array in staged.items():
            own[name][...] = array
        self._write_buffers(staged_buffers, buffers)
        if self._on_device():  # `own` holds host copies: write the whole arena back
            own = {name: value for name, value in own.items() if name not in buffers}
            layout = root._device_layout()
            flat = root._compiled.model.read_parameters()
            for module, local, full in self._named_param_slots():
                offset, shape = layout[(id(module), local)]
                flat[offset:offset + int(np.prod(shape))] = own[full].reshape(-1)
            root._compiled.model.write_parameters(flat)
        else:
            root.compiled.refresh_half_parameters()

    def _write_buffers(self, values: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> None:
        """Writes checked buffer values by full name into their arrays (views of the arena on the
        CPU; on a device, host copies written back as a whole)."""
        if not values:
            return
        for name, value in values.items():
            arrays[name][...] = value
        root = self._owner or self
        if root._compiled.on_host:
            return
        flat = root._compiled.model.read_buffers()
        slots = ((id(module), local) for module, local, _ in root._unique_buffer_slots())
        full_of = {(id(module), local): full for module, local, full in self._named_buffer_slots()}
        for key, (offset, shape, dtype) in zip(slots, root._compiled.model.buffer_layout()):
            if full_of.get(key) in values:
                flat[offset:offset + arrays[full_of[key]].nbytes] = arrays[full_of[key]].reshape(-1).view(np.uint8)
        root._compiled.model.write_buffers(flat)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients: mark them None (no memory touched) or write zeros."""
        self.compiled  # noqa: B018 - compiles, or refuses for a submodule
        compiled = self._compiled
        if set_to_none:
            compiled.grads_valid = False
        else:
            compiled.zero_grads()
            compiled.grads_valid = True

    def _apply_training(self, mode: bool) -> None:
        if self._compiled is not None:  # first: it refuses while a step in another thread runs
            self._compiled.model.training = mode
        for module in self.modules():
            module.training = mode

    def train(self, mode: bool = True) -> Module:
        """Set training mode (dropout active, BatchNorm2d on batch statistics) on this module and every
        submodule, as torch.nn.Module.train; returns self. TypeError for a mode that is not a bool."""
        if not isinstance(mode, bool):
            raise TypeError("mode must be a bool")
        self._apply_training(mode)
        return self

    def eval(self) -> Module:
        """Evaluation mode: train(False); returns self."""
        return self.train(False)

    def to(self, device: Any = None, dtype: Any = None, non_blocking: bool = False) -> Module:
        """Move the model to `device` ('cpu', 'cuda[:N]', 'sim[:N]' or a torch.device), keeping its
        parameter values; torch.nn.Module.to's signature (``to(dtype)`` alone too).

        non_blocking: accepted as in PyTorch, where it is a permission, not a promise: gputrain
        rebuilds the model's arenas on the new device, and the move is complete when this returns.
        dtype: parameters stay float32 master weights whatever the compute precision, so only a
        float32 dtype (a no-op) is accepted; train in half precision with
        ``TrainStep(precision="bf16")`` or ``TrainingArguments(bf16=True)`` instead.
        """
        if dtype is None and is_dtype(device):  # model.to(torch.float32), as torch takes it
            device, dtype = None, device
        if not isinstance(non_blocking, bool):
            raise TypeError(f"non_blocking must be a bool, not {type(non_blocking).__name__}")
        if dtype is not None and parse_precision(dtype, "dtype") != "fp32":
            raise ValueError(f"dtype={dtype!r}: gputrain keeps parameters as float32 master weights; train in "
                             "half precision with TrainStep(precision='bf16'/'fp16') or TrainingArguments(bf16=True)")
        if device is None:
            return self
        device = parse_device(device)
        current = parse_device(self._compiled.device) if self._compiled is not None else None
        if device == current:
            return self
        old = self._compiled.model if self._compiled is not None else None
        if old is None:
            self._compile(device)
            return self
        # A move keeps the values, the dropout stream (seed, step) and the step settings; the new
        # model is built in its precision at once, so a failure (e.g. out of memory) changes nothing.
        new = self._compile(device, seed=old.seed, precision=old.precision).model
        new.step, new.checkpointing = old.step, old.checkpointing
        return self

    # -- copy.deepcopy and pickle -----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The attributes, with the parameters as standalone copies (see Parameter) and, for a
        compiled root, what rebuilds its C model: device, dropout seed and step, precision,
        checkpointing and whether the gradients are valid. A submodule copied on its own becomes
        a model of its own (compiled at first use, as a new layer is)."""
        (self._owner or self)._check_intact()
        state = {**self.__dict__, "_owner": None, "_lost": None, "_compiled": None}
        if self._buffer_names:  # host copies of this module's buffers, written into its next model
            copies = self._buffer_copies()
            state["_buffer_values"] = {local: copies[(id(self), local)] for local in self._buffer_names
                                       if (id(self), local) in copies}
        compiled = self._compiled
        if compiled is not None:
            model = compiled.model
            state["_c_model"] = {"device": compiled.device, "seed": model.seed, "step": model.step,
                                 "precision": model.precision, "checkpointing": model.checkpointing,
                                 "grads_valid": model.grads_valid and compiled.on_host}
        return state

    def __copy__(self) -> Module:
        """A shallow copy shares everything, as PyTorch's: the submodules, the Parameters and the
        C model (rebuilding it, as a deep copy does, would take the original's Parameters)."""
        clone = type(self).__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __setstate__(self, state: dict[str, Any]) -> None:
        c_model = state.pop("_c_model", None)
        self.__dict__.update(state)
        if c_model is None:
            return
        # The submodules are complete (copy and pickle build an object's state before it), so
        # the root compiles them back into one C model around the copied Parameter objects.
        slots = list(self._unique_param_slots())
        grads = [module._params[local]._grad_storage for module, local, _ in slots] if c_model["grads_valid"] else []
        compiled = self._compile(c_model["device"], seed=c_model["seed"], precision=c_model["precision"])
        compiled.model.step = c_model["step"]
        compiled.model.checkpointing = c_model["checkpointing"]
        if grads:
            for (module, local, _), grad in zip(slots, grads):
                module._params[local]._grad_storage[...] = grad
            compiled.grads_valid = True

    def __call__(self, x: np.ndarray, attention_mask: Any = None, token_type_ids: Any = None,
                 position_ids: Any = None) -> np.ndarray:
        """Forward pass (dropout follows train()/eval()); returns a new float32 array. With
        attention_mask, token_type_ids and/or position_ids, x is input_ids (batch, seq) of a model
        whose first layer is a TokenEmbedding reading them (gputrain.nn.sequence); a decoder's
        (position_ids=True) also takes (batch, seq) input_ids alone: mask ones, positions 0..seq-1."""
        from gputrain.nn.sequence import needs_packing, pack_for
        if attention_mask is not None or token_type_ids is not None or position_ids is not None or \
                needs_packing(self, x):
            x = pack_for(self, x, attention_mask, token_type_ids, position_ids)
        return self.compiled.forward(x)

    def summary(self, input_shape: tuple[int, ...] | None = None, *, precision: Any = None,
                checkpointing: bool | None = None) -> str:
        """A table of layers and parameter counts; with `input_shape`, the exact memory plan of
        every region for that (micro-)batch shape in `precision` ('fp32', 'bf16', 'fp16' or an alias
        such as 'f16' or np.float16; default: the model's)."""
        from gputrain.memory import format_bytes

        compiled = self.compiled
        rows = [f"{'layer':<28} {'type':<12} {'parameters':>12} {'bytes':>12}"]
        for name, module in self._named_modules():
            count = module._own_param_count()
            rows.append(f"{name or '(root)':<28} {type(module).__name__:<12} {count:>12,} {format_bytes(4 * count):>12}")
        total = compiled.num_parameters
        rows.append(f"{'total':<28} {'':<12} {total:>12,} {format_bytes(4 * total):>12}")
        if input_shape is not None:
            precision = parse_precision(compiled.precision if precision is None else precision)
            plan = compiled.plan(tuple(input_shape), precision=c_dtype(precision),
                                 checkpointing=compiled.checkpointing if checkpointing is None else checkpointing)
            rows.append("")
            rows.append(f"memory plan for input {tuple(input_shape)} in {precision}:")
            rows.extend(f"  {key:<18} {format_bytes(value):>12} ({value:,} bytes)" for key, value in plan.items())
        return "\n".join(rows)

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """(name, module) for this module ("" or `prefix`) and every submodule, each once under
        its first name, parents before children (PyTorch's order): the names adapters target."""
        return self._named_modules(prefix)

    def get_submodule(self, target: str) -> Module:
        """The submodule at the dotted path `target` ("" is this module), as PyTorch's;
        AttributeError naming the first part that is not there."""
        if not isinstance(target, str):
            raise TypeError(f"target must be a str, not {type(target).__name__}")
        if target == "":
            return self
        module: Module = self
        path = ""
        for part in target.split("."):
            children = dict(module.named_children())
            # a list of children is named "layers.0": take the next part with it
            key = f"{path}.{part}" if path else part
            if key in children:
                module, path = children[key], ""
            elif any(name.startswith(key + ".") for name in children):
                path = key
            else:
                where = f"'{target}'" if module is self else f"'{target}' ({type(module).__name__} has none)"
                raise AttributeError(f"{type(self).__name__} has no submodule {part!r} in {where}")
        if path:
            raise AttributeError(f"{type(self).__name__}: '{target}' names a list of modules, not a module")
        return module

    def _named_modules(self, prefix: str = "", seen: set[int] | None = None) -> Iterator[tuple[str, Module]]:
        """(name, module) for this module and its submodules, each once under its first name."""
        seen = set() if seen is None else seen
        if id(self) in seen:
            return
        seen.add(id(self))
        yield prefix, self
        for name, child in self.named_children():
            yield from child._named_modules(f"{prefix}.{name}" if prefix else name, seen)

    def extra_repr(self) -> str:
        """The arguments shown in this module's repr() line (a layer's hyper-parameters); '' by default."""
        return ""

    def __repr__(self) -> str:
        children = list(self.named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}("]
        for name, child in children:
            lines.extend(f"  ({name}): " + line if i == 0 else "  " + line
                         for i, line in enumerate(repr(child).splitlines()))
        lines.append(")")
        return "\n".join(lines)
