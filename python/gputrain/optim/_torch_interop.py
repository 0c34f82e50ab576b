"""PyTorch interop for the optimizers: torch's implementation flags, its state_dict values, and a
state_dict that torch's `load_state_dict` takes. torch is imported only inside `to_torch_state_dict`.

torch.optim.AdamW and SGD take flags that choose how PyTorch runs the update, not what it
computes. gputrain has one update (a fused C pass) and treats each flag by what it asks for:

- ``fused`` (None, True or False) and ``foreach`` (None, True or False): accepted. PyTorch picks
  between a per-tensor loop, multi-tensor kernels and one fused kernel, which compute the same
  update; gputrain's update is always one fused C pass (with numerics="exact", PyTorch's
  single-tensor AdamW bit for bit).
- ``capturable`` (AdamW; False or True): accepted and changes nothing. PyTorch keeps its step
  tensors on the device so that the update can be captured in a CUDA graph; gputrain keeps the
  step count inside its C optimizer and has no CUDA-graph capture. (For steps that do not wait
  on the host, use ``TrainStep(sync=False)``.)
- ``differentiable=True``: refused. It makes the update part of an autograd graph, and gputrain
  has no autograd through the optimizer step.
- ``maximize``: a real hyperparameter, honoured (a group key, as in PyTorch).
- ``decoupled_weight_decay`` (a group key of torch>=2.6 AdamW state_dicts): True is AdamW and
  accepted; False would be Adam's L2 penalty and is refused.

Loaded state values may be NumPy arrays, torch tensors (on any device: ``.cpu()`` is called when
NumPy cannot read them directly), anything with ``__array__`` or ``__dlpack__``, or nested lists.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

#: torch's implementation flags per optimizer kind, with torch's defaults.
FLAG_DEFAULTS = {
    "adamw": {"foreach": None, "capturable": False, "differentiable": False, "fused": None},
    "sgd": {"foreach": None, "differentiable": False, "fused": None},
}
_OPTIONAL_BOOLS = ("foreach", "fused")  # None (torch decides) or a bool


def check_flags(kind: str, flags: dict[str, Any], where: str = "") -> dict[str, Any]:
    """The flags with torch's defaults filled in, each checked (TypeError: not a bool/None;
    ValueError: a value gputrain cannot honour, with the reason). `where` prefixes names."""
    out = dict(FLAG_DEFAULTS.get(kind, {}))
    for name, value in flags.items():
        label = f"{where}[{name!r}]" if where else name
        if name in _OPTIONAL_BOOLS:
            if value is not None and not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{label} must be None or a bool, not {type(value).__name__}")
        elif not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{label} must be a bool, not {type(value).__name__}")
        if name == "differentiable" and value:
            raise ValueError(f"{label}=True is not supported: it makes the optimizer step part of an autograd "
                             "graph, and gputrain has no autograd through the step (its update is one fused C "
                             "pass); use differentiable=False")
        if name == "decoupled_weight_decay" and not value:
            raise ValueError(f"{label}=False is Adam with an L2 penalty, which gputrain does not implement; "
                             "gputrain.optim.AdamW decays the weights decoupled (decoupled_weight_decay=True)")
        out[name] = None if value is None else bool(value)
    return out


def split_group(kind: str, saved: dict[str, Any], where: str) -> dict[str, Any]:
    """A saved group's hyperparameters without torch's implementation flags, which are checked
    (a torch state_dict carries them in every group)."""
    names = (*FLAG_DEFAULTS.get(kind, {}), *(("decoupled_weight_decay",) if kind == "adamw" else ()))
    check_flags(kind, {k: saved[k] for k in names if k in saved}, where)
    return {k: v for k, v in saved.items() if k not in names}


def host_value(value: Any) -> Any:
    """A torch tensor or other array-like as a NumPy array (0-d for a scalar such as torch's
    ``step``); Python numbers, NumPy values, lists and None unchanged."""
    if value is None or isinstance(value, (np.ndarray, np.generic, numbers.Number, list, tuple, str, bytes)):
        return value
    if not (hasattr(value, "__array__") or hasattr(value, "__dlpack__")):
        return value
    try:
        return np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as first:
        to_host = getattr(value, "cpu", None)  # a tensor in device memory: copied to the host first
        if callable(to_host):
            return np.asarray(to_host())
        if hasattr(value, "__dlpack__"):
            return np.from_dlpack(value)
        raise TypeError(f"cannot read a {type(value).__name__} as an array ({first})") from None


def to_torch_state_dict(kind: str, state_dict: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """gputrain's state_dict in the layout and types torch.optim's load_state_dict takes: torch
    tensors when torch is importable (a float32 0-d ``step``), NumPy arrays otherwise; every group
    with torch's implementation flags (and decoupled_weight_decay=True for AdamW)."""
    try:
        import torch
    except ImportError:
        torch = None

    def tensor(array: np.ndarray) -> Any:
        copy = np.array(array, dtype=np.float32, copy=True)
        return copy if torch is None else torch.from_numpy(copy)

    state = {index: {name: tensor(value) for name, value in saved.items()}
             for index, saved in state_dict["state"].items()}
    extra = {**flags, **({"decoupled_weight_decay": True} if kind == "adamw" else {})}
    groups = []
    for group in state_dict["param_groups"]:
        hparams = {k: v for k, v in group.items() if k != "params"}
        if "betas" in hparams:
            hparams["betas"] = tuple(hparams["betas"])
        groups.append({**hparams, **extra, "params": list(group["params"])})
    return {"state": state, "param_groups": groups}
