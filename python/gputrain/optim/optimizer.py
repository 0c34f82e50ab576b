"""Optimizer: PyTorch's optimizer interface over the fused C optimizer (gputrain._C.Optimizer).

Parameters are packed in group order into one flat state space owned by C; `step()` is one
pass over parameters, gradients and state (parameters that are adjacent in memory, as a
model's are, merge into one run). Hyperparameters live in `param_groups` (plain dicts, so
schedulers and GradScaler work as with PyTorch) and are pushed into C before every step.

The C optimizer points into the parameters' arrays. A Parameter whose module was since compiled
into a container has moved into the container's arena; before the next step the optimizer
re-points C at it, keeping its state, so an optimizer built from a layer before the layer was
put in a model trains it there.

Parameters of a model on a device (`model.to("sim")`, `"cuda"`) have their values, gradients and
optimizer state in device memory: the C optimizer is then a _C.ModelOptimizer over that model's
arenas (one model, one device per optimizer), with the same groups and the same flat state
space, so the updates are the CPU's bit for bit; `cpu_offload_fraction` keeps the state of
the last part in pinned host memory, updated by CPU threads while the device updates the rest.

Clipping can be fused: `optimizer.clip_grad_norm_(max_norm)` returns the total norm and makes
the next `step()` multiply each gradient element by the clip coefficient as it is read,
without rewriting the gradients (`gputrain.optim.clip_grad_norm_` rewrites them, as PyTorch's).
"""

from __future__ import annotations

import math
import numbers
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from gputrain import _C
from gputrain._deferred import DeferredSteps
from gputrain._state_checks import check_keys, check_mapping, float32_array, integer, real
from gputrain.nn.parameter import Parameter
from gputrain.optim._torch_interop import (FLAG_DEFAULTS, check_flags, host_value, split_group,
                                           to_torch_state_dict)
from gputrain.optim.clip import clip_coefficient, total_norm
from gputrain.optim.zero import Shard, check_zero_stage

if TYPE_CHECKING:
    from gputrain.nn.module import Module

__all__ = ["Optimizer"]

NUMERICS = ("exact", "fast")

# Saved state arrays that must be >= 0 (second moments: their square root is taken).
_NONNEGATIVE_STATE = ("exp_avg_sq", "max_exp_avg_sq")


def _state_index(key: Any) -> int:
    """A key of state_dict['state'] as a parameter index (an int, or its decimal string)."""
    if isinstance(key, str) and key.isdigit():
        return int(key)
    return integer(key, "state_dict['state'] keys", 0)


def _check_number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, not {type(value).__name__}")
    return float(value)


