"""The CUDA op table (cuda/ops_*.cu) against the CPU op table, op by op on the same inputs through
_C_testing.run_op, and a model on CUDA against the same model on the CPU.

Tests marked `cuda` need a GPU (they skip without one): every op on random inputs in f32/f16/bf16,
bit-identical where the CUDA kernels follow the CPU's arithmetic and order (elementwise ops, dropout
masks, LayerNorm statistics and din, embedding gradients, mse, sum_squares, casts), within a few
ulp elsewhere (GEMM, transcendental activations, softmax), and bit-identical from run to run for
the deterministic reductions. The unmarked tests run everywhere: the run_op harness on the CPU
table (the plumbing the GPU tests rely on), the Model's host-copy methods, and the clear errors a
machine without a usable device gives.
"""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
import gputrain as gt
from gputrain import _C
from gputrain import _C_testing

nn = gt.nn
cuda = pytest.mark.cuda

DTYPES = ["f32", "f16", "bf16"]
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "tanh": 3, "silu": 4}
F32_ULP = 2.0**-23


def randn(shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def act(shape, dt, seed=0, scale=1.0):
    """Random activations rounded to dt (float32, float16 or bfloat16 arrays)."""
    return ref.to_dtype(randn(shape, seed, scale), dt)


def at_offset(array, offset):
    """A copy of `array` that starts `offset` elements into a fresh buffer (for unaligned pointers)."""
    flat = np.empty(array.size + offset, dtype=array.dtype)
    view = flat[offset:].reshape(array.shape)
    view[...] = array
    return view


def copies(arrays):
    """Fresh copies (None kept), each as (mis)aligned modulo 16 bytes as the original."""
    return [None if a is None else at_offset(a, (a.__array_interface__["data"][0] % 16) // a.itemsize)
            for a in arrays]


def run_both(op, arrays, args):
    """(result, arrays) of the CPU table and of the CUDA table, each on its own copies."""
    cpu, gpu = copies(arrays), copies(arrays)
    return (_C_testing.run_op("cpu", op, cpu, args), cpu), (_C_testing.run_op("cuda", op, gpu, args), gpu)


def run_cuda(op, arrays, args):
    gpu = copies(arrays)
    return _C_testing.run_op("cuda", op, gpu, args), gpu


def same_bits(a, b):
    return ref.same_bits(np.asarray(a), np.asarray(b))


def assert_within_ulps(got, expected, dt, ulps=1.0, scale=None):
    """|got - expected| <= ulps units in the last place of dt (relative to |expected|, or to
    `scale` when given), NaN matching NaN."""
    got64, expected64 = ref.f64(got), ref.f64(expected)
    base = np.abs(expected64) if scale is None else scale
    tiny = 2.0**-24 if dt == "f16" else 1e-37
    bound = ulps * ref.ULP[dt] * base + tiny
    bad = ~(np.abs(got64 - expected64) <= bound) & ~(np.isnan(got64) & np.isnan(expected64))
    assert not bad.any(), (f"{bad.sum()} of {bad.size} differ by more than {ulps} ulp ({dt}); first at "
                           f"{np.argwhere(bad)[0]}: {got64[bad][0]!r} vs {expected64[bad][0]!r}")


# ------------------------------------------------------------------ GEMM


def gemm_args(trans_a, trans_b, m, n, k, alpha, beta, dts, lds, batch=1, strides=(0, 0, 0)):
    return (trans_a, trans_b, m, n, k, alpha, dts[0], lds[0], dts[1], lds[1], beta, dts[2], lds[2], batch, *strides)


def operand(rows, cols, trans, dt, seed, batch=None):
    shape = (cols, rows) if trans else (rows, cols)
    return act(((batch,) if batch else ()) + shape, dt, seed)


def gemm_scale(a, b, trans_a, trans_b, alpha, beta, c):
    """sum_k |a_ik b_kj| |alpha| + |beta c|: what the accumulation error is relative to."""
    scale = ref.gemm(np.abs(ref.f64(a)), np.abs(ref.f64(b)), trans_a, trans_b, abs(alpha))
    return scale + abs(beta) * np.abs(ref.f64(c)) if beta != 0.0 else scale


def assert_gemm_agrees(gpu_c, cpu_c, scale, c_dt, tol=1e-5):
    """Two fp32-accumulated GEMMs agree to `tol` of the scale, plus one ulp of a half result."""
    error = np.abs(ref.f64(gpu_c) - ref.f64(cpu_c))
    bound = tol * scale + 1e-30
    if c_dt != "f32":
        bound = bound + ref.ULP[c_dt] * np.abs(ref.f64(cpu_c))
    assert np.all(np.isfinite(ref.f64(gpu_c)))
    assert np.all(error <= bound), f"max excess {np.max(error - bound)} ({c_dt})"


GEMM_TYPES = [("f32", "f32", "f32"), ("f16", "f16", "f16"), ("f16", "f16", "f32"), ("bf16", "bf16", "bf16"),
              ("bf16", "bf16", "f32"), ("f16", "f32", "f32"), ("f32", "f32", "bf16"), ("f16", "f16", "bf16")]


@cuda
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("dts", GEMM_TYPES)
@pytest.mark.parametrize("alpha,beta", [(1.0, 0.0), (0.5, 1.0)])
def test_gemm_matches_cpu_for_every_transpose_and_dtype_mix(trans_a, trans_b, dts, alpha, beta):
    gt.backends.set_tf32(False)
    m, n, k = 37, 29, 53
    a, b = operand(m, k, trans_a, dts[0], 1), operand(k, n, trans_b, dts[1], 2)
    c = act((m, n), dts[2], 3)
    if beta == 0.0:
        c[...] = np.nan  # beta = 0 must not read C
    args = gemm_args(trans_a, trans_b, m, n, k, alpha, beta, dts, (a.shape[1], b.shape[1], n))
    (_, cpu), (_, gpu) = run_both("gemm", [a, b, c], args)
    assert_gemm_agrees(gpu[2], cpu[2], gemm_scale(a, b, trans_a, trans_b, alpha, beta, c), dts[2])
    assert same_bits(gpu[0], a) and same_bits(gpu[1], b)  # inputs untouched


@cuda
@pytest.mark.parametrize("dts", [("f32", "f32", "f32"), ("f16", "f16", "f16"), ("bf16", "bf16", "f32"),
                                 ("f16", "f32", "f16")])
def test_gemm_strided_batches_with_a_broadcast_operand(dts):
    gt.backends.set_tf32(False)
    batch, m, n, k = 4, 17, 33, 24
    a = operand(m, k, False, dts[0], 4, batch)
    b = operand(k, n, True, dts[1], 5)  # one B for every batch: stride 0
    c = act((batch, m, n), dts[2], 6)
    args = gemm_args(False, True, m, n, k, 1.0, 1.0, dts, (k, k, n), batch, (m * k, 0, m * n))
    (_, cpu), (_, gpu) = run_both("gemm", [a, b, c], args)
    scale = gemm_scale(a, np.broadcast_to(b, (batch,) + b.shape), False, True, 1.0, 1.0, c)
    assert_gemm_agrees(gpu[2], cpu[2], scale, dts[2])


@cuda
@pytest.mark.parametrize("dt", DTYPES)
def test_gemm_with_unaligned_pointers_and_padded_leading_dimensions(dt):
    gt.backends.set_tf32(False)
    m, n, k, pad = 21, 19, 27, 3
    a = at_offset(act((m, k + pad), dt, 7), 1)  # one element past an aligned start, lda = k + pad
    b = at_offset(act((n, k), dt, 8), 3)
    c = at_offset(act((m, n + pad), dt, 9), 1)
    args = gemm_args(False, True, m, n, k, 1.0, 0.5, (dt, dt, dt), (k + pad, k, n + pad))
    (_, cpu), (_, gpu) = run_both("gemm", [a, b, c], args)
    scale = gemm_scale(a[:, :k], b, False, True, 1.0, 0.5, c[:, :n])
    assert_gemm_agrees(gpu[2][:, :n], cpu[2][:, :n], scale, dt)
    assert same_bits(gpu[2][:, n:], c[:, n:])  # the padding columns are not written


@cuda
@pytest.mark.parametrize("dt", DTYPES)
def test_gemm_with_k_zero_scales_c_by_beta(dt):
    m, n = 5, 7
    c = act((m, n), dt, 10)
    nan_c = np.full_like(c, np.nan)
    empty = np.zeros(1, dtype=c.dtype)
    (_, gpu) = run_cuda("gemm", [empty, empty, c], gemm_args(False, False, m, n, 0, 1.0, 0.5, (dt, dt, dt),
                                                                 (1, n, n)))
    assert same_bits(gpu[2], ref.to_dtype(ref.f64(c) * 0.5, dt))
    (_, gpu) = run_cuda("gemm", [empty, empty, nan_c], gemm_args(False, False, m, n, 0, 1.0, 0.0,
                                                                     (dt, dt, dt), (1, n, n)))
    assert np.all(ref.f64(gpu[2]) == 0.0)


@cuda
def test_gemm_large_enough_for_tensor_cores_and_tf32():
    m, n, k = 256, 192, 320
    a, b = operand(m, k, False, "f32", 11), operand(k, n, False, "f32", 12)
    c = np.zeros((m, n), np.float32)
    args = gemm_args(False, False, m, n, k, 1.0, 0.0, ("f32",) * 3, (k, n, n))
    scale = gemm_scale(a, b, False, False, 1.0, 0.0, c)
    try:
        gt.backends.set_tf32(False)
        (_, cpu), (_, gpu) = run_both("gemm", [a, b, c], args)
        assert_gemm_agrees(gpu[2], cpu[2], scale, "f32")
        gt.backends.set_tf32(True)  # 10-bit mantissa inputs: about 1e-3 of the scale
        (_, tf32) = run_cuda("gemm", [a, b, c], args)
        assert_gemm_agrees(tf32[2], cpu[2], scale, "f32", tol=2e-3)
    finally:
        gt.backends.set_tf32(False)


@cuda
def test_gemm_bad_arguments_fail_as_on_the_cpu():
    a = np.zeros(64, np.float32)  # room for 4 x 4 f64 values
    for args, match in [(gemm_args(False, False, -1, 4, 4, 1.0, 0.0, ("f32",) * 3, (4, 4, 4)), "m: must be in"),
                        (gemm_args(False, False, 4, 4, 4, 1.0, 0.0, ("f32",) * 3, (2, 4, 4)), "lda: must be in"),
                        (gemm_args(False, False, 4, 4, 4, 1.0, 0.0, ("f64", "f32", "f32"), (4, 4, 4)), "a_dt")]:
        for backend in ("cpu", "cuda"):
            with pytest.raises(ValueError, match=match):
                _C_testing.run_op(backend, "gemm", [a.copy(), a.copy(), a.copy()], args)


# ------------------------------------------------------------------ elementwise


@cuda
@pytest.mark.parametrize("dt", DTYPES)
def test_bias_add_and_add_are_bit_identical(dt):
    rows, cols = 129, 77
    x, y = act((rows, cols), dt, 1), act((rows, cols), dt, 2)
    bias = randn(cols, 3)
    (_, cpu), (_, gpu) = run_both("bias_add", [x, bias], (rows, cols, dt))
    assert same_bits(gpu[0], cpu[0])
    (_, cpu), (_, gpu) = run_both("add", [np.zeros_like(x), x, y], (x.size, dt))
    assert same_bits(gpu[0], cpu[0])


@cuda
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_bias_backward_is_deterministic_and_matches_cpu(dt, accumulate):
    rows, cols = 3001, 70
    dout = act((rows, cols), dt, 4)
    dbias = randn(cols, 5)
    (_, cpu), (_, gpu) = run_both("bias_backward", [dbias, dout], (rows, cols, dt, accumulate))
    (_, again) = run_cuda("bias_backward", [dbias, dout], (rows, cols, dt, accumulate))
    assert same_bits(gpu[0], again[0])
    scale = np.abs(ref.f64(dout)).sum(axis=0) + (np.abs(dbias) if accumulate else 0.0)
    assert_within_ulps(gpu[0], cpu[0], "f32", ulps=2.0, scale=scale)


@cuda
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", list(ACTIVATIONS))
def test_activations_match_cpu_to_a_few_ulp(dt, kind):
    n = 10007
    x = act(n, dt, 6, scale=4.0)
    x[:5] = ref.to_dtype(np.array([0.0, -0.0, 30.0, -30.0, np.nan], np.float32), dt)
    dout = act(n, dt, 7)
    code = ACTIVATIONS[kind]
    (_, cpu), (_, gpu) = run_both("activation_forward", [np.zeros_like(x), x], (n, code, dt))
    (_, cpu_b), (_, gpu_b) = run_both("activation_backward", [np.zeros_like(x), dout, x], (n, code, dt))
    if kind == "relu":
        assert same_bits(gpu[0], cpu[0]) and same_bits(gpu_b[0], cpu_b[0])
        return
    ulps = 16.0 if dt == "f32" else 1.0  # libdevice vs glibc expf/erfcf/tanhf; one rounding of a half
    assert_within_ulps(gpu[0], cpu[0], dt, ulps)
    assert_within_ulps(gpu_b[0], cpu_b[0], dt, ulps)


@cuda
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("offset", [0, 3, 1001])
def test_dropout_masks_are_bit_identical_to_the_cpu_and_the_reference(dt, offset):
    n, p, seed, layer, step = 4099, 0.3, 1234, 2, 7
    x = act(n, dt, 8)
    args = (n, p, seed, layer, step, offset, dt)
    (_, cpu), (_, gpu) = run_both("dropout_forward", [np.zeros_like(x), x], args)
    assert same_bits(gpu[0], cpu[0])
    mask = ref.dropout_mask(n, p, seed, layer, step, offset)
    assert np.array_equal(ref.f64(gpu[0]) != 0.0, mask & (ref.f64(x) != 0.0))
    (_, cpu), (_, gpu) = run_both("dropout_backward", [np.zeros_like(x), x], args)
    assert same_bits(gpu[0], cpu[0])


# ------------------------------------------------------------------ LayerNorm, embedding


def layernorm_inputs(rows, cols, dt):
    return act((rows, cols), dt, 9, scale=3.0), randn(cols, 10), randn(cols, 11)


@cuda
@pytest.mark.parametrize("dt", DTYPES)
def test_layernorm_forward_is_bit_identical(dt):
    rows, cols = 67, 301
    x, weight, bias = layernorm_inputs(rows, cols, dt)
    arrays = [np.zeros_like(x), np.zeros(rows, np.float32), np.zeros(rows, np.float32), x, weight, bias]
    (_, cpu), (_, gpu) = run_both("layernorm_forward", arrays, (rows, cols, 1e-5, dt))
    for k in range(3):
        assert same_bits(gpu[k], cpu[k]), ["out", "mean", "rstd"][k]


@cuda
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_layernorm_backward_din_is_bit_identical_and_param_grads_deterministic(dt, accumulate):
    rows, cols = 1031, 45
    x, weight, bias = layernorm_inputs(rows, cols, dt)
    mean, rstd = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    _C_testing.run_op("cpu", "layernorm_forward", [np.zeros_like(x), mean, rstd, x, weight, bias],
                      (rows, cols, 1e-5, dt))
    dout = act((rows, cols), dt, 12)
    dweight, dbias = randn(cols, 13), randn(cols, 14)
    arrays = [np.zeros_like(x), dweight, dbias, dout, x, weight, mean, rstd]
    (_, cpu), (_, gpu) = run_both("layernorm_backward", arrays, (rows, cols, dt, accumulate))
    (_, again) = run_cuda("layernorm_backward", arrays, (rows, cols, dt, accumulate))
    assert same_bits(gpu[0], cpu[0])
    assert same_bits(gpu[1], again[1]) and same_bits(gpu[2], again[2])
    xhat = (ref.f64(x) - mean[:, None]) * rstd[:, None]
    extra = lambda v: np.abs(v) if accumulate else 0.0  # noqa: E731
    assert_within_ulps(gpu[1], cpu[1], "f32", 2.0, np.abs(ref.f64(dout) * xhat).sum(0) + extra(dweight))
    assert_within_ulps(gpu[2], cpu[2], "f32", 2.0, np.abs(ref.f64(dout)).sum(0) + extra(dbias))


@cuda
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_embedding_forward_and_backward_are_bit_identical(dt, accumulate):
    n, num, dim = 700, 37, 130
    ids = np.random.default_rng(15).integers(0, num, n).astype(np.int64)
    ids[:50] = 3  # many repeats of one row
    table = randn((num, dim), 16)
    (_, cpu), (_, gpu) = run_both("embedding_forward", [np.zeros((n, dim), ref.NUMPY_TYPES[dt]), ids, table],
                                  (n, num, dim, dt))
    assert same_bits(gpu[0], cpu[0])
    dout = act((n, dim), dt, 17)
    dtable = randn((num, dim), 18)
    (_, cpu), (_, gpu) = run_both("embedding_backward", [dtable, dout, ids], (n, num, dim, dt, accumulate))
    assert same_bits(gpu[0], cpu[0])


@cuda
def test_embedding_ids_out_of_range_are_named_as_on_the_cpu():
    ids = np.array([0, 1, 2, 3, 4, 40, 5, -1], np.int64)
    table = randn((30, 4), 19)
    for backend in ("cpu", "cuda"):
        with pytest.raises(IndexError, match=r"ids\[5\] = 40 is out of range \[0, 30\)"):
            _C_testing.run_op(backend, "embedding_forward", [np.zeros((8, 4), np.float32), ids, table],
                              (8, 30, 4, "f32"))
        with pytest.raises(IndexError, match=r"ids\[5\] = 40"):
            _C_testing.run_op(backend, "embedding_backward", [table.copy(), np.zeros((8, 4), np.float32), ids],
                      (8, 30, 4, "f32", False))


# ------------------------------------------------------------------ losses and reductions


@cuda
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("classes", [37, 1000])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_xent_matches_cpu(dt, classes, smoothing):
    rows = 64
    logits = act((rows, classes), dt, 20, scale=3.0)
    targets = np.random.default_rng(21).integers(0, classes, rows).astype(np.int64)
    targets[::7] = -100
    args = (rows, classes, smoothing, -100, 0.5, dt)
    arrays = [np.zeros(rows, np.float32), np.zeros_like(logits), logits, targets]
    (count_cpu, cpu), (count_gpu, gpu) = run_both("softmax_xent", arrays, args)
    assert count_gpu == count_cpu == int((targets != -100).sum())
    assert_within_ulps(gpu[0], cpu[0], "f32", ulps=64.0)
    assert np.all(gpu[0][::7] == 0.0) and np.all(ref.f64(gpu[1][::7]) == 0.0)
    grad_scale = 0.5 / count_cpu  # p - y cancels near the target: compare relative to the step size
    scale = np.abs(ref.f64(cpu[1])) + grad_scale
    assert_within_ulps(gpu[1], cpu[1], dt, ulps=64.0 if dt == "f32" else 1.0, scale=scale)
    (count, nograd) = run_cuda("softmax_xent", [np.zeros(rows, np.float32), None, logits, targets], args)
    assert count == count_cpu and same_bits(nograd[0], gpu[0])


@cuda
def test_softmax_xent_bad_target_is_named_as_on_the_cpu():
    logits = randn((4, 5), 22)
    targets = np.array([1, -100, 5, 0], np.int64)
    for backend in ("cpu", "cuda"):
        with pytest.raises(IndexError, match=r"targets\[2\] = 5 is out of range \[0, 5\) \(ignore_index -100\)"):
            _C_testing.run_op(backend, "softmax_xent", [np.zeros(4, np.float32), None, logits, targets],
                      (4, 5, 0.0, -100, 1.0, "f32"))


@cuda
@pytest.mark.parametrize("dt", DTYPES)
def test_mse_loss_and_gradient_are_bit_identical(dt):
    n = 100003  # several fixed-order parts
    pred, target = act(n, dt, 23), randn(n, 24)
    (loss_cpu, cpu), (loss_gpu, gpu) = run_both("mse", [np.zeros_like(pred), pred, target], (n, 0.25, dt))
    assert loss_gpu == loss_cpu
    assert same_bits(gpu[0], cpu[0])
    (loss, _) = run_cuda("mse", [None, pred, target], (n, 0.25, dt))
    assert loss == loss_cpu


@cuda
@pytest.mark.parametrize("n", [0, 1, 8191, 3_000_001])
def test_sum_squares_is_bit_identical(n):
    x = randn(max(n, 1), 25, scale=10.0)
    (cpu, _), (gpu, _) = run_both("sum_squares", [x], (n,))
    assert gpu == cpu
    assert gpu == pytest.approx(float(np.sum(ref.f64(x[:n]) ** 2)), rel=1e-12)


@cuda
@pytest.mark.parametrize("src_dt", DTYPES)
@pytest.mark.parametrize("dst_dt", DTYPES)
def test_cast_is_bit_identical_including_special_values(src_dt, dst_dt):
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 1e-8, 6e-8, 3e38, -1e-40],
                       np.float32)
    with np.errstate(over="ignore"):  # 65520 and 3e38 overflow to inf in f16 on purpose
        src = ref.to_dtype(np.concatenate([special, randn(5000, 26, scale=100.0)]), src_dt)
    dst = np.zeros(src.size, ref.NUMPY_TYPES[dst_dt])
    (_, cpu), (_, gpu) = run_both("cast", [dst, src], (dst_dt, src_dt, src.size))
    assert same_bits(gpu[0], cpu[0])


