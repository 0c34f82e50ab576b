"""NumPy references of the rotary position embedding, written from Hugging Face's transformers
code (modeling_rope_utils.py: _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters,
_compute_llama3_parameters, _compute_yarn_parameters;
modeling_llama.py: LlamaRotaryEmbedding, rotate_half, apply_rotary_pos_emb) in float32 with
PyTorch's roundings, independently of the C code."""

from __future__ import annotations

import math

import numpy as np

import _reference as ref

F32 = np.float32


def inv_freq_default(rotary_dim: int, theta: float, pow_in_double: bool = True) -> np.ndarray:
    """1.0 / (base ** (arange(0, dim, 2).float() / dim)) in float32: the power as a double rounded
    once (pow_in_double), or NumPy's float32 power (its libm's powf)."""
    exponent = np.arange(0, rotary_dim, 2).astype(F32) / F32(rotary_dim)
    if pow_in_double:
        power = np.power(np.float64(F32(theta)), exponent.astype(np.float64)).astype(F32)
    else:
        power = np.power(F32(theta), exponent)
    return (F32(1.0) / power).astype(F32)


def inv_freq_llama3(inv_freq: np.ndarray, factor: float, low_freq_factor: float,
                    high_freq_factor: float, old_context_len: float) -> np.ndarray:
    """_compute_llama3_parameters on a float32 inv_freq, with PyTorch's float32 arithmetic:
    `scalar / tensor` is tensor.reciprocal() * scalar, Python floats are cast to float32."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = (F32(1.0) / inv_freq) * F32(2 * math.pi)
    inv_freq_llama = np.where(wavelen > F32(low_freq_wavelen), inv_freq / F32(factor), inv_freq)
    smooth_factor = ((F32(1.0) / wavelen) * F32(old_context_len) - F32(low_freq_factor)) / \
        F32(high_freq_factor - low_freq_factor)
    smoothed = ((F32(1.0) - smooth_factor) * inv_freq_llama) / F32(factor) + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < F32(high_freq_wavelen)) & ~(wavelen > F32(low_freq_wavelen))
    return np.where(is_medium, smoothed, inv_freq_llama).astype(F32)


def inv_freq_linear(rotary_dim: int, theta: float, factor: float) -> np.ndarray:
    """_compute_linear_scaling_rope_parameters: the default inv_freq, then `inv_freq /= factor`
    (a float32 division by the float32 factor)."""
    return (inv_freq_default(rotary_dim, theta) / F32(factor)).astype(F32)


def inv_freq_yarn(rotary_dim: int, theta: float, factor: float, original_max: float, beta_fast: float = 32.0,
                  beta_slow: float = 1.0, truncate: bool = True) -> np.ndarray:
    """_compute_yarn_parameters' inv_freq: the correction range in Python floats (math), the ramp
    and the blend in float32 (Python scalars cast to float32; `1.0 / t` is t.reciprocal())."""
    dim = rotary_dim
    pos_freqs = np.power(np.float64(F32(theta)), (np.arange(0, dim, 2).astype(F32) / F32(dim)).astype(np.float64))
    pos_freqs = pos_freqs.astype(F32)
    extrapolation = (F32(1.0) / pos_freqs).astype(F32)
    interpolation = (F32(1.0) / (F32(factor) * pos_freqs)).astype(F32)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = (np.arange(dim // 2, dtype=F32) - F32(low)) / F32(high - low)
    keep = (F32(1) - np.clip(ramp, F32(0), F32(1))).astype(F32)
    return (interpolation * (F32(1) - keep) + extrapolation * keep).astype(F32)


def cos_sin(positions: np.ndarray, inv_freq: np.ndarray, dt: str, f32_libm: bool = False,
            attention_factor: float = 1.0):
    """LlamaRotaryEmbedding: (cos, sin) of shape (B, T, R), computed in float32, multiplied by
    attention_factor (its attention_scaling) in float32 and cast to dt. The f32 angle's cos/sin
    are taken in float64 and rounded (the op's definition), or with NumPy's float32 cos/sin
    (f32_libm)."""
    freqs = positions[:, :, None].astype(F32) * inv_freq[None, None, :]  # (B, T, R/2), f32
    emb = np.concatenate([freqs, freqs], axis=-1)
    if f32_libm:
        cos, sin = np.cos(emb), np.sin(emb)
    else:
        cos, sin = np.cos(emb.astype(np.float64)).astype(F32), np.sin(emb.astype(np.float64)).astype(F32)
    cos, sin = (cos * F32(attention_factor)).astype(F32), (sin * F32(attention_factor)).astype(F32)
    return ref.to_dtype(cos, dt), ref.to_dtype(sin, dt)


def _round(x: np.ndarray, dt: str) -> np.ndarray:
    """x (float32) rounded to dt and widened back: one PyTorch op's result in dt."""
    return ref.to_dtype(x, dt).astype(F32)


def rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray, dt: str, backward: bool = False,
          f32_libm: bool = False, attention_factor: float = 1.0) -> np.ndarray:
    """apply_rotary_pos_emb on x (B, H, T, D) of dtype dt (partial rotary: the first R elements
    rotate, the rest pass through), or (backward) autograd's gradient of it for dout = x:
    dout * cos + rotate_half^T(dout * sin). Each PyTorch op rounds to dt."""
    rotary = 2 * inv_freq.shape[0]
    cos, sin = cos_sin(positions, inv_freq, dt, f32_libm, attention_factor)
    cos, sin = cos[:, None].astype(F32), sin[:, None].astype(F32)  # unsqueeze(1): over heads
    xr, passed = x[..., :rotary].astype(F32), x[..., rotary:]
    if not backward:
        rotated = _round(xr * cos, dt) + _round(rotate_half(xr) * sin, dt)
    else:
        g_sin = _round(xr * sin, dt)
        half = rotary // 2
        transposed = np.concatenate([g_sin[..., half:], -g_sin[..., :half]], axis=-1)  # rotate_half^T
        rotated = _round(xr * cos, dt) + transposed
    return np.concatenate([ref.to_dtype(rotated, dt), passed], axis=-1)


def apply64(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """The rotation in float64 (no rounding but the f32 angle's): for finite differences."""
    rotary = 2 * inv_freq.shape[0]
    freqs = (positions[:, :, None].astype(F32) * inv_freq[None, None, :]).astype(np.float64)
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None]
    xr = x[..., :rotary]
    return np.concatenate([xr * np.cos(emb) + rotate_half(xr) * np.sin(emb), x[..., rotary:]], axis=-1)
