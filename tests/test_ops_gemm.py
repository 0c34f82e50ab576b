"""CPU GEMM (csrc/ops/cpu_gemm.c) and the linear layer built on it, against float64 NumPy:
every transpose, alpha/beta, batches, f32/f16/bf16 operand mixes, finite-difference gradients of
linear, thread counts and bad arguments."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _reference as ref
from gputrain import _C
from gputrain import functional as F
from gputrain import info as gt_info

DTYPES = ["f32", "f16", "bf16"]


def randn(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def operand(rows, cols, trans, seed, dt="f32", batch=None):
    """A matrix stored as (rows, cols) or transposed, in dtype dt (batch: a leading axis)."""
    shape = (cols, rows) if trans else (rows, cols)
    return ref.to_dtype(randn(((batch,) if batch else ()) + shape, seed), dt)


def assert_gemm_close(got, a, b, trans_a, trans_b, alpha, beta, c, dt):
    """got against float64: f32 accumulation error bounded by 1e-5 (sum |a_ik b_kj|) plus, for a
    half result, one unit in the last place of the rounded reference."""
    expected = ref.gemm(a, b, trans_a, trans_b, alpha, beta, c)
    scale = ref.gemm(np.abs(ref.f64(a)), np.abs(ref.f64(b)), trans_a, trans_b, abs(alpha))
    if beta != 0.0:
        scale = scale + abs(beta) * np.abs(ref.f64(c))
    bound = 1e-5 * scale + 1e-30
    if dt != "f32":
        bound = bound + ref.ULP[dt] * np.abs(expected)
    error = np.abs(ref.f64(got) - expected)
    assert np.all(error <= bound), f"max error {np.max(error - bound)} beyond the bound ({dt})"


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 1.0), (-2.0, 0.25)])
def test_gemm_f32_every_transpose_and_scale(trans_a, trans_b, alpha, beta):
    m, n, k = 37, 29, 53
    a, b = operand(m, k, trans_a, 1), operand(k, n, trans_b, 2)
    c = randn((m, n), 3)
    got = F.gemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, c=c)
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert_gemm_close(got, a, b, trans_a, trans_b, alpha, beta, c, "f32")


@pytest.mark.parametrize("a_dt", DTYPES)
@pytest.mark.parametrize("b_dt", DTYPES)
@pytest.mark.parametrize("c_dt", DTYPES)
def test_gemm_half_operands_are_widened_exactly(a_dt, b_dt, c_dt):
    m, n, k = 19, 23, 31
    a, b = operand(m, k, True, 4, a_dt), operand(k, n, False, 5, b_dt)
    c = ref.to_dtype(randn((m, n), 6), c_dt)
    for beta in (0.0, 0.75):
        got = F.gemm(a, b, trans_a=True, beta=beta, c=c, out_dtype=c_dt)
        assert got.dtype == ref.NUMPY_TYPES[c_dt]
        assert_gemm_close(got, a, b, True, False, 1.0, beta, c, c_dt)


@pytest.mark.parametrize("c_dt", DTYPES)
def test_gemm_beta_zero_does_not_read_c(c_dt):
    a, b = randn((8, 6), 7), randn((6, 5), 8)
    raw = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[c_dt]
    c = np.full((8, 5), np.nan, dtype=np.float32).astype(ref.NUMPY_TYPES[c_dt]).view(raw)
    _C.op_gemm(a, b, c, "f32", "f32", c_dt, False, False, 1.0, 0.0)
    got = c.view(ref.BF16) if c_dt == "bf16" else c
    assert not np.isnan(ref.f64(got)).any()
    assert_gemm_close(got, a, b, False, False, 1.0, 0.0, None, c_dt)


@pytest.mark.parametrize("c_dt", DTYPES)
def test_gemm_beta_one_accumulates_into_c(c_dt):
    a, b = randn((9, 7), 9), randn((7, 4), 10)
    c0 = ref.to_dtype(randn((9, 4), 11), c_dt)
    raw = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[c_dt]
    c = c0.copy().view(raw)
    _C.op_gemm(a, b, c, "f32", "f32", c_dt, False, False, 1.0, 1.0)
    assert_gemm_close(c.view(c0.dtype), a, b, False, False, 1.0, 1.0, c0, c_dt)


@pytest.mark.parametrize("a_batched,b_batched", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_gemm_strided_batches(a_batched, b_batched, dt):
    batch, m, n, k = 5, 7, 6, 9
    a = operand(m, k, False, 12, dt, batch if a_batched else None)
    b = operand(k, n, True, 13, dt, batch if b_batched else None)
    got = F.gemm(a, b, trans_b=True)
    assert got.shape == (batch, m, n)
    assert_gemm_close(got, a, b, False, True, 1.0, 0.0, None, dt)
    for i in range(batch):
        single = F.gemm(a[i] if a_batched else a, b[i] if b_batched else b, trans_b=True)
        assert ref.same_bits(got[i], single)


def test_gemm_empty_sizes():
    assert F.gemm(randn((0, 4), 14), randn((4, 3), 15)).shape == (0, 3)
    np.testing.assert_array_equal(F.gemm(randn((2, 0), 16), randn((0, 3), 17)), np.zeros((2, 3)))
    c = randn((2, 3), 18)
    np.testing.assert_array_equal(F.gemm(randn((2, 0), 16), randn((0, 3), 17), beta=2.0, c=c), 2 * c)


def test_gemm_inputs_are_not_modified():
    a, b, c = randn((6, 5), 19), randn((5, 4), 20), randn((6, 4), 21)
    copies = [x.copy() for x in (a, b, c)]
    F.gemm(a, b, beta=1.0, c=c)
    assert all(ref.same_bits(x, y) for x, y in zip((a, b, c), copies))


# Shapes cut into one part, a few, and many (up to 32) parts, rows or columns, with edges that
# are not multiples of the 16-element alignment.
THREAD_SHAPES = [(256, 300, 200), (40, 1000, 64), (300, 333, 77), (256, 1024, 784),
                 (1500, 200, 96), (64, 4100, 33)]


@pytest.mark.parametrize("m,n,k", THREAD_SHAPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (True, False), (False, False)])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_gemm_same_bits_for_any_thread_count(m, n, k, trans_a, trans_b, dt):
    # C is cut into parts by its sizes alone and each part is one single-threaded library call,
    # so every thread count makes the same calls: the bits cannot depend on the threads
    a, b = operand(m, k, trans_a, 22, dt), operand(k, n, trans_b, 23, dt)
    results = []
    for threads in (1, 2, 3):
        with ref.num_threads(threads):
            results.append(F.gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype="f32"))
    assert all(ref.same_bits(results[0], other) for other in results[1:])
    assert_gemm_close(results[1], a, b, trans_a, trans_b, 1.0, 0.0, None, "f32")


# Run in a fresh process whose CPU library is capped at an instruction set (oneDNN reads
# DNNL_MAX_CPU_ISA before it generates its first kernel), so the kernels of CPUs without AVX-512
# run here too. Prints the kernel level, then whether 1, 2 and 3 threads gave the same bits.
CAPPED_GEMMS = """
import numpy as np, gputrain as gt
from gputrain import functional as F
rng = np.random.default_rng(0)
same = []
# B^T as in forward GEMMs; A^T as in weight gradients (wider parts below AVX-512: cpu_blas.h)
for m, n, k, trans_a in [(256, 1024, 784, False), (1500, 200, 96, False), (300, 333, 77, False),
                         (1024, 784, 256, True), (2000, 48, 64, True)]:
    a = rng.standard_normal((k, m) if trans_a else (m, k), dtype=np.float32)
    b = rng.standard_normal((n, k), dtype=np.float32)
    outs = []
    for threads in (1, 2, 3):
        gt.set_num_threads(threads)
        outs.append(F.gemm(a, b, trans_a=trans_a, trans_b=True))
    op_a = a.T if trans_a else a
    ref = op_a.astype(np.float64) @ b.astype(np.float64).T
    assert np.max(np.abs(outs[0] - ref) / (np.abs(op_a) @ np.abs(b).T)) < 1e-5
    same.append(all(o.tobytes() == outs[0].tobytes() for o in outs))