@cuda
def test_copy_and_zero():
    src, dst = randn(1000, 27), randn(1000, 28)
    (_, gpu) = run_cuda("copy", [dst, src], (4000,))
    assert same_bits(gpu[0], src)
    (_, gpu) = run_cuda("zero", [dst], (2000,))
    assert np.all(gpu[0][:500] == 0.0) and same_bits(gpu[0][500:], dst[500:])


@cuda
def test_size_and_dtype_errors_match_the_cpu():
    x = np.zeros(8, np.float32)
    cases = [("add", [x, x, x], (-1, "f32"), ValueError, "n: must be >= 0"),
             ("activation_forward", [x, x], (8, 9, "f32"), ValueError, "act: unknown activation"),
             ("dropout_forward", [x, x], (8, 1.5, 0, 0, 0, 0, "f32"), ValueError, "p: dropout probability"),
             ("cast", [x, x], ("i32", "f32", 2), TypeError, "dst_dtype: cast supports"),
             ("mse", [None, x, x], (0, 1.0, "f32"), ValueError, "n: the mean squared error needs")]
    for op, arrays, args, error, match in cases:
        for backend in ("cpu", "cuda"):
            with pytest.raises(error, match=match):
                _C_testing.run_op(backend, op, copies(arrays), args)


# ------------------------------------------------------------------ models on CUDA


