"""AdamW: PyTorch's torch.optim.AdamW, one fused C pass per step (CPU: AVX-512/AVX2 + OpenMP)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gputrain.optim.optimizer import Optimizer, _check_flags, _check_number

__all__ = ["AdamW"]


class AdamW(Optimizer):
    """AdamW with decoupled weight decay (Loshchilov & Hutter), PyTorch's defaults and state.

    numerics="exact" reproduces PyTorch's CPU AdamW (foreach=False) bit for bit; "fast" turns
    the two divisions per element into a multiplication and a Newton-Raphson reciprocal
    (DeepSpeed CPU-Adam style, a few ulps from exact per step) to run at memory bandwidth.
    cpu_offload_fraction=f keeps the state (and an fp32 master copy) of the last f of the
    parameter elements in pinned host memory, updated by CPU threads while the device updates
    the rest, with gradients and parameters streamed in chunks of offload_chunk_numel elements
    (0: 1 Mi) through double-buffered pinned staging; results are identical for every f.
    Parameters changed other than by step() (e.g. model.load_state_dict) need reload_params()
    when f > 0.

    zero_stage=1 (DeepSpeed's name for the stage; PyTorch's ZeroRedundancyOptimizer is the same
    idea as a wrapper class) shards the state over the ranks of gputrain.distributed.init():
    each rank keeps exp_avg, exp_avg_sq (and the offloaded master copy) of its contiguous 1/N
    of the model's parameters, and TrainStep reduce-scatters the gradients, updates the shard
    and all-gathers the parameters, bit-identical to zero_stage=0. With one process it is
    zero_stage=0. See gputrain.optim.zero.

    PyTorch's implementation flags are taken as torch.optim.AdamW takes them: fused (None, True,
    False) and foreach: accepted, the update is always gputrain's one fused C pass; capturable:
    accepted, nothing to change (no CUDA-graph capture here; see TrainStep(sync=False));
    differentiable=True: refused (no autograd through the step). state_dict(format="torch") gives
    a dict torch.optim.AdamW.load_state_dict takes, and load_state_dict takes torch's.
    """

    _kind = "adamw"

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False,
                 fused: bool | None = None, numerics: str = "exact", cpu_offload_fraction: float = 0.0,
                 offload_chunk_numel: int = 0, zero_stage: int = 0) -> None:
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay,
                    "amsgrad": bool(amsgrad), "maximize": bool(maximize)}
        self._check_hyperparameters(defaults)
        super().__init__(params, defaults, numerics=numerics, cpu_offload_fraction=cpu_offload_fraction,
                         offload_chunk_numel=offload_chunk_numel, zero_stage=zero_stage,
                         torch_flags={"foreach": foreach, "capturable": capturable,
                                      "differentiable": differentiable, "fused": fused})

    @staticmethod
    def _check_hyperparameters(group: dict[str, Any]) -> None:
        lr = _check_number(group["lr"], "lr")
        eps = _check_number(group["eps"], "eps")
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair of floats, got {betas!r}")
        beta1, beta2 = (_check_number(b, f"betas[{i}]") for i, b in enumerate(betas))
        weight_decay = _check_number(group["weight_decay"], "weight_decay")
        _check_flags(group, ("amsgrad", "maximize"))
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 < eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= beta1 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {beta1}")
        if not 0.0 <= beta2 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {beta2}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")

    def _state_keys(self, group: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        required = ("step", "exp_avg", "exp_avg_sq")
        return (required + ("max_exp_avg_sq",) if group["amsgrad"] else required), ()

    def _state_names(self) -> tuple[str, ...]:
        if any(group.get("amsgrad") for group in self.param_groups):
            return ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        return ("step", "exp_avg", "exp_avg_sq")
