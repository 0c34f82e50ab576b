"""CPU fused attention (csrc/ops/cpu_attention.c) through gputrain.functional against a float64
NumPy reference with an explicit softmax: causal or not, key-length masks, sizes that are not
multiples of the 64-row tiles, dropout (the exact Philox mask and forward/backward agreement),
finite differences, half precision, and the same bits for any thread count or SIMD level."""

from __future__ import annotations

import numpy as np
import pytest

import _attention_reference as aref
import _reference as ref
from gputrain import functional as F

SHAPES = [(1, 1, 1, 32), (2, 3, 17, 32), (1, 2, 64, 64), (2, 2, 65, 80), (1, 1, 130, 64)]


def qkv(shape, seed=0, scale=1.0):
    rng = np.random.default_rng(seed)
    return tuple((rng.standard_normal(shape) * scale).astype(np.float32) for _ in range(3))


def lengths_for(batch, seq, seed=1):
    return np.random.default_rng(seed).integers(1, seq + 1, size=batch)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_forward_and_backward_match_reference(shape, causal, masked):
    q, k, v = qkv(shape, seed=shape[2])
    lengths = lengths_for(shape[0], shape[2]) if masked else None
    out, lse = F.scaled_dot_product_attention(q, k, v, causal=causal, key_lengths=lengths)
    ref_out, ref_lse = aref.attention(q, k, v, causal, lengths)
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6, atol=2e-6)
    dout = qkv(shape, seed=99)[0]
    grads = F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                    key_lengths=lengths)
    for name, got, want in zip("qkv", grads, aref.attention_backward(dout, q, k, v, causal, lengths)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")


def test_scale_argument_and_default():
    q, k, v = qkv((1, 2, 9, 32), seed=3)
    out, _ = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    np.testing.assert_allclose(out, aref.attention(q, k, v, scale=0.3)[0], rtol=1e-5, atol=2e-6)
    default, _ = F.scaled_dot_product_attention(q, k, v)
    explicit, _ = F.scaled_dot_product_attention(q, k, v, scale=1 / np.sqrt(32))
    assert ref.same_bits(default, explicit)


def test_query_that_sees_no_key_gives_zero_output_and_gradient():
    q, k, v = qkv((2, 1, 5, 32), seed=4)
    lengths = np.array([0, 3])
    out, lse = F.scaled_dot_product_attention(q, k, v, key_lengths=lengths)
    assert np.all(out[0] == 0) and np.all(lse[0] == -np.inf) and np.all(np.isfinite(out[1]))
    dq, dk, dv = F.scaled_dot_product_attention_backward(np.ones_like(q), q, k, v, out, lse,
                                                         key_lengths=lengths)
    assert np.all(dq[0] == 0) and np.all(dk[0] == 0) and np.all(dv[0] == 0)
    assert np.all(dk[1, :, 3:] == 0) and np.all(dv[1, :, 3:] == 0)  # keys nobody sees


def test_large_scores_do_not_overflow():
    q, k, v = qkv((1, 1, 70, 32), seed=5, scale=30.0)  # scores of order 1e3: exp needs the max shift
    out, lse = F.scaled_dot_product_attention(q, k, v, causal=True)
    ref_out, ref_lse = aref.attention(q, k, v, True)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6)


# --- finite differences --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_finite_differences(causal):
    shape = (1, 2, 7, 32)
    q, k, v = qkv(shape, seed=6)
    lengths = np.array([6])
    dout = qkv(shape, seed=7)[0]
    out, lse = F.scaled_dot_product_attention(q, k, v, causal=causal, key_lengths=lengths)
    grads = F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                    key_lengths=lengths)
    inputs = [ref.f64(q), ref.f64(k), ref.f64(v)]
    for index, got in enumerate(grads):
        def f(x, index=index):
            args = list(inputs)
            args[index] = x
            return aref.attention(*args, causal, lengths)[0]
        ref.assert_grad(got, ref.numerical_grad(f, inputs[index], ref.f64(dout)), rtol=1e-4,
                        atol=1e-5, err_msg="qkv"[index])


