"""The CUDA attention kernels' arithmetic, run on the host: tests/_attention_harness.c (compiled
here with the system C compiler) runs the per-thread functions of csrc/ops/attention_hd.h -- the
code every thread of cuda/ops_attention.cu runs -- over the kernels' whole grid. Checked against
the CPU op (the same bits: the kernels repeat its operations in its order) and the float64
reference, causal or not, with key lengths, dropout, head_dim 32/64/80/96 (each of the CPU's
register blocks of tile products: 4 x 64, 4 x 32, and any), sequence lengths that are not
multiples of the 64-row tiles, f32/f16/bf16, and the layer's strided (B, T, 3, H, D) layout.
No GPU is needed; the CUDA op itself is compared with the CPU op in tests/test_cuda_attention.py
where a GPU is present."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

import _attention_reference as aref
import _c_harness
import _reference as ref
from gputrain import functional as F

DT_CODES = {"f32": 0, "f16": 1, "bf16": 2}
SHAPES = [(1, 1, 1, 32), (2, 3, 17, 32), (1, 2, 64, 64), (2, 2, 65, 80), (1, 1, 130, 64),
          (2, 1, 70, 96)]


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    so = _c_harness.build("_attention_harness.c", tmp_path_factory.mktemp("harness"))
    so.gt_harness_attention.restype = ctypes.c_int
    return so.gt_harness_attention


def pointer(array):
    return ctypes.c_void_p(0 if array is None else array.ctypes.data)


def int64s(*values):
    return (ctypes.c_int64 * len(values))(*values)


def run(harness, q, k, v, out, lse, dt, *, head_dim, in_strides, out_strides, causal=False,
        lengths=None, dropout_p=0.0, key=(0, 0, 0, 0), dout=None, grads=(None, None, None),
        kv_heads=None, kv_strides=None, window=0, key_starts=None, scale=None):
    """One harness call on raw buffers: q (and dq) at `in_strides`, k, v (and dk, dv) at
    `kv_strides` (default: in_strides; kv_heads default: heads), out (and dout) at `out_strides`,
    in elements; (B, H, T) is lse's shape; the scale defaults to functional's."""
    batch, heads, seq = lse.shape
    lengths = None if lengths is None else np.ascontiguousarray(lengths, np.int64)
    starts = None if key_starts is None else np.ascontiguousarray(key_starts, np.int64)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    status = harness(
        ctypes.c_int(dout is not None),
        int64s(batch, heads, seq, head_dim, heads if kv_heads is None else kv_heads), pointer(q),
        pointer(k), pointer(v), pointer(out), pointer(lse), pointer(dout), *map(pointer, grads),
        int64s(*in_strides), int64s(*(in_strides if kv_strides is None else kv_strides)),
        int64s(*out_strides), ctypes.c_float(scale), ctypes.c_int(causal), pointer(lengths),
        ctypes.c_int64(window), pointer(starts), ctypes.c_double(dropout_p),
        (ctypes.c_uint64 * 4)(*key), ctypes.c_int(DT_CODES[dt]))
    assert status == 0


def contiguous(harness, q, k, v, dt, **options):
    """(out, lse) and, with `dout`, (dq, dk, dv) of contiguous (B, H, T, D) operands."""
    batch, heads, seq, dim = q.shape
    strides = (heads * seq * dim, seq * dim, dim)
    out = np.zeros_like(q)
    lse = np.zeros((batch, heads, seq), np.float32)
    dout = options.pop("dout", None)
    fwd_out = options.pop("out", None)
    fwd_lse = options.pop("lse", None)
    if dout is None:
        run(harness, q, k, v, out, lse, dt, head_dim=dim, in_strides=strides, out_strides=strides, **options)
        return out, lse
    grads = tuple(np.full_like(q, np.nan) for _ in range(3))
    run(harness, q, k, v, fwd_out, fwd_lse, dt, head_dim=dim, in_strides=strides, out_strides=strides,
        dout=dout, grads=grads, **options)
    return grads


def qkv(shape, dt, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(ref.to_dtype(rng.standard_normal(shape), dt) for _ in range(4))


def compare_with_cpu_op(harness, shape, dt, causal, lengths, dropout_p):
    q, k, v, dout = qkv(shape, dt, seed=shape[2])
    key = dict(seed=77, layer=2, step=5, offset=3 * shape[2])
    options = dict(causal=causal, lengths=lengths, dropout_p=dropout_p, key=tuple(key.values()))
    cpu_options = dict(causal=causal, key_lengths=lengths, dropout_p=dropout_p, **key)
    out, lse = contiguous(harness, q, k, v, dt, **options)
    cpu_out, cpu_lse = F.scaled_dot_product_attention(q, k, v, **cpu_options)
    assert ref.same_bits(out, cpu_out), "out"
    assert ref.same_bits(lse, cpu_lse), "lse"
    grads = contiguous(harness, q, k, v, dt, dout=dout, out=out, lse=lse, **options)
    cpu_grads = F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, **cpu_options)
    for name, got, want in zip("qkv", grads, cpu_grads):
        assert ref.same_bits(got, want), f"d{name}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked, dropout_p", [(False, 0.0), (True, 0.0), (True, 0.2)])
def test_device_math_gives_the_cpu_ops_bits(harness, shape, causal, masked, dropout_p):
    lengths = np.random.default_rng(1).integers(1, shape[2] + 1, size=shape[0]) if masked else None
    compare_with_cpu_op(harness, shape, "f32", causal, lengths, dropout_p)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_device_math_in_half_precision_gives_the_cpu_ops_bits(harness, dt, causal):
    compare_with_cpu_op(harness, (2, 2, 70, 80), dt, causal, np.array([70, 0]), 0.1)


@pytest.mark.parametrize("causal", [False, True])
def test_device_math_matches_the_float64_reference(harness, causal):
    shape = (2, 2, 67, 64)
    q, k, v, dout = qkv(shape, "f32", seed=21)
    lengths = np.array([67, 40])
    p, key = 0.25, (9, 1, 4, 0)
    mult = aref.multipliers(shape, p, *key)
    out, lse = contiguous(harness, q, k, v, "f32", causal=causal, lengths=lengths, dropout_p=p, key=key)
    ref_out, ref_lse = aref.attention(q, k, v, causal, lengths, mult=mult)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6, atol=2e-6)
    grads = contiguous(harness, q, k, v, "f32", dout=dout, out=out, lse=lse, causal=causal,
                       lengths=lengths, dropout_p=p, key=key)
    want = aref.attention_backward(dout, q, k, v, causal, lengths, mult=mult)
    for name, got, ref_grad in zip("qkv", grads, want):
        np.testing.assert_allclose(got, ref_grad, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_the_layers_fused_layout_is_read_and_written_in_place(harness, dt):
    """The layer passes its (B, T, 3, H, D) projection and (B, T, H, D) output with strides: the
    results are those of the same operands made contiguous, and nothing outside them is written."""
    batch, seq, heads, dim = 2, 70, 3, 32
    embed = heads * dim
    rng = np.random.default_rng(5)
    fused = ref.to_dtype(rng.standard_normal((batch, seq, 3, heads, dim)), dt)
    dout = ref.to_dtype(rng.standard_normal((batch, seq, heads, dim)), dt)
    q, k, v = (np.ascontiguousarray(fused[:, :, n].transpose(0, 2, 1, 3)) for n in range(3))
    options = dict(causal=True, lengths=np.array([70, 33]), dropout_p=0.1, key=(3, 1, 2, 0))
    want_out, want_lse = contiguous(harness, q, k, v, dt, **options)
    want_grads = contiguous(harness, q, k, v, dt, dout=np.ascontiguousarray(dout.transpose(0, 2, 1, 3)),
                            out=want_out, lse=want_lse, **options)

    in_strides, out_strides = (seq * 3 * embed, dim, 3 * embed), (seq * embed, dim, embed)
    flat = fused.reshape(-1)
    out = np.full((batch, seq, heads, dim), np.nan, fused.dtype)
    lse = np.zeros((batch, heads, seq), np.float32)
    run(harness, flat, flat[embed:], flat[2 * embed:], out, lse, dt, head_dim=dim, in_strides=in_strides,
        out_strides=out_strides, **options)
    assert ref.same_bits(out.transpose(0, 2, 1, 3), want_out) and ref.same_bits(lse, want_lse)
    din = np.full_like(fused, np.nan).reshape(-1)
    run(harness, flat, flat[embed:], flat[2 * embed:], out, lse, dt, head_dim=dim, in_strides=in_strides,
        out_strides=out_strides, dout=dout, grads=(din, din[embed:], din[2 * embed:]), **options)
    din = din.reshape(fused.shape)
    for n, want in enumerate(want_grads):
        assert ref.same_bits(din[:, :, n].transpose(0, 2, 1, 3), want), "dqkv"[n]
