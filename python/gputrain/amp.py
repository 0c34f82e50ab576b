"""Mixed precision: the dynamic loss scaler `GradScaler`, with PyTorch's semantics.

The scaler's state is a C struct (csrc/core/scaler_rules.h) that this class inherits from
`gputrain._C.Scaler`; the unscale + inf check and the update rules run in C, and the fused
training step uses the same object without Python in between. Per-iteration bookkeeping
(which optimizer was unscaled or stepped) stays here, as in PyTorch.

    scaler = GradScaler()
    for batch in data:
        optimizer.zero_grad(set_to_none=True)
        loss = ...                            # forward
        ... backward of scaler.scale(loss) fills the gradients ...
        skipped = scaler.step(optimizer)      # unscale + inf check, optimizer.step() unless inf/NaN
        scaler.update()
        if not skipped:
            scheduler.step()                  # the LR schedule advances only on real steps

`step()` returns whether the optimizer step was skipped, so the LR scheduler (and any step
counter) can follow the optimizer instead of running ahead of it on overflow.
"""

from __future__ import annotations

import enum
import numbers
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np

from gputrain import _C
from gputrain._deferred import DeferredSteps
from gputrain._state_checks import check_keys, check_mapping, integer, real

__all__ = ["GradScaler", "OptState", "ScaleUnderflowWarning"]


# The keys of GradScaler.state_dict(), PyTorch's.
_STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


class OptState(enum.Enum):
    """Where one optimizer is in the current iteration (PyTorch's names)."""

    READY = 0
    UNSCALED = 1
    STEPPED = 2


class ScaleUnderflowWarning(RuntimeWarning):
    """The loss scale fell below 1: gradients overflow even without scaling."""


class OptimizerLike(Protocol):
    """What GradScaler needs from an optimizer (PyTorch's interface)."""

    param_groups: list[dict[str, Any]]

    def step(self, *args: Any, **kwargs: Any) -> Any: ...


class _IterationState:
    """One optimizer's progress through the current iteration."""

    __slots__ = ("found_inf", "stage")

    def __init__(self) -> None:
        self.stage = OptState.READY  # READY -> UNSCALED (unscale_) -> STEPPED (step)
        self.found_inf = False       # NaN/Inf seen in this optimizer's gradients


def _gradients_of(optimizer: OptimizerLike) -> list[np.ndarray]:
    """The gradient arrays of every parameter in the optimizer's param_groups (None skipped)."""
    groups = getattr(optimizer, "param_groups", None)
    if groups is None:
        raise TypeError(f"optimizer must have param_groups, got {type(optimizer).__name__}")
    grads = []
    for g, group in enumerate(groups):
        for i, param in enumerate(group["params"]):
            grad = param.grad
            if grad is None:
                continue
            if grad.dtype == np.float16:
                raise ValueError("Attempting to unscale FP16 gradients.")
            if grad.dtype != np.float32:
                raise TypeError(f"param_groups[{g}]['params'][{i}].grad must be float32, got {grad.dtype}")
            grads.append(grad)
    return grads


def _scalar(value: Any, name: str) -> float:
    """A Python float from a real number or a one-element NumPy array."""
    if isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"{name} must be a float or a one-element array, got shape {value.shape}")
        value = value.reshape(()).item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, not {type(value).__name__}")
    return float(value)


