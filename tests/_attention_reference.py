"""Float64 NumPy reference of scaled dot-product attention (explicit softmax over the whole
(seq, seq) score matrix), written from the math independently of csrc/ops/cpu_attention.c."""

from __future__ import annotations

import numpy as np

import _reference as ref


def visible(batch: int, seq: int, causal: bool, key_lengths: np.ndarray | None,
            window: int = 0, key_starts: np.ndarray | None = None) -> np.ndarray:
    """(batch, 1, seq, seq) bool: query i of entry b sees key j (transformers' masks: causal
    j <= i, sliding window j > i - window, padding j < key_lengths[b], segments j >=
    key_starts[b, i])."""
    i, j = np.arange(seq)[:, None], np.arange(seq)[None, :]
    lengths = np.full(batch, seq) if key_lengths is None else np.asarray(key_lengths)
    mask = np.broadcast_to(j[None] < lengths[:, None, None], (batch, seq, seq)).copy()
    if causal:
        mask &= j <= i
    if window:
        mask &= j > i - window
    if key_starts is not None:
        mask &= j[None] >= np.asarray(key_starts)[:, :, None]
    return mask[:, None]


def repeat_kv(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, K, T, D) -> (B, H, T, D): kv head g serves query heads [g H / K, (g + 1) H / K)
    (transformers' repeat_kv)."""
    return np.repeat(x, heads // x.shape[1], axis=1)


def sum_groups(x: np.ndarray, kv_heads: int) -> np.ndarray:
    """(B, H, T, D) per-query-head gradients of repeated k or v -> (B, K, T, D)."""
    b, h, t, d = x.shape
    return x.reshape(b, kv_heads, h // kv_heads, t, d).sum(axis=2)


def multipliers(shape: tuple[int, int, int, int], p: float, seed: int, layer: int = 0,
                step: int = 0, offset: int = 0) -> np.ndarray:
    """(batch, heads, seq, seq) dropout multipliers of the probabilities (element
    offset + ((b * heads + h) * seq + i) * seq + j under the rule of csrc/core/dropout.h)."""
    batch, heads, seq, _ = shape
    if p == 0:
        return np.ones((batch, heads, seq, seq))
    keep = ref.dropout_mask(batch * heads * seq * seq, p, seed, layer, step, offset)
    scale = float(np.float32(1.0) / np.float32(1.0 - p)) if p < 1 else 0.0
    return keep.reshape(batch, heads, seq, seq) * scale


def probabilities(q, k, scale, mask):
    """Softmax of the visible scaled scores (rows that see nothing are 0) and each row's lse."""
    s = np.einsum("bhid,bhjd->bhij", ref.f64(q), ref.f64(k)) * scale
    s = np.where(mask, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(mask, np.exp(s - top), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    p = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    with np.errstate(divide="ignore"):
        lse = np.where(total[..., 0] > 0, np.log(total[..., 0]) + top[..., 0], -np.inf)
    return p, lse


def attention(q, k, v, causal=False, key_lengths=None, scale=None, mult=None, window=0,
              key_starts=None):
    """(out, lse) in float64; mult: dropout multipliers of the probabilities, or None. k and v may
    have fewer heads than q (grouped-query attention)."""
    batch, heads, seq, dim = q.shape
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    k, v = repeat_kv(ref.f64(k), heads), repeat_kv(ref.f64(v), heads)
    p, lse = probabilities(q, k, scale, visible(batch, seq, causal, key_lengths, window, key_starts))
    pm = p if mult is None else p * mult
    return pm @ v, lse


def attention_backward(dout, q, k, v, causal=False, key_lengths=None, scale=None, mult=None,
                       window=0, key_starts=None):
    """(dq, dk, dv) in float64 from the explicit softmax Jacobian; dk and dv of a kv head sum its
    query heads' terms."""
    batch, heads, seq, dim = q.shape
    kv_heads = k.shape[1]
    scale = 1.0 / np.sqrt(dim) if scale is None else scale
    k, v = repeat_kv(ref.f64(k), heads), repeat_kv(ref.f64(v), heads)
    p, _ = probabilities(q, k, scale, visible(batch, seq, causal, key_lengths, window, key_starts))
    m = np.ones_like(p) if mult is None else mult
    dout = ref.f64(dout)
    dv = np.swapaxes(p * m, -1, -2) @ dout
    dp = (dout @ np.swapaxes(v, -1, -2)) * m
    ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))
    dk = scale * np.swapaxes(ds, -1, -2) @ ref.f64(q)
    return scale * ds @ k, sum_groups(dk, kv_heads), sum_groups(dv, kv_heads)