def mixed_model(seed=0):
    gt.random.manual_seed(seed)
    block = nn.Residual(nn.LayerNorm(24), nn.Linear(24, 48), nn.GELU(approximate="tanh"), nn.Dropout(0.2),
                        nn.Linear(48, 24))
    return nn.Sequential(nn.Linear(12, 24), nn.SiLU(), block, nn.LayerNorm(24), nn.Tanh(), nn.Linear(24, 7))


def batch(rows=32, seed=30):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 12)).astype(np.float32), rng.integers(0, 7, rows).astype(np.int64)


def gradients_after_step(model, x, y, precision="fp32", **kwargs):
    step = gt.TrainStep(model, nn.CrossEntropyLoss(label_smoothing=0.1), None, precision=precision, **kwargs)
    out = step(x, y)
    return out.loss, model.compiled.read_gradients()


@cuda
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 3e-2), ("bf16", 6e-2)])
def test_model_step_on_cuda_matches_the_cpu_model(precision, tol):
    gt.backends.set_tf32(False)
    cpu_model, gpu_model = mixed_model(), mixed_model().to("cuda")
    assert gpu_model.compiled.device == "cuda:0"
    for name, value in cpu_model.state_dict().items():  # the same host initialisation
        assert same_bits(gpu_model.state_dict()[name], value), name
    x, y = batch()
    loss_cpu, grads_cpu = gradients_after_step(cpu_model, x, y, precision, micro_batches=2)
    loss_gpu, grads_gpu = gradients_after_step(gpu_model, x, y, precision, micro_batches=2)
    assert loss_gpu == pytest.approx(loss_cpu, rel=tol)
    assert np.max(np.abs(grads_gpu - grads_cpu)) <= tol * np.max(np.abs(grads_cpu))
    cpu_model.eval()
    gpu_model.eval()
    np.testing.assert_allclose(gpu_model(x), cpu_model(x), rtol=tol, atol=tol)


