"""EMA: an exponential moving average of the weights, swapped in for evaluation.

    ema = gt.optim.EMA(model, decay=0.999)            # or location="host" (pinned host memory)
    for batch in loader:
        ... optimizer.step() ...
        ema.update()                                   # after every optimizer step that ran
    with ema.average_parameters():                     # the averaged weights, then back
        evaluate(model)

The update is shadow = lerp(shadow, p, 1 - decay) (PyTorch's `ema.lerp_(p, 1 - decay)`), one
fused C pass over all parameters. For a model on a device (`model.to("sim")`, `"cuda"`), the
pass runs there: location="device" keeps the shadow in device memory beside the parameters,
"host" in pinned host memory (the parameters are streamed to the host and averaged by the CPU).
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator
from typing import Any

import numpy as np

from gputrain import _C
from gputrain._state_checks import check_keys, check_mapping, float32_array, integer, real
from gputrain.nn.parameter import Parameter

__all__ = ["EMA"]

LOCATIONS = ("device", "host")


def _parameters(params: Any) -> list[Parameter]:
    if hasattr(params, "parameters"):
        params = params.parameters()
    params = [params] if isinstance(params, Parameter) else list(params)
    for p in params:
        if not isinstance(p, Parameter):
            raise TypeError(f"EMA averages Parameters, got {type(p).__name__}")
    if not params:
        raise ValueError("EMA got an empty parameter list")
    return params


class EMA:
    """A shadow copy of the parameters, averaged after each optimizer step.

    Args:
        params: a module or Parameters.
        decay: weight of the old average per update, in [0, 1] (ema_decay).
        location: "device" keeps the shadow beside the parameters; "host" keeps it in pinned
            host memory (for small GPUs: updates then stream the parameters to the host).
        use_warmup: use min(decay, (1 + n) / (10 + n)) for update n (TensorFlow/timm warmup),
            so early averages are not dominated by the random initialisation.
    """

    def __init__(self, params: Any, decay: float = 0.999, *, location: str = "device",
                 use_warmup: bool = False) -> None:
        if isinstance(decay, bool) or not isinstance(decay, numbers.Real):
            raise TypeError(f"decay must be a real number, not {type(decay).__name__}")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"Invalid ema_decay: {decay} (must be in [0, 1])")
        if location not in LOCATIONS:
            raise ValueError(f"location must be 'device' or 'host', got {location!r}")
        self.params = _parameters(params)
        self.decay = float(decay)
        self.location = location
        self.use_warmup = bool(use_warmup)
        self.num_updates = 0
        self._swapped = False
        self._generation = Parameter.generation  # read before the views: a later move changes it
        self._views = self._param_views()  # what the C average points into
        self._core = self._build_core(self._views)

    def _param_views(self) -> list[Any]:
        """Each parameter's array, or its DeviceSlot when it lives in device memory."""
        return [p._device if p._device is not None else p.data for p in self.params]

    def _build_core(self, views: list[Any]) -> Any:
        """The C average over `views`: host arrays, or the parameters of one model on a device
        (ValueError naming params when they mix devices or models)."""
        devices = sorted({p.device for p in self.params})
        if len(devices) > 1:
            raise ValueError(f"params: the parameters of one EMA must be on one device, found {devices}")
        on_host = self.location == "host"
        if devices[0] == "cpu":
            return _C.EMA(views, on_host=on_host)
        owners = {id(slot.compiled): slot.compiled for slot in views}
        if len(owners) > 1:
            raise ValueError(f"params: parameters of {len(owners)} models on '{devices[0]}'; an EMA of "
                             "parameters on a device averages one model's")
        return _C.EMA([slot.index for slot in views], on_host=on_host, model=next(iter(owners.values())).model)

    def _follow_params(self) -> None:
        """Re-points C at parameters that moved since it was built (their module was compiled into
        a container or moved to a device, as the optimizer does), keeping the average; free
        unless some Parameter did."""
        generation = Parameter.generation
        if generation == self._generation:
            return
        views = self._param_views()
        if any(new is not old for new, old in zip(views, self._views)):
            shadow = self.shadow
            core = self._build_core(views)
            for index, value in enumerate(shadow):
                core.set(index, value)
            self._core, self._views = core, views
        self._generation = generation

    def current_decay(self) -> float:
        """The decay the next update() uses."""
        if not self.use_warmup:
            return self.decay
        return min(self.decay, (1.0 + self.num_updates) / (10.0 + self.num_updates))

    def update(self) -> None:
        """Fold the current parameters into the average (call after optimizer steps that ran)."""
        if self._swapped:
            raise RuntimeError("EMA.update() while the average is swapped in; swap back first")
        self._follow_params()
        self._core.update(self.current_decay())
        self.num_updates += 1

    def swap(self) -> None:
        """Exchange the parameters and the average (calling it twice restores both exactly)."""
        self._follow_params()
        self._core.swap()
        self._refresh_half_copies()
        self._swapped = not self._swapped

    @property
    def swapped(self) -> bool:
        """True while the parameters hold the average."""
        return self._swapped

    @contextlib.contextmanager
    def average_parameters(self) -> Iterator[None]:
        """Evaluate with the averaged weights inside the block; the trained ones come back after."""
        if self._swapped:
            raise RuntimeError("the average is already swapped in")
        self.swap()
        try:
            yield
        finally:
            self.swap()

    def copy_to(self) -> None:
        """Overwrite the parameters with the average (e.g. before saving the final model)."""
        self._follow_params()
        self._core.copy_to_params()
        self._refresh_half_copies()

    def _refresh_half_copies(self) -> None:
        """A model trained in bf16/fp16 computes with a half copy of its weights: after the fp32
        weights were overwritten it must follow them, or evaluation silently uses the old ones."""
        owners = {id(p._owner): p._owner for p in self.params if p._owner is not None}
        for owner in owners.values():
            model = getattr(owner, "model", None)
            if model is not None and model.precision != "f32":
                model.refresh_half_parameters()

    @property
    def shadow(self) -> list[np.ndarray]:
        """Copies of the averaged values, one per parameter."""
        return [self._core.get(i).reshape(p.shape) for i, p in enumerate(self.params)]

    def memory(self) -> dict[str, Any]:
        """Bytes of the shadow and where it lives."""
        return {"bytes": self._core.nbytes, "location": self.location}

    def state_dict(self) -> dict[str, Any]:
        """decay, num_updates, use_warmup and shadow (copies of the averaged values), for checkpoints."""
        return {"decay": self.decay, "num_updates": self.num_updates, "use_warmup": self.use_warmup,
                "shadow": self.shadow}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state_dict(): its four keys (KeyError otherwise), decay in [0, 1],
        num_updates >= 0, use_warmup a bool, one finite float32-compatible shadow array of each
        parameter's shape. Everything is checked before anything is applied."""
        self._apply_staged(self._stage_state_dict(state_dict))

    def _stage_state_dict(self, state_dict: dict[str, Any]) -> tuple[float, int, bool, list[np.ndarray]]:
        """load_state_dict's checks, changing nothing: (decay, num_updates, use_warmup, arrays)."""
        check_mapping(state_dict, "state_dict")
        check_keys(state_dict, "state_dict", ("decay", "num_updates", "use_warmup", "shadow"))
        decay = real(state_dict["decay"], "state_dict['decay']", 0.0, 1.0)
        num_updates = integer(state_dict["num_updates"], "state_dict['num_updates']", 0)
        use_warmup = state_dict["use_warmup"]
        if not isinstance(use_warmup, (bool, np.bool_)):
            raise TypeError(f"state_dict['use_warmup'] must be a bool, not {type(use_warmup).__name__}")
        shadow = state_dict["shadow"]
        if not isinstance(shadow, (list, tuple)):
            raise TypeError(f"state_dict['shadow'] must be a list of arrays, not {type(shadow).__name__}")
        if len(shadow) != len(self.params):
            raise ValueError(f"state_dict has {len(shadow)} shadow arrays, expected {len(self.params)}")
        arrays = [float32_array(value, f"state_dict['shadow'][{index}]", shape=p.shape)
                  for index, (value, p) in enumerate(zip(shadow, self.params))]
        return decay, num_updates, bool(use_warmup), arrays

    def _apply_staged(self, staged: tuple[float, int, bool, list[np.ndarray]]) -> None:
        """Writes what _stage_state_dict checked."""
        decay, num_updates, use_warmup, arrays = staged
        for index, array in enumerate(arrays):
            self._core.set(index, array)
        self.decay, self.num_updates, self.use_warmup = decay, num_updates, use_warmup

    # -- copy.deepcopy and pickle -----------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """The attributes, the Parameters (the copied model's when copied with it) and the
        average; the C average is rebuilt on load."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_core", "_views", "_generation")}
        state["_shadow"] = self.shadow
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        shadow = state.pop("_shadow")
        self.__dict__.update(state)
        self._generation = Parameter.generation
        self._views = self._param_views()
        self._core = self._build_core(self._views)
        for index, value in enumerate(shadow):
            self._core.set(index, value)
