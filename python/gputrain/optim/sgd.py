"""SGD: PyTorch's torch.optim.SGD (momentum, dampening, Nesterov, weight decay), fused in C."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from gputrain.optim.optimizer import Optimizer, _check_flags, _check_number

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent with PyTorch's semantics and state ('momentum_buffer').

    PyTorch's implementation flags as torch.optim.SGD takes them: fused and foreach (None, True,
    False): accepted, the update is always gputrain's one fused C pass; differentiable=True:
    refused (no autograd through the step). state_dict(format="torch") gives a dict
    torch.optim.SGD.load_state_dict takes, and load_state_dict takes torch's.
    """

    _kind = "sgd"

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None) -> None:
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay,
                    "nesterov": bool(nesterov), "maximize": bool(maximize)}
        self._check_hyperparameters(defaults)
        super().__init__(params, defaults,
                         torch_flags={"foreach": foreach, "differentiable": differentiable, "fused": fused})

    @staticmethod
    def _check_hyperparameters(group: dict[str, Any]) -> None:
        lr = _check_number(group["lr"], "lr")
        momentum = _check_number(group["momentum"], "momentum")
        dampening = _check_number(group["dampening"], "dampening")
        weight_decay = _check_number(group["weight_decay"], "weight_decay")
        _check_flags(group, ("nesterov", "maximize"))
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _state_keys(self, group: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (), ("momentum_buffer",)

    def _state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",)

    def _has_state(self, state: dict[str, Any]) -> bool:
        return state["step"] > 0 and "momentum_buffer" in state

    def _imported_step(self, step: int, arrays: dict[str, np.ndarray]) -> int:
        return 1 if "momentum_buffer" in arrays else 0