print(gt.info()["blas_kernel"], all(same))
"""


@pytest.mark.skipif(_C.build_info()["blas"] != "onednn", reason="caps oneDNN's kernels")
@pytest.mark.parametrize("isa,kernel", [("AVX2", "avx2"), ("SSE41", "sse41")])
def test_gemm_same_bits_for_any_thread_count_at_lower_instruction_sets(isa, kernel):
    env = dict(os.environ, DNNL_MAX_CPU_ISA=isa)
    out = subprocess.run([sys.executable, "-c", CAPPED_GEMMS], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [kernel, "True"]


def bf16_gemm_script(m, n, k):
    """A script that multiplies random bf16 (m, k) by (n, k) transposed on 2 threads."""
    return f"""
import numpy as np, gputrain as gt
from gputrain import functional as F
rng = np.random.default_rng(0)
a = gt.cast(rng.standard_normal(({m}, {k}), dtype=np.float32), "bf16")
b = gt.cast(rng.standard_normal(({n}, {k}), dtype=np.float32), "bf16")
gt.set_num_threads(2)
F.gemm(a, b, trans_b=True, dtype="bf16")
"""


# A bf16 GEMM cut into 16 row blocks, logged by oneDNN: its B is packed once (one reorder, first)
# and every block's matmul reads that packed layout, instead of each block copying B again.
PACKED_B_GEMM = bf16_gemm_script(2048, 1024, 768)


def logged_layout(line, operand):
    """The layout oneDNN's verbose log gives an operand ("wei", "dst"), e.g. "BA16a64b2a"."""
    field = next(f for f in line.split() + line.split(",") if f.startswith(operand + "_"))
    return field.split(":")[3]


