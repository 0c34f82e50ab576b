"""CPU LayerNorm and embedding (csrc/ops/cpu_layernorm.c, cpu_embedding.c) against float64 NumPy:
forward, analytic and finite-difference gradients, accumulation, determinism across thread counts
and SIMD levels, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _reference as ref
from gputrain import _C
from gputrain import functional as F

DTYPES = ["f32", "f16", "bf16"]


def randn(shape, seed=0, scale=1.0, shift=0.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(np.float32)


# --- LayerNorm -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
def test_layer_norm_forward_matches_reference(dt):
    x = ref.to_dtype(randn((4, 6, 48), 1, 3.0, 5.0), dt)
    w, b = randn(48, 2), randn(48, 3)
    out, mean, rstd = F.layer_norm(x, w, b, eps=1e-5)
    assert out.dtype == x.dtype and mean.shape == rstd.shape == (4, 6) and mean.dtype == np.float32
    ref_out, ref_mean, ref_rstd = ref.layer_norm(x, w, b, 1e-5)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-6)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-6)
    ref.assert_close(out, ref_out, dt, rtol=2e-6 if dt == "f32" else None, atol=1e-6)


def test_layer_norm_statistics_survive_a_large_mean():
    x = randn((8, 256), 4, 1.0, 1e4)  # a one-pass E[x^2] - E[x]^2 in f32 would lose the variance
    out, mean, rstd = F.layer_norm(x, np.ones(256, np.float32), np.zeros(256, np.float32))
    ref_out, ref_mean, ref_rstd = ref.layer_norm(x, np.ones(256), np.zeros(256), 1e-5)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=1e-5)
    np.testing.assert_allclose(out, ref_out, rtol=1e-3, atol=1e-3)  # x itself has f32 rounding


@pytest.mark.parametrize("dt", DTYPES)
def test_layer_norm_backward_matches_reference(dt):
    x = ref.to_dtype(randn((5, 7, 40), 5, 2.0, 1.0), dt)
    dout = ref.to_dtype(randn((5, 7, 40), 6), dt)
    w, b = randn(40, 7), randn(40, 8)
    _, mean, rstd = F.layer_norm(x, w, b, eps=1e-5)
    dx, dw, db = F.layer_norm_backward(dout, x, w, mean, rstd)
    ref_dx, ref_dw, ref_db = ref.layer_norm_backward(dout, x, w, 1e-5)
    ref.assert_close(dx, ref_dx, dt, rtol=1e-4 if dt == "f32" else 2 * ref.ULP[dt], atol=1e-4)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, ref_db, rtol=1e-5, atol=1e-5)


def test_layer_norm_backward_matches_finite_differences():
    x, w, b, dout = randn((3, 9), 9, 2.0), randn(9, 10), randn(9, 11), randn((3, 9), 12)
    eps = 1e-5
    _, mean, rstd = F.layer_norm(x, w, b, eps)
    dx, dw, db = F.layer_norm_backward(dout, x, w, mean, rstd)
    d64 = ref.f64(dout)
    ref.assert_grad(dx, ref.numerical_grad(lambda v: ref.layer_norm(v, w, b, eps)[0], x, d64), rtol=1e-4, atol=1e-5)
    ref.assert_grad(dw, ref.numerical_grad(lambda v: ref.layer_norm(x, v, b, eps)[0], w, d64))
    ref.assert_grad(db, ref.numerical_grad(lambda v: ref.layer_norm(x, w, v, eps)[0], b, d64))


def test_layer_norm_backward_accumulates_parameter_gradients():
    x, w, b, dout = randn((6, 10), 13), randn(10, 14), randn(10, 15), randn((6, 10), 16)
    _, mean, rstd = F.layer_norm(x, w, b)
    dx, dw, db = F.layer_norm_backward(dout, x, w, mean, rstd)
    dw0, db0 = randn(10, 17), randn(10, 18)
    into_w, into_b = dw0.copy(), db0.copy()
    dx2, dw2, db2 = F.layer_norm_backward(dout, x, w, mean, rstd, dweight_into=into_w, dbias_into=into_b)
    assert dw2 is into_w and db2 is into_b and ref.same_bits(dx2, dx)
    np.testing.assert_array_equal(into_w, dw0 + dw)
    np.testing.assert_array_equal(into_b, db0 + db)


def test_layer_norm_din_may_alias_dout():
    x, w, b, dout = randn((300, 70), 19), randn(70, 20), randn(70, 21), randn((300, 70), 22)
    _, mean, rstd = F.layer_norm(x, w, b)
    dx, dw, db = F.layer_norm_backward(dout, x, w, mean, rstd)
    buf, dw2, db2 = dout.copy(), np.empty(70, np.float32), np.empty(70, np.float32)
    _C.op_layernorm_backward(buf, dw2, db2, buf, x, w, mean.reshape(-1), rstd.reshape(-1), "f32")
    assert ref.same_bits(buf, dx) and ref.same_bits(dw2, dw) and ref.same_bits(db2, db)


@pytest.mark.parametrize("dt", DTYPES)
def test_layer_norm_same_bits_for_any_thread_count_and_simd_level(dt):
    x = ref.to_dtype(randn((300, 333), 23, 2.0), dt)  # several row blocks and column blocks
    dout = ref.to_dtype(randn((300, 333), 24), dt)
    w, b = randn(333, 25), randn(333, 26)

    def run():
        out, mean, rstd = F.layer_norm(x, w, b)
        return (out, mean, rstd) + F.layer_norm_backward(dout, x, w, mean, rstd)

    base = run()
    for count in (1, 2):
        with ref.num_threads(count):
            assert all(ref.same_bits(u, v) for u, v in zip(run(), base)), count
    for level in ref.simd_levels():
        with ref.simd_level(level):
            assert all(ref.same_bits(u, v) for u, v in zip(run(), base)), level


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.integers(0, 5), max_size=2), cols=st.integers(1, 70), dt=st.sampled_from(DTYPES))
def test_layer_norm_any_shape(rows, cols, dt):
    x = ref.to_dtype(randn(tuple(rows) + (cols,), 27, 2.0), dt)
    w, b = randn(cols, 28), randn(cols, 29)
    out, mean, rstd = F.layer_norm(x, w, b)
    assert out.shape == x.shape and mean.shape == tuple(rows)
    ref.assert_close(out, ref.layer_norm(x, w, b, 1e-5)[0], dt, rtol=2e-6 if dt == "f32" else None, atol=1e-5)


def test_layer_norm_bad_arguments():
    x, w, b = randn((3, 4), 30), randn(4, 31), randn(4, 32)
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\)"):
        F.layer_norm(x, randn(5, 33), b)
    with pytest.raises(TypeError, match="bias must be float32"):
        F.layer_norm(x, w, b.astype(np.float16))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        F.layer_norm(x, w, b, eps=-1.0)
    with pytest.raises(ValueError, match="non-empty last dimension"):
        F.layer_norm(np.zeros((3, 0), np.float32), np.zeros(0, np.float32), np.zeros(0, np.float32))
    _, mean, rstd = F.layer_norm(x, w, b)
    with pytest.raises(ValueError, match=r"mean must have shape \(3,\)"):
        F.layer_norm_backward(x, x, w, mean[:2], rstd)
    with pytest.raises(ValueError, match="given together"):
        F.layer_norm_backward(x, x, w, mean, rstd, dweight_into=np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"rstd: must have shape \(3,\)"):
        _C.op_layernorm_forward(np.empty_like(x), np.empty(3, np.float32), np.empty(2, np.float32), x, w, b, 1e-5, "f32")


# --- embedding -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
def test_embedding_forward_matches_reference(dt):
    table = randn((11, 6), 40)
    ids = np.array([[3, 0, 10], [3, 3, 7]], dtype=np.int32)
    out = F.embedding(ids, table, dtype=dt)
    assert out.shape == (2, 3, 6) and out.dtype == ref.NUMPY_TYPES[dt]
    assert ref.same_bits(out, ref.to_dtype(table[ids], dt))


@pytest.mark.parametrize("dt", DTYPES)
def test_embedding_backward_scatter_adds(dt):
    ids = np.array([[3, 0, 10], [3, 3, 7]])
    dout = ref.to_dtype(randn((2, 3, 6), 41), dt)
    dtable = F.embedding_backward(dout, ids, 11)
    np.testing.assert_allclose(dtable, ref.embedding_backward(dout, ids, 11), rtol=1e-6, atol=1e-7)
    assert not dtable[[1, 2, 4, 5, 6, 8, 9]].any()
    start = randn((11, 6), 42)
    into = start.copy()
    assert F.embedding_backward(dout, ids, 11, accumulate_into=into) is into
    np.testing.assert_allclose(into, start + ref.embedding_backward(dout, ids, 11), rtol=1e-6, atol=1e-6)


def test_embedding_backward_matches_finite_differences():
    table, ids, dout = randn((5, 4), 43), np.array([1, 4, 1, 0]), randn((4, 4), 44)
    numeric = ref.numerical_grad(lambda t: t[ids], table, ref.f64(dout))
    ref.assert_grad(F.embedding_backward(dout, ids, 5), numeric)


def test_embedding_backward_adds_rows_in_index_order():
    # many rows hitting few ids: fixed order means a sequential float32 sum per element
    rng = np.random.default_rng(45)
    ids = rng.integers(0, 3, 5000)
    dout = randn((5000, 300), 46)
    expected = np.zeros((3, 300), np.float32)
    for i, row in enumerate(ids):
        expected[row] += dout[i]
    base = F.embedding_backward(dout, ids, 3)
    assert ref.same_bits(base, expected)
    for count in (1, 2):
        with ref.num_threads(count):
            assert ref.same_bits(F.embedding_backward(dout, ids, 3), base)
    for level in ref.simd_levels():
        with ref.simd_level(level):
            assert ref.same_bits(F.embedding_backward(dout, ids, 3), base)


def test_embedding_bad_arguments():
    table = randn((4, 3), 47)
    with pytest.raises(IndexError, match=r"ids\[2\] = 4 is out of range \[0, 4\)"):
        F.embedding(np.array([0, 1, 4]), table)
    with pytest.raises(IndexError, match=r"ids\[0\] = -1"):
        F.embedding_backward(randn((1, 3), 48), np.array([-1]), 4)
    with pytest.raises(TypeError, match="ids must be an integer array"):
        F.embedding(np.array([0.0, 1.0]), table)
    with pytest.raises(ValueError, match="table must be 2-D"):
        F.embedding(np.array([0]), randn(4, 49))
    with pytest.raises(ValueError, match=r"dout must have shape ids.shape \+ \(dim,\)"):
        F.embedding_backward(randn((2, 3), 50), np.array([0, 1, 2]), 4)
    with pytest.raises(ValueError, match="num must be an int"):
        F.embedding_backward(randn((2, 3), 51), np.array([0, 1]), -4)
    with pytest.raises(ValueError, match="out: must have the shape of ids plus"):
        _C.op_embedding(np.empty((2, 4), np.float32), np.array([0, 1]), table, "f32")
