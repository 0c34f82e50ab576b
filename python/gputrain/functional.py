"""NumPy-in, NumPy-out functions over gputrain's CPU op table, in the spirit of torch.nn.functional.

Every function runs the same C op the training step runs (csrc/ops/cpu_*.c), with the GIL
released, and returns new arrays (inputs are never modified, except an ``*_into`` gradient
buffer, which is accumulated into in place as the training step does).

Activation precision: activation arrays (inputs, outputs, their gradients) may be float32,
float16 or ``ml_dtypes.bfloat16``; the dtype is taken from the array (uint16 arrays hold bf16 or
f16 bit patterns and need ``dtype="bf16"`` or ``"fp16"``; every ``dtype=`` takes gputrain's one
precision vocabulary: ``"fp32"``/``"bf16"``/``"fp16"``, the aliases ``"f32"``, ``"f16"``,
``"float16"``, ``"bfloat16"``, ... and NumPy/torch dtypes). Ops load half values into float32,
compute in float32 and round the result once. Parameters (weights, biases, tables) and their
gradients are always float32. Dtypes must be exact: nothing is converted silently (use
:func:`gputrain.cast`). Inputs may have any memory layout (a strided view such as ``x[:, ::2]``
is copied to a C-contiguous array first); an ``*_into`` array, written in place, must be
C-contiguous.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gputrain import _C
from gputrain._cast import bfloat16, is_bfloat16
from gputrain._vocab import c_dtype

__all__ = [
    "activation",
    "activation_backward",
    "add",
    "bias_add",
    "bias_backward",
    "conv2d",
    "conv2d_backward",
    "cross_entropy",
    "dropout",
    "dropout_backward",
    "embedding",
    "embedding_backward",
    "gelu",
    "gelu_backward",
    "gated_activation",
    "gated_activation_backward",
    "gemm",
    "layer_norm",
    "layer_norm_backward",
    "linear",
    "linear_backward",
    "mse_loss",
    "relu",
    "relu_backward",
    "rope_inv_freq",
    "rotary_embedding",
    "rotary_embedding_backward",
    "scaled_dot_product_attention",
    "scaled_dot_product_attention_backward",
    "silu",
    "silu_backward",
    "sum_squares",
    "tanh",
    "tanh_backward",
]

#: Activation names and their codes in ops.h (gt_activation).
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "tanh": 3, "silu": 4}

_NUMPY_DT = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16"}


def _wrap(raw: np.ndarray, dt: str, bits: bool) -> np.ndarray:
    """A raw result (float32, float16 or uint16 bf16 bits) as the caller's kind of array: uint16
    bit patterns when the caller passed bits, ml_dtypes.bfloat16 for bf16 when installed."""
    if bits:
        return raw.view(np.uint16)
    bf16 = bfloat16() if dt == "bf16" else None
    if bf16 is not None:
        return raw.view(bf16)
    return raw


class _Act:
    """An activation array ready for the C ops: its raw view and its dtype name."""

    __slots__ = ("raw", "dt", "bits")

    def __init__(self, raw: np.ndarray, dt: str, bits: bool) -> None:
        self.raw = raw    # float32, float16 or uint16 (bf16 bits) array
        self.dt = dt      # "f32", "f16" or "bf16"
        self.bits = bits  # True when the caller passed uint16 bit patterns

    def empty(self, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A new raw array of this dtype (shape defaults to raw's)."""
        return np.empty(self.raw.shape if shape is None else shape, dtype=self.raw.dtype)

    def wrap(self, raw: np.ndarray) -> np.ndarray:
        """A raw result of this dtype as the caller's kind of array."""
        return _wrap(raw, self.dt, self.bits)


_RAW_TYPES = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def _dtype_name(dtype: Any, arg_name: str = "dtype") -> str | None:
    """The C core's name ('f32', 'f16', 'bf16') of a precision (gputrain._vocab), or None."""
    return None if dtype is None else c_dtype(dtype, arg_name)


def _array(value: Any, name: str, in_place: bool = False) -> np.ndarray:
    """An array as the C ops read it: C-contiguous and aligned, copied when it is not (inputs are
    never written); an array written in place must be so already."""
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, not {type(value).__name__}")
    if value.flags.c_contiguous and value.flags.aligned:
        return value
    if in_place:
        raise ValueError(f"{name} must be C-contiguous and aligned: it is updated in place "
                         "(pass an array made with np.ascontiguousarray and keep using that one)")
    return np.require(value, requirements=["C", "A"])


def _act(value: Any, name: str, dtype: str | None) -> _Act:
    """Checks an activation array; dtype (a canonical name or None) must agree with it."""
    array = _array(value, name)
    if is_bfloat16(array.dtype):
        found, raw, bits = "bf16", array.view(np.uint16), False
    elif array.dtype == np.uint16:
        if dtype not in ("bf16", "f16"):
            raise TypeError(f"{name} is a uint16 array: pass dtype='bf16' or 'f16' "
                            "to say which bits it holds")
        found, raw, bits = dtype, array if dtype == "bf16" else array.view(np.float16), True
    elif array.dtype in _NUMPY_DT:
        found, raw, bits = _NUMPY_DT[array.dtype], array, False
    else:
        raise TypeError(f"{name} must be float32, float16 or bfloat16, got {array.dtype}")
    if dtype is not None and found != dtype:
        raise TypeError(f"{name} has dtype {array.dtype} but dtype={dtype!r} was asked for "
                        "(convert it with gputrain.cast)")
    return _Act(raw, found, bits)


def _acts(dtype: str | None, **arrays: Any) -> list[_Act]:
    """Checks several activation arrays that must share one dtype (dtype, else the first's). A
    uint16 array needs an explicit dtype: its bits are never read as another array's dtype."""
    dtype = _dtype_name(dtype)
    checked: list[_Act] = []
    for name, value in arrays.items():
        act = _act(value, name, dtype)
        if checked and act.dt != checked[0].dt:
            raise TypeError(f"{name} is {act.dt} but {next(iter(arrays))} is {checked[0].dt}: "
                            "the activation arrays of one call share one dtype")
        checked.append(act)
    return checked