@cuda
def test_cuda_step_checkpointing_and_set_to_none_are_bit_identical_on_the_device():
    x, y = batch(seed=31)
    _, plain = gradients_after_step(mixed_model(1).to("cuda"), x, y)
    _, checkpointed = gradients_after_step(mixed_model(1).to("cuda"), x, y, gradient_checkpointing=True)
    _, zeroed = gradients_after_step(mixed_model(1).to("cuda"), x, y, set_to_none=False)
    assert same_bits(checkpointed, plain)
    assert np.array_equal(zeroed, plain)  # 0 + (-0) = +0: equal values, as on the CPU


@cuda
def test_embedding_model_with_mse_on_cuda_matches_cpu():
    def build():
        gt.random.manual_seed(5)
        return nn.Sequential(nn.Embedding(50, 16), nn.Flatten(), nn.Linear(16 * 6, 4))

    rng = np.random.default_rng(32)
    ids, target = rng.integers(0, 50, (8, 6)), rng.standard_normal((8, 4)).astype(np.float32)
    results = []
    for model in (build(), build().to("cuda")):
        out = gt.TrainStep(model, nn.MSELoss(), None)(ids, target)
        results.append((out.loss, model.compiled.read_gradients()))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-5)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-4, atol=1e-6)


@cuda
def test_cuda_model_weights_move_through_state_dict_and_to():
    model = mixed_model(2)
    before = model.state_dict()
    model.to("cuda")
    assert all(same_bits(model.state_dict()[k], v) for k, v in before.items())
    changed = {k: v * 2.0 for k, v in before.items()}
    model.load_state_dict(changed)
    assert all(same_bits(model.state_dict()[k], v) for k, v in changed.items())
    assert model.num_parameters() == sum(v.size for v in before.values())
    with pytest.raises(RuntimeError, match="named_parameters: the parameters of this model live on 'cuda:0'"):
        list(model.parameters())
    with pytest.raises(RuntimeError, match="live on 'cuda:0'"):
        model[0].weight  # noqa: B018
    with pytest.raises(RuntimeError, match="parameter_arrays"):
        model.compiled.parameter_arrays()
    model.to("cpu")
    assert all(same_bits(model.state_dict()[k], v) for k, v in changed.items())
    assert model[0].weight.data.shape == (24, 12)


