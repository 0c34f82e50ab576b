"""Float64 NumPy references of every CPU op (csrc/ops/) and a finite-difference gradient check.

The references are written from the math, independently of the C code: they use float64 and
NumPy/`math` only (Philox4x32-10 is re-implemented here in NumPy), so a test that compares an op
with them can fail for real.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import ml_dtypes
import numpy as np

import gputrain

BF16 = np.dtype(ml_dtypes.bfloat16)
HALF_TYPES = {"f16": np.dtype(np.float16), "bf16": BF16}
NUMPY_TYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16}
#: Relative size of one unit in the last place of each dtype (2^-mantissa bits).
ULP = {"f32": 2.0**-23, "f16": 2.0**-10, "bf16": 2.0**-7}


# --- dtype helpers ------------------------------------------------------------------------------


def to_dtype(x: np.ndarray, dt: str) -> np.ndarray:
    """x rounded (RNE) to an activation dtype, as float32/float16/bfloat16 arrays."""
    return np.asarray(x, dtype=np.float32).astype(NUMPY_TYPES[dt])


def f64(x: np.ndarray) -> np.ndarray:
    """Exact widening of float32/float16/bfloat16 values to float64."""
    return np.asarray(x).astype(np.float64)


def assert_close(actual: np.ndarray, reference: np.ndarray, dt: str = "f32",
                 rtol: float | None = None, atol: float = 0.0, err_msg: str = "") -> None:
    """actual (dtype dt) against a float64 reference: f32 to ~1e-5 relative; half dtypes to the
    reference rounded to dt within one unit in the last place (the op rounds its f32 result once,
    which can fall on the other side of a rounding boundary)."""
    actual64 = f64(actual)
    if dt == "f32":
        np.testing.assert_allclose(actual64, reference, rtol=rtol or 1e-5, atol=atol, err_msg=err_msg)
        return
    rounded = f64(to_dtype(reference, dt))
    tolerance = (rtol or ULP[dt]) * np.abs(rounded) + max(atol, 1e-30)
    bad = ~(np.abs(actual64 - rounded) <= tolerance) & ~(np.isnan(actual64) & np.isnan(rounded))
    if bad.any():
        index = tuple(np.argwhere(bad)[0])
        raise AssertionError(f"{err_msg} {bad.sum()} of {bad.size} elements differ beyond 1 ulp of {dt}; "
                             f"first at {index}: {actual64[index]!r} vs reference {reference[index]!r}")


# --- run-time settings ----------------------------------------------------------------------------

SIMD_ORDER = ["scalar", "avx2", "avx512"]


def simd_levels() -> list[str]:
    """The SIMD levels this CPU supports, lowest first."""
    best = gputrain._C.build_info()["simd_supported"]
    return SIMD_ORDER[: SIMD_ORDER.index(best) + 1]


@contextlib.contextmanager
def simd_level(level: str) -> Iterator[None]:
    """Runs the body at a lowered SIMD level, then restores the previous one."""
    previous = gputrain._C.build_info()["simd"]
    gputrain._C.set_simd_level(level)
    try:
        yield
    finally:
        gputrain._C.set_simd_level(previous)


@contextlib.contextmanager
def num_threads(count: int) -> Iterator[None]:
    """Runs the body with `count` threads (OpenMP and BLAS), then restores the previous count."""
    previous = gputrain.get_num_threads()
    gputrain.set_num_threads(count)
    try:
        yield
    finally:
        gputrain.set_num_threads(previous)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two arrays (NaNs with equal payloads compare equal)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_thread_counts_keep_the_bits(make: Callable[[], tuple], counts: list[tuple[int, int]]) -> None:
    """For each (planned, running) in counts: make()'s (model, x, y) (seeded with 0) planned by a
    TrainStep with `planned` threads, then stepped with `running`; the losses and gradients of all
    pairs have the same bits."""
    results = []
    for planned, running in counts:
        gputrain.random.manual_seed(0)
        model, x, y = make()
        with num_threads(planned):
            gputrain.TrainStep(model, gputrain.nn.CrossEntropyLoss())(x, y)  # plans and allocates
        with num_threads(running):
            step = gputrain.TrainStep(model, gputrain.nn.CrossEntropyLoss())(x, y)
        results.append((step.loss, [p.grad.copy() for p in model.parameters()]))
    for loss, grads in results[1:]:
        assert loss == results[0][0]
        assert all(same_bits(a, b) for a, b in zip(grads, results[0][1]))


# --- finite differences -------------------------------------------------------------------------


def numerical_grad(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, dout: np.ndarray | float,
                   h: float = 1e-6) -> np.ndarray:
    """Gradient of sum(f(x) * dout) with respect to x by central differences in float64."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    flat, grad_flat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        saved = flat[i]
        flat[i] = saved + h
        plus = np.sum(f(x) * dout)
        flat[i] = saved - h
        minus = np.sum(f(x) * dout)
        flat[i] = saved
        grad_flat[i] = (plus - minus) / (2.0 * h)
    return grad


