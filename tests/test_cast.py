"""gputrain.cast / gputrain._C.cast: the API around the conversions (tests/test_half.py checks
the rounding itself): dtypes, shapes, layouts, `out`, bad arguments, references and threads."""

from __future__ import annotations

import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import gputrain
from gputrain import _C, _cast

BF16 = np.dtype(ml_dtypes.bfloat16)
NUMPY_TYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": BF16}


def values(shape=(3, 5)) -> np.ndarray:
    return np.linspace(-3.0, 3.0, int(np.prod(shape)), dtype=np.float32).reshape(shape)


@pytest.mark.parametrize("src", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("dst", ["f32", "f16", "bf16"])
def test_every_pair_matches_astype(src, dst):
    x = values().astype(NUMPY_TYPES[src])
    result = gputrain.cast(x, dst)
    assert result.dtype == NUMPY_TYPES[dst] and result.shape == x.shape
    expected = x.astype(np.float32).astype(NUMPY_TYPES[dst])
    assert np.array_equal(result.view(np.uint8), expected.view(np.uint8))
    assert not np.shares_memory(result, x)


@pytest.mark.parametrize("shape", [(), (0,), (4, 0, 3), (1,), (2, 3, 4, 5)])
def test_shapes_are_kept(shape):
    x = np.full(shape, 1.5, dtype=np.float32)
    for dst in ("f16", "bf16", "f32"):
        result = gputrain.cast(x, dst)
        assert result.shape == shape
        assert np.all(result.astype(np.float32) == 1.5)


@pytest.mark.parametrize(
    "make",
    [
        lambda x: x[:, ::2],
        lambda x: x.T,
        lambda x: np.asfortranarray(x),
        lambda x: x.astype(">f4"),
        lambda x: x[::-1],
    ],
    ids=["strided", "transposed", "fortran", "big-endian", "reversed"],
)
def test_non_contiguous_and_swapped_inputs(make):
    x = make(values((6, 8)))
    expected = np.ascontiguousarray(x, dtype=np.float32).astype(np.float16)
    assert np.array_equal(gputrain.cast(x, "f16"), expected)


@pytest.mark.parametrize(
    "spelling", ["f16", "float16", np.float16, np.dtype("float16"), "bf16", "bfloat16", ml_dtypes.bfloat16,
                 "f32", "float32", np.float32],
)
def test_dtype_spellings(spelling):
    result = gputrain.cast(values(), spelling)
    assert result.dtype == np.dtype(spelling if not isinstance(spelling, str) else
                                    NUMPY_TYPES[_cast._dtype_name(spelling, "dtype")])


def test_uint16_bit_patterns_need_src_dtype():
    bits = np.array([0x3F80, 0xC000], dtype=np.uint16)
    assert gputrain.cast(bits, "f32", src_dtype="bf16").tolist() == [1.0, -2.0]
    assert gputrain.cast(bits, "f32", src_dtype="f16").tolist() == [1.875, -2.0]
    with pytest.raises(TypeError, match="src_dtype"):
        gputrain.cast(bits, "f32")


def test_c_level_returns_bit_patterns_for_bf16():
    result = _C.cast(np.array([1.0, 2.0], np.float32), "bf16")
    assert result.dtype == np.uint16 and result.tolist() == [0x3F80, 0x4000]


def test_without_ml_dtypes_bf16_is_uint16(monkeypatch):
    monkeypatch.setattr(_cast, "_BFLOAT16", None)
    result = gputrain.cast(np.array([1.0], np.float32), "bf16")
    assert result.dtype == np.uint16 and result.tolist() == [0x3F80]


@pytest.mark.parametrize("dst", ["f32", "f16", "bf16"])
def test_out_is_filled_and_returned(dst):
    x = values((4, 4))
    out = np.empty((4, 4), dtype=NUMPY_TYPES[dst])
    assert gputrain.cast(x, dst, out=out) is out
    assert np.array_equal(out.view(np.uint8), x.astype(NUMPY_TYPES[dst]).view(np.uint8))


def test_out_may_hold_bit_patterns():
    out = np.empty(3, dtype=np.uint16)
    gputrain.cast(np.array([1.0, 2.0, 4.0], np.float32), "bf16", out=out)
    assert out.tolist() == [0x3F80, 0x4000, 0x4080]
    gputrain.cast(np.array([1.0, 2.0, 4.0], np.float32), "f16", out=out)
    assert out.tolist() == [0x3C00, 0x4000, 0x4400]


def test_inputs_are_not_mutated():
    x = values((5, 7))
    copy = x.copy()
    for dst in ("f16", "bf16", "f32"):
        gputrain.cast(x, dst)
    assert np.array_equal(x, copy)


def test_no_reference_leaks():
    x = values((64,))
    out = np.empty(64, np.float16)
    before = sys.getrefcount(x), sys.getrefcount(out)
    for _ in range(200):
        _C.cast(x, "f16")
        _C.cast(x, "f16", out=out)
        try:
            _C.cast(x, "f64")
        except ValueError:
            pass
    assert (sys.getrefcount(x), sys.getrefcount(out)) == before


def test_concurrent_threads_get_correct_results():
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(1 << 20).astype(np.float32) for _ in range(4)]
    results: list[np.ndarray | None] = [None] * 4

    def work(i: int) -> None:
        results[i] = gputrain.cast(inputs[i], "bf16")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, result in zip(inputs, results):
        assert np.array_equal(result.view(np.uint16), x.astype(BF16).view(np.uint16))


