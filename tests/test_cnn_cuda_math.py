"""The CUDA BatchNorm, 2-D pooling and sequence kernels' arithmetic, run on the host:
tests/_cnn_harness.c (compiled here with the system C compiler) runs the GT_HD functions of
csrc/ops/batchnorm_hd.h, pool2d_hd.h and sequence_hd.h -- the code the threads of
cuda/ops_batchnorm.cu, ops_pool2d.cu and ops_sequence.cu run -- over the kernels' whole grids in
their order of work. Checked bit for bit against the CPU ops (f32/f16/bf16, odd sizes, more planes
than a channel block has threads, ties and NaN for max pooling, the running-statistics update,
momentum=None, eval mode, sequence lengths 0 and full). No GPU is needed; a CUDA step of the models
is compared with the CPU step in tests/test_cuda_cnn.py where a GPU is present."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import _c_harness
import _reference as ref
from gputrain import _C
from gputrain import _C_testing

DT_CODES = {"f32": 0, "f16": 1, "bf16": 2}
DTYPES = list(DT_CODES)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    so = _c_harness.build("_cnn_harness.c", tmp_path_factory.mktemp("cnn_harness"))
    i64, p = ctypes.c_int64, ctypes.c_void_p
    so.gt_harness_mask_lengths.argtypes = [p, p, i64, i64, i64]
    so.gt_harness_seq_pool.argtypes = [ctypes.c_int, p, p, p, i64, i64, i64, ctypes.c_int, ctypes.c_int]
    so.gt_harness_key_starts.argtypes = [p, p, p, p, p, i64, i64, i64, i64]
    for name in ("gt_harness_batchnorm", "gt_harness_pool2d", "gt_harness_mask_lengths", "gt_harness_seq_pool",
                 "gt_harness_key_starts"):
        getattr(so, name).restype = ctypes.c_int
    return so


def ptr(array):
    return ctypes.c_void_p(0 if array is None else array.ctypes.data)


def int64s(*values):
    return (ctypes.c_int64 * len(values))(*values)


def raw(array):
    """What _C's op bindings take: bf16 as its uint16 bits."""
    return None if array is None else array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def assert_same(got, want, names):
    for name, a, b in zip(names, got, want):
        assert (a is None and b is None) or ref.same_bits(a, b), name


# ------------------------------------------------------------------------------------- BatchNorm

BN_SHAPES = [(3, 5, 7, 9), (2, 3, 1, 17), (1, 2, 3, 1), (300, 2, 1, 3)]  # the last: N > 256 threads
BN_MODES = {  # batch_stats, update_running, momentum, affine, tracked
    "train": (True, True, 0.1, True, True),
    "momentum_none": (True, True, -1.0, True, True),
    "eval": (False, False, 0.1, True, True),
    "untracked_no_affine": (True, False, 0.1, False, False),
}
EPS = 1e-3


def bn_forward(lib, backend, x, params, mode, dt):
    batch_stats, update, momentum, _, tracked = BN_MODES[mode]
    w, b, rm, rv = (None if p is None else p.copy() for p in params)
    c = x.shape[1]
    out, mean, rstd = np.full_like(x, np.nan), np.full(c, np.nan, np.float32), np.full(c, np.nan, np.float32)
    count = np.array([3], np.int64) if tracked else None
    if backend == "cpu":
        _C_testing.op_batchnorm2d(raw(out), mean, rstd, raw(x), w, b, rm, rv, count, EPS, momentum, batch_stats,
                                  update, dt)
    else:
        sizes = int64s(x.shape[0], c, x.shape[2] * x.shape[3])
        assert lib.gt_harness_batchnorm(
            0, sizes, ptr(x), ptr(out), ptr(w), ptr(b), ptr(mean), ptr(rstd), ptr(rm), ptr(rv), ptr(count),
            ctypes.c_float(EPS), ctypes.c_double(momentum), int(batch_stats), int(update), None, None, None,
            None, 0, DT_CODES[dt]) == 0
    return out, mean, rstd, rm, rv, count