def _check_flags(group: dict[str, Any], names: tuple[str, ...]) -> None:
    """TypeError unless every flag of the group is a bool (KeyError when one is missing)."""
    for name in names:
        if not isinstance(group[name], (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool, not {type(group[name]).__name__}")


def check_offload_fraction(fraction: Any) -> float:
    """cpu_offload_fraction as a float in [0, 1] (ValueError naming it otherwise)."""
    value = _check_number(fraction, "cpu_offload_fraction")
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"Invalid cpu_offload_fraction: {fraction} (must be in [0, 1])")
    return value


class Optimizer(DeferredSteps):
    """Base class of the fused optimizers (PyTorch's torch.optim.Optimizer interface)."""

    _deferred_resolver: Callable[[], None] | None = None  # TrainStep(sync=False) with a scaler: resolves its steps

    _kind: ClassVar[str] = ""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any], *, numerics: str = "exact",
                 cpu_offload_fraction: float = 0.0, offload_chunk_numel: int = 0, zero_stage: int = 0,
                 torch_flags: dict[str, Any] | None = None) -> None:
        if isinstance(params, (Parameter, np.ndarray)):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Parameters or dicts, but got {type(params).__name__}")
        if isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but "
                            "the ordering of tensors in sets will change between runs. Please use a list instead.")
        if numerics not in NUMERICS:
            raise ValueError(f"numerics must be 'exact' or 'fast', got {numerics!r}")
        # torch's implementation flags (fused, foreach, capturable, differentiable): see _torch_interop
        self._torch_flags = check_flags(self._kind, torch_flags or {})
        self.defaults = dict(defaults)
        self.numerics = numerics
        self.cpu_offload_fraction = check_offload_fraction(cpu_offload_fraction)
        if isinstance(offload_chunk_numel, bool) or not isinstance(offload_chunk_numel, int) \
                or not 0 <= offload_chunk_numel <= sys.maxsize:
            raise ValueError(f"offload_chunk_numel must be an int in [0, {sys.maxsize}], got {offload_chunk_numel!r}")
        self.offload_chunk_numel = offload_chunk_numel
        self.zero_stage = check_zero_stage(zero_stage)
        self.param_groups: list[dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self._add_group(group)
        self._pending_coef = 1.0
        self._skip_next = False
        self.last_step_skipped = False
        self._steps_before = 0  # steps taken by the cores that _rebuild_core replaced
        self._generation = Parameter.generation  # read before _views: a later move changes it
        self._shard = self._make_shard()
        self._views = self._param_views()  # the arrays the C optimizer points into
        self._core = self._build_core(self._views)

    def _make_shard(self) -> Shard | None:
        """ZeRO-1's shard of this rank (gputrain.optim.zero), or None: zero_stage=0 or one process."""
        from gputrain import distributed

        if self.zero_stage == 0 or distributed.communicator() is None:
            return None
        return Shard(self._params(), distributed.communicator())

    def _refuse_sharded(self, what: str) -> None:
        if self._shard is not None:
            raise RuntimeError(f"{what}: with zero_stage=1 each rank holds a shard of the state; the update runs "
                               "inside gputrain.TrainStep (reduce-scatter, shard update, all-gather)")

    # -- hooks for subclasses -------------------------------------------------------------
    @staticmethod
    def _check_hyperparameters(group: dict[str, Any]) -> None:
        """Raise ValueError (PyTorch's messages) for invalid hyperparameters of a group."""
        raise NotImplementedError

    def _state_names(self) -> tuple[str, ...]:
        """The state_dict names of the per-parameter state arrays."""
        raise NotImplementedError

    @classmethod
    def for_model(cls, model: Module, **hyperparameters: Any) -> Optimizer:
        """`cls(model.parameters(), **hyperparameters)`: kept for scripts written when a model
        on a device had no Parameters."""
        from gputrain.nn.module import Module

        if not isinstance(model, Module):
            raise TypeError(f"model must be a gputrain.nn.Module, not {type(model).__name__}")
        return cls(model.parameters(), **hyperparameters)

    # -- groups -----------------------------------------------------------------------------
    def _add_group(self, group: dict[str, Any]) -> None:
        if not isinstance(group, dict):
            raise TypeError(f"param_groups must be dicts, got {type(group).__name__}")
        params = group["params"] if "params" in group else None
        if params is None:
            raise ValueError("a parameter group needs a 'params' entry")
        if isinstance(params, Parameter):
            params = [params]
        elif isinstance(params, (set, frozenset)):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but "
                            "the ordering of tensors in sets will change between runs. Please use a list instead.")
        else:
            params = list(params)
        for p in params:
            if not isinstance(p, Parameter):
                raise TypeError(f"optimizer can only optimize Parameters, but one of the params is {type(p).__name__}")
        new_group = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}, "params": params}
        self._check_hyperparameters(new_group)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params) or any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(new_group)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (PyTorch's semantics); the state of the existing parameters is kept."""
        self._refuse_sharded("add_param_group")
        self._add_group(param_group)
        try:  # the C core checks what the Python side does not (hyperparameters, a running step)
            self._rebuild_core()
        except BaseException:
            self.param_groups.pop()
            raise

    def _params(self) -> list[Parameter]:
        return [p for group in self.param_groups for p in group["params"]]

    @staticmethod
    def _hparams(group: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in group.items() if k != "params"}

    def _param_views(self) -> list[tuple[Any, Any]]:
        """What the C optimizer points into: each parameter's data and its gradient in a model
        (None for a standalone parameter or one that does not require grad); for a parameter
        on a device, its DeviceSlot and requires_grad. With zero_stage=1: this rank's slices."""
        if self._shard is not None:
            return self._shard.views(self._params())
        return [(p._device, p.requires_grad) if p._device is not None else
                (p.data, p._grad_storage if p._owner is not None and p.requires_grad else None)
                for p in self._params()]

    def _device_model(self) -> Any:
        """The _Compiled model on a device whose parameters this optimizer updates, or None when
        they are host arrays; ValueError naming params when they mix devices or models."""
        params = self._params()
        if any(p._device is not None and p._device.compiled.model.plan_only for p in params):
            raise ValueError("params: parameters of a model built for planning only (gputrain.memory_plan.planning()) "
                             "have no values to optimize; build the model outside planning to train it")
        devices = sorted({p.device for p in params})
        if len(devices) > 1:
            raise ValueError(f"params: the parameters of one optimizer must be on one device, found {devices}")
        if devices[0] == "cpu":
            return None
        owners = {id(p._owner): p._owner for p in params}
        if len(owners) > 1:
            raise ValueError(f"params: parameters of {len(owners)} models on '{devices[0]}'; an optimizer of "
                             "parameters on a device updates one model's")
        return next(iter(owners.values()))

    @property
    def _on_device(self) -> bool:
        return isinstance(self._core, _C.ModelOptimizer)

    def _build_core(self, views: list[tuple[Any, Any]]) -> Any:
        group_of = [g for g, group in enumerate(self.param_groups) for _ in group["params"]]
        compiled = self._device_model()
        zero = {"zero_size": self._shard.size, "zero_rank": self._shard.rank} if self._shard is not None else {}
        if compiled is not None:
            return _C.ModelOptimizer(self._kind, compiled.model, [slot.index for slot, _ in views], group_of,
                                     [self._hparams(g) for g in self.param_groups],
                                     [trainable for _, trainable in views], numerics=self.numerics,
                                     cpu_offload_fraction=self.cpu_offload_fraction,
                                     offload_chunk_numel=self.offload_chunk_numel, **zero, **self._core_kwargs())
        return _C.Optimizer(self._kind, [data for data, _ in views], group_of,
                            [self._hparams(g) for g in self.param_groups],
                            grads=[grad for _, grad in views], numerics=self.numerics,
                            cpu_offload_fraction=self.cpu_offload_fraction,
                            offload_chunk_numel=self.offload_chunk_numel, **zero, **self._core_kwargs())

    def _core_kwargs(self) -> dict[str, Any]:
        """Arguments of the C optimizer particular to a subclass (AdamW8bit: min_8bit_size)."""
        return {}

    def _rebuild_core(self) -> None:
        """A new C optimizer over the current parameter arrays, keeping every parameter's state
        (the parameters already known keep their index) and the step count."""
        saved = [self._core.get_state(i) for i in range(len(self._views))]
        steps = self.step_count
        views = self._param_views()
        core = self._build_core(views)
        for index, state in enumerate(saved):
            core.set_state(index, state.pop("step"), state)
        self._core, self._views, self._steps_before = core, views, steps

    def _follow_params(self) -> None:
        """Re-points C at parameters that moved since it was built (their module was compiled into
        a container) or whose requires_grad changed; free unless some Parameter did."""
        generation = Parameter.generation
        if generation == self._generation:
            return
        if self._shard is not None:
            self._shard.check_unmoved(self._params())
            self._generation = generation
            return
        current = self._param_views()
        if any(data is not old_data or grad is not old_grad
               for (data, grad), (old_data, old_grad) in zip(current, self._views)):
            self._rebuild_core()
        self._generation = generation

    def push_hyperparameters(self) -> None:
        """Copy every group's hyperparameters (e.g. an lr set by a scheduler) into C, after
        re-pointing it at parameters that moved (run before every step, TrainStep's included)."""
        self._follow_params()
        for index, group in enumerate(self.param_groups):
            self._check_hyperparameters(group)
            self._core.set_hparams(index, self._hparams(group))

    # -- the step ---------------------------------------------------------------------------
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        skip_if_nonfinite: bool = False) -> float:
        """Total norm of the gradients; the next step() scales them by min(1, max_norm/(norm+1e-6)).

        The gradients are not rewritten: the coefficient is applied as the fused update reads
        them. With a non-finite norm, error_if_nonfinite raises (PyTorch's behaviour) and
        skip_if_nonfinite makes the next step() a no-op (`last_step_skipped` tells).
        """
        max_norm = _check_number(max_norm, "max_norm")
        self._refuse_sharded("clip_grad_norm_")
        self._follow_params()
        if float(norm_type) == 2.0 and self._on_device:
            norm = self._core.grad_norm()
        elif float(norm_type) == 2.0:
            norm = self._core.grad_norm([p.grad for p in self._params()])
        else:
            norm = total_norm([g for g in (p.grad for p in self._params()) if g is not None], norm_type)
        if not math.isfinite(norm):
            if error_if_nonfinite:
                raise RuntimeError(f"The total norm of order {float(norm_type)} for gradients from `parameters` "
                                   "is non-finite, so it cannot be clipped. To disable this error and scale the "
                                   "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
            self._skip_next = skip_if_nonfinite
        self._pending_coef = clip_coefficient(max_norm, norm)
        return norm

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One fused update of every parameter that has a gradient; returns closure() if given."""
        self._refuse_sharded("step")
        loss = closure() if closure is not None else None
        coef, skip = self._pending_coef, self._skip_next
        self._pending_coef, self._skip_next = 1.0, False
        self.last_step_skipped = skip
        if skip:
            return loss
        self.push_hyperparameters()
        if self._on_device:
            self._core.step(grad_coef=coef)
        else:
            self._core.step([p.grad for p in self._params()], grad_coef=coef)
        return loss

    @property
    def step_count(self) -> int:
        """Steps that updated at least one parameter (skipped steps do not count)."""
        return self._steps_before + self._core.num_steps

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (None, no memory touched) or zero them in place."""
        self._pending_coef, self._skip_next = 1.0, False
        for p in self._params():
            if set_to_none:
                p.grad = None
            elif p._device is not None:  # the model's gradients, in device memory
                if p._owner.grads_valid:
                    p._owner.zero_grads()
            elif p.grad is not None:
                p.grad[...] = 0.0

    # -- state --------------------------------------------------------------------------------
    def _has_state(self, state: dict[str, Any]) -> bool:
        return state["step"] > 0

    def _raw_states(self) -> list[dict[str, Any]]:
        """Every parameter's whole state as the C optimizer keeps it (gathered from every rank's
        shard with zero_stage=1: a collective, every rank calls it)."""
        if self._shard is not None:
            return self._shard.gather(self._core, [p.numel() for p in self._params()])
        return [self._core.get_state(i) for i in range(len(self._params()))]

    def _export_state(self, raw: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any] | None:
        if not self._has_state(raw):
            return None
        out: dict[str, Any] = {}
        for name in self._state_names():
            if name == "step":
                out["step"] = np.array(float(raw["step"]), dtype=np.float32)
            elif name in raw:
                out[name] = raw[name].reshape(shape)
        return out

    @property
    def state(self) -> defaultdict[Parameter, dict[str, Any]]:
        """Per-parameter state (copies), keyed by Parameter, as torch's optimizer.state: a
        defaultdict(dict), so a parameter without state yet reads as {}."""
        result: defaultdict[Parameter, dict[str, Any]] = defaultdict(dict)
        for raw, p in zip(self._raw_states(), self._params()):
            exported = self._export_state(raw, p.shape)
            if exported is not None:
                result[p] = exported
        return result

    def state_dict(self, format: str = "gputrain") -> dict[str, Any]:
        """PyTorch's layout: {'state': {index: {...}}, 'param_groups': [{..., 'params': [indices]}]}.
        With zero_stage=1 the whole state, gathered on every rank (every rank calls it). Resolves
        the TrainStep(sync=False) steps in flight first (their step counts and schedule).

        format="gputrain": NumPy arrays (a float32 0-d array for ``step``) and gputrain's group
        keys. format="torch": what ``torch.optim.AdamW/SGD.load_state_dict`` takes: torch tensors
        (torch is imported by this call only; NumPy arrays when torch is not installed) and
        torch's implementation flags (fused, foreach, ...) in every group.
        """
        if format not in ("gputrain", "torch"):
            raise ValueError(f"format must be 'gputrain' or 'torch', got {format!r}")
        self._resolve_deferred()
        state = {}
        for index, (raw, p) in enumerate(zip(self._raw_states(), self._params())):
            exported = self._export_state(raw, p.shape)
            if exported is not None:
                state[index] = exported
        groups, start = [], 0
        for group in self.param_groups:
            count = len(group["params"])
            groups.append({**self._hparams(group), "params": list(range(start, start + count))})
            start += count
        if format == "torch":
            return to_torch_state_dict(self._kind, {"state": state, "param_groups": groups},
                                       getattr(self, "_torch_flags", FLAG_DEFAULTS.get(self._kind, {})))
        return {"state": state, "param_groups": groups}

    def _state_keys(self, group: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(required, optional) keys of one parameter's saved state in a group with these
        hyperparameters (PyTorch's names)."""
        raise NotImplementedError

    def _prepare_state(self, index: int, p: Parameter, saved: Any,
                       group: dict[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """A saved per-parameter state as (step, flat float32 arrays), checked against p and its group."""
        name = f"state_dict['state'][{index}]"
        check_mapping(saved, name)
        required, optional = self._state_keys(group)
        check_keys(saved, name, required, optional)
        step = 0
        if saved.get("step") is not None:  # torch's is a 0-d tensor
            value = real(host_value(saved["step"]), f"{name}['step']", 0.0, 2.0**53)
            if not value.is_integer():
                raise ValueError(f"{name}['step'] must be a whole number of steps, got {value}")
            step = int(value)
        arrays = {}
        for key, value in saved.items():
            if key == "step":
                continue
            if value is None:
                if key in required:
                    raise TypeError(f"{name}[{key!r}] must be an array, not None")
                continue
            arrays[key] = float32_array(host_value(value), f"{name}[{key!r}]", shape=p.shape,
                                        nonnegative=key in _NONNEGATIVE_STATE).reshape(-1)
        return self._imported_step(step, arrays), arrays

    def _imported_step(self, step: int, arrays: dict[str, np.ndarray]) -> int:
        return step

    def _saved_groups(self, state_dict: Any) -> tuple[list[dict[str, Any]], dict[int, int]]:
        """The checked param_groups of a state_dict (hyperparameters with our Parameters) and
        the position in self._params() of every saved parameter index."""
        check_mapping(state_dict, "state_dict")
        check_keys(state_dict, "state_dict", ("state", "param_groups"))
        groups = state_dict["param_groups"]
        if not isinstance(groups, (list, tuple)):
            raise TypeError(f"state_dict['param_groups'] must be a list, not {type(groups).__name__}")
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        position = {id(p): i for i, p in enumerate(self._params())}
        index_of: dict[int, int] = {}
        new_groups = []
        for g, (saved, own) in enumerate(zip(groups, self.param_groups)):
            name = f"state_dict['param_groups'][{g}]"
            check_mapping(saved, name)
            if "params" not in saved:
                raise KeyError(f"{name}: missing key 'params'")
            indices = saved["params"]
            if not isinstance(indices, (list, tuple)):
                raise TypeError(f"{name}['params'] must be a list of ints, not {type(indices).__name__}")
            if len(indices) != len(own["params"]):
                raise ValueError("loaded state dict contains a parameter group that doesn't match "
                                 "the size of optimizer's group")
            for saved_index, p in zip(indices, own["params"]):
                saved_index = integer(saved_index, f"{name}['params'] entries", 0)
                if saved_index in index_of:
                    raise ValueError(f"{name}['params']: parameter index {saved_index} appears twice")
                index_of[saved_index] = position[id(p)]
            group = {**split_group(self._kind, self._hparams(saved), name), "params": own["params"]}
            try:
                self._check_hyperparameters(group)
            except (KeyError, TypeError, ValueError) as error:
                raise type(error)(f"{name}: {error.args[0] if error.args else error}") from None
            new_groups.append(group)
        return new_groups, index_of

    def _saved_states(self, state_dict: Any, groups: list[dict[str, Any]],
                      index_of: dict[int, int]) -> dict[int, tuple[int, dict[str, np.ndarray]]]:
        """The checked per-parameter states, by position in self._params()."""
        saved_state = check_mapping(state_dict["state"], "state_dict['state']")
        params = self._params()
        group_of = [g for g, group in enumerate(groups) for _ in group["params"]]
        prepared = {}
        for key, saved in saved_state.items():
            index = _state_index(key)
            if index not in index_of:
                raise ValueError(f"loaded state dict has state for parameter {key!r}, which is in no group")
            at = index_of[index]
            prepared[at] = self._prepare_state(index, params[at], saved, groups[group_of[at]])
        return prepared

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state_dict of PyTorch's layout: gputrain's own, or torch.optim's
        (``torch_optimizer.state_dict()``: tensor steps and states, on any device, and torch's
        implementation flags in the groups, checked as the constructor checks them). Arrays may
        be NumPy, torch tensors, or anything np.asarray takes.

        Everything is checked before anything is applied (KeyError: a wrong key set; TypeError:
        a wrong type; ValueError: a wrong size, a NaN/infinite or negative second moment, a
        hyperparameter out of range), and a refusal by the C optimizer (e.g. amsgrad turned on
        in a group of an optimizer built without it) restores the previous groups and state:
        a failed load leaves the optimizer exactly as it was.
        """
        self._apply_staged(self._stage_state_dict(state_dict))

    def _stage_state_dict(self, state_dict: dict[str, Any]) -> tuple[Any, ...]:
        """load_state_dict's checks, changing nothing: (groups, per-parameter states) for
        _apply_staged. Also refuses a flag the C optimizer cannot turn on after it was built."""
        new_groups, index_of = self._saved_groups(state_dict)
        slots = set(self._core.get_state(0)) if self._params() else set()
        for g, group in enumerate(new_groups):
            for flag, slot in (("amsgrad", "max_exp_avg_sq"), ("momentum", "momentum_buffer")):
                if group.get(flag) and slot not in slots:  # AdamW's groups have no momentum, SGD's no amsgrad
                    raise ValueError(f"state_dict['param_groups'][{g}][{flag!r}]: cannot be turned on after the "
                                     "optimizer was created without it")
        return new_groups, self._saved_states(state_dict, new_groups, index_of)

    def _apply_staged(self, staged: tuple[Any, ...]) -> None:
        """Applies what _stage_state_dict checked; a refusal by the C optimizer restores the
        previous groups and state before it propagates."""
        new_groups, prepared = staged
        old_groups = self.param_groups
        old_states = [self._core.get_state(i) for i in range(len(self._params()))]
        try:
            self.param_groups = new_groups
            self.push_hyperparameters()
            self._write_states(self._local_states(prepared))
        except BaseException:
            self.param_groups = old_groups
            self.push_hyperparameters()
            self._write_states({i: (state.pop("step"), state) for i, state in enumerate(old_states)})
            raise
        self._core.reload_params()

    def _local_states(self, states: dict[int, tuple[int, dict[str, np.ndarray]]]
                      ) -> dict[int, tuple[int, dict[str, np.ndarray]]]:
        """Whole per-parameter states as the C optimizer holds them: this rank's shard of each
        with zero_stage=1, unchanged otherwise."""
        shard = self._shard
        if shard is None:
            return states
        return {i: (step, {k: shard.local(i, a) for k, a in arrays.items()}) for i, (step, arrays) in states.items()}

    def _write_states(self, states: dict[int, tuple[int, dict[str, np.ndarray]]]) -> None:
        """Sets every parameter's step and state arrays (zeros and step 0 where `states` has none),
        the arrays as the C optimizer holds them (a shard's slices with zero_stage=1)."""
        for i, p in enumerate(self._params()):
            current = self._core.get_state(i)
            step, arrays = states.get(i, (0, {}))
            zeros = {k: np.zeros_like(v) for k, v in current.items() if k != "step" and k not in arrays}
            self._core.set_state(i, step, {**zeros, **arrays})

    def reload_params(self) -> None:
        """Re-read offloaded parameters into the host master copy after changing them directly
        (e.g. model.load_state_dict); not needed without cpu_offload_fraction."""
        self._follow_params()
        self._core.reload_params()

    def memory(self) -> dict[str, int]:
        """Optimizer bytes and elements on the device and on the host (offloaded share)."""
        return self._core.memory()

    # -- copy.deepcopy and pickle -----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The attributes and param_groups (their Parameters: deep-copied with a model, the
        copy's), and the state through state_dict(); the C optimizer is rebuilt on load."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_core", "_views", "_generation", "_shard")}
        state["_steps_before"] = self.step_count
        state["_saved"] = self.state_dict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        saved = state.pop("_saved")
        self.__dict__.update(state)
        # Built over the Parameters as they are now: copied with their model, they may still be
        # standalone and move into its arenas afterwards, which _follow_params then follows.
        self._generation = Parameter.generation
        self._shard = self._make_shard()
        self._views = self._param_views()
        self._core = self._build_core(self._views)
        self.load_state_dict(saved)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for index, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {index}")
            for key in sorted(k for k in group if k != "params"):
                lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)
