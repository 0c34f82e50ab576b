"""Value specs for the fuzz suite: hypothesis strategies draw plain, picklable descriptions
(specs) of arguments; `make` turns a spec into the object in the worker process.

A spec is a tuple:
  ("A", dtype, shape, layout, fill)   a NumPy array (layouts: c, f, strided, readonly, bcast,
                                      unaligned; fills: normal, zeros, nan, inf, huge, neg, labels)
  ("V", value)                        a plain Python value (int, float, str, None, bool, bytes)
  ("O", kind)                         an object of the wrong kind (see OBJECTS)
  ("L", [spec, ...]) / ("T", ...)     a list / tuple of specs
  ("D", [(key, spec), ...])           a dict
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

try:
    import ml_dtypes

    BFLOAT16: Any = ml_dtypes.bfloat16
except ImportError:  # the suite then fuzzes without bfloat16 arrays
    BFLOAT16 = None

DTYPES = ["float32", "float16", "float64", "int64", "int32", "uint16", "uint8", "bool", "complex64",
          "object", "bfloat16"]
SMALL_DIMS = [0, 1, 2, 3, 4, 5, 8]
HUGE_DIMS = [2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62]
BAD_INTS = [0, -1, -2**31, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, -2**63, -2**64, 2**100]
BAD_FLOATS = [0.0, -0.0, -1.0, 1.0, 2.0, 1e-45, 1e-300, 1e38, 1e300, math.inf, -math.inf, math.nan]
BAD_OTHERS = [None, True, False, "1", "", "nan", b"x", 1j]
OBJECTS = ["object", "list", "dict", "callable", "generator", "set", "ndarray0d", "array_list"]
MAX_MATERIALISED = 1 << 16  # elements; bigger shapes become zero-stride broadcast views


def spec_arr(dtype: str, shape: tuple[int, ...], layout: str = "c", fill: str = "normal") -> tuple:
    return ("A", dtype, tuple(shape), layout, fill)


def lit(value: Any) -> tuple:
    return ("V", value)


layouts = st.sampled_from(["c", "c", "c", "f", "strided", "readonly", "bcast", "unaligned"])
fills = st.sampled_from(["normal", "normal", "normal", "zeros", "nan", "inf", "huge", "neg", "labels"])
bad_scalars = st.one_of(st.sampled_from(BAD_INTS), st.sampled_from(BAD_FLOATS), st.sampled_from(BAD_OTHERS),
                        st.integers(), st.floats())
wrong_things = st.one_of(bad_scalars.map(lit), st.sampled_from(OBJECTS).map(lambda k: ("O", k)))


def _mutated_shapes(shape: tuple[int, ...]) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes near `shape`: one dimension changed (to 0, 1, +1, huge), one added or removed."""
    options = [st.just(()), st.just(shape + (1,)), st.just(shape + (3,))]
    if shape:
        options.append(st.just(shape[:-1]))
        options.append(st.tuples(st.integers(0, len(shape) - 1),
                                 st.sampled_from(SMALL_DIMS + HUGE_DIMS + [-1])).map(
            lambda change: tuple(change[1] if i == change[0] else d for i, d in enumerate(shape))))
    options.append(st.lists(st.sampled_from(SMALL_DIMS), max_size=4).map(tuple))
    return st.one_of(options)


@dataclass(frozen=True)
class Arg:
    """An argument's strategies: `valid` draws values the call accepts, `bad` wrong ones. A case
    draws one or two arguments from `bad` and the rest from `valid`, so that each bad value gets
    past the others' checks (and now and then all of them from `bad`)."""

    valid: st.SearchStrategy
    bad: st.SearchStrategy


def valid_of(a: Arg | st.SearchStrategy) -> st.SearchStrategy:
    return a.valid if isinstance(a, Arg) else a


def bad_of(a: Arg | st.SearchStrategy) -> st.SearchStrategy:
    return a.bad if isinstance(a, Arg) else a