def bn_backward(lib, backend, x, dout, w, mean, rstd, batch_stats, accumulate, dt):
    c = x.shape[1]
    din = np.full_like(x, np.nan)
    dw, db = (None, None) if w is None else (np.full(c, 0.5, np.float32), np.full(c, -0.25, np.float32))
    if backend == "cpu":
        _C_testing.op_batchnorm2d_backward(raw(din), dw, db, raw(dout), raw(x), w, mean, rstd, batch_stats, dt,
                                           accumulate)
    else:
        sizes = int64s(x.shape[0], c, x.shape[2] * x.shape[3])
        assert lib.gt_harness_batchnorm(
            1, sizes, ptr(x), None, ptr(w), None, ptr(mean), ptr(rstd), None, None, None, ctypes.c_float(EPS),
            ctypes.c_double(0.0), int(batch_stats), 0, ptr(dout), ptr(din), ptr(dw), ptr(db), int(accumulate),
            DT_CODES[dt]) == 0
    return din, dw, db


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("mode", list(BN_MODES))
def test_batchnorm_device_math_gives_the_cpu_ops_bits(lib, dt, shape, mode):
    rng = np.random.default_rng(sum(shape))
    x = ref.to_dtype(rng.standard_normal(shape) * 2.0 + 0.7, dt)
    dout = ref.to_dtype(rng.standard_normal(shape), dt)
    c, affine, tracked = shape[1], BN_MODES[mode][3], BN_MODES[mode][4]
    w, b = (rng.standard_normal(c).astype(np.float32) for _ in range(2)) if affine else (None, None)
    rm, rv = (rng.standard_normal(c).astype(np.float32), rng.random(c).astype(np.float32) + 0.5) if tracked \
        else (None, None)
    names = ["out", "mean", "rstd", "running_mean", "running_var", "num_batches_tracked"]
    want = bn_forward(lib, "cpu", x, (w, b, rm, rv), mode, dt)
    assert_same(bn_forward(lib, "device", x, (w, b, rm, rv), mode, dt), want, names)
    for accumulate in (False, True):
        args = (x, dout, w, want[1], want[2], BN_MODES[mode][0], accumulate, dt)
        assert_same(bn_backward(lib, "device", *args), bn_backward(lib, "cpu", *args), ["din", "dweight", "dbias"])


# ------------------------------------------------------------------------------------ 2-D pooling

POOL_KINDS = {"max": 0, "avg": 1, "adaptive_avg": 2}
POOLS = {  # kind, kernel, stride, padding, dilation, count_include_pad, ceil_mode / adaptive output
    "max2": ("max", (2, 2), (2, 2), (0, 0), (1, 1), True, False),
    "max3_s2_p1_ceil": ("max", (3, 3), (2, 2), (1, 1), (1, 1), True, True),
    "max_dilated": ("max", (2, 3), (1, 2), (1, 0), (2, 1), True, True),
    "avg3_s2_p1": ("avg", (3, 3), (2, 2), (1, 1), (1, 1), True, False),
    "avg_no_pad_count_ceil": ("avg", (3, 2), (2, 1), (1, 1), (1, 1), False, True),
    "adaptive_global": ("adaptive_avg", (1, 1), (1, 1), (0, 0), (1, 1), True, (1, 1)),
    "adaptive_3x2": ("adaptive_avg", (1, 1), (1, 1), (0, 0), (1, 1), True, (3, 2)),
    "adaptive_overlap": ("adaptive_avg", (1, 1), (1, 1), (0, 0), (1, 1), True, (4, 4)),
}


