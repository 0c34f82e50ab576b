"""LLM.int8's weight format (bitsandbytes' Int8Params / int8_vectorwise_quant, threshold 0): int8
codes and one float32 absmax per row. NumPy only (no C op yet)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gputrain.quant import blockwise, reference


def int8_vectorwise_quant(w: Any) -> tuple[np.ndarray, np.ndarray]:
    """(int8 codes, float32 row absmax) of a 2-D float array: round_half_even(w * (127 / absmax))
    per row; a zero row gives codes 0 and absmax 0 (as bitsandbytes' NaN cast gives)."""
    values, dt = blockwise.prepared(w, "w")
    if values.ndim != 2:
        raise ValueError(f"w must be 2-D (rows, cols), got shape {values.shape}")
    f32 = values if dt == "f32" else reference.half_bits_to_f32(values, dt)
    return reference.int8_rowwise(f32)


def int8_vectorwise_dequant(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """float32 (q * scale) * (1 / 127) per row, as bitsandbytes' int8_vectorwise_dequant rounds it."""
    q, scale = np.asarray(q), np.asarray(scale)
    if q.dtype != np.int8 or q.ndim != 2:
        raise ValueError(f"q must be a 2-D int8 array, got {q.dtype} {q.shape}")
    if scale.dtype != np.float32 or scale.shape != (q.shape[0],):
        raise ValueError(f"scale must be float32 of shape ({q.shape[0]},), got {scale.dtype} {scale.shape}")
    return reference.int8_rowwise_dequantize(q, scale)