def logged_runs(script):
    """The "exec" lines of oneDNN's verbose log of `script`, run in a fresh process."""
    env = dict(os.environ, ONEDNN_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("onednn_verbose,exec")]


native_bf16_onednn = pytest.mark.skipif(
    _C.build_info()["blas"] != "onednn"
    or not any(level in gt_info()["blas_kernel"] for level in ("bf16", "fp16", "amx")),
    reason="bf16 GEMMs are widened to f32 without AVX512_BF16")


@native_bf16_onednn
def test_row_blocks_of_a_bf16_gemm_share_one_packed_b():
    runs = logged_runs(PACKED_B_GEMM)
    assert [line.split(",")[3] for line in runs] == ["reorder"] + ["matmul"] * 16
    packed = logged_layout(runs[0], "dst")
    assert packed not in ("ab", "ba")
    assert all(logged_layout(line, "wei") == packed for line in runs[1:])


# A bf16 GEMM wider than tall (M = 64 tokens, N = 2048), B transposed as in a forward layer: cut
# into 16 column blocks, each written into a dense block of the scratch and copied into C, so
# oneDNN runs every block on its brgemm kernels (with C's rows 2048 apart it fell back to gemm:jit).
DENSE_C_GEMM = bf16_gemm_script(64, 2048, 256)


@native_bf16_onednn
def test_column_blocks_of_a_bf16_gemm_write_dense_c_blocks():
    runs = logged_runs(DENSE_C_GEMM)
    assert len(runs) == 16
    assert all(line.split(",")[4].startswith("brg") for line in runs), runs[0]
    assert all(logged_layout(line, "dst") == "ab" and ":ab::" in line for line in runs), runs[0]