# --- dropout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [320, 323])  # a row's first key on a Philox group's start, or not
def test_dropout_multipliers_follow_the_philox_rule(offset):
    # q = 0: every visible key gets probability 1/n; v = identity: out[i, j] = M[i, j] / n.
    batch, heads, seq, p = 2, 2, 64, 0.3
    q = np.zeros((batch, heads, seq, seq), np.float32)
    v = np.broadcast_to(np.eye(seq, dtype=np.float32), q.shape).copy()
    key = dict(seed=1234, layer=3, step=7, offset=offset)
    out, _ = F.scaled_dot_product_attention(q, q, v, dropout_p=p, **key)
    expected = aref.multipliers(q.shape, p, **key)
    np.testing.assert_allclose(out * seq, expected, rtol=1e-6)
    kept = np.mean(expected > 0)
    assert abs(kept - (1 - p)) < 4 * np.sqrt(p * (1 - p) / expected.size)


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_forward_and_backward_use_one_mask(causal):
    shape, p = (2, 2, 33, 32), 0.25
    q, k, v = qkv(shape, seed=8)
    lengths = np.array([33, 20])
    key = dict(seed=99, layer=1, step=2, offset=0)
    mult = aref.multipliers(shape, p, **key)
    out, lse = F.scaled_dot_product_attention(q, k, v, causal=causal, key_lengths=lengths,
                                              dropout_p=p, **key)
    np.testing.assert_allclose(out, aref.attention(q, k, v, causal, lengths, mult=mult)[0],
                               rtol=1e-5, atol=1e-5)
    dout = qkv(shape, seed=9)[0]
    grads = F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, causal=causal,
                                                    key_lengths=lengths, dropout_p=p, **key)
    want = aref.attention_backward(dout, q, k, v, causal, lengths, mult=mult)
    for name, got, ref_grad in zip("qkv", grads, want):
        np.testing.assert_allclose(got, ref_grad, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")
    other, _ = F.scaled_dot_product_attention(q, k, v, causal=causal, key_lengths=lengths,
                                              dropout_p=p, **{**key, "step": 3})
    assert not np.array_equal(out, other)  # another step draws another mask


def test_dropout_one_drops_everything():
    q, k, v = qkv((1, 1, 10, 32), seed=10)
    out, _ = F.scaled_dot_product_attention(q, k, v, dropout_p=1.0)
    assert np.all(out == 0)


# --- half precision ------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("causal", [False, True])
def test_half_precision_within_bounds(dt, causal):
    """Inputs rounded to dt; the op computes in f32 and rounds out and the gradients once, so the
    error against float64 on the same rounded inputs stays within 2 ulp of dt of the largest value
    (the f32 arithmetic adds ~1e-6 relative)."""
    shape = (2, 2, 70, 64)
    q, k, v = (ref.to_dtype(x, dt) for x in qkv(shape, seed=11))
    out, lse = F.scaled_dot_product_attention(q, k, v, causal=causal)
    assert out.dtype == q.dtype and lse.dtype == np.float32
    ref_out, ref_lse = aref.attention(q, k, v, causal)
    bound = 2 * ref.ULP[dt] * np.abs(ref_out).max()
    assert np.abs(ref.f64(out) - ref_out).max() <= bound
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    dout = ref.to_dtype(qkv(shape, seed=12)[0], dt)
    grads = F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, causal=causal)
    # the backward reads the rounded out (for dout . out): allow that rounding too
    for name, got, want in zip("qkv", grads, aref.attention_backward(dout, q, k, v, causal)):
        bound = 4 * ref.ULP[dt] * np.abs(want).max()
        assert np.abs(ref.f64(got) - want).max() <= bound, f"d{name}"


# --- determinism ---------------------------------------------------------------------------------


def run_all(dt="f32", head_dim=32):
    shape = (2, 3, 90, head_dim)
    q, k, v = (ref.to_dtype(x, dt) for x in qkv(shape, seed=13))
    key = dict(causal=True, key_lengths=np.array([90, 50]), dropout_p=0.1, seed=5)
    out, lse = F.scaled_dot_product_attention(q, k, v, **key)
    grads = F.scaled_dot_product_attention_backward(q, q, k, v, out, lse, **key)
    return (out, lse, *grads)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_same_bits_for_any_thread_count(dt):
    with ref.num_threads(1):
        base = run_all(dt)
    for threads in (2, 3, 5):
        with ref.num_threads(threads):
            for a, b in zip(base, run_all(dt)):
                assert ref.same_bits(a, b), threads


@pytest.mark.parametrize("head_dim", [32, 96])  # 96: register blocks of 64 and 32 columns at d0 > 0
def test_same_bits_at_every_simd_level(head_dim):
    base = run_all(head_dim=head_dim)
    for level in ref.simd_levels():
        with ref.simd_level(level):
            for a, b in zip(base, run_all(head_dim=head_dim)):
                assert ref.same_bits(a, b), level


# --- arguments -----------------------------------------------------------------------------------


def test_inputs_are_not_modified():
    q, k, v = qkv((1, 2, 9, 32), seed=14)
    copies = [x.copy() for x in (q, k, v)]
    out, lse = F.scaled_dot_product_attention(q, k, v, causal=True)
    out_copy, lse_copy = out.copy(), lse.copy()
    F.scaled_dot_product_attention_backward(q, q, k, v, out, lse, causal=True)
    for a, b in zip((q, k, v, out, lse), (*copies, out_copy, lse_copy)):
        assert ref.same_bits(a, b)


def test_bad_arguments_raise_naming_them():
    q, k, v = qkv((2, 1, 5, 32), seed=15)
    with pytest.raises(ValueError, match="q must be 4-D"):
        F.scaled_dot_product_attention(q[0], k[0], v[0])
    with pytest.raises(ValueError, match=r"k must be \(batch, kv_heads, seq, head_dim\) = \(2, kv_heads, 5, 32\)"):
        F.scaled_dot_product_attention(q, k[:, :, :4], v)
    with pytest.raises(ValueError, match="v must have k's shape"):
        F.scaled_dot_product_attention(q, k, v[:, :, :4])
    with pytest.raises(TypeError, match="v is f16"):
        F.scaled_dot_product_attention(q, k, v.astype(np.float16))
    with pytest.raises(ValueError, match=r"key_lengths must be in \[0, 5\]"):
        F.scaled_dot_product_attention(q, k, v, key_lengths=[6, 1])
    with pytest.raises(ValueError, match="key_lengths must have shape"):
        F.scaled_dot_product_attention(q, k, v, key_lengths=[1])
    with pytest.raises(ValueError, match="dropout_p"):
        F.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match="seed"):
        F.scaled_dot_product_attention(q, k, v, seed=-1)
    out, lse = F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="lse must have shape"):
        F.scaled_dot_product_attention_backward(q, q, k, v, out, lse[:, :, :4])
