"""CPU elementwise ops (csrc/ops/cpu_activation.c, cpu_bias.c, cpu_add.c, cpu_dropout.c,
cpu_memory.c) against float64 NumPy references, finite-difference gradients, SIMD levels,
thread counts and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _reference as ref
from gputrain import _C
from gputrain import _C_testing
from gputrain import functional as F

KINDS = ["relu", "gelu", "gelu_tanh", "tanh", "silu"]
DTYPES = ["f32", "f16", "bf16"]
BIG = 70_001  # > 4 chunks of 16384 elements, odd so that the last chunk is partial


def randn(shape, seed=0, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


# --- activations -------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_activation_forward_matches_reference(kind, dt):
    x = ref.to_dtype(np.concatenate([randn(500, 1, 3.0), [0.0, -0.0, 1e-8, -30.0, 30.0, 88.0, -88.0]]), dt)
    out = F.activation(x, kind)
    assert out.dtype == x.dtype and out.shape == x.shape
    ref.assert_close(out, ref.activation(x, kind), dt, rtol=2e-6 if dt == "f32" else None, atol=1e-7)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_activation_backward_matches_reference(kind, dt):
    x = ref.to_dtype(randn(400, 2, 3.0), dt)
    dout = ref.to_dtype(randn(400, 3), dt)
    din = F.activation_backward(dout, x, kind)
    expected = ref.f64(dout) * ref.activation_grad(x, kind)
    ref.assert_close(din, expected, dt, rtol=1e-5 if dt == "f32" else None, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_activation_backward_matches_finite_differences(kind):
    x = randn(40, 4, 2.0)
    x[np.abs(x) < 1e-3] = 0.5  # relu is not differentiable at 0
    dout = randn(40, 5)
    numeric = ref.numerical_grad(lambda v: ref.activation(v, kind), x, ref.f64(dout))
    ref.assert_grad(F.activation_backward(dout, x, kind), numeric, rtol=1e-4, atol=1e-5)


def test_named_activation_functions_match_generic_one():
    x, dout = randn(64, 6), randn(64, 7)
    pairs = [(F.relu(x), F.activation(x, "relu")), (F.gelu(x), F.activation(x, "gelu")),
             (F.gelu(x, approximate="tanh"), F.activation(x, "gelu_tanh")),
             (F.tanh(x), F.activation(x, "tanh")), (F.silu(x), F.activation(x, "silu")),
             (F.relu_backward(dout, x), F.activation_backward(dout, x, "relu")),
             (F.gelu_backward(dout, x, "tanh"), F.activation_backward(dout, x, "gelu_tanh")),
             (F.tanh_backward(dout, x), F.activation_backward(dout, x, "tanh")),
             (F.silu_backward(dout, x), F.activation_backward(dout, x, "silu"))]
    for a, b in pairs:
        assert ref.same_bits(a, b)
    assert not ref.same_bits(F.gelu(x), F.gelu(x, approximate="tanh"))


@pytest.mark.parametrize("kind", ["gelu", "gelu_tanh", "silu"])
def test_activations_keep_relative_accuracy_far_left(kind):
    # 1 + erf, 1 + tanh and 1 - sigmoid cancel here in the textbook (and PyTorch) formulas
    x = np.linspace(-10.0, -3.0, 301, dtype=np.float32)
    np.testing.assert_allclose(F.activation(x, kind), ref.activation(x, kind), rtol=2e-5)
    if kind != "gelu":  # Phi(x) + x phi(x) cancels in the true derivative of the erf GELU
        dout = np.ones_like(x)
        np.testing.assert_allclose(F.activation_backward(dout, x, kind), ref.activation_grad(x, kind), rtol=2e-5)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_half_elementwise_ops_round_the_f32_result_once(dt):
    # load to f32, compute in f32, round once: bit-identical to the f32 op on widened inputs
    # (f16 goes through staged bulk conversions, bf16 through inline ones; both must agree)
    x = ref.to_dtype(randn(BIG, 16), dt)
    dout = ref.to_dtype(randn(BIG, 17), dt)
    x32, d32 = x.astype(np.float32), dout.astype(np.float32)
    bias = randn(BIG, 18)
    for kind in KINDS:
        assert ref.same_bits(F.activation(x, kind), F.activation(x32, kind).astype(x.dtype)), kind
        assert ref.same_bits(F.activation_backward(dout, x, kind),
                             F.activation_backward(d32, x32, kind).astype(x.dtype)), kind
    assert ref.same_bits(F.add(x, dout), F.add(x32, d32).astype(x.dtype))
    assert ref.same_bits(F.dropout(x, 0.3, 5, 1, 2, 3), F.dropout(x32, 0.3, 5, 1, 2, 3).astype(x.dtype))
    assert ref.same_bits(F.bias_add(x.reshape(1, -1), bias), F.bias_add(x32.reshape(1, -1), bias).astype(x.dtype))


def test_relu_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0], dtype=np.float32)
    out = F.relu(x)
    assert np.isnan(out[0]) and out[1] == np.inf and out[2] == 0.0 and out[5] == 2.0
    np.testing.assert_array_equal(F.relu_backward(np.ones(6, np.float32), x), [0, 1, 0, 0, 0, 1])


@pytest.mark.parametrize("dt", DTYPES)
def test_activations_same_bits_at_every_simd_level_and_thread_count(dt):
    x = ref.to_dtype(randn(BIG, 8), dt)
    dout = ref.to_dtype(randn(BIG, 9), dt)
    for kind in ["relu", "gelu", "silu"]:
        base_fwd, base_bwd = F.activation(x, kind), F.activation_backward(dout, x, kind)
        for level in ref.simd_levels():
            with ref.simd_level(level):
                assert ref.same_bits(F.activation(x, kind), base_fwd), (kind, level)
                assert ref.same_bits(F.activation_backward(dout, x, kind), base_bwd), (kind, level)
        with ref.num_threads(1):
            assert ref.same_bits(F.activation(x, kind), base_fwd)
        with ref.num_threads(2):
            assert ref.same_bits(F.activation_backward(dout, x, kind), base_bwd)


def test_activation_inputs_are_not_modified():
    x, dout = randn(100, 10), randn(100, 11)
    x0, d0 = x.copy(), dout.copy()
    F.gelu(x)
    F.gelu_backward(dout, x)
    assert ref.same_bits(x, x0) and ref.same_bits(dout, d0)


def test_activation_accepts_bf16_bits_with_dtype():
    x = ref.to_dtype(randn(50, 12), "bf16")
    bits = F.relu(x.view(np.uint16), dtype="bf16")
    assert bits.dtype == np.uint16 and ref.same_bits(bits.view(ref.BF16), F.relu(x))


def test_activation_bad_arguments():
    x = randn(10, 13)
    with pytest.raises(ValueError, match="kind"):
        F.activation(x, "swish")
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(x, approximate="fast")
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
        F.relu(x.astype(np.float64))
    with pytest.raises(TypeError, match="x must be a numpy.ndarray"):
        F.relu([1.0, 2.0])
    strided = randn((4, 6), 14)[:, ::2]  # any layout is read (through a C-contiguous copy)
    assert ref.same_bits(F.relu(strided), F.relu(np.ascontiguousarray(strided)))
    with pytest.raises(TypeError, match="uint16 array"):
        F.relu(x.view(np.uint16))
    with pytest.raises(TypeError, match="dtype='f16'"):
        F.relu(x, dtype="f16")
    with pytest.raises(ValueError, match="dout must have x's shape"):
        F.relu_backward(randn(9, 15), x)
    with pytest.raises(TypeError, match="x is f32 but dout is f16"):
        F.relu_backward(x.astype(np.float16), x)
    with pytest.raises(ValueError, match="act: unknown activation 9"):
        _C.op_activation(np.empty_like(x), x, 9, "f32")
    with pytest.raises(ValueError, match="out must be writeable"):
        readonly = np.empty_like(x)
        readonly.flags.writeable = False
        _C.op_activation(readonly, x, 0, "f32")
    with pytest.raises(ValueError, match="dt must be 'f32', 'f16' or 'bf16'"):
        _C.op_activation(np.empty_like(x), x, 0, "f64")


# --- bias ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
def test_bias_add_and_backward_match_reference(dt):
    x = ref.to_dtype(randn((3, 7, 33), 20), dt)
    bias = randn(33, 21)
    ref.assert_close(F.bias_add(x, bias), ref.f64(x) + ref.f64(bias), dt, atol=1e-7)
    dbias = F.bias_backward(x)
    assert dbias.dtype == np.float32 and dbias.shape == (33,)
    np.testing.assert_allclose(dbias, ref.f64(x).sum(axis=(0, 1)), rtol=1e-6, atol=1e-6)


def test_bias_backward_accumulates_in_place():
    dout, start = randn((50, 9), 22), randn(9, 23)
    into = start.copy()
    result = F.bias_backward(dout, accumulate_into=into)
    assert result is into
    np.testing.assert_array_equal(into, start + F.bias_backward(dout))
    zero = np.zeros(9, np.float32)
    assert ref.same_bits(F.bias_backward(dout, accumulate_into=zero), F.bias_backward(dout))


def test_bias_backward_matches_finite_differences():
    x, bias, dout = randn((6, 5), 24), randn(5, 25), randn((6, 5), 26)
    numeric = ref.numerical_grad(lambda b: ref.f64(x) + b, bias, ref.f64(dout))
    ref.assert_grad(F.bias_backward(dout), numeric)


def test_bias_same_bits_for_any_thread_count_and_simd_level():
    dout = randn((300, 333), 27)  # several column blocks, > 16384 elements
    bias = randn(333, 28)
    base, base_add = F.bias_backward(dout), F.bias_add(dout, bias)
    for count in (1, 2):
        with ref.num_threads(count):
            assert ref.same_bits(F.bias_backward(dout), base)
            assert ref.same_bits(F.bias_add(dout, bias), base_add)
    for level in ref.simd_levels():
        with ref.simd_level(level):
            assert ref.same_bits(F.bias_backward(dout), base)
            assert ref.same_bits(F.bias_add(dout, bias), base_add)


def test_bias_bad_arguments():
    x = randn((4, 5), 29)
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        F.bias_add(x, randn(4, 30))
    with pytest.raises(TypeError, match="bias must be float32"):
        F.bias_add(x, np.ones(5))
    with pytest.raises(ValueError, match="accumulate_into must have shape"):
        F.bias_backward(x, accumulate_into=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"dbias: must have shape \(5,\)"):
        _C.op_bias(x, np.zeros(3, np.float32), "f32", backward=True)


# --- residual add ------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
def test_add_matches_reference(dt):
    a, b = ref.to_dtype(randn((8, 17), 30), dt), ref.to_dtype(randn((8, 17), 31), dt)
    ref.assert_close(F.add(a, b), ref.f64(a) + ref.f64(b), dt)


def test_add_in_place_alias_and_bad_arguments():
    a, b = randn(BIG, 32), randn(BIG, 33)
    expected = F.add(a, b)
    _C.op_add(a, a, b, "f32")  # out aliases a
    assert ref.same_bits(a, expected)
    with pytest.raises(ValueError, match="b must have a's shape"):
        F.add(a, b[:-1])
    with pytest.raises(TypeError, match="b is f16 but a is f32"):
        F.add(a, b.astype(np.float16))


# --- dropout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 6, 2**33 + 3, 2**34 - 20])
def test_dropout_matches_numpy_philox_reference(dt, offset):
    x = ref.to_dtype(randn((37, 29), 40), dt)
    p, seed, layer, step = 0.3, 2**40 + 12345, 7, 99
    out = F.dropout(x, p, seed, layer=layer, step=step, offset=offset)
    ref.assert_close(out, ref.dropout(x, p, seed, layer, step, offset), dt)
    mask = ref.dropout_mask(x.size, p, seed, layer, step, offset).reshape(x.shape)
    assert np.all((ref.f64(out) == 0) | mask)
    back = F.dropout_backward(x, p, seed, layer=layer, step=step, offset=offset)
    assert ref.same_bits(back, out)


def test_dropout_rate_and_scale():
    x = np.ones(200_000, np.float32)
    out = F.dropout(x, 0.25, seed=3, layer=1, step=5)
    kept = out != 0
    assert abs(kept.mean() - 0.75) < 0.005
    np.testing.assert_array_equal(out[kept], np.float32(1) / np.float32(0.75))


@pytest.mark.parametrize("p", [0.9, 0.999, 0.1, 1 / 3, 0.7])
def test_dropout_scale_is_rounded_as_pytorch_cpu(p):
    # torch's CPU dropout: noise.div_(1 - p) on a float32 tensor, 1 - p in double (p = 0.9: 10.0,
    # not 1 / (1 - float32(0.9)) = 9.999998).
    x = np.ones(4096, np.float32)
    expected = np.float32(1.0) / np.float32(1.0 - p)
    for out in (F.dropout(x, p, seed=5), F.dropout_backward(x, p, seed=5)):
        kept = out[out != 0]
        assert kept.size > 0 and np.all(kept == expected), (p, kept[:1], expected)
    if p == 0.9:
        assert expected == np.float32(10.0)


@pytest.mark.parametrize("dt", DTYPES)
def test_dropout_p1_gives_zeros_and_keeps_nan(dt):
    x = ref.to_dtype(np.array([1.0, -2.0, np.nan, np.inf, 0.0, 3.0], np.float32), dt)
    out = ref.f64(F.dropout(x, 1.0, seed=3))
    assert np.array_equal(np.isnan(out), [False, False, True, True, False, False])
    assert np.all(out[~np.isnan(out)] == 0)
    assert np.all(ref.f64(F.dropout_backward(ref.to_dtype(np.ones(6, np.float32), dt), 1.0, seed=3)) == 0)


def test_dropout_offset_splits_a_tensor_consistently():
    x = randn(1003, 41)
    whole = F.dropout(x, 0.5, 11, layer=2, step=3)
    parts = [F.dropout(x[s:e].copy(), 0.5, 11, layer=2, step=3, offset=s)
             for s, e in [(0, 5), (5, 6), (6, 501), (501, 1003)]]
    assert ref.same_bits(np.concatenate(parts), whole)


def test_dropout_key_changes_mask_and_p0_is_identity():
    x = randn(4096, 42)
    base = F.dropout(x, 0.5, 1, layer=0, step=0)
    for kwargs in [dict(layer=1), dict(step=1), dict(offset=4)]:
        assert not np.array_equal(F.dropout(x, 0.5, 1, **kwargs) == 0, base == 0), kwargs
    assert not np.array_equal(F.dropout(x, 0.5, 2) == 0, base == 0)
    assert ref.same_bits(F.dropout(x, 0.0, 1), x)


def test_dropout_backward_matches_finite_differences():
    x, dout = randn(30, 43), randn(30, 44)
    numeric = ref.numerical_grad(lambda v: ref.dropout(v, 0.4, 9, 1, 2, 3), x, ref.f64(dout))
    ref.assert_grad(F.dropout_backward(dout, 0.4, 9, layer=1, step=2, offset=3), numeric)


@pytest.mark.parametrize("dt", DTYPES)
def test_dropout_same_bits_for_any_thread_count_and_simd_level(dt):
    x = ref.to_dtype(randn(BIG, 45), dt)
    base = F.dropout(x, 0.2, 77, layer=3, step=4, offset=5)
    for count in (1, 2):
        with ref.num_threads(count):
            assert ref.same_bits(F.dropout(x, 0.2, 77, layer=3, step=4, offset=5), base)
    for level in ref.simd_levels():
        with ref.simd_level(level):
            assert ref.same_bits(F.dropout(x, 0.2, 77, layer=3, step=4, offset=5), base)


def test_dropout_bad_arguments():
    x = randn(10, 46)
    for p in (-0.1, float("nan"), 1.5):
        with pytest.raises(ValueError, match="p must"):
            F.dropout(x, p, 1)
    with pytest.raises(TypeError, match="p must be a real number"):
        F.dropout(x, "0.5", 1)
    with pytest.raises(ValueError, match="seed must be in"):
        F.dropout(x, 0.5, -1)
    with pytest.raises(ValueError, match="layer must be in"):
        F.dropout(x, 0.5, 1, layer=2**32)
    with pytest.raises(TypeError, match="step must be an int"):
        F.dropout(x, 0.5, 1, step=1.5)
    with pytest.raises(ValueError, match="p: dropout probability must be in"):
        _C.op_dropout(np.empty_like(x), x, 1.5, 1, 0, 0, 0, "f32")


# --- cast, copy, zero ----------------------------------------------------------------------------


@pytest.mark.parametrize("src_dt,dst_dt", [("f32", "f16"), ("f32", "bf16"), ("f16", "f32"),
                                           ("bf16", "f32"), ("f16", "bf16"), ("bf16", "f16")])
def test_cast_matches_numpy_rounding(src_dt, dst_dt):
    x = ref.to_dtype(randn(BIG, 50, 1000.0), src_dt)
    raw = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}
    src = x.view(np.uint16) if src_dt == "bf16" else x
    dst = np.empty(x.shape, raw[dst_dt])
    _C.op_cast(dst, dst_dt, src, src_dt)
    expected = x.astype(np.float32).astype(ref.NUMPY_TYPES[dst_dt])
    got = dst.view(ref.BF16) if dst_dt == "bf16" else dst
    assert ref.same_bits(got, expected)


def test_copy_and_zero():
    src = randn((3, 100_000), 51)
    dst = np.full_like(src, np.nan)
    _C_testing.op_copy(dst, src)
    assert ref.same_bits(dst, src)
    _C_testing.op_copy(dst)
    assert not dst.any()
    with pytest.raises(ValueError, match="src: has 8 bytes"):
        _C_testing.op_copy(np.zeros(3, np.float32), np.zeros(1, np.float64))
    with pytest.raises(ValueError, match="dst must be C-contiguous"):
        _C_testing.op_copy(src[:, ::2])


# --- hypothesis: shapes ------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(shape=st.lists(st.integers(0, 40), min_size=1, max_size=3), dt=st.sampled_from(DTYPES),
       kind=st.sampled_from(KINDS))
def test_activation_any_shape(shape, dt, kind):
    x = ref.to_dtype(randn(tuple(shape), 60), dt)
    out = F.activation(x, kind)
    assert out.shape == x.shape
    ref.assert_close(out, ref.activation(x, kind), dt, rtol=2e-6 if dt == "f32" else None, atol=1e-7)
