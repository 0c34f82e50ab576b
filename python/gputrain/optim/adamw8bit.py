"""AdamW8bit: bitsandbytes' 8-bit AdamW (blockwise dynamic quantization of both moments), fused in C."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from gputrain._state_checks import check_keys, check_mapping, float32_array, real
from gputrain.nn.parameter import Parameter
from gputrain.optim._torch_interop import host_value
from gputrain.optim.adamw import AdamW
from gputrain.optim.optimizer import Optimizer

__all__ = ["AdamW8bit", "BLOCK_SIZE", "DEFAULT_MIN_8BIT_SIZE"]

#: Elements per quantization block of a parameter's moments (bitsandbytes' 8-bit optimizers).
BLOCK_SIZE = 256
#: bitsandbytes' default min_8bit_size: smaller parameters keep float32 moments.
DEFAULT_MIN_8BIT_SIZE = 4096

_STATE_8BIT = ("state1", "state2", "absmax1", "absmax2")
_STATE_32BIT = ("exp_avg", "exp_avg_sq")


class AdamW8bit(Optimizer):
    """bitsandbytes.optim.AdamW8bit: AdamW whose moments are kept in 8 bits.

    Each parameter of at least `min_8bit_size` elements keeps its first moment as codes of
    bitsandbytes' signed dynamic map and its second as codes of the unsigned one (one byte per
    element each, gputrain.quant.codes.DYNAMIC_SIGNED / DYNAMIC_UNSIGNED), with one float32
    absmax per block of 256 elements of the parameter for each moment: 2 bytes of state per
    element plus 8 bytes per block, instead of AdamW's 8. Every step dequantizes a block's
    moments (code * absmax), updates them and the parameter in float32 (bitsandbytes' order:
    m = m*beta1 + (1-beta1)*g, v = v*beta2 + (1-beta2)*g*g, decoupled decay, then
    p += -lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)), and requantizes them with the
    block's new absmax to the nearest code (csrc/ops/adamw8bit_hd.h). Smaller parameters keep
    float32 moments and are updated exactly as gputrain.optim.AdamW updates them.

    The arguments are bitsandbytes': amsgrad must be False and optim_bits 32 (bitsandbytes'
    defaults, kept for its signature; the state is 8-bit regardless); args=None. The state is on
    the device of a model's parameters (cpu, sim, cuda), updated synchronously by TrainStep (no
    sync=False with a GradScaler, no zero_stage).

    cpu_offload_fraction=f (gputrain's, as AdamW's) keeps the state of the last parameters, from
    the parameter boundary nearest to the last f of the elements, in pinned host memory, where CPU
    threads update it: each step copies such a parameter's values and gradient to the host in
    chunks of whole blocks (offload_chunk_numel elements, rounded down to blocks; the next chunk
    in flight while one is updated) and its new values back, on a stream beside the compute. The
    bits are the device's (the same kernels on the host). Unlike AdamW's offload there is no fp32
    master copy on the host: the values make the round trip. is_paged=True (bitsandbytes'
    PagedAdamW8bit, whose state lives in CUDA unified memory and pages to the host on demand)
    keeps the whole state in pinned host memory so (cpu_offload_fraction=1 unless given).

    state_dict() holds, per parameter, bitsandbytes' fields ("state1", "state2":
    uint8 codes of the parameter's shape; "absmax1", "absmax2": float32 per block) or, for a
    parameter kept in 32 bits, "exp_avg" and "exp_avg_sq"; load_state_dict restores them exactly.
    """

    _kind = "adamw8bit"

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, optim_bits: int = 32,
                 args: Any = None, min_8bit_size: int = DEFAULT_MIN_8BIT_SIZE, is_paged: bool = False, *,
                 cpu_offload_fraction: float | None = None, offload_chunk_numel: int = 0) -> None:
        if amsgrad:
            raise ValueError("AdamW8bit does not support amsgrad=True")
        if optim_bits != 32:
            raise ValueError("AdamW8bit only supports optim_bits=32 (default value for compatibility)")
        if args is not None:
            raise ValueError("args: bitsandbytes' GlobalOptimManager arguments are not supported; pass None")
        if not isinstance(is_paged, bool):
            raise TypeError(f"is_paged must be a bool, not {type(is_paged).__name__}")
        if cpu_offload_fraction is None:
            cpu_offload_fraction = 1.0 if is_paged else 0.0
        if isinstance(min_8bit_size, bool) or not isinstance(min_8bit_size, int) \
                or not 0 <= min_8bit_size <= sys.maxsize:
            raise ValueError(f"min_8bit_size must be an int >= 0, got {min_8bit_size!r}")
        self.min_8bit_size = min_8bit_size
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "amsgrad": False,
                    "maximize": False}
        self._check_hyperparameters(defaults)
        super().__init__(params, defaults, cpu_offload_fraction=cpu_offload_fraction,
                         offload_chunk_numel=offload_chunk_numel)

    @staticmethod
    def _check_hyperparameters(group: dict[str, Any]) -> None:
        AdamW._check_hyperparameters(group)
        if group["amsgrad"]:
            raise ValueError("AdamW8bit does not support amsgrad=True")

    def _core_kwargs(self) -> dict[str, Any]:
        return {"min_8bit_size": self.min_8bit_size}

    def is_8bit(self, p: Parameter) -> bool:
        """Whether parameter p keeps 8-bit moments (numel >= min_8bit_size)."""
        return p.numel() >= self.min_8bit_size and p.numel() > 0

    def _state_keys(self, group: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ("step",) + _STATE_8BIT, ()

    def _state_names(self) -> tuple[str, ...]:
        return ("step",) + _STATE_8BIT + _STATE_32BIT

    def _export_state(self, raw: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any] | None:
        if not self._has_state(raw):
            return None
        out: dict[str, Any] = {"step": np.array(float(raw["step"]), dtype=np.float32)}
        for name in _STATE_8BIT + _STATE_32BIT:
            if name in raw:
                out[name] = raw[name] if name.startswith("absmax") else raw[name].reshape(shape)
        return out

    def _prepare_state(self, index: int, p: Parameter, saved: Any,
                       group: dict[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """A saved state as (step, flat arrays), checked against p's format: codes in [0, 255]
        of p's shape, finite absmax >= 0 per block, finite float32 moments (v >= 0)."""
        name = f"state_dict['state'][{index}]"
        check_mapping(saved, name)
        fields = _STATE_8BIT if self.is_8bit(p) else _STATE_32BIT
        check_keys(saved, name, ("step",) + fields)
        value = real(host_value(saved["step"]), f"{name}['step']", 0.0, 2.0**53)
        if not value.is_integer():
            raise ValueError(f"{name}['step'] must be a whole number of steps, got {value}")
        blocks = -(-p.numel() // BLOCK_SIZE)
        arrays = {}
        for key in fields:
            where = f"{name}[{key!r}]"
            if key.startswith("state"):
                arrays[key] = _codes(host_value(saved[key]), where, p.shape)
            elif key.startswith("absmax"):
                arrays[key] = float32_array(host_value(saved[key]), where, shape=(blocks,), nonnegative=True)
            else:
                arrays[key] = float32_array(host_value(saved[key]), where, shape=p.shape,
                                            nonnegative=key == "exp_avg_sq").reshape(-1)
        return int(value), arrays


def _codes(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A flat uint8 copy of an integer array of `shape` whose values are codes in [0, 255]."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an array of uint8 codes, got dtype {array.dtype}")
    if array.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {array.shape}")
    if array.size and (array.min() < 0 or array.max() > 255):
        raise ValueError(f"{name} holds values outside the 8-bit codes [0, 255]")
    return np.ascontiguousarray(array, dtype=np.uint8).reshape(-1)