def _is_bits(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == np.uint16


def _param(value: Any, name: str, shape: tuple[int, ...] | None = None,
           in_place: bool = False) -> np.ndarray:
    """Checks a float32 parameter (or gradient) array."""
    array = _array(value, name, in_place)
    if array.dtype != np.float32:
        raise TypeError(f"{name} must be float32 (parameters are always float32), "
                        f"got {array.dtype}")
    if shape is not None and array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    return array


def _grad_into(value: np.ndarray | None, name: str,
               shape: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    """The gradient buffer and whether to accumulate: a new array to write, or the caller's."""
    if value is None:
        return np.empty(shape, dtype=np.float32), False
    array = _param(value, name, shape, in_place=True)
    if not array.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    return array, True


def _ids(value: Any, name: str) -> np.ndarray:
    """An integer index array as C-contiguous int64 of the same shape (0-d stays 0-d)."""
    array = np.asarray(value)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got {array.dtype}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} has values that do not fit int64")
    return np.asarray(array, dtype=np.int64, order="C")


def _real(value: Any, name: str, low: float | None = None, high: float | None = None) -> float:
    """A finite real scalar, optionally within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a real number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}")
    if low is not None and number < low:
        raise ValueError(f"{name} must be >= {low}, got {number}")
    if high is not None and number > high:
        raise ValueError(f"{name} must be <= {high}, got {number}")
    return number


def _check_no_nan(act: _Act, name: str) -> None:
    """Raises ValueError when an activation array holds a NaN (losses are where NaNs surface)."""
    raw = act.raw
    if act.dt == "bf16":
        has_nan = bool(np.any((raw & 0x7FFF) > 0x7F80))
    else:
        has_nan = bool(np.isnan(raw).any())
    if has_nan:
        raise ValueError(f"{name} contains NaN")


# --- GEMM and linear layers -------------------------------------------------------------------


def gemm(a: np.ndarray, b: np.ndarray, *, trans_a: bool = False, trans_b: bool = False,
         alpha: float = 1.0, beta: float = 0.0, c: np.ndarray | None = None,
         out_dtype: str | None = None, dtype: str | None = None) -> np.ndarray:
    """``alpha * op(a) @ op(b) + beta * c`` with float32 accumulation (oneDNN or OpenBLAS on CPU).

    ``a`` and ``b`` are 2-D, or 3-D for a batch of GEMMs (a 2-D operand is shared by the
    batch); ``op(x)`` is ``x`` or its last two axes swapped when ``trans_x``. Each operand keeps
    its own activation dtype (half operands are widened exactly to float32). The result has
    ``out_dtype`` (default: a's), rounded once. ``c`` (read only when ``beta != 0``) is not
    modified. ``dtype`` says what uint16 operands hold.
    """
    dtype = _dtype_name(dtype)
    a_act = _act(a, "a", dtype if _is_bits(a) else None)
    b_act = _act(b, "b", dtype if _is_bits(b) else None)
    explicit_out = _dtype_name(out_dtype, "out_dtype")
    out_dt = explicit_out or a_act.dt
    alpha, beta = _real(alpha, "alpha"), _real(beta, "beta")
    for name, act in (("a", a_act), ("b", b_act)):
        if act.raw.ndim not in (2, 3):
            raise ValueError(f"{name} must be 2-D or 3-D, got shape {act.raw.shape}")
    m = a_act.raw.shape[-1] if trans_a else a_act.raw.shape[-2]
    n = b_act.raw.shape[-2] if trans_b else b_act.raw.shape[-1]
    batch = [x.raw.shape[0] for x in (a_act, b_act) if x.raw.ndim == 3]
    shape = ((batch[0],) if batch else ()) + (m, n)
    if c is None or beta == 0.0:
        out = np.empty(shape, dtype=_RAW_TYPES[out_dt])
    else:
        c_act = _act(c, "c", (explicit_out or dtype) if _is_bits(c) else out_dt)
        if c_act.dt != out_dt:
            raise TypeError(f"c holds {c_act.dt} values but the result is {out_dt} (pass out_dtype)")
        if c_act.raw.shape != shape:
            raise ValueError(f"c must have shape {shape}, got {c_act.raw.shape}")
        out = c_act.raw.copy()
    _C.op_gemm(a_act.raw, b_act.raw, out, a_act.dt, b_act.dt, out_dt, bool(trans_a),
               bool(trans_b), alpha, beta)
    return _wrap(out, out_dt, a_act.bits)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
           dtype: str | None = None) -> np.ndarray:
    """``x @ weight.T + bias`` for x (..., in), weight (out, in), bias (out,) float32.

    The GEMM result is rounded to x's dtype, then the bias is added and rounded again, as the
    training step's Linear layer does.
    """
    (x_act,) = _acts(dtype, x=x)
    if x_act.raw.ndim < 1:
        raise ValueError("x must have at least one dimension")
    weight = _param(weight, "weight")
    if weight.ndim != 2 or weight.shape[1] != x_act.raw.shape[-1]:
        raise ValueError(f"weight must have shape (out_features, {x_act.raw.shape[-1]}), "
                         f"got {weight.shape}")
    x2 = x_act.raw.reshape(-1, x_act.raw.shape[-1])
    out = np.empty((x2.shape[0], weight.shape[0]), dtype=x2.dtype)
    _C.op_gemm(x2, weight, out, x_act.dt, "f32", x_act.dt, False, True, 1.0, 0.0)
    if bias is not None:
        _C.op_bias(out, _param(bias, "bias", (weight.shape[0],)), x_act.dt)
    return x_act.wrap(out.reshape(x_act.raw.shape[:-1] + (weight.shape[0],)))


def linear_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, dtype: str | None = None,
                    with_bias: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Gradients of :func:`linear`: ``(dx, dweight, dbias)``; dbias is None without a bias.

    ``dx = dout @ weight`` (x's dtype), ``dweight = dout.T @ x`` and ``dbias = dout.sum(0)``
    (float32, summed in a fixed order).
    """
    dout_act, x_act = _acts(dtype, dout=dout, x=x)
    weight = _param(weight, "weight")
    if x_act.raw.ndim < 1:
        raise ValueError("x must have at least 1 dimension (features last), got a 0-d array")
    if weight.ndim != 2 or weight.shape[1] != x_act.raw.shape[-1]:
        raise ValueError(f"weight must have shape (out_features, {x_act.raw.shape[-1]}), "
                         f"got {weight.shape}")
    if dout_act.raw.shape != x_act.raw.shape[:-1] + (weight.shape[0],):
        raise ValueError(f"dout must have shape {x_act.raw.shape[:-1] + (weight.shape[0],)}, "
                         f"got {dout_act.raw.shape}")
    d2 = dout_act.raw.reshape(-1, weight.shape[0])
    x2 = x_act.raw.reshape(-1, weight.shape[1])
    dx = np.empty(x2.shape, dtype=x2.dtype)
    _C.op_gemm(d2, weight, dx, x_act.dt, "f32", x_act.dt, False, False, 1.0, 0.0)
    dweight = np.empty(weight.shape, dtype=np.float32)
    _C.op_gemm(d2, x2, dweight, x_act.dt, x_act.dt, "f32", True, False, 1.0, 0.0)
    dbias = None
    if with_bias:
        dbias = np.empty(weight.shape[0], dtype=np.float32)
        _C.op_bias(d2, dbias, x_act.dt, backward=True)
    return x_act.wrap(dx.reshape(x_act.raw.shape)), dweight, dbias


def bias_add(x: np.ndarray, bias: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``x + bias`` over the last dimension (bias float32), rounded to x's dtype."""
    (x_act,) = _acts(dtype, x=x)
    if x_act.raw.ndim < 1:
        raise ValueError("x must have at least one dimension")
    bias = _param(bias, "bias", (x_act.raw.shape[-1],))
    out = x_act.raw.copy()
    _C.op_bias(out, bias, x_act.dt)
    return x_act.wrap(out)


def bias_backward(dout: np.ndarray, dtype: str | None = None,
                  accumulate_into: np.ndarray | None = None) -> np.ndarray:
    """Column sums of dout over all but the last dimension, in float32 (fixed order).

    With ``accumulate_into`` (a float32 array), the sums are added to it in place.
    """
    (dout_act,) = _acts(dtype, dout=dout)
    if dout_act.raw.ndim < 1:
        raise ValueError("dout must have at least one dimension")
    dbias, accumulate = _grad_into(accumulate_into, "accumulate_into", (dout_act.raw.shape[-1],))
    _C.op_bias(dout_act.raw, dbias, dout_act.dt, backward=True, accumulate=accumulate)
    return dbias


# --- activations -------------------------------------------------------------------------------


def _activation_code(kind: str) -> int:
    if not isinstance(kind, str) or kind not in ACTIVATIONS:
        raise ValueError(f"kind must be one of {sorted(ACTIVATIONS)}, got {kind!r}")
    return ACTIVATIONS[kind]


def _gelu_kind(approximate: str) -> str:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    return "gelu" if approximate == "none" else "gelu_tanh"


def activation(x: np.ndarray, kind: str, dtype: str | None = None) -> np.ndarray:
    """``act(x)`` elementwise; kind: 'relu', 'gelu' (exact erf), 'gelu_tanh', 'tanh', 'silu'."""
    code = _activation_code(kind)
    (x_act,) = _acts(dtype, x=x)
    out = x_act.empty()
    _C.op_activation(out, x_act.raw, code, x_act.dt)
    return x_act.wrap(out)


def activation_backward(dout: np.ndarray, x: np.ndarray, kind: str,
                        dtype: str | None = None) -> np.ndarray:
    """``dout * act'(x)`` elementwise (x is the activation's input)."""
    code = _activation_code(kind)
    dout_act, x_act = _acts(dtype, dout=dout, x=x)
    if dout_act.raw.shape != x_act.raw.shape:
        raise ValueError(f"dout must have x's shape {x_act.raw.shape}, got {dout_act.raw.shape}")
    din = x_act.empty()
    _C.op_activation(din, x_act.raw, code, x_act.dt, dout=dout_act.raw)
    return x_act.wrap(din)


def relu(x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``max(x, 0)`` (NaN stays NaN)."""
    return activation(x, "relu", dtype)


def relu_backward(dout: np.ndarray, x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``dout`` where ``x > 0``, else 0."""
    return activation_backward(dout, x, "relu", dtype)


def gelu(x: np.ndarray, approximate: str = "none", dtype: str | None = None) -> np.ndarray:
    """GELU: ``x * Phi(x)`` (approximate='none') or its tanh approximation ('tanh')."""
    return activation(x, _gelu_kind(approximate), dtype)


def gelu_backward(dout: np.ndarray, x: np.ndarray, approximate: str = "none",
                  dtype: str | None = None) -> np.ndarray:
    """``dout * gelu'(x)``."""
    return activation_backward(dout, x, _gelu_kind(approximate), dtype)


def tanh(x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``tanh(x)``."""
    return activation(x, "tanh", dtype)


def tanh_backward(dout: np.ndarray, x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``dout * (1 - tanh(x)^2)``."""
    return activation_backward(dout, x, "tanh", dtype)


def silu(x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``x * sigmoid(x)``."""
    return activation(x, "silu", dtype)


def silu_backward(dout: np.ndarray, x: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``dout * s (1 + x (1 - s))`` with ``s = sigmoid(x)``."""
    return activation_backward(dout, x, "silu", dtype)


# --- dropout and residual add ------------------------------------------------------------------


def dropout(x: np.ndarray, p: float, seed: int, layer: int = 0, step: int = 0, offset: int = 0,
            dtype: str | None = None) -> np.ndarray:
    """``x * mask * scale``; element i is kept when the Philox uniform of (seed, layer, step,
    offset + i) is >= p (rule in csrc/core/dropout.h). ``scale`` is PyTorch's float32
    ``1 / (1 - p)`` (``1 - p`` rounded to float32 first: 10.0 for p = 0.9); p = 1 gives zeros
    (NaN stays NaN). The same key gives the same mask on every backend and thread count."""
    p = _real(p, "p", 0.0, 1.0)
    (x_act,) = _acts(dtype, x=x)
    out = x_act.empty()
    _C.op_dropout(out, x_act.raw, p, seed, layer, step, offset, x_act.dt)
    return x_act.wrap(out)


def dropout_backward(dout: np.ndarray, p: float, seed: int, layer: int = 0, step: int = 0,
                     offset: int = 0, dtype: str | None = None) -> np.ndarray:
    """``dout * mask * scale`` with the mask regenerated from the same key (see :func:`dropout`)."""
    p = _real(p, "p", 0.0, 1.0)
    (dout_act,) = _acts(dtype, dout=dout)
    din = dout_act.empty()
    _C.op_dropout(din, dout_act.raw, p, seed, layer, step, offset, dout_act.dt, backward=True)
    return dout_act.wrap(din)


def add(a: np.ndarray, b: np.ndarray, dtype: str | None = None) -> np.ndarray:
    """``a + b`` (same shapes), computed in float32 and rounded once."""
    a_act, b_act = _acts(dtype, a=a, b=b)
    if a_act.raw.shape != b_act.raw.shape:
        raise ValueError(f"b must have a's shape {a_act.raw.shape}, got {b_act.raw.shape}")
    out = a_act.empty()
    _C.op_add(out, a_act.raw, b_act.raw, a_act.dt)
    return a_act.wrap(out)


# --- LayerNorm and embedding -------------------------------------------------------------------


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = 1e-5,
               dtype: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """LayerNorm over the last dimension: ``(out, mean, rstd)``.

    ``out = (x - mean) * rstd * weight + bias`` with float32 statistics over the last axis,
    ``rstd = 1 / sqrt(var + eps)`` (biased variance); mean and rstd have shape x.shape[:-1].
    """
    (x_act,) = _acts(dtype, x=x)
    eps = _real(eps, "eps", 0.0)
    if x_act.raw.ndim < 1 or x_act.raw.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {x_act.raw.shape}")
    cols = x_act.raw.shape[-1]
    weight, bias = _param(weight, "weight", (cols,)), _param(bias, "bias", (cols,))
    stats_shape = x_act.raw.shape[:-1]
    rows = int(np.prod(stats_shape, dtype=np.int64))
    out = x_act.empty()
    mean, rstd = np.empty(rows, dtype=np.float32), np.empty(rows, dtype=np.float32)
    _C.op_layernorm_forward(out, mean, rstd, x_act.raw, weight, bias, eps, x_act.dt)
    return x_act.wrap(out), mean.reshape(stats_shape), rstd.reshape(stats_shape)


def layer_norm_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, mean: np.ndarray,
                        rstd: np.ndarray, dtype: str | None = None,
                        dweight_into: np.ndarray | None = None,
                        dbias_into: np.ndarray | None = None
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`layer_norm`: ``(dx, dweight, dbias)``.

    ``dweight_into`` and ``dbias_into`` (both or neither) accumulate the parameter gradients in
    place, as the training step does after the first micro-batch.
    """
    dout_act, x_act = _acts(dtype, dout=dout, x=x)
    if x_act.raw.ndim < 1 or x_act.raw.shape[-1] == 0:
        raise ValueError(f"x must have a non-empty last dimension, got shape {x_act.raw.shape}")
    if dout_act.raw.shape != x_act.raw.shape:
        raise ValueError(f"dout must have x's shape {x_act.raw.shape}, got {dout_act.raw.shape}")
    if (dweight_into is None) != (dbias_into is None):
        raise ValueError("dweight_into and dbias_into must be given together")
    cols, stats_shape = x_act.raw.shape[-1], x_act.raw.shape[:-1]
    weight = _param(weight, "weight", (cols,))
    mean, rstd = _param(mean, "mean", stats_shape), _param(rstd, "rstd", stats_shape)
    dweight, accumulate = _grad_into(dweight_into, "dweight_into", (cols,))
    dbias, _ = _grad_into(dbias_into, "dbias_into", (cols,))
    din = x_act.empty()
    _C.op_layernorm_backward(din, dweight, dbias, dout_act.raw, x_act.raw, weight, mean.reshape(-1),
                             rstd.reshape(-1), x_act.dt, accumulate=accumulate)
    return x_act.wrap(din), dweight, dbias


def embedding(ids: Any, table: np.ndarray, dtype: str | None = "f32") -> np.ndarray:
    """``table[ids]`` rounded to ``dtype`` (None: f32): shape ids.shape + (dim,); ids must be
    in [0, num)."""
    ids = _ids(ids, "ids")
    table = _param(table, "table")
    if table.ndim != 2:
        raise ValueError(f"table must be 2-D (num, dim), got shape {table.shape}")
    dt = _dtype_name(dtype) or "f32"
    out = np.empty(ids.shape + (table.shape[1],), dtype=_RAW_TYPES[dt])
    _C.op_embedding(out, ids, table, dt)
    return _wrap(out, dt, False)


def embedding_backward(dout: np.ndarray, ids: Any, num: int, dtype: str | None = None,
                       accumulate_into: np.ndarray | None = None) -> np.ndarray:
    """Scatter-add ``dtable[ids[i]] += dout[i]`` into a (num, dim) float32 gradient.

    Rows receive their contributions in increasing i, so the result is deterministic. With
    ``accumulate_into`` the gradient is added to that array in place.
    """
    ids = _ids(ids, "ids")
    (dout_act,) = _acts(dtype, dout=dout)
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num < 0:
        raise ValueError(f"num must be an int >= 0, got {num!r}")
    if dout_act.raw.ndim != ids.ndim + 1 or dout_act.raw.shape[:-1] != ids.shape:
        raise ValueError(f"dout must have shape ids.shape + (dim,) = {ids.shape} + (dim,), "
                         f"got {dout_act.raw.shape}")
    shape = (int(num), dout_act.raw.shape[-1])
    dtable, accumulate = _grad_into(accumulate_into, "accumulate_into", shape)
    _C.op_embedding(dout_act.raw, ids, dtable, dout_act.dt, backward=True, accumulate=accumulate)
    return dtable


# --- attention ---------------------------------------------------------------------------------


def _attention_options(batch: int, seq: int, head_dim: int, scale: float | None,
                       key_lengths: Any, dropout_p: float) -> tuple[float, np.ndarray | None, float]:
    """The checked scale (default 1 / sqrt(head_dim)), key lengths and dropout probability."""
    scale = 1.0 / math.sqrt(head_dim) if scale is None else _real(scale, "scale")
    dropout_p = _real(dropout_p, "dropout_p", 0.0, 1.0)
    if key_lengths is None:
        return scale, None, dropout_p
    lengths = _ids(key_lengths, "key_lengths")
    if lengths.shape != (batch,):
        raise ValueError(f"key_lengths must have shape ({batch},) (one per batch entry), "
                         f"got {lengths.shape}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > seq):
        raise ValueError(f"key_lengths must be in [0, {seq}] (the sequence length), "
                         f"got values in [{lengths.min()}, {lengths.max()}]")
    return scale, lengths, dropout_p


def _attention_mask_options(batch: int, seq: int, window: Any,
                            key_starts: Any) -> tuple[int, np.ndarray | None]:
    """The checked sliding window (0: none) and per-query first visible keys (or None)."""
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be an int >= 0 (0: no sliding window), got {window!r}")
    if key_starts is None:
        return int(window), None
    starts = _ids(key_starts, "key_starts")
    if starts.shape != (batch, seq):
        raise ValueError(f"key_starts must have shape ({batch}, {seq}) (batch, seq), "
                         f"got {starts.shape}")
    return int(window), starts


def _attention_inputs(dtype: str | None, **arrays: Any) -> list[_Act]:
    """Checked operands: those named k, v, dk, dv are (batch, kv_heads, seq, head_dim) with
    kv_heads dividing the heads of the others, which share the first one's shape."""
    acts = _acts(dtype, **arrays)
    names = list(arrays)
    first = next(name for name in names if name not in ("k", "v"))
    shape = acts[names.index(first)].raw.shape
    if len(shape) != 4 or shape[3] == 0:
        raise ValueError(f"{first} must be 4-D (batch, heads, seq, head_dim) with head_dim >= 1, "
                         f"got shape {shape}")
    kv_shape = acts[names.index("k")].raw.shape
    if (len(kv_shape) != 4 or kv_shape[0] != shape[0] or kv_shape[2:] != shape[2:] or kv_shape[1] < 1
            or shape[1] % kv_shape[1]):
        raise ValueError(f"k must be (batch, kv_heads, seq, head_dim) = ({shape[0]}, kv_heads, "
                         f"{shape[2]}, {shape[3]}) with kv_heads dividing {first}'s {shape[1]} heads "
                         f"(grouped-query attention), got shape {kv_shape}")
    for name, act in zip(names, acts):
        want, like = (kv_shape, "k") if name in ("k", "v") else (shape, first)
        if act.raw.shape != want:
            raise ValueError(f"{name} must have {like}'s shape {want}, got {act.raw.shape}")
    return acts


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *,
                                 causal: bool = False, key_lengths: Any = None,
                                 dropout_p: float = 0.0, seed: int = 0, layer: int = 0,
                                 step: int = 0, offset: int = 0, scale: float | None = None,
                                 dtype: str | None = None, window: int = 0,
                                 key_starts: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Fused attention over (batch, heads, seq, head_dim) q and (batch, kv_heads, seq, head_dim)
    k and v: ``(out, lse)``.

    ``out = dropout(softmax(scale q k^T + mask)) v`` per batch entry and head, with
    ``scale = 1 / sqrt(head_dim)`` by default. Grouped-query attention when kv_heads < heads:
    query head h reads kv head ``h // (heads // kv_heads)`` (Hugging Face's ``repeat_kv``; k and
    v are never expanded). Query i sees key j when ``j < key_lengths[b]`` (every key when
    key_lengths is None), when ``causal``, ``j <= i``, with a sliding ``window`` > 0,
    ``j > i - window``, and with ``key_starts`` ((batch, seq) int64), ``j >= key_starts[b, i]``
    (documents packed in a row, left padding); a query that sees no key gets 0 (and lse -inf,
    zero gradients). Dropout multiplies probability (b, h, i, j) by 0 or ``1 / (1 - p)`` with the
    Philox rule of :func:`dropout` at element ``offset + ((b * heads + h) * seq + i) * seq + j``.
    ``lse`` (batch, heads, seq) float32 is the log-sum-exp of each query's visible scaled scores
    (-inf when it sees none), which :func:`scaled_dot_product_attention_backward` needs. Blocked
    online softmax in float32 (no seq x seq matrix is stored, key tiles outside a query block's
    visible keys are skipped); half inputs give half outputs.
    """
    q_act, k_act, v_act = _attention_inputs(dtype, q=q, k=k, v=v)
    batch, heads, seq, head_dim = q_act.raw.shape
    scale, lengths, dropout_p = _attention_options(batch, seq, head_dim, scale, key_lengths, dropout_p)
    window, starts = _attention_mask_options(batch, seq, window, key_starts)
    out = q_act.empty()
    lse = np.empty(batch * heads * seq, dtype=np.float32)
    _C.op_attention(out, lse, q_act.raw, k_act.raw, v_act.raw, q_act.dt, bool(causal), scale,
                    lengths, dropout_p, seed, layer, step, offset, window=window, key_starts=starts)
    return q_act.wrap(out), lse.reshape(batch, heads, seq)


def scaled_dot_product_attention_backward(
        dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, out: np.ndarray,
        lse: np.ndarray, *, causal: bool = False, key_lengths: Any = None, dropout_p: float = 0.0,
        seed: int = 0, layer: int = 0, step: int = 0, offset: int = 0, scale: float | None = None,
        dtype: str | None = None, window: int = 0,
        key_starts: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of :func:`scaled_dot_product_attention` given ``dout`` and its
    ``out`` and ``lse`` (the same options must be passed: the probabilities and the dropout
    mask are recomputed, never stored). dk and dv have k's shape: with grouped-query attention
    each kv head's gradient sums its query heads' terms in increasing head order."""
    dout_act, q_act, k_act, v_act, out_act = _attention_inputs(dtype, dout=dout, q=q, k=k, v=v,
                                                               out=out)
    batch, heads, seq, head_dim = q_act.raw.shape
    scale, lengths, dropout_p = _attention_options(batch, seq, head_dim, scale, key_lengths, dropout_p)
    window, starts = _attention_mask_options(batch, seq, window, key_starts)
    lse = _param(lse, "lse", (batch, heads, seq)).reshape(-1)
    dq, dk, dv = q_act.empty(), k_act.empty(), k_act.empty()
    _C.op_attention(out_act.raw, lse, q_act.raw, k_act.raw, v_act.raw, q_act.dt, bool(causal),
                    scale, lengths, dropout_p, seed, layer, step, offset, dout=dout_act.raw,
                    dq=dq, dk=dk, dv=dv, window=window, key_starts=starts)
    return q_act.wrap(dq), k_act.wrap(dk), k_act.wrap(dv)


def _gated_input(x: Any, name: str, dtype: str | None) -> _Act:
    (act,) = _acts(dtype, **{name: x})
    if act.raw.ndim < 1 or act.raw.shape[-1] % 2 != 0:
        raise ValueError(f"{name} must have an even last dimension ([gate | up] halves), "
                         f"got shape {act.raw.shape}")
    return act


def gated_activation(x: np.ndarray, kind: str = "silu", dtype: str | None = None) -> np.ndarray:
    """Gated MLP activation ``act(gate) * up`` of x (..., 2 * inter) -> (..., inter).

    Each row of x is ``[gate | up]``: the output of one GEMM by the stacked weight
    ``[gate_proj; up_proj]`` (2 * inter, hidden), or of two GEMMs into the halves. ``kind`` is an
    activation name (``"silu"``: SwiGLU as in Llama/Qwen/Mistral; ``"gelu_tanh"``: GeGLU with
    ``gelu_pytorch_tanh`` as in Gemma). In bf16/f16 the activation is rounded to the dtype before
    the product, as Hugging Face's ``act_fn(gate_proj(x)) * up_proj(x)`` is.
    """
    x_act = _gated_input(x, "x", dtype)
    out = x_act.empty(x_act.raw.shape[:-1] + (x_act.raw.shape[-1] // 2,))
    _C.op_glu(out, x_act.raw, _activation_code(kind), x_act.dt)
    return x_act.wrap(out)


def gated_activation_backward(dout: np.ndarray, x: np.ndarray, kind: str = "silu",
                              dtype: str | None = None) -> np.ndarray:
    """Gradient of :func:`gated_activation`: ``[dgate | dup]`` of x's shape, with ``dup = dout *
    act(gate)`` and ``dgate = act'(gate) * (dout * up)`` (PyTorch autograd's roundings in
    bf16/f16)."""
    x_act = _gated_input(x, "x", dtype)
    (dout_act,) = _acts(x_act.dt, dout=dout)
    half = x_act.raw.shape[:-1] + (x_act.raw.shape[-1] // 2,)
    if dout_act.raw.shape != half:
        raise ValueError(f"dout must have shape {half} (x's with the last dimension halved), "
                         f"got {dout_act.raw.shape}")
    din = x_act.empty()
    _C.op_glu(din, x_act.raw, _activation_code(kind), x_act.dt, dout=dout_act.raw)
    return x_act.wrap(din)


# --- rotary position embedding ----------------------------------------------------------------

_ROPE_LAYOUTS = {"bhtd": 1, "bthd": 2}


def rope_inv_freq(head_dim: int, theta: float = 10000.0, partial_rotary_factor: float = 1.0,
                  rope_scaling: dict[str, Any] | None = None) -> np.ndarray:
    """Hugging Face's RoPE inverse frequencies of one head, float32 of shape (rotary_dim / 2,).

    ``rotary_dim = int(head_dim * partial_rotary_factor)`` (even); ``inv_freq[i] =
    1 / theta ** (2 i / rotary_dim)``, each float32 operation of transformers'
    ``_compute_default_rope_parameters`` rounded as PyTorch rounds it (the power as a double
    rounded once: PyTorch's float32 pow is within 1 ulp of it). ``rope_scaling`` is a config's
    dict: None or ``rope_type`` (or ``type``) ``"default"``, or ``"llama3"`` with ``factor``,
    ``low_freq_factor``, ``high_freq_factor`` and ``original_max_position_embeddings``
    (``_compute_llama3_parameters``'s float32 arithmetic). Any other rope type is refused by name.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)):
        raise TypeError(f"head_dim must be an int, got {head_dim!r}")
    theta = _real(theta, "theta")
    partial_rotary_factor = _real(partial_rotary_factor, "partial_rotary_factor")
    if rope_scaling is None:
        return _C.op_rope_inv_freq(int(head_dim), theta, partial_rotary_factor)
    if not isinstance(rope_scaling, dict):
        raise TypeError(f"rope_scaling must be a dict or None, got {type(rope_scaling).__name__}")
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind == "default":
        return _C.op_rope_inv_freq(int(head_dim), theta, partial_rotary_factor)
    if kind != "llama3":
        raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported ('default', 'llama3')")
    fields = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [name for name in fields if name not in rope_scaling]
    if missing:
        raise ValueError(f"rope_scaling: llama3 needs {', '.join(missing)}")
    values = {name: _real(rope_scaling[name], f"rope_scaling[{name!r}]") for name in fields}
    return _C.op_rope_inv_freq(int(head_dim), theta, partial_rotary_factor, "llama3", **values)


def _rope_call(x: np.ndarray, positions: Any, inv_freq: np.ndarray, layout: str, dtype: str | None,
               in_place: bool, backward: bool) -> np.ndarray:
    if layout not in _ROPE_LAYOUTS:
        raise ValueError(f"layout must be 'bhtd' or 'bthd', got {layout!r}")
    name = "dout" if backward else "x"
    if in_place:
        _array(x, name, in_place=True)
    (act,) = _acts(dtype, **{name: x})
    if act.raw.ndim != 4:
        raise ValueError(f"{name} must be 4-D ({', '.join(layout)}), got shape {act.raw.shape}")
    if in_place and not act.raw.flags.writeable:
        raise ValueError(f"{name} must be writeable: it is updated in place")
    positions = _ids(positions, "positions")
    inv_freq = _param(inv_freq, "inv_freq")
    out = act.raw if in_place else act.empty()
    _C.op_rope(out, act.raw, positions, inv_freq, act.dt, _ROPE_LAYOUTS[layout], backward=backward)
    return act.wrap(out)


def rotary_embedding(x: np.ndarray, positions: Any, inv_freq: np.ndarray, *, layout: str = "bhtd",
                     in_place: bool = False, dtype: str | None = None) -> np.ndarray:
    """Rotary position embedding of q or k in Hugging Face's ``rotate_half`` layout.

    ``x`` is (batch, heads, seq, head_dim) (``layout="bhtd"``, the attention op's) or (batch,
    seq, heads, head_dim) (``"bthd"``); ``positions`` int64 (batch, seq) or (1, seq) (positions
    restart per packed document); ``inv_freq`` float32 (rotary_dim / 2,) from
    :func:`rope_inv_freq`. With ``c = cos(pos * inv_freq[i])`` and ``s = sin(...)`` (float32
    angle, then cast to x's dtype as transformers' LlamaRotaryEmbedding does), pairs (i, i + R/2)
    become ``(x1 c - x2 s, x2 c + x1 s)``: ``x * cos + rotate_half(x) * sin`` with PyTorch's
    roundings in bf16/f16 (each product, then the sum); elements from rotary_dim on pass
    through. ``in_place`` rotates x itself (a C-contiguous, writeable array) and returns it.
    """
    return _rope_call(x, positions, inv_freq, layout, dtype, in_place, False)


def rotary_embedding_backward(dout: np.ndarray, positions: Any, inv_freq: np.ndarray, *,
                              layout: str = "bhtd", in_place: bool = False,
                              dtype: str | None = None) -> np.ndarray:
    """Gradient of :func:`rotary_embedding` with respect to x: the transpose rotation of ``dout``
    (``(g1 c + g2 s, g2 c - g1 s)``, PyTorch autograd's roundings in bf16/f16)."""
    return _rope_call(dout, positions, inv_freq, layout, dtype, in_place, True)


# --- losses and norms --------------------------------------------------------------------------


def cross_entropy(logits: np.ndarray, targets: Any, label_smoothing: float = 0.0,
                  ignore_index: int = -100, dloss_scale: float = 1.0,
                  dtype: str | None = None) -> tuple[float, np.ndarray]:
    """Mean softmax cross-entropy over rows not ignored, and its gradient: ``(loss, dlogits)``.

    PyTorch semantics: ``loss_r = (1 - e) * nll_r + e * mean_j(-log p_rj)`` with
    ``e = label_smoothing``; rows whose target equals ``ignore_index`` count for nothing (the
    mean is over the other rows; NaN when there are none, as in PyTorch, with a zero ``dlogits``;
    a TrainStep reports 0.0 for such a micro-batch instead: see gputrain.step). ``dlogits``
    (logits' dtype) is ``dloss_scale`` times the gradient of the mean loss. Targets out of range
    raise IndexError.
    """
    (logits_act,) = _acts(dtype, logits=logits)
    if logits_act.raw.ndim != 2:
        raise ValueError(f"logits must be 2-D (rows, classes), got shape {logits_act.raw.shape}")
    targets = _ids(targets, "targets")
    if targets.shape != logits_act.raw.shape[:1]:
        raise ValueError(f"targets must have shape ({logits_act.raw.shape[0]},), "
                         f"got {targets.shape}")
    label_smoothing = _real(label_smoothing, "label_smoothing", 0.0, 1.0)
    dloss_scale = _real(dloss_scale, "dloss_scale")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, (int, np.integer)):
        raise TypeError(f"ignore_index must be an int, not {type(ignore_index).__name__}")
    if not -2**63 <= ignore_index < 2**63:
        raise ValueError(f"ignore_index must fit in int64 (targets' type), got {ignore_index}")
    _check_no_nan(logits_act, "logits")
    losses = np.empty(targets.shape[0], dtype=np.float32)
    dlogits = logits_act.empty()
    count = _C.op_softmax_xent(losses, dlogits, logits_act.raw, targets, label_smoothing,
                               int(ignore_index), dloss_scale, logits_act.dt)
    loss = float(np.sum(losses, dtype=np.float64) / count) if count else math.nan
    return loss, logits_act.wrap(dlogits)


def mse_loss(pred: np.ndarray, target: np.ndarray, dloss_scale: float = 1.0,
             dtype: str | None = None) -> tuple[float, np.ndarray]:
    """``mean((pred - target)^2)`` and ``dpred = dloss_scale * 2 (pred - target) / n``.

    pred may be half precision; target is float32 of pred's shape. The sum runs in double in a
    fixed order.
    """
    (pred_act,) = _acts(dtype, pred=pred)
    target = _param(target, "target", pred_act.raw.shape)
    if pred_act.raw.size == 0:
        raise ValueError("pred must not be empty")
    dloss_scale = _real(dloss_scale, "dloss_scale")
    _check_no_nan(pred_act, "pred")
    if np.isnan(target).any():
        raise ValueError("target contains NaN")
    dpred = pred_act.empty()
    loss = _C.op_mse(dpred, pred_act.raw, target, dloss_scale, pred_act.dt)
    return loss, pred_act.wrap(dpred)


def sum_squares(x: np.ndarray) -> float:
    """``sum(x**2)`` of a float32 array, accumulated in double in an order that does not depend
    on the thread count (the building block of the global gradient norm)."""
    return _C.op_sum_squares(_param(x, "x"))


# --- convolution -------------------------------------------------------------------------------


def _conv_pair(value: Any, name: str, minimum: int) -> tuple[int, int]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in items):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if any(not minimum <= int(v) <= 2**31 - 1 for v in items):
        raise ValueError(f"{name} must be in [{minimum}, {2**31 - 1}], got {value!r}")
    return int(items[0]), int(items[1])


def _conv_options(stride: Any, padding: Any, dilation: Any,
                  groups: Any) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int]:
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)):
        raise TypeError(f"groups must be an int, not {type(groups).__name__}")
    if not 1 <= groups <= 2**31 - 1:
        raise ValueError(f"groups must be in [1, {2**31 - 1}], got {groups!r}")
    return (_conv_pair(stride, "stride", 1), _conv_pair(padding, "padding", 0),
            _conv_pair(dilation, "dilation", 1), int(groups))


def _conv_weight(weight: Any, x_act: _Act) -> tuple[np.ndarray, np.ndarray]:
    """The float32 weight (checked 4-D) and its copy in x's dtype (what the op multiplies by)."""
    weight = _param(weight, "weight")
    if weight.ndim != 4:
        raise ValueError("weight must be 4-D (out_channels, in_channels / groups, kh, kw), "
                         f"got shape {weight.shape}")
    if x_act.dt == "f32":
        return weight, weight
    rounded = np.empty(weight.shape, dtype=x_act.raw.dtype)
    _C.op_cast(rounded, x_act.dt, weight, "f32")
    return weight, rounded


def _conv_input(x_act: _Act, name: str) -> None:
    if x_act.raw.ndim != 4:
        raise ValueError(f"{name} must be 4-D (batch, channels, height, width), got shape {x_act.raw.shape}")


def conv2d(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, stride: Any = 1,
           padding: Any = 0, dilation: Any = 1, groups: int = 1, dtype: str | None = None) -> np.ndarray:
    """2-D convolution of x (N, C, H, W) by weight (O, C / groups, KH, KW) float32, plus bias
    (O,) float32: PyTorch's ``conv2d`` with zero padding; stride, padding and dilation are ints or
    (height, width) pairs. The output (N, O, OH, OW) has x's dtype; for half x the weight is
    rounded to that dtype first (as the training step's half copy), products are summed in
    float32 and the result (bias included) is rounded once. im2col tiles and the GEMM library."""
    (x_act,) = _acts(dtype, x=x)
    _conv_input(x_act, "x")
    stride, padding, dilation, groups = _conv_options(stride, padding, dilation, groups)
    _, rounded = _conv_weight(weight, x_act)
    n, _, h, w = x_act.raw.shape
    o, _, kh, kw = rounded.shape
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = x_act.empty((n, o, max(oh, 0), max(ow, 0)))
    bias = None if bias is None else _param(bias, "bias")
    _C.op_conv2d(out, x_act.raw, rounded, bias, x_act.dt, stride, padding, dilation, groups)
    return x_act.wrap(out)


def conv2d_backward(dout: np.ndarray, x: np.ndarray, weight: np.ndarray, stride: Any = 1,
                    padding: Any = 0, dilation: Any = 1, groups: int = 1, dtype: str | None = None,
                    with_bias: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Gradients ``(dx, dweight, dbias)`` of :func:`conv2d` given dout (N, O, OH, OW): dx in x's
    dtype (rounded once), dweight and dbias float32 (dbias None without a bias), every sum in a
    fixed order (the same bits for any thread count)."""
    dout_act, x_act = _acts(dtype, dout=dout, x=x)
    _conv_input(x_act, "x")
    _conv_input(dout_act, "dout")
    stride, padding, dilation, groups = _conv_options(stride, padding, dilation, groups)
    weight, rounded = _conv_weight(weight, x_act)
    dx = x_act.empty()
    dweight = np.empty(weight.shape, dtype=np.float32)
    dbias = np.empty(weight.shape[0], dtype=np.float32) if with_bias else None
    _C.op_conv2d_backward(dx, dweight, dbias, dout_act.raw, x_act.raw, rounded, x_act.dt, stride, padding,
                          dilation, groups)
    return x_act.wrap(dx), dweight, dbias