def anyof(a: Arg | st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(a.valid, a.bad) if isinstance(a, Arg) else a


def either(*options: Arg | st.SearchStrategy) -> Arg:
    """One of several argument kinds (e.g. None or an array)."""
    return Arg(st.one_of([valid_of(o) for o in options]), st.one_of([bad_of(o) for o in options]))


def arr(*shape: int, dtype: str = "float32", fill: str | None = None) -> Arg:
    """An array argument: valid in any layout (contiguous or not, read-only, unaligned) and with
    NaN/Inf or huge values; bad with a wrong dtype, shape or type."""
    good_fill = st.just(fill) if fill else fills
    valid = st.builds(spec_arr, st.just(dtype), st.just(shape), layouts, good_fill)
    wrong_dtype = st.builds(spec_arr, st.sampled_from(DTYPES), st.just(shape), layouts, fills)
    wrong_shape = st.builds(spec_arr, st.just(dtype), _mutated_shapes(shape), layouts, fills)
    as_list = st.just(("LIST", spec_arr(dtype, shape, "c", fill or "normal")))
    return Arg(valid, st.one_of(wrong_dtype, wrong_shape, wrong_shape, wrong_things, as_list))


def num(*valid: Any) -> Arg:
    """A scalar argument: one of `valid`, or a bad one (huge, negative, NaN, wrong type)."""
    return Arg(st.sampled_from(valid).map(lit), st.one_of(bad_scalars.map(lit), wrong_things))


def choice(*valid: Any) -> Arg:
    """An option argument (a string or enum-like value): valid, or wrong."""
    return Arg(st.sampled_from(valid).map(lit),
               st.one_of(st.sampled_from(["", "F32", "fp64", "cuda", "none ", "\x00", "tanh"]).map(lit),
                         wrong_things))


def _values(dtype: Any, count: int, fill: str, rng: np.random.Generator) -> np.ndarray:
    kind = np.dtype(dtype).kind
    if fill == "zeros":
        return np.zeros(count, dtype)
    if fill in ("nan", "inf") and kind in "fc":
        v = rng.standard_normal(count)
        v[rng.random(count) < 0.3] = np.nan if fill == "nan" else np.inf
        return v.astype(dtype)
    if fill == "huge":
        if kind in "iu":
            return np.full(count, np.iinfo(dtype).max, dtype)
        return np.full(count, 1e38 if np.dtype(dtype).itemsize >= 4 else 65504, dtype)
    if fill == "neg" and kind not in "ub":
        return (-rng.integers(1, 1000, count)).astype(dtype)
    if fill == "labels":
        return rng.integers(0, 4, count).astype(dtype)
    return rng.standard_normal(count).astype(dtype) if kind in "fc" else rng.integers(0, 3, count).astype(dtype)


def make_array(dtype_name: str, shape: tuple[int, ...], layout: str, fill: str, seed: int) -> Any:
    if dtype_name == "bfloat16":
        if BFLOAT16 is None:
            dtype_name = "float16"
        dtype: Any = BFLOAT16 or np.float16
    else:
        dtype = np.dtype(dtype_name)
    if any(d < 0 for d in shape):  # no array has this shape: the shape tuple itself is passed
        return shape
    total = math.prod(shape)
    if dtype_name == "object":
        if total > MAX_MATERIALISED:
            return np.empty(0, object)
        a = np.empty(total, object)
        a[:] = [None if i % 2 else 1.5 for i in range(total)]
        return a.reshape(shape)
    if total > MAX_MATERIALISED or layout == "bcast":
        base = _values(dtype, 1, fill, np.random.default_rng(seed)).reshape(())
        if total * np.dtype(dtype).itemsize >= 2**63:  # more than NumPy can describe: pass the shape
            return shape
        return np.broadcast_to(base, shape)
    rng = np.random.default_rng(seed)
    if layout == "strided" and shape:
        wide = _values(dtype, total * 2, fill, rng).reshape(shape[:-1] + (shape[-1] * 2,))
        return wide[..., ::2]
    if layout == "unaligned" and total > 0:
        itemsize = np.dtype(dtype).itemsize
        raw = np.zeros(total * itemsize + 1, np.uint8)
        view = raw[1:].view(dtype).reshape(shape)
        view[...] = _values(dtype, total, fill, rng).reshape(shape)
        return view
    a = _values(dtype, total, fill, rng).reshape(shape)
    if layout == "f":
        a = np.asfortranarray(a)
    if layout == "readonly":
        a.setflags(write=False)
    return a


def _object(kind: str) -> Any:
    return {
        "object": object(), "list": [1.0, 2.0], "dict": {"a": 1}, "callable": (lambda *a, **k: None),
        "generator": (i for i in range(3)), "set": {1, 2}, "ndarray0d": np.array(1.5, np.float32),
        "array_list": [np.zeros(2, np.float32), np.ones(3, np.float32)],
    }[kind]


def make(spec: Any, seed: int = 0) -> Any:
    """The object a spec describes (in the worker)."""
    if not isinstance(spec, tuple) or not spec:
        return spec
    tag = spec[0]
    if tag == "A":
        return make_array(spec[1], spec[2], spec[3], spec[4], seed)
    if tag == "LIST":
        return make(spec[1], seed).tolist()
    if tag == "V":
        return spec[1]
    if tag == "O":
        return _object(spec[1])
    if tag == "L":
        return [make(s, seed + i) for i, s in enumerate(spec[1])]
    if tag == "T":
        return tuple(make(s, seed + i) for i, s in enumerate(spec[1]))
    if tag == "D":
        return {k: make(s, seed + i) for i, (k, s) in enumerate(spec[1])}
    raise ValueError(f"unknown spec {spec!r}")