@cuda
def test_cuda_model_plan_reserves_the_input_and_target_copies():
    x, _ = batch(rows=16)
    cpu_model, gpu_model = mixed_model(3), mixed_model(3).to("cuda")
    cpu_plan, gpu_plan = cpu_model.compiled.plan(x.shape), gpu_model.compiled.plan(x.shape)
    align = lambda b: (b + 63) // 64 * 64  # noqa: E731
    extra = align(x.nbytes) + align(max(16 * 8, 16 * 7 * 4))
    assert gpu_plan["loss_buffers"] == cpu_plan["loss_buffers"] + extra
    assert gpu_plan["workspace"] >= 4 << 20
    assert gpu_plan["activations"] == cpu_plan["activations"]


# ------------------------------------------------------------------ everywhere


def test_run_op_on_the_cpu_table_matches_numpy():
    a, b = randn((3, 4), 40), randn((5, 4), 41)
    c = np.full((3, 5), np.nan, np.float32)
    args = gemm_args(False, True, 3, 5, 4, 2.0, 0.0, ("f32",) * 3, (4, 4, 5))
    assert _C_testing.run_op("cpu", "gemm", [a, b, c], args) is None
    np.testing.assert_allclose(c, 2.0 * a @ b.T, rtol=1e-6)
    x = randn(10, 42)
    expected = pytest.approx(float(np.sum(ref.f64(x) ** 2)), rel=1e-15)
    assert _C_testing.run_op("cpu", "sum_squares", [x], (10,)) == expected
    loss = _C_testing.run_op("cpu", "mse", [None, x, np.zeros(10, np.float32)], (10, 1.0, "f32"))
    assert loss == pytest.approx(float(np.mean(ref.f64(x) ** 2)), rel=1e-6)
    logits, targets = randn((4, 3), 43), np.array([0, 2, -100, 1], np.int64)
    count = _C_testing.run_op("cpu", "softmax_xent", [np.zeros(4, np.float32), None, logits, targets],
                      (4, 3, 0.0, -100, 1.0, "f32"))
    assert count == 3