@pytest.mark.parametrize("c_dt", ["bf16", "f32"])
@pytest.mark.parametrize("beta", [0.0, 1.0, -0.5])
def test_gemm_column_blocks_with_dense_c_accumulate_into_c(c_dt, beta):
    # the blocks' rows of C are copied into their dense blocks first when beta reads them
    m, n, k = 64, 2048, 256
    a, b = operand(m, k, False, 27, "bf16"), operand(k, n, True, 28, "bf16")
    c0 = ref.to_dtype(randn((m, n), 29), c_dt)
    raw = {"f32": np.float32, "bf16": np.uint16}[c_dt]
    c = c0.copy().view(raw)
    _C.op_gemm(a.view(np.uint16), b.view(np.uint16), c, "bf16", "bf16", c_dt, False, True, 1.0,
               beta)
    assert_gemm_close(c.view(c0.dtype), a, b, False, True, 1.0, beta, c0, c_dt)
    with ref.num_threads(1):
        again = c0.copy().view(raw)
        _C.op_gemm(a.view(np.uint16), b.view(np.uint16), again, "bf16", "bf16", c_dt, False, True,
                   1.0, beta)
    assert ref.same_bits(c, again)


def test_gemm_plans_kept_per_shape_give_the_same_bits_when_found_again():
    # cpu_gemm_split.c keeps each thread's last 64 plans (cut, packed B, scratch) by shape: 70
    # split shapes twice over evict every plan before it is wanted again, then each shape run
    # twice in a row finds its own. The shapes are a grid of 10 m by 7 n: a plan found for
    # another m would cut another count of rows, for another n size another packed B.
    rng = np.random.default_rng(26)

    def operand_bf16(rows):
        return ref.to_dtype(rng.standard_normal((rows, 64), dtype=np.float32), "bf16")

    pairs = [(operand_bf16(384 + 16 * i), operand_bf16(256 + 16 * j))
             for j in range(7) for i in range(10)]

    def product(a, b):
        return F.gemm(a, b, trans_b=True, out_dtype="f32")

    first = [product(a, b) for a, b in pairs]
    again = [product(a, b) for a, b in pairs]
    twice = [(product(a, b), product(a, b)) for a, b in pairs]
    assert all(ref.same_bits(x, y) for x, y in zip(first, again))
    assert all(ref.same_bits(x, y) and ref.same_bits(x, z) for x, (y, z) in zip(first, twice))
    for (a, b), got in zip(pairs, again):
        assert_gemm_close(got, a, b, False, True, 1.0, 0.0, None, "f32")


def test_gemm_small_batches_run_in_parallel_with_the_same_bits():
    a, b = randn((64, 16, 24), 60), randn((64, 24, 8), 61)
    with ref.num_threads(1):
        one = F.gemm(a, b)
    with ref.num_threads(2):
        two = F.gemm(a, b)
    assert ref.same_bits(one, two)
    assert_gemm_close(two, a, b, False, False, 1.0, 0.0, None, "f32")


@settings(max_examples=30, deadline=None)
@given(m=st.integers(0, 24), n=st.integers(0, 24), k=st.integers(0, 24), trans_a=st.booleans(),
       trans_b=st.booleans(), dt=st.sampled_from(DTYPES))
def test_gemm_any_shape(m, n, k, trans_a, trans_b, dt):
    a, b = operand(m, k, trans_a, 24, dt), operand(k, n, trans_b, 25, dt)
    got = F.gemm(a, b, trans_a=trans_a, trans_b=trans_b)
    assert got.shape == (m, n)
    assert_gemm_close(got, a, b, trans_a, trans_b, 1.0, 0.0, None, dt)


def test_gemm_bad_arguments():
    a, b = randn((4, 5), 26), randn((5, 3), 27)
    with pytest.raises(ValueError, match="b: inner dimension does not match"):
        F.gemm(a, randn((4, 3), 28))
    with pytest.raises(ValueError, match="a must be 2-D or 3-D"):
        F.gemm(randn(5, 29), b)
    strided = randn((4, 10), 30)[:, ::2]  # any layout is read (through a C-contiguous copy)
    assert ref.same_bits(F.gemm(strided, b), F.gemm(np.ascontiguousarray(strided), b))
    with pytest.raises(TypeError, match="b must be float32, float16 or bfloat16"):
        F.gemm(a, b.astype(np.float64))
    with pytest.raises(ValueError, match="alpha must be finite"):
        F.gemm(a, b, alpha=float("nan"))
    with pytest.raises(ValueError, match=r"c must have shape \(4, 3\)"):
        F.gemm(a, b, beta=1.0, c=randn((3, 4), 31))
    with pytest.raises(ValueError, match="out_dtype must be"):
        F.gemm(a, b, out_dtype="f64")
    with pytest.raises(ValueError, match="c: batch does not match"):
        F.gemm(randn((2, 4, 5), 32), randn((3, 5, 3), 33))
    with pytest.raises(TypeError, match="c must have native dtype float16"):
        _C.op_gemm(a, b, np.zeros((4, 3), np.float32), "f32", "f32", "f16", False, False, 1.0, 0.0)
    with pytest.raises(ValueError, match="c: must be"):
        _C.op_gemm(a, b, np.zeros((4, 4), np.float32), "f32", "f32", "f32", False, False, 1.0, 0.0)


