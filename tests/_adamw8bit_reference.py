"""NumPy reference of 8-bit AdamW (gputrain.optim.AdamW8bit, csrc/ops/adamw8bit_hd.h): the same
float32 operations in the same order, each rounded once (NumPy's float32 arithmetic has no FMA),
and the same blockwise quantization of the moments with bitsandbytes' dynamic maps."""

from __future__ import annotations

import numpy as np

from gputrain.quant.codes import DYNAMIC_SIGNED, DYNAMIC_UNSIGNED, sorted_bounds

BLOCK = 256
TINY = np.float32(1e-38)
F32 = np.float32


def scalars(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
            grad_coef: float = 1.0) -> dict[str, np.float32]:
    """The float32 constants of update `step` (>= 1), made in float64 as core/adamw.h makes them."""
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    return {"coef": F32(grad_coef), "decay": F32(1.0 - lr * weight_decay), "beta1": F32(beta1),
            "one_minus_beta1": F32(1.0 - beta1), "beta2": F32(beta2), "one_minus_beta2": F32(1.0 - beta2),
            "bc2_sqrt": F32(bc2 ** 0.5), "eps": F32(eps), "neg_step": F32(-(lr / bc1))}


def quantize(x: np.ndarray, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, absmax) of x in blocks of 256: nearest value of the sorted map (bucketize over the
    midpoints) of x * f32(1 / absmax) in a full block, x / max(absmax, 1e-38) in a short one."""
    bounds, order = sorted_bounds(code)
    codes = np.empty(x.size, np.uint8)
    absmax = np.empty(-(-x.size // BLOCK), np.float32)
    for b in range(absmax.size):
        block = x[b * BLOCK:(b + 1) * BLOCK]
        amax = np.abs(block).max()
        divisor = amax if amax > TINY else TINY
        partial = block.size < BLOCK
        scaled = block / divisor if partial else block * (F32(1) / divisor)
        scaled = np.clip(scaled, F32(-1), F32(1))
        codes[b * BLOCK:b * BLOCK + block.size] = order[np.searchsorted(bounds, scaled, side="left")]
        absmax[b] = divisor if partial else amax
    return codes, absmax


def dequantize(codes: np.ndarray, absmax: np.ndarray, code: np.ndarray) -> np.ndarray:
    return code[codes] * np.repeat(absmax, BLOCK)[:codes.size]


def step8(p: np.ndarray, g: np.ndarray, state: dict[str, np.ndarray], s: dict[str, np.float32]) -> None:
    """One update of a flat float32 parameter p (in place) and its 8-bit state
    {"state1", "state2", "absmax1", "absmax2"} (replaced)."""
    m = dequantize(state["state1"], state["absmax1"], DYNAMIC_SIGNED)
    v = dequantize(state["state2"], state["absmax2"], DYNAMIC_UNSIGNED)
    g = g * s["coef"]
    m = m * s["beta1"] + s["one_minus_beta1"] * g
    v = v * s["beta2"] + (s["one_minus_beta2"] * g) * g
    param = p * s["decay"]
    denom = np.sqrt(v) / s["bc2_sqrt"] + s["eps"]
    p[...] = param + (s["neg_step"] * m) / denom
    state["state1"], state["absmax1"] = quantize(m, DYNAMIC_SIGNED)
    state["state2"], state["absmax2"] = quantize(v, DYNAMIC_UNSIGNED)


def initial_state(numel: int) -> dict[str, np.ndarray]:
    """bitsandbytes' initial state: codes 0 and absmax 0."""
    blocks = -(-numel // BLOCK)
    return {"state1": np.zeros(numel, np.uint8), "state2": np.zeros(numel, np.uint8),
            "absmax1": np.zeros(blocks, np.float32), "absmax2": np.zeros(blocks, np.float32)}