def test_run_op_checks_its_arguments_before_running():
    x = np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=r"arrays\[2\] \(b\): these arguments need 64 bytes, it has 32"):
        _C_testing.run_op("cpu", "add", [np.zeros(16, np.float32), np.zeros(16, np.float32), x], (16, "f32"))
    with pytest.raises(TypeError, match=r"arrays\[1\] \(a\) must be a numpy.ndarray"):
        _C_testing.run_op("cpu", "add", [x, None, x], (8, "f32"))
    with pytest.raises(ValueError, match="arrays: add takes 3 arrays, got 2"):
        _C_testing.run_op("cpu", "add", [x, x], (8, "f32"))
    with pytest.raises(ValueError, match="C-contiguous, aligned and writeable"):
        _C_testing.run_op("cpu", "add", [x, np.zeros(16, np.float32)[::2], x], (8, "f32"))
    with pytest.raises(ValueError, match="unknown op 'nope'"):
        _C_testing.run_op("cpu", "nope", [], ())
    with pytest.raises(ValueError, match="backend must be 'cpu', 'cuda' or 'sim'"):
        _C_testing.run_op("tpu", "add", [x, x, x], (8, "f32"))
    with pytest.raises(ValueError, match="dt"):
        _C_testing.run_op("cpu", "add", [x, x, x], (8, "f99"))
    with pytest.raises(TypeError):
        _C_testing.run_op("cpu", "add", [x, x, x], (8,))


