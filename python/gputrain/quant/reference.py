"""NumPy reference of bitsandbytes' quantization formats, written from bitsandbytes 0.50's CPU
backend (backends/default/ops.py and backends/cpu/ops.py) and checked against its outputs
(tests/test_quant.py). Every function works on f32 values and on raw half bit patterns; the C path
(gputrain.quant.fast) must give the same bits.

Blockwise quantization of n values with blocksize B (bitsandbytes' quantize_blockwise and
quantize_4bit): per block b, absmax[b] = max |x| in f32; the scaled value is
clamp(x * f32(1 / max(absmax, 1e-38)), -1, 1) in a full block and clamp(x / max(absmax, 1e-38), -1, 1)
in a last, partial block (bitsandbytes multiplies by the reciprocal in one and divides in the other,
and stores the partial block's absmax clamped to 1e-38, a full block's unclamped);
its code is order[i] for the i with bounds[i - 1] < scaled <= bounds[i] (torch.bucketize over the
midpoints of the sorted code). 4-bit codes are packed two per byte, the even element in the high
nibble; an odd count is padded with one zero scaled value. Dequantization is
dt(f32(code[q] * absmax[b])).
"""

from __future__ import annotations

import numpy as np

from gputrain.quant.codes import sorted_bounds

_TINY = np.float32(1e-38)


def f32_to_half_bits(x: np.ndarray, dt: str) -> np.ndarray:
    """Round f32 values to f16 or bf16 (round to nearest even) and return their uint16 bits."""
    x = np.ascontiguousarray(x, np.float32)
    if dt == "f16":
        return x.astype(np.float16).view(np.uint16)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    quiet = (u >> 16) | 0x40
    return np.where(np.isnan(x), quiet, rounded).astype(np.uint16)


def half_bits_to_f32(b: np.ndarray, dt: str) -> np.ndarray:
    """uint16 bit patterns of f16 or bf16 values as f32 (exact)."""
    b = np.ascontiguousarray(b, np.uint16)
    if dt == "f16":
        return b.view(np.float16).astype(np.float32)
    return (b.astype(np.uint32) << 16).view(np.float32)


def _scaled_blocks(x: np.ndarray, blocksize: int) -> tuple[np.ndarray, np.ndarray]:
    """(scaled values in [-1, 1], absmax per block) of flat f32 x, as bitsandbytes computes them."""
    n = x.size
    full = n - n % blocksize
    blocks = x[:full].reshape(-1, blocksize)
    absmax = np.abs(blocks).max(axis=1) if full else np.zeros(0, np.float32)
    inv = (np.float32(1) / np.maximum(absmax, _TINY)).astype(np.float32)
    scaled = np.clip(blocks * inv[:, None], -1, 1).reshape(-1)
    if full < n:
        am = np.maximum(np.abs(x[full:]).max(), _TINY)
        absmax = np.append(absmax, am).astype(np.float32)
        scaled = np.concatenate([scaled, np.clip(x[full:] / am, -1, 1)])
    return scaled.astype(np.float32), absmax.astype(np.float32)


def _encode(scaled: np.ndarray, code: np.ndarray) -> np.ndarray:
    bounds, order = sorted_bounds(code)
    return order[np.searchsorted(bounds, scaled, side="left")]


def quantize_blockwise(x: np.ndarray, code: np.ndarray, blocksize: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 codes, f32 absmax) of flat f32 x with an 8-bit code (256 sorted values)."""
    scaled, absmax = _scaled_blocks(np.ascontiguousarray(x, np.float32).reshape(-1), blocksize)
    return _encode(scaled, code), absmax


def dequantize_blockwise(q: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int) -> np.ndarray:
    """f32 values code[q] * absmax of their block."""
    q = np.asarray(q, np.uint8).reshape(-1)
    scale = np.repeat(np.asarray(absmax, np.float32), blocksize)[: q.size]
    return (code[q] * scale).astype(np.float32)


def quantize_4bit(x: np.ndarray, code: np.ndarray, blocksize: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed uint8 of ceil(n / 2) bytes, f32 absmax) of flat f32 x with a 16-entry code."""
    scaled, absmax = _scaled_blocks(np.ascontiguousarray(x, np.float32).reshape(-1), blocksize)
    if scaled.size % 2:
        scaled = np.append(scaled, np.float32(0))
    q = _encode(scaled, code)
    return ((q[0::2] << 4) | q[1::2]).astype(np.uint8), absmax


def dequantize_4bit(packed: np.ndarray, absmax: np.ndarray, code: np.ndarray, blocksize: int,
                    n: int) -> np.ndarray:
    """The first n f32 values of packed 4-bit codes: code[q] * absmax of their block."""
    p = np.asarray(packed, np.uint8).reshape(-1)
    q = np.empty(2 * p.size, np.uint8)
    q[0::2], q[1::2] = p >> 4, p & 0xF
    return dequantize_blockwise(q[:n], absmax, code, blocksize)


def int8_rowwise(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LLM.int8's weight format (bitsandbytes' int8_vectorwise_quant, threshold 0) of a 2-D f32
    array: scale[r] = max |w[r]| (f32), q = round_half_even(w * m[r]) as int8 with m[r] =
    f32(f32(1 / scale[r]) * 127), as torch computes bitsandbytes' 127.0 / scale (a scalar divided
    by a tensor is its reciprocal times the scalar; f32(127 / scale) differs in the last bit for
    a quarter of random rows); a zero row has scale 0 and codes 0 (0 * inf = NaN, cast to int8 as 0)."""
    w = np.asarray(w, np.float32)
    scale = np.abs(w).max(axis=1).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        mult = ((np.float32(1) / scale).astype(np.float32) * np.float32(127)).astype(np.float32)
        q = np.rint(w * mult[:, None])
    return np.nan_to_num(q, nan=0.0).astype(np.int8), scale


def int8_rowwise_dequantize(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """f32 w ~ q * scale / 127 as bitsandbytes' int8_vectorwise_dequant computes it:
    f32(f32(q * scale) * f32(7.874015718698502e-3))."""
    prod = (np.asarray(q, np.int8).astype(np.float32) * np.asarray(scale, np.float32)[:, None]).astype(np.float32)
    return (prod * np.float32(7.874015718698502e-3)).astype(np.float32)