# --- linear (gemm + bias) ------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
def test_linear_matches_reference(dt):
    x, w, b = ref.to_dtype(randn((3, 4, 12), 40), dt), randn((7, 12), 41), randn(7, 42)
    got = F.linear(x, w, b)
    assert got.shape == (3, 4, 7) and got.dtype == x.dtype
    product = ref.f64(x) @ ref.f64(w).T
    expected = product + ref.f64(b)
    # the product is rounded to dt, then the bias sum is rounded again: one ulp of each
    ulp = 1e-6 if dt == "f32" else ref.ULP[dt]
    bound = ulp * (np.abs(product) + np.abs(expected)) + 1e-5 * np.abs(ref.f64(x)) @ np.abs(ref.f64(w)).T
    assert np.all(np.abs(ref.f64(got) - expected) <= bound)
    assert ref.same_bits(F.linear(x, w), F.gemm(x.reshape(12, 12), w, trans_b=True).reshape(3, 4, 7))


def test_linear_backward_matches_finite_differences():
    x, w, b, dout = randn((5, 6), 43), randn((4, 6), 44), randn(4, 45), randn((5, 4), 46)
    dx, dw, db = F.linear_backward(dout, x, w)
    def f_x(v):
        return v @ ref.f64(w).T + ref.f64(b)
    def f_w(v):
        return ref.f64(x) @ v.T + ref.f64(b)
    def f_b(v):
        return ref.f64(x) @ ref.f64(w).T + v
    ref.assert_grad(dx, ref.numerical_grad(f_x, x, ref.f64(dout)))
    ref.assert_grad(dw, ref.numerical_grad(f_w, w, ref.f64(dout)))
    ref.assert_grad(db, ref.numerical_grad(f_b, b, ref.f64(dout)))
    assert F.linear_backward(dout, x, w, with_bias=False)[2] is None


@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_linear_backward_half_activations(dt):
    x, w, dout = ref.to_dtype(randn((9, 6), 47), dt), randn((4, 6), 48), ref.to_dtype(randn((9, 4), 49), dt)
    dx, dw, db = F.linear_backward(dout, x, w)
    assert dx.dtype == x.dtype and dw.dtype == np.float32 and db.dtype == np.float32
    ref.assert_close(dx, ref.f64(dout) @ ref.f64(w), dt, rtol=2 * ref.ULP[dt], atol=1e-4)
    np.testing.assert_allclose(dw, ref.f64(dout).T @ ref.f64(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(db, ref.f64(dout).sum(0), rtol=1e-5, atol=1e-5)


def test_linear_bad_arguments():
    x = randn((3, 4), 50)
    with pytest.raises(ValueError, match=r"weight must have shape \(out_features, 4\)"):
        F.linear(x, randn((5, 3), 51))
    with pytest.raises(TypeError, match="weight must be float32"):
        F.linear(x, randn((5, 4), 52).astype(np.float16))
    with pytest.raises(ValueError, match=r"bias must have shape \(5,\)"):
        F.linear(x, randn((5, 4), 53), randn(4, 54))
    with pytest.raises(ValueError, match="dout must have shape"):
        F.linear_backward(randn((3, 6), 55), x, randn((5, 4), 56))