def assert_grad(analytic: np.ndarray, numeric: np.ndarray, rtol: float = 1e-4,
                atol: float = 1e-6, err_msg: str = "") -> None:
    """An op's float32 gradient against central differences of the float64 reference."""
    np.testing.assert_allclose(f64(analytic), numeric, rtol=rtol, atol=atol, err_msg=err_msg)


# --- GEMM ---------------------------------------------------------------------------------------


def gemm(a: np.ndarray, b: np.ndarray, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, c: np.ndarray | None = None) -> np.ndarray:
    """alpha op(a) @ op(b) + beta c in float64 (3-D operands are batches)."""
    a, b = f64(a), f64(b)
    op_a = np.swapaxes(a, -1, -2) if trans_a else a
    op_b = np.swapaxes(b, -1, -2) if trans_b else b
    out = alpha * (op_a @ op_b)
    return out + beta * f64(c) if beta != 0.0 else out


# --- activations --------------------------------------------------------------------------------

_erfc = np.vectorize(math.erfc, otypes=[np.float64])
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@np.errstate(over="ignore")  # exp(-2u) = inf for u << 0 gives the right limit x / inf = -0
def activation(x: np.ndarray, kind: str) -> np.ndarray:
    """act(x) in float64 (PyTorch's definitions; relu keeps NaN)."""
    x = f64(x)
    if kind == "relu":
        return np.where(x > 0, x, np.where(np.isnan(x), x, 0.0))
    if kind == "gelu":  # 0.5 x (1 + erf(x / sqrt 2)), written with erfc to stay exact for x << 0
        return 0.5 * x * _erfc(-x / math.sqrt(2.0))
    if kind == "gelu_tanh":  # 0.5 x (1 + tanh(u)) = x sigmoid(2u)
        return x / (1.0 + np.exp(-2.0 * SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
    if kind == "tanh":
        return np.tanh(x)
    if kind == "silu":
        return x / (1.0 + np.exp(-x))
    raise ValueError(kind)


@np.errstate(over="ignore")
def activation_grad(x: np.ndarray, kind: str) -> np.ndarray:
    """act'(x) in float64 (relu'(0) = 0)."""
    x = f64(x)
    if kind == "relu":
        return (x > 0).astype(np.float64)
    if kind == "gelu":
        return 0.5 * _erfc(-x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    if kind == "gelu_tanh":  # with s = sigmoid(2u): 0.5 (1 + tanh u) = s, 0.5 (1 - tanh^2 u) = 2 s (1 - s)
        u = SQRT_2_OVER_PI * (x + 0.044715 * x**3)
        s, one_minus_s = 1.0 / (1.0 + np.exp(-2.0 * u)), 1.0 / (1.0 + np.exp(2.0 * u))
        return s + 2.0 * x * s * one_minus_s * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
    if kind == "tanh":
        return 1.0 - np.tanh(x) ** 2
    if kind == "silu":
        s, one_minus_s = 1.0 / (1.0 + np.exp(-x)), 1.0 / (1.0 + np.exp(x))
        return s * (1.0 + x * one_minus_s)
    raise ValueError(kind)


# --- Philox4x32-10 and dropout ------------------------------------------------------------------

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_LOW = np.uint64(0xFFFFFFFF)


def philox4x32_10(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 (Salmon et al. 2011) of counters (n, 4) uint32 under key (k0, k1): (n, 4)."""
    x = [counters[:, j].astype(np.uint64) for j in range(4)]
    k0, k1 = key
    for _ in range(10):
        p0, p1 = _M0 * x[0], _M1 * x[2]
        x = [(p1 >> np.uint64(32)) ^ x[1] ^ np.uint64(k0), p1 & _LOW,
             (p0 >> np.uint64(32)) ^ x[3] ^ np.uint64(k1), p0 & _LOW]
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return np.stack(x, axis=1).astype(np.uint32)


def dropout_mask(n: int, p: float, seed: int, layer: int, step: int, offset: int) -> np.ndarray:
    """The keep mask of elements offset .. offset + n - 1 (rule of csrc/core/dropout.h): element g
    uses word g % 4 of Philox(key = seed, counter = (g // 4 low, high, layer, step)) and is kept
    when (word >> 8) * 2^-24 >= p."""
    g = np.arange(offset, offset + n, dtype=np.uint64)
    groups = np.unique(g // np.uint64(4))
    counters = np.stack([groups & _LOW, groups >> np.uint64(32),
                         np.full_like(groups, layer), np.full_like(groups, step)], axis=1).astype(np.uint32)
    words = philox4x32_10(counters, (seed & 0xFFFFFFFF, seed >> 32))
    row = np.searchsorted(groups, g // np.uint64(4))
    word = words[row, (g % np.uint64(4)).astype(np.int64)]
    uniform = (word >> np.uint32(8)).astype(np.float64) * 2.0**-24
    return uniform >= np.float32(p)


def dropout(x: np.ndarray, p: float, seed: int, layer: int = 0, step: int = 0,
            offset: int = 0) -> np.ndarray:
    """x * mask * scale with PyTorch's CPU scale: float32(1) / float32(1 - p), 1 - p in double
    (0 for p = 1, where nothing is kept)."""
    mask = dropout_mask(x.size, p, seed, layer, step, offset).reshape(x.shape)
    scale = float(np.float32(1.0) / np.float32(1.0 - p)) if p < 1 else 0.0
    return f64(x) * mask * scale


# --- LayerNorm, embedding -----------------------------------------------------------------------


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray,
               eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(out, mean, rstd) over the last axis in float64 (biased variance)."""
    x = f64(x)
    mean = x.mean(axis=-1)
    var = ((x - mean[..., None]) ** 2).mean(axis=-1)
    rstd = 1.0 / np.sqrt(var + eps)
    out = (x - mean[..., None]) * rstd[..., None] * f64(weight) + f64(bias)
    return out, mean, rstd


def layer_norm_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray,
                        eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Analytic float64 (dx, dweight, dbias) of layer_norm."""
    x, dout = f64(x), f64(dout)
    _, mean, rstd = layer_norm(x, weight, np.zeros_like(weight), eps)
    xhat = (x - mean[..., None]) * rstd[..., None]
    g = dout * f64(weight)
    dx = rstd[..., None] * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    axes = tuple(range(x.ndim - 1))
    return dx, (dout * xhat).sum(axis=axes), dout.sum(axis=axes)


def embedding_backward(dout: np.ndarray, ids: np.ndarray, num: int) -> np.ndarray:
    dtable = np.zeros((num, dout.shape[-1]))
    np.add.at(dtable, ids.reshape(-1), f64(dout).reshape(-1, dout.shape[-1]))
    return dtable


# --- losses -------------------------------------------------------------------------------------


def cross_entropy(logits: np.ndarray, targets: np.ndarray, label_smoothing: float = 0.0,
                  ignore_index: int = -100) -> tuple[np.ndarray, np.ndarray, int]:
    """(per-row losses, d(mean loss)/dlogits, count) in float64 with PyTorch's semantics."""
    x = f64(logits)
    rows, classes = x.shape
    shifted = x - x.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    counted = targets != ignore_index
    count = int(counted.sum())
    safe_targets = np.where(counted, targets, 0)
    nll = -logp[np.arange(rows), safe_targets]
    losses = (1.0 - label_smoothing) * nll + label_smoothing * (-logp.mean(axis=1))
    losses = np.where(counted, losses, 0.0)
    smoothed = np.full_like(x, label_smoothing / classes)
    smoothed[np.arange(rows), safe_targets] += 1.0 - label_smoothing
    grad = (np.exp(logp) - smoothed) * counted[:, None] / max(count, 1)
    return losses, grad, count


def mse(pred: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """(mean squared error, its gradient) in float64."""
    diff = f64(pred) - f64(target)
    return float(np.mean(diff**2)), 2.0 * diff / diff.size