class GradScaler(_C.Scaler, DeferredSteps):
    """Dynamic loss scaling for fp16 training, with torch.amp.GradScaler's rules and API.

    The scale is fp32 and the growth tracker int32. Each iteration: multiply the loss by the
    scale, unscale the gradients (multiply by float32(1 / float64(scale)), checking for
    NaN/Inf in the same pass), skip the optimizer step if any was found, then `update()`:
    after an overflow the scale is multiplied by `backoff_factor`; after `growth_interval`
    consecutive clean iterations by `growth_factor` (kept only if finite).

    Args:
        init_scale: initial scale (finite, > 0).
        growth_factor: > 1.
        backoff_factor: in (0, 1).
        growth_interval: clean iterations per growth, >= 1.
        enabled: False makes every method a no-op (step() just calls optimizer.step()).
        min_scale: optional floor for the scale after a backoff (None: PyTorch's behaviour).

    Beyond PyTorch: `skipped_steps` / `consecutive_skipped_steps` counters, `min_scale`,
    a ScaleUnderflowWarning when the scale falls below 1, `unscale_arrays()` for plain NumPy
    gradients, and `step()` returning whether the step was skipped.

    Threads: while a TrainStep that holds this scaler runs in another thread, reading what the
    step writes (the scale, the growth tracker, the skip counters, state_dict()) or changing
    anything raises RuntimeError("the GradScaler is in use by another thread"), as the
    optimizer's calls do; the factors, interval, min_scale and is_enabled() stay readable.
    """

    __slots__ = ("_arrays_found_inf", "_per_optimizer_states", "_deferred_resolver")

    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        *,
        min_scale: float | None = None,
    ) -> None:
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral):
            raise TypeError(f"growth_interval must be an int, not {type(growth_interval).__name__}")
        super().__init__(init_scale, growth_factor, backoff_factor, int(growth_interval),
                         bool(enabled), min_scale=min_scale)
        self._per_optimizer_states: dict[int, _IterationState] = {}
        self._arrays_found_inf: bool | None = None  # unscale_arrays() results this iteration
        self._deferred_resolver: Callable[[], None] | None = None  # TrainStep(sync=False): resolves its steps

    def scale(self, outputs: Any) -> Any:
        """Multiply a loss (float, NumPy float scalar or array, or a list/tuple of them) by the scale.

        NumPy results follow NumPy's promotion with a float32 scalar; a disabled scaler
        returns `outputs` unchanged.
        """
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(item) for item in outputs)
        if isinstance(outputs, np.ndarray):
            if not np.issubdtype(outputs.dtype, np.floating):
                raise TypeError(f"outputs must have a floating dtype, got {outputs.dtype}")
            return outputs * np.float32(self._scale)
        if isinstance(outputs, np.floating):
            return outputs * np.float32(self._scale)
        if isinstance(outputs, float):
            return outputs * self._scale
        raise TypeError(f"outputs must be a float, a NumPy floating array, or a list/tuple of them, "
                        f"not {type(outputs).__name__}")

    def unscale_(self, optimizer: OptimizerLike) -> None:
        """Unscale the optimizer's gradients in place and record whether any is NaN/Inf.

        At most once per optimizer between update() calls, and not after step() (RuntimeError).
        """
        if not self._enabled:
            return
        state = self._per_optimizer_states.setdefault(id(optimizer), _IterationState())
        if state.stage is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state.stage is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        state.found_inf = self._unscale(_gradients_of(optimizer))
        state.stage = OptState.UNSCALED

    def unscale_arrays(self, arrays: Iterable[np.ndarray]) -> bool:
        """Unscale float32 arrays in place (one fused pass each); True if any held NaN/Inf.

        The result counts for the next update(), so the scaler works without an optimizer.
        A disabled scaler leaves the arrays alone and returns False.
        """
        if isinstance(arrays, np.ndarray):
            raise TypeError("arrays must be a list of arrays; wrap a single array as [array]")
        arrays = list(arrays)
        if not self._enabled:
            return False
        found_inf = self._unscale(arrays)
        self._arrays_found_inf = bool(self._arrays_found_inf) or found_inf
        return found_inf

    def step(self, optimizer: OptimizerLike, *args: Any, **kwargs: Any) -> bool:
        """Unscale (unless unscale_() was called), then optimizer.step() unless NaN/Inf was found.

        Returns True when the step was skipped: advance LR schedulers only when it is False.
        Arguments after `optimizer` are passed to optimizer.step().
        """
        if not self._enabled:
            optimizer.step(*args, **kwargs)
            return False
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        state = self._per_optimizer_states.setdefault(id(optimizer), _IterationState())
        if state.stage is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state.stage is OptState.READY:
            self.unscale_(optimizer)
        if not state.found_inf:
            optimizer.step(*args, **kwargs)
        state.stage = OptState.STEPPED
        return state.found_inf

    def update(self, new_scale: float | np.ndarray | None = None) -> None:
        """End the iteration: back off after NaN/Inf, grow after growth_interval clean ones.

        Warns (ScaleUnderflowWarning) when a backoff takes the scale below 1. `new_scale` sets
        the scale directly instead (finite and > 0, rounded to float32, growth tracker kept). Either way the
        iteration's NaN/Inf result is counted in skipped_steps / consecutive_skipped_steps.
        """
        if not self._enabled:
            return
        found_infs = [s.found_inf for s in self._per_optimizer_states.values() if s.stage is not OptState.READY]
        if self._arrays_found_inf is not None:
            found_infs.append(self._arrays_found_inf)
        if new_scale is not None:
            self._set_scale(_scalar(new_scale, "new_scale"), any(found_infs))
        elif not found_infs:
            raise RuntimeError("No inf checks were recorded prior to update().")
        else:
            before = self._scale
            self._update(any(found_infs))
            self._warn_if_below_one(before)
        self._per_optimizer_states.clear()
        self._arrays_found_inf = None

    def _warn_if_below_one(self, before: float) -> None:
        after = self._scale
        if after < 1.0 <= before:
            warnings.warn(
                f"GradScaler: the loss scale fell below 1 (now {after:g}) after "
                f"{self.consecutive_skipped_steps} consecutive skipped steps. Gradients overflow even "
                "unscaled: the loss or the inputs probably hold NaN/Inf, or the model does not suit "
                "fp16 (try bf16).",
                ScaleUnderflowWarning,
                stacklevel=3,
            )

    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled)."""
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        """The factor the scale is multiplied by after growth_interval steps without inf/NaN gradients."""
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        """Set growth_factor (a finite number > 1; ValueError otherwise)."""
        self._configure(growth_factor=_scalar(new_factor, "growth_factor"))

    def get_backoff_factor(self) -> float:
        """The factor the scale is multiplied by when a step finds inf/NaN gradients."""
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        """Set backoff_factor (a number in (0, 1); ValueError otherwise)."""
        self._configure(backoff_factor=_scalar(new_factor, "backoff_factor"))

    def get_growth_interval(self) -> int:
        """Steps without inf/NaN gradients after which the scale grows."""
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        """Set growth_interval (an int in 1..2**31-1; ValueError otherwise)."""
        self._configure(growth_interval=new_interval)

    def _get_growth_tracker(self) -> int:
        return self._growth_tracker if self._enabled else 0

    def is_enabled(self) -> bool:
        """False for GradScaler(enabled=False), whose methods do nothing (step() just calls optimizer.step())."""
        return self._enabled

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's five entries (scale, factors, interval, _growth_tracker); {} when disabled.
        Resolves the sync=False steps in flight first (their updates of the scale)."""
        self._resolve_deferred()
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state_dict(): PyTorch's five keys (KeyError for a missing or an unexpected
        one), each of the right type (TypeError) and in range (ValueError): `scale` finite and
        > 0 in float32, `growth_factor` > 1, `backoff_factor` in (0, 1), `growth_interval` >= 1,
        `_growth_tracker` in [0, growth_interval). Everything is checked before anything is
        applied: a failed load leaves the scaler as it was."""
        self._apply_staged(self._stage_state_dict(state_dict))

    def _apply_staged(self, staged: dict[str, Any] | None) -> None:
        """Sets what _stage_state_dict checked (nothing when the scaler is disabled)."""
        if staged is not None:
            self._configure(**staged)

    def _stage_state_dict(self, state_dict: Mapping[str, Any]) -> dict[str, Any] | None:
        """load_state_dict's checks, changing nothing: the checked values for _configure (None
        when the scaler is disabled: nothing to load)."""
        if not self._enabled:
            return None
        check_mapping(state_dict, "state_dict")
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        check_keys(state_dict, "state_dict", _STATE_KEYS)
        scale = real(state_dict["scale"], "state_dict['scale']", 0.0, low_open=True)
        with np.errstate(over="ignore"):
            scale32 = np.float32(scale)
        if not 0.0 < scale32 < np.inf:
            raise ValueError(f"state_dict['scale'] must be finite and > 0 in float32, got {scale!r}")
        interval = integer(state_dict["growth_interval"], "state_dict['growth_interval']", 1, 2**31 - 1)
        return dict(
            scale=scale,
            growth_factor=real(state_dict["growth_factor"], "state_dict['growth_factor']", 1.0, low_open=True),
            backoff_factor=real(state_dict["backoff_factor"], "state_dict['backoff_factor']", 0.0, 1.0,
                                low_open=True, high_open=True),
            growth_interval=interval,
            growth_tracker=integer(state_dict["_growth_tracker"], "state_dict['_growth_tracker']", 0, interval - 1),
        )

    def __getstate__(self) -> dict[str, Any]:
        if self._per_optimizer_states or self._arrays_found_inf is not None:
            raise RuntimeError("A GradScaler instance may only be pickled at the beginning of an "
                               "iteration, or at the end after scaler.update().")
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "enabled": self._enabled,
            "min_scale": self.min_scale,
            "growth_tracker": self._growth_tracker,
            "skipped_steps": self.skipped_steps,
            "consecutive_skipped_steps": self.consecutive_skipped_steps,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        GradScaler.__init__(self, 1.0, state["growth_factor"], state["backoff_factor"],
                            state["growth_interval"], state["enabled"], min_scale=state["min_scale"])
        self._configure(scale=state["scale"], growth_tracker=state["growth_tracker"],
                        skipped_steps=state["skipped_steps"],
                        consecutive_skipped_steps=state["consecutive_skipped_steps"])

    def __repr__(self) -> str:
        if not self._enabled:
            return "GradScaler(enabled=False)"
        try:
            scale, tracker, skipped = self._scale, self._growth_tracker, self.skipped_steps
        except RuntimeError:  # a training step in another thread holds (and writes) the state
            return "GradScaler(in use by another thread)"
        return (f"GradScaler(scale={scale:g}, growth_tracker={tracker}, "
                f"growth_factor={self._growth_factor:g}, backoff_factor={self._backoff_factor:g}, "
                f"growth_interval={self._growth_interval}, skipped_steps={skipped})")