def test_run_op_on_cuda_without_a_device_raises_naming_it():
    x = np.arange(8, dtype=np.float32)
    if gt.cuda.is_available():
        out = np.zeros(8, np.float32)
        _C_testing.run_op("cuda", "add", [out, x, x.copy()], (8, "f32"))
        assert np.array_equal(out, 2 * x)
        return
    # the device is parsed by gt_device_parse, as _C.Model's is: the same RuntimeError, naming it
    reason = "built without CUDA" if not gt.cuda.is_compiled() else "0 CUDA devices usable"
    with pytest.raises(RuntimeError, match=f"device: device 'cuda:0' is not available .*{reason}"):
        _C_testing.run_op("cuda", "add", [np.zeros(8, np.float32), x, x.copy()], (8, "f32"))


def test_models_name_an_unusable_cuda_device():
    spec = [("linear", 4, 3, True)]
    with pytest.raises(RuntimeError, match="device 'cuda:15' is not available"):
        _C.Model(spec, 0, device="cuda:15")
    model = nn.Sequential(nn.Linear(4, 3))
    before = model.state_dict()
    if gt.cuda.is_available():
        assert model.to("cuda").compiled.device == "cuda:0"
        return
    with pytest.raises(RuntimeError, match="device 'cuda:0' is not available"):  # the canonical name
        model.to("cuda")
    with pytest.raises(NotImplementedError, match="'pinned' is not supported"):
        _C.Model(spec, 0, device="pinned")
    assert all(same_bits(model.state_dict()[k], v) for k, v in before.items())  # still usable on the CPU


