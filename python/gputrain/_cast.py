"""Bulk conversions between float32, float16 and bfloat16 arrays (csrc/core/cast.c)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from gputrain import _C
from gputrain._vocab import c_dtype

_UNKNOWN = object()
# ml_dtypes' bfloat16 dtype, None without ml_dtypes; looked up on first use (bfloat16()), not at
# `import gputrain`: importing ml_dtypes takes half a second.
_BFLOAT16: Any = _UNKNOWN


def bfloat16() -> np.dtype | None:
    """ml_dtypes.bfloat16 as a NumPy dtype (importing ml_dtypes the first time), or None when
    ml_dtypes is not installed."""
    global _BFLOAT16
    if _BFLOAT16 is _UNKNOWN:
        try:
            import ml_dtypes
        except ImportError:
            _BFLOAT16 = None
        else:
            _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
    return _BFLOAT16


def is_bfloat16(dtype: np.dtype) -> bool:
    """Whether `dtype` is ml_dtypes.bfloat16. An array has that dtype only once ml_dtypes is
    imported, so this never imports it for another dtype."""
    return dtype.name == "bfloat16" and "ml_dtypes" in sys.modules and dtype == bfloat16()

def _dtype_name(dtype: Any, arg_name: str) -> str:
    """'f32', 'f16' or 'bf16' (the C core's names) for any precision gputrain accepts."""
    return c_dtype(dtype, arg_name)


def _is_bfloat16(array: np.ndarray) -> bool:
    return is_bfloat16(array.dtype)


def cast(
    array: Any,
    dtype: Any,
    *,
    src_dtype: str | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Convert an array between float32, float16 and bfloat16, rounding to nearest even.

    Results are bit-identical to ``array.astype(np.float16)`` (NumPy) and to
    ``array.astype(ml_dtypes.bfloat16)``, NaN payloads included, on every SIMD level.

    Args:
        array: float32, float16 or ``ml_dtypes.bfloat16`` values, or uint16 bit patterns
            together with ``src_dtype``. Other dtypes (float64, integers) raise ``TypeError``:
            convert them to float32 first, so no value is rounded twice without you seeing it.
        dtype: the result's type: ``"fp32"``, ``"fp16"`` or ``"bf16"`` (the aliases ``"f32"``,
            ``"float16"``, ... and NumPy/ml_dtypes/torch dtypes such as ``np.float16`` too).
        src_dtype: what a uint16 ``array`` holds: ``"bf16"`` or ``"f16"`` bit patterns.
        out: a C-contiguous array of the input's shape to write into (for ``"bf16"``: a
            bfloat16 or uint16 array); it must not share memory with ``array``.

    Returns:
        A new array (or ``out``): float32, float16, and for bf16 ``ml_dtypes.bfloat16`` when
        ml_dtypes is installed, otherwise its uint16 bit patterns.
    """
    target = _dtype_name(dtype, "dtype")
    source = np.asarray(array)
    if _is_bfloat16(source):
        if src_dtype is not None and _dtype_name(src_dtype, "src_dtype") != "bf16":
            raise ValueError(f"src_dtype {src_dtype!r} does not describe a bfloat16 array")
        source, src_dtype = source.view(np.uint16), "bf16"
    if src_dtype is not None:
        src_dtype = _dtype_name(src_dtype, "src_dtype")
    if out is None:
        result = _C.cast(source, target, src_dtype=src_dtype)
        bf16 = bfloat16() if target == "bf16" else None
        return result.view(bf16) if bf16 is not None else result
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, not {type(out).__name__}")
    _C.cast(source, target, src_dtype=src_dtype, out=out.view(np.uint16) if _is_bfloat16(out) else out)
    return out


def widen(array: np.ndarray) -> np.ndarray:
    """float32 values of a half array held as gputrain holds one: float16, ml_dtypes' bfloat16, or
    bfloat16's uint16 bit patterns (without ml_dtypes). Exact."""
    return cast(array, "f32", src_dtype="bf16" if array.dtype == np.uint16 else None)