def pool_out_size(size, k, pad, stride, dil, ceil_mode):
    """PyTorch's pooling_output_shape (the plan's pool_out_size)."""
    span = size + 2 * pad - dil * (k - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    return out - 1 if ceil_mode and (out - 1) * stride >= size + pad else out


def pool_run(lib, backend, x, config, dt, dout=None, argmax=None):
    kind, kernel, stride, padding, dilation, include_pad, extra = config
    n, c, h, w = x.shape
    if kind == "adaptive_avg":
        oh, ow = extra
    else:
        oh, ow = (pool_out_size((h, w)[d], kernel[d], padding[d], stride[d], dilation[d], extra) for d in range(2))
    if dout is None:
        out = np.full((n, c, oh, ow), np.nan, x.dtype)
        saved = np.full(out.shape, -1, np.int32) if kind == "max" else None
    else:
        out, saved = np.full_like(x, np.nan), argmax
    if backend == "cpu":
        _C_testing.op_pool2d(raw(out), raw(x), kind, kernel, stride, padding, dilation, include_pad, dt,
                     dout=raw(dout), argmax=saved)
    else:
        sizes = int64s(POOL_KINDS[kind], n, c, h, w, oh, ow)
        window = int64s(*kernel, *stride, *padding, *dilation)
        target = (ptr(None), ptr(out)) if dout is not None else (ptr(out), ptr(None))
        assert lib.gt_harness_pool2d(int(dout is not None), sizes, window, int(include_pad), ptr(x), target[0],
                                     ptr(dout), target[1], ptr(saved), DT_CODES[dt]) == 0
    return out, saved


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", list(POOLS))
@pytest.mark.parametrize("shape", [(2, 3, 9, 8), (1, 2, 5, 7)])
def test_pool2d_device_math_gives_the_cpu_ops_bits(lib, dt, name, shape):
    """Forward (with the maxima's offsets) and backward (from the saved maxima and recomputed),
    on values with many ties and, in f32/f16, NaNs."""
    rng = np.random.default_rng(len(name))
    x = rng.integers(0, 4, shape).astype(np.float32)
    if dt != "bf16":
        x[0, 0, 1, :3] = np.nan
    x = ref.to_dtype(x + rng.random(shape).astype(np.float32) * (rng.random(shape) < 0.3), dt)
    config = POOLS[name]
    want = pool_run(lib, "cpu", x, config, dt)
    got = pool_run(lib, "device", x, config, dt)
    assert_same(got, want, ["out", "argmax"])
    dout = ref.to_dtype(rng.standard_normal(want[0].shape), dt)
    for argmax in ((want[1], None) if config[0] == "max" else (None,)):
        assert_same(pool_run(lib, "device", x, config, dt, dout, argmax)[:1],
                    pool_run(lib, "cpu", x, config, dt, dout, argmax)[:1], ["din"])


# -------------------------------------------------------------------- sequence mask and pooling


def seq_pool_reference(x, lengths, mode, dt):
    """The pooling's exact f32 arithmetic (sums in increasing t, one division), rounded to dt."""
    batch, seq, dim = x.shape
    xf = x.astype(np.float32)
    out = np.zeros((batch, dim), np.float32)
    for b in range(batch):
        count = 1 if mode != 1 else seq if lengths is None else int(lengths[b])
        first = 0 if mode != 2 else seq - 1 if lengths is None else int(lengths[b])
        total = np.zeros(dim, np.float32)
        for t in range(first, first + count):
            total = total + xf[b, t]
        out[b] = total / np.float32(count) if count else 0.0
    return ref.to_dtype(out, dt)


def seq_pool_grad_reference(dout, lengths, seq, mode, dt):
    batch, dim = dout.shape
    din = np.zeros((batch, seq, dim), np.float32)
    for b in range(batch):
        count = 1 if mode != 1 else seq if lengths is None else int(lengths[b])
        first = 0 if mode != 2 else seq - 1 if lengths is None else int(lengths[b])
        if count:
            din[b, first:first + count] = dout[b].astype(np.float32) / np.float32(count)
    return ref.to_dtype(din, dt)


def test_key_starts_device_math_is_the_cpu_ops(lib):
    from gputrain import _C

    rng = np.random.default_rng(1)
    batch, seq = 6, 11
    rows = np.stack([rng.integers(0, 3, (batch, seq)), rng.integers(0, 2, (batch, seq)),
                     rng.integers(0, 3, (batch, seq))], axis=1).astype(np.int64)
    rows[0, 1] = 1  # a row of ones, positions restarting
    rows[1, 1], rows[1, 0] = 0, 0  # padding only
    for pad in (0, 2, -1):
        starts, last = np.full((batch, seq), -1, np.int64), np.full(batch, -1, np.int64)
        assert lib.gt_harness_key_starts(ptr(starts), ptr(last), ptr(rows), ptr(rows.reshape(-1)[seq:]),
                                         ptr(rows.reshape(-1)[2 * seq:]), batch, seq, 3 * seq, pad) == 0
        cpu_starts, cpu_last = np.full_like(starts, -2), np.full_like(last, -2)
        _C_testing.run_op("cpu", "key_starts", [cpu_starts, cpu_last, rows], (batch, seq, 3, pad))
        np.testing.assert_array_equal(starts, cpu_starts)
        np.testing.assert_array_equal(last, cpu_last)


def test_mask_lengths_count_the_ones_of_rows_at_a_stride(lib):
    batch, seq, stride = 5, 7, 21  # the mask is channel 2 of (batch, 3, seq) int64 rows
    rows = np.random.default_rng(0).integers(0, 2, (batch, 3, seq)).astype(np.int64)
    rows[0, 2], rows[1, 2] = 0, 1  # lengths 0 and full
    lengths = np.full(batch, -1, np.int64)
    assert lib.gt_harness_mask_lengths(ptr(lengths), ptr(rows.reshape(-1)[2 * seq:]), batch, seq, stride) == 0
    np.testing.assert_array_equal(lengths, (rows[:, 2] != 0).sum(1))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("mode", [0, 1, 2], ids=["first", "mean", "last"])
@pytest.mark.parametrize("masked", [False, True])
def test_sequence_pooling_device_math_is_the_ops_f32_arithmetic(lib, dt, mode, masked):
    batch, seq, dim = 4, 9, 13
    rng = np.random.default_rng(mode)
    x = ref.to_dtype(rng.standard_normal((batch, seq, dim)) * 3.0, dt)
    dout = ref.to_dtype(rng.standard_normal((batch, dim)), dt)
    lengths = np.array([0, seq - 1 if mode == 2 else seq, 1, 5], np.int64) if masked else None
    out = np.full((batch, dim), np.nan, x.dtype)
    assert lib.gt_harness_seq_pool(0, ptr(out), ptr(x), ptr(lengths), batch, seq, dim, mode, DT_CODES[dt]) == 0
    assert ref.same_bits(out, seq_pool_reference(x, lengths, mode, dt))
    din = np.full_like(x, np.nan)
    assert lib.gt_harness_seq_pool(1, ptr(din), ptr(dout), ptr(lengths), batch, seq, dim, mode, DT_CODES[dt]) == 0
    assert ref.same_bits(din, seq_pool_grad_reference(dout, lengths, seq, mode, dt))