@pytest.fixture
def simulated_device(monkeypatch):
    """Models compiled for device 'sim' run on the CPU but, like a CUDA model, expose no NumPy
    views of their arenas: the Python side then takes its device path (host copies only)."""
    from gputrain.nn import module

    original = module._Compiled.__init__

    def compile_for(self, spec, seed, device, precision="f32", plan_only=False):
        original(self, spec, seed, "cpu" if device == "sim:0" else device, precision, plan_only=plan_only)
        if device == "sim:0":  # Module.to passes the canonical name
            self.device, self.on_host, self.params_flat, self.grads_flat = "sim:0", False, None, None

    monkeypatch.setattr(module._Compiled, "__init__", compile_for)


def test_device_models_are_read_and_written_through_host_copies(simulated_device):
    model = mixed_model(7)
    before = model.state_dict()
    model.to("sim")
    assert list(model.state_dict()) == list(before)
    assert all(same_bits(model.state_dict()[k], v) for k, v in before.items())
    assert model.num_parameters() == sum(v.size for v in before.values())
    summary = model.summary()
    assert "2.block.1" in summary and "1,200" in summary and f"{model.num_parameters():,}" in summary
    params = dict(model.named_parameters())  # read-only host copies, as p.detach().cpu().numpy()
    assert list(params) == list(dict.fromkeys(before))
    assert same_bits(params["0.weight"].data, before["0.weight"]) and params["0.weight"].grad is None
    with pytest.raises(ValueError, match="read-only"):
        params["0.weight"].data[...] = 0.0
    assert model[0].weight is params["0.weight"]
    params["0.weight"].data = before["0.weight"] * 2.0  # assigning writes the device memory
    assert same_bits(model.state_dict()["0.weight"], before["0.weight"] * 2.0)
    params["0.weight"].data = before["0.weight"]
    with pytest.raises(RuntimeError, match="grad: this parameter lives on"):
        params["0.weight"].grad = np.zeros((24, 12), np.float32)
    block = model[2].state_dict()  # a submodule reads and writes its own slice of the arena
    model[2].load_state_dict({k: v * 3.0 for k, v in block.items()})
    assert all(same_bits(model.state_dict()["2." + k], v * 3.0) for k, v in block.items())
    assert same_bits(model.state_dict()["0.weight"], before["0.weight"])
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({"0.weight": before["0.weight"]})
    with pytest.raises(ValueError, match=r"state_dict\['0.weight'\]: expected shape \(24, 12\)"):
        model.load_state_dict({**model.state_dict(), "0.weight": np.zeros((2, 2))})
    x, y = batch()
    gradients_after_step(model, x, y)
    model.zero_grad(set_to_none=False)
    assert np.all(model.compiled.read_gradients() == 0.0)
    values, out = model.state_dict(), model.eval()(x)
    model.to("cpu")
    assert all(same_bits(model.state_dict()[k], v) for k, v in values.items())
    assert same_bits(model(x), out) and model[0].weight.data.shape == (24, 12)
    linear = nn.Linear(3, 4).to("sim")  # a device module absorbed into a new container keeps its values
    kept = linear.state_dict()
    assert same_bits(nn.Sequential(linear, nn.ReLU()).state_dict()["0.weight"], kept["weight"])


def test_moving_a_model_keeps_its_dropout_stream_and_step_settings(simulated_device):
    model = mixed_model(8)
    compiled = model.compiled
    compiled.step, compiled.precision, compiled.checkpointing = 3, "bf16", True
    seed = compiled.seed
    x, _ = batch(seed=33)
    out = model(x)  # training mode: dropout active, keyed by (seed, step)
    moved = model.to("sim").compiled
    assert (moved.seed, moved.step, moved.precision, moved.checkpointing) == (seed, 3, "bf16", True)
    assert same_bits(model(x), out)


def test_model_host_copies_of_parameters_and_gradients():
    model = mixed_model(6)
    compiled = model.compiled
    assert compiled.device == "cpu"
    params, grads = compiled.parameter_arrays()
    flat = compiled.read_parameters()
    assert same_bits(flat, params) and not np.shares_memory(flat, params)
    compiled.write_parameters(flat * 0.5)
    assert same_bits(params, flat * 0.5)
    x, y = batch()
    gradients_after_step(model, x, y)
    assert same_bits(compiled.read_gradients(), grads) and np.any(grads != 0.0)
    compiled.zero_gradients()
    assert np.all(grads == 0.0)
    with pytest.raises(ValueError, match="values: expected a 1-d array of"):
        compiled.write_parameters(flat[:-1])
