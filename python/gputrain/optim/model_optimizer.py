"""ModelOptimizer: the fused AdamW/SGD over a compiled model's own arenas, on its device.

A model moved to CUDA keeps its parameters and gradients in device memory and has no
Parameter objects, so the usual `AdamW(model.parameters())` cannot be built for it. Instead:

    model = build().to("cuda")
    optimizer = gt.optim.AdamW.for_model(model, lr=3e-4, weight_decay=0.1)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, max_grad_norm=1.0)

The C optimizer gets one parameter per model parameter (the model's parameter_layout()),
pointing into the model's parameter and gradient arenas, and keeps its state on the model's
device. It has one hyperparameter group (`param_groups[0]`, a plain dict that schedulers may
change); the update runs inside the training step (`TrainStep` / `_C.train_step`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from gputrain import _C
from gputrain.nn.module import Module

if TYPE_CHECKING:
    from gputrain.optim.optimizer import Optimizer

__all__ = ["ModelOptimizer"]

# Constructor arguments that are not hyperparameters of the group.
_NOT_HYPERPARAMETERS = ("self", "params", "numerics", "cpu_offload_fraction", "offload_chunk_numel")


def _group_defaults(optimizer_cls: type[Optimizer], hyperparameters: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The constructor's hyperparameters with its defaults filled in, and `numerics`."""
    bound = inspect.signature(optimizer_cls.__init__).bind(None, (), **hyperparameters)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    for name in ("cpu_offload_fraction", "offload_chunk_numel"):
        if arguments.get(name):
            raise ValueError(f"{name}: for_model keeps the whole optimizer state on the model's device")
    numerics = arguments.get("numerics", "exact")
    if numerics not in ("exact", "fast"):
        raise ValueError(f"numerics must be 'exact' or 'fast', got {numerics!r}")
    defaults = {k: v for k, v in arguments.items() if k not in _NOT_HYPERPARAMETERS}
    for flag in ("amsgrad", "nesterov", "maximize"):
        if flag in defaults:
            defaults[flag] = bool(defaults[flag])
    return defaults, numerics


class ModelOptimizer:
    """`optimizer_cls` (AdamW or SGD) over the arenas of `model` (a gputrain Module)."""

    def __init__(self, optimizer_cls: type[Optimizer], model: Module, **hyperparameters: Any) -> None:
        if not isinstance(model, Module):
            raise TypeError(f"model must be a gputrain.nn.Module, not {type(model).__name__}")
        defaults, numerics = _group_defaults(optimizer_cls, hyperparameters)
        optimizer_cls._check_hyperparameters(defaults)
        self._check = optimizer_cls._check_hyperparameters
        self.defaults = dict(defaults)
        self.numerics = numerics
        self.param_groups: list[dict[str, Any]] = [dict(defaults)]
        self.device: str = model.compiled.device
        self._kind = optimizer_cls._kind
        self._model = model  # the Module whose C model the core updates (copies rebuild over it)
        self._steps_before = 0  # steps counted before this core was built (a copy's original's)
        self._core = _C.ModelOptimizer(self._kind, model.compiled, defaults, numerics=numerics)

    def push_hyperparameters(self) -> None:
        """Copy the group's hyperparameters (e.g. an lr set by a scheduler) into C."""
        if len(self.param_groups) != 1:
            raise ValueError(f"param_groups: for_model keeps one group, found {len(self.param_groups)}")
        self._check(self.param_groups[0])
        self._core.set_hparams(0, self.param_groups[0])

    @property
    def step_count(self) -> int:
        """Steps that updated the parameters (skipped steps do not count)."""
        return self._steps_before + self._core.num_steps

    def get_state(self, index: int) -> dict[str, Any]:
        """Parameter `index`'s state (parameter_layout order): {'step': int, name: float32 host copy}."""
        return self._core.get_state(index)

    # -- copy.deepcopy and pickle -----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The settings, the model (deep-copied with it: the copy's) and every parameter's state
        as host arrays; the C optimizer is rebuilt over the model's arenas on load."""
        state = {k: v for k, v in self.__dict__.items() if k != "_core"}
        state["_steps_before"] = self.step_count
        state["_states"] = [self._core.get_state(i) for i in range(len(self._model.compiled.parameter_layout()))]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        states = state.pop("_states")
        self.__dict__.update(state)
        self._core = _C.ModelOptimizer(self._kind, self._model.compiled, self.defaults, numerics=self.numerics)
        self.push_hyperparameters()
        for index, saved in enumerate(states):
            self._core.set_state(index, saved.pop("step"), saved)

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v!r}" for k, v in sorted(self.param_groups[0].items()))
        return f"ModelOptimizer({self._core.model.device}: {settings})"
