"""Rotary position embedding (csrc/ops/cpu_rope.c, rope.c; gputrain.functional.rotary_embedding,
rope_inv_freq) against NumPy references of Hugging Face's code (tests/_rope_reference.py): the
inverse frequencies ("default" and "llama3", float32), the rotation and its transpose bit for bit
in f32/f16/bf16 with PyTorch's roundings, partial rotary dims, packed positions, both layouts, in
place, finite differences, the sim backend, thread counts, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
import _rope_reference as rref
from gputrain import _C
from gputrain import _C_testing
from gputrain import functional as F

DTYPES = ["f32", "f16", "bf16"]
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
LLAMA32 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}


def randn(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def positions_for(batch, seq, seed=0, high=5000):
    return np.random.default_rng(seed).integers(0, high, size=(batch, seq)).astype(np.int64)


# --- inverse frequencies --------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim,theta", [(64, 10000.0), (128, 500000.0), (80, 1e6), (256, 10000.0)])
def test_default_inv_freq_is_hf_float32_formula(head_dim, theta):
    inv = F.rope_inv_freq(head_dim, theta)
    assert inv.dtype == np.float32 and inv.shape == (head_dim // 2,)
    assert ref.same_bits(inv, rref.inv_freq_default(head_dim, theta))
    # NumPy's float32 power (a powf within about 1 ulp, as PyTorch's Sleef powf is) agrees within
    # 2 ulps after the reciprocal: the table is HF's up to its powf's last bits.
    libm = rref.inv_freq_default(head_dim, theta, pow_in_double=False)
    assert np.all(np.abs(inv.view(np.int32) - libm.view(np.int32)) <= 2)
    assert inv[0] == 1.0 and np.all(np.diff(inv) < 0)


@pytest.mark.parametrize("scaling", [LLAMA31, LLAMA32])
def test_llama3_inv_freq_is_hf_float32_formula(scaling):
    inv = F.rope_inv_freq(128, 500000.0, rope_scaling=scaling)
    base = F.rope_inv_freq(128, 500000.0)
    expected = rref.inv_freq_llama3(base, scaling["factor"], scaling["low_freq_factor"],
                                    scaling["high_freq_factor"], scaling["original_max_position_embeddings"])
    assert ref.same_bits(inv, expected)
    wavelen = 2 * np.pi / base.astype(np.float64)
    high = wavelen < 8192 / 4.0
    low = wavelen > 8192 / 1.0
    assert high.any() and low.any() and (~high & ~low).any()  # all three bands are exercised
    assert ref.same_bits(inv[high], base[high])
    np.testing.assert_array_equal(inv[low], base[low] / np.float32(scaling["factor"]))
    medium = inv[~high & ~low]
    assert np.all((medium <= base[~high & ~low]) & (medium >= base[~high & ~low] / scaling["factor"]))


def test_partial_rotary_factor_sets_the_rotary_dim():
    inv = F.rope_inv_freq(80, 10000.0, partial_rotary_factor=0.5)
    assert ref.same_bits(inv, rref.inv_freq_default(40, 10000.0))
    assert F.rope_inv_freq(64, 10000.0, rope_scaling={"rope_type": "default"}).shape == (32,)


@pytest.mark.parametrize("kwargs,match", [
    ({"head_dim": 64, "theta": 0.0}, "rope_theta"),
    ({"head_dim": 64, "theta": 1e4, "partial_rotary_factor": 1.5}, "partial_rotary_factor"),
    ({"head_dim": 64, "theta": 1e4, "partial_rotary_factor": 0.3}, "partial_rotary_factor"),  # 19: odd
    ({"head_dim": 64, "theta": 1e4, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"head_dim": 64, "theta": 1e4, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"head_dim": 64, "theta": 1e4, "rope_scaling": dict(LLAMA31, high_freq_factor=0.5)}, "high_freq_factor"),
    ({"head_dim": 64, "theta": 1e4, "rope_scaling": dict(LLAMA31, factor=-1.0)}, "factor"),
])
def test_bad_inv_freq_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        F.rope_inv_freq(**kwargs)


# --- the rotation ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (32, 0.5), (80, 0.25)])
def test_forward_and_backward_are_hf_bits(dt, head_dim, partial):
    batch, heads, seq = 2, 3, 17
    inv = F.rope_inv_freq(head_dim, 10000.0, partial)
    x = ref.to_dtype(randn((batch, heads, seq, head_dim), 1), dt)
    pos = positions_for(batch, seq, 2)
    out = F.rotary_embedding(x, pos, inv)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert ref.same_bits(out, rref.apply(x, pos, inv, dt))
    din = F.rotary_embedding_backward(x, pos, inv)
    assert ref.same_bits(din, rref.apply(x, pos, inv, dt, backward=True))
    # Against float32 libm cos/sin (as PyTorch's cosf): within the half dtype's ulp, or 2e-6 in f32.
    libm = rref.apply(x, pos, inv, dt, f32_libm=True)
    ref.assert_close(out, ref.f64(libm), dt, rtol=2e-6 if dt == "f32" else 1.01 * ref.ULP[dt], atol=1e-6)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_bthd_layout_and_in_place_match_bhtd(dt):
    batch, heads, seq, dim = 2, 4, 9, 32
    inv = F.rope_inv_freq(dim, 10000.0)
    x = ref.to_dtype(randn((batch, heads, seq, dim), 3), dt)
    pos = positions_for(batch, seq, 4)
    expected = F.rotary_embedding(x, pos, inv)
    bthd = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    out = F.rotary_embedding(bthd, pos, inv, layout="bthd")
    assert ref.same_bits(np.ascontiguousarray(out.transpose(0, 2, 1, 3)), expected)
    returned = F.rotary_embedding(bthd, pos, inv, layout="bthd", in_place=True)
    assert returned.base is bthd or returned is bthd or np.shares_memory(returned, bthd)
    assert ref.same_bits(bthd, out)
    back = F.rotary_embedding_backward(bthd, pos, inv, layout="bthd", in_place=True)
    assert np.shares_memory(back, bthd)


def test_backward_undoes_forward_in_f32_and_is_the_transpose():
    inv = F.rope_inv_freq(16, 10000.0)
    x, g = randn((1, 2, 5, 16), 5), randn((1, 2, 5, 16), 6)
    pos = positions_for(1, 5, 7)
    y = F.rotary_embedding(x, pos, inv)
    np.testing.assert_allclose(F.rotary_embedding_backward(y, pos, inv), x, rtol=0, atol=1e-5)
    # <R x, g> = <x, R^T g>
    lhs = np.sum(ref.f64(y) * g)
    rhs = np.sum(ref.f64(x) * F.rotary_embedding_backward(g, pos, inv))
    assert abs(lhs - rhs) < 1e-4 * np.sum(np.abs(x) * np.abs(g))


def test_backward_matches_finite_differences():
    inv = F.rope_inv_freq(12, 10000.0, partial_rotary_factor=2 / 3)  # rotary 8 of 12
    x, dout = randn((2, 2, 3, 12), 8), randn((2, 2, 3, 12), 9)
    pos = positions_for(2, 3, 10, high=300)
    numeric = ref.numerical_grad(lambda z: rref.apply64(z, pos, inv), x, dout)
    ref.assert_grad(F.rotary_embedding_backward(dout, pos, inv), numeric, rtol=1e-5, atol=1e-6)


def test_positions_restart_per_packed_document_and_broadcast():
    inv = F.rope_inv_freq(16, 10000.0)
    x = randn((2, 1, 6, 16), 11)
    packed = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]], np.int64)
    out = F.rotary_embedding(x, packed, inv)
    assert ref.same_bits(out[0, :, 3:], F.rotary_embedding(np.ascontiguousarray(x[0:1, :, 3:]),
                                                           packed[:1, :3], inv)[0])
    assert ref.same_bits(out[0, :, 0], x[0, :, 0])  # position 0: cos 1, sin 0
    shared = F.rotary_embedding(x, packed[1:], inv)  # (1, seq): every batch entry
    assert ref.same_bits(shared[1], out[1])


def test_inputs_are_not_mutated_and_thread_counts_keep_the_bits():
    inv = F.rope_inv_freq(64, 10000.0)
    x = ref.to_dtype(randn((4, 8, 64, 64), 12), "bf16")
    pos = positions_for(4, 64, 13)
    saved = x.copy()
    with ref.num_threads(1):
        one = F.rotary_embedding(x, pos, inv)
    with ref.num_threads(2):
        two = F.rotary_embedding(x, pos, inv)
    assert ref.same_bits(one, two) and ref.same_bits(x, saved)


@pytest.mark.parametrize("backend", ["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("op", ["rope_forward", "rope_backward"])
def test_device_backends_give_the_cpu_bits(backend, dt, op):
    """sim runs the CPU op through the generated table; CUDA runs rope_kernel (the same GT_HD math:
    the same bits up to the double cos/sin's last ulp, rope_hd.h), where a GPU is present."""
    batch, heads, seq, dim, rotary = 2, 3, 5, 24, 16
    inv = F.rope_inv_freq(dim, 10000.0, rotary / dim)
    raw = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[dt]
    x = np.ascontiguousarray(ref.to_dtype(randn((batch, heads, seq, dim), 14), dt).view(raw))
    for rows in (1, batch):
        pos = positions_for(rows, seq, 15)
        outs = {}
        for name in ("cpu", backend):
            out = np.zeros_like(x)
            _C_testing.run_op(name, op, [x.copy(), out, pos, inv], (batch, heads, seq, dim, rotary, rows, dt))
            outs[name] = out
        assert ref.same_bits(outs["cpu"], outs[backend])
        assert ref.same_bits(outs["cpu"][..., rotary:], x[..., rotary:])


def test_bad_arguments_are_named_and_leave_x_unchanged():
    inv = F.rope_inv_freq(16, 10000.0)
    x = randn((1, 2, 3, 16))
    pos = positions_for(1, 3)
    saved = x.copy()
    with pytest.raises(ValueError, match="positions"):
        F.rotary_embedding(x, positions_for(2, 3), inv)
    with pytest.raises(ValueError, match="rotary_dim"):
        F.rotary_embedding(x, pos, F.rope_inv_freq(32, 10000.0))
    with pytest.raises(ValueError, match="layout"):
        F.rotary_embedding(x, pos, inv, layout="tbhd")
    with pytest.raises(ValueError, match="4-D"):
        F.rotary_embedding(x[0], pos, inv)
    with pytest.raises(TypeError, match="positions"):
        F.rotary_embedding(x, pos.astype(np.float32), inv)
    with pytest.raises(ValueError, match="in place"):
        F.rotary_embedding(x[:, :, :, :8].copy().transpose(0, 1, 3, 2), pos, F.rope_inv_freq(4, 1e4),
                           in_place=True)
    buffer = np.zeros(2 * x.size, np.float32)
    first, shifted = buffer[:x.size].reshape(x.shape), buffer[8:8 + x.size].reshape(x.shape)
    with pytest.raises(ValueError, match="overlap"):
        _C.op_rope(shifted, first, pos, inv, "f32", 1)
    assert ref.same_bits(x, saved)