@pytest.mark.parametrize(
    ("array", "error", "match"),
    [
        (np.ones(3, np.float64), TypeError, "float64"),
        (np.ones(3, np.int32), TypeError, "int32"),
        ([1.0, 2.0], TypeError, "float64"),
        (["a", "b"], TypeError, "array"),
        (np.array([None, 1.0]), TypeError, "array"),
        (None, TypeError, "array"),
        (np.ones(3, np.complex64), TypeError, "complex64"),
    ],
)
def test_bad_arrays(array, error, match):
    with pytest.raises(error, match=match):
        gputrain.cast(array, "f16")


@pytest.mark.parametrize(
    ("dtype", "error"),
    [("f64", ValueError), ("int8", ValueError), ("", ValueError), (np.int32, ValueError),
     (3, TypeError), (None, TypeError), (object(), TypeError)],
)
def test_bad_dtypes(dtype, error):
    with pytest.raises(error, match="dtype"):
        gputrain.cast(values(), dtype)


@pytest.mark.parametrize(
    ("array", "src_dtype", "error"),
    [
        (np.ones(2, np.float32), "bf16", ValueError),
        (np.ones(2, np.float16), "f32", ValueError),
        (np.ones(2, np.uint16), "f32", ValueError),
        (np.ones(2, BF16), "f16", ValueError),
        (np.ones(2, np.uint16), "u16", ValueError),
        (np.ones(2, np.uint16), 5, TypeError),
    ],
)
def test_bad_src_dtype(array, src_dtype, error):
    with pytest.raises(error, match="src_dtype"):
        gputrain.cast(array, "f32", src_dtype=src_dtype)


def test_bad_out():
    x = values((4, 4))
    with pytest.raises(TypeError, match="out"):
        gputrain.cast(x, "f16", out=[0.0] * 16)
    with pytest.raises(TypeError, match="out"):
        gputrain.cast(x, "f16", out=np.empty((4, 4), np.float32))
    with pytest.raises(TypeError, match="out"):
        gputrain.cast(x, "bf16", out=np.empty((4, 4), np.float16))
    with pytest.raises(TypeError, match="out"):
        gputrain.cast(x, "f16", out=np.empty((4, 4), ">f2"))
    with pytest.raises(ValueError, match="shape"):
        gputrain.cast(x, "f16", out=np.empty(16, np.float16))
    with pytest.raises(ValueError, match="contiguous"):
        gputrain.cast(x, "f16", out=np.empty((4, 8), np.float16)[:, ::2])
    read_only = np.empty((4, 4), np.float16)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        gputrain.cast(x, "f16", out=read_only)


def test_out_must_not_overlap_input():
    x = values((8,))
    with pytest.raises(ValueError, match="share memory"):
        gputrain.cast(x, "f32", out=x)
    with pytest.raises(ValueError, match="share memory"):
        gputrain.cast(x, "f16", out=x.view(np.float16)[:8])


def test_c_level_bad_arguments():
    with pytest.raises(TypeError, match="numpy.ndarray"):
        _C.cast([1.0], "f16")
    with pytest.raises(TypeError, match="dtype"):
        _C.cast(values(), b"f16")
    with pytest.raises(TypeError):
        _C.cast(values())
    with pytest.raises(TypeError):
        _C.cast(values(), "f16", "f32")   # src_dtype and out are keyword-only
