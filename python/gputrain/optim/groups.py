"""Parameter-group helpers: no weight decay on biases and norm weights, and layer-wise
learning-rate decay (LLRD), producing plain param_groups dicts for AdamW/SGD."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gputrain.nn.parameter import Parameter

__all__ = ["no_weight_decay", "param_groups_llrd", "param_groups_weight_decay"]


def no_weight_decay(name: str, param: Parameter, skip_list: Iterable[str] = ()) -> bool:
    """True for parameters that should not decay: biases, 1-D tensors (norm weights and biases,
    timm's rule) and any name in skip_list."""
    return len(param.shape) <= 1 or name.endswith("bias") or name in set(skip_list)


def _named(params: Any) -> list[tuple[str, Parameter]]:
    """(name, Parameter) pairs from a module, a Parameter, or an iterable of either form."""
    if hasattr(params, "named_parameters"):
        return list(params.named_parameters())
    if isinstance(params, Parameter):
        return [(params.name, params)]
    named = []
    for item in params:
        if isinstance(item, Parameter):
            named.append((item.name, item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Parameter):
            named.append((str(item[0]), item[1]))
        else:
            raise TypeError(f"expected Parameters or (name, Parameter) pairs, got {type(item).__name__}")
    return named


def param_groups_weight_decay(params: Any, weight_decay: float = 1e-2, skip_list: Iterable[str] = (),
                              **group_options: Any) -> list[dict[str, Any]]:
    """Two groups: decaying weights with `weight_decay`, and biases/norm weights with 0.

    `params` is a module, or Parameters / (name, Parameter) pairs; empty groups are left out.
    Extra keyword arguments (e.g. lr) are copied into both groups.
    """
    skip = set(skip_list)
    decay, no_decay = [], []
    for name, param in _named(params):
        if param.requires_grad:
            (no_decay if no_weight_decay(name, param, skip) else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay, **group_options},
              {"params": no_decay, "weight_decay": 0.0, **group_options}]
    return [group for group in groups if group["params"]]


def _layers_of(layers: Any) -> list[Any]:
    if hasattr(layers, "named_children"):
        layers = [child for _, child in layers.named_children()]
    layers = [layer for layer in layers if _named(layer)]
    if not layers:
        raise ValueError("layers: no layer has parameters")
    return layers


def param_groups_llrd(layers: Sequence[Any] | Any, lr: float, llrd: float = 0.9, weight_decay: float = 0.0,
                      skip_list: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Layer-wise learning-rate decay: the top layer gets lr, the one below lr * llrd, then
    lr * llrd**2, ... (depth counted over layers that have parameters).

    `layers` is ordered bottom (input) to top (output): a sequence whose items are modules,
    Parameters or lists of them, or a container module whose children are the layers. Each
    layer gives a decaying and a non-decaying group (see param_groups_weight_decay) carrying
    "lr", "lr_scale" and "layer_id".
    """
    if not 0.0 < llrd <= 1.0:
        raise ValueError(f"llrd must be in (0, 1], got {llrd}")
    ordered = _layers_of(layers)
    top = len(ordered) - 1
    groups = []
    for layer_id, layer in enumerate(ordered):
        scale = llrd ** (top - layer_id)
        for group in param_groups_weight_decay(layer, weight_decay, skip_list):
            groups.append({**group, "lr": lr * scale, "lr_scale": scale, "layer_id": layer_id})
    return groups
