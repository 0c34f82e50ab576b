"""Philox4x32-10 (csrc/core/philox.h): Random123 known answers, an independent Python reference,
the stream layout, and the uniform / normal helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputrain import _C_testing

MASK32 = 0xFFFFFFFF

# Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter[4], key[2], expected[4].
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox_reference(counter: tuple[int, ...], key: tuple[int, ...]) -> tuple[int, ...]:
    """Philox4x32-10 written from the SC11 paper's description, in Python integers."""
    x0, x1, x2, x3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * x0, 0xCD9E8D57 * x2
        x0, x1, x2, x3 = (p1 >> 32) ^ x1 ^ k0, p1 & MASK32, (p0 >> 32) ^ x3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return x0, x1, x2, x3


@pytest.mark.parametrize(("counter", "key", "expected"), KNOWN_ANSWERS)
def test_random123_known_answers(counter, key, expected):
    assert _C_testing.philox4x32_10(counter, key) == expected
    assert philox_reference(counter, key) == expected


words = st.integers(0, MASK32)


@settings(max_examples=200, deadline=None)
@given(st.tuples(words, words, words, words), st.tuples(words, words))
def test_matches_python_reference(counter, key):
    assert _C_testing.philox4x32_10(counter, key) == philox_reference(counter, key)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**64 - 1), words, words, st.integers(0, 2**64 - 9))
def test_stream_layout(seed, stream_a, stream_b, start):
    """key = (seed lo, seed hi); counter = (index lo, index hi, stream_a, stream_b)."""
    block = _C_testing.philox_uint32(seed, stream_a, stream_b, start, 8)
    assert block.shape == (8, 4) and block.dtype == np.uint32
    for i in range(8):
        index = start + i
        counter = (index & MASK32, index >> 32, stream_a, stream_b)
        assert tuple(int(w) for w in block[i]) == philox_reference(counter, (seed & MASK32, seed >> 32))


def test_index_carries_into_high_word():
    block = _C_testing.philox_uint32(7, 1, 2, 2**32 - 1, 2)
    assert tuple(block[1]) == philox_reference((0, 1, 1, 2), (7, 0))


def test_streams_differ_and_repeat():
    a = _C_testing.philox_uint32(1, 0, 0, 0, 1000)
    assert np.array_equal(a, _C_testing.philox_uint32(1, 0, 0, 0, 1000))
    assert np.array_equal(a[10:20], _C_testing.philox_uint32(1, 0, 0, 10, 10))
    for other in (_C_testing.philox_uint32(2, 0, 0, 0, 1000), _C_testing.philox_uint32(1, 1, 0, 0, 1000),
                  _C_testing.philox_uint32(1, 0, 1, 0, 1000)):
        assert np.mean(a == other) < 0.01


def test_uniform_is_top_24_bits():
    w = _C_testing.philox_uint32(3, 4, 5, 0, 50_000)
    expected = (w >> 8).astype(np.float32) * np.float32(2.0**-24)
    assert np.array_equal(_C_testing.philox_uniform(3, 4, 5, 0, 50_000), expected)
    expected_open = ((w >> 8) + 1).astype(np.float32) * np.float32(2.0**-24)
    assert np.array_equal(_C_testing.philox_uniform_open(3, 4, 5, 0, 50_000), expected_open)


def test_uniform_range_and_moments():
    u = _C_testing.philox_uniform(11, 0, 0, 0, 250_000).ravel()
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.002            # sd of the mean: 0.29 / 1000
    assert abs(u.var() - 1 / 12) < 0.001
    counts = np.bincount((u * 16).astype(int), minlength=16)
    assert np.all(np.abs(counts / u.size - 1 / 16) < 0.002)
    u_open = _C_testing.philox_uniform_open(11, 0, 0, 0, 250_000)
    assert u_open.min() > 0.0 and u_open.max() <= 1.0


def test_normal_matches_box_muller_in_float64():
    w = _C_testing.philox_uint32(5, 6, 7, 100, 20_000).astype(np.float64)
    z = _C_testing.philox_normal(5, 6, 7, 100, 20_000).astype(np.float64)
    u1 = (np.floor(w[:, 0::2] / 256) + 1) * 2.0**-24
    u2 = np.floor(w[:, 1::2] / 256) * 2.0**-24
    radius, theta = np.sqrt(-2 * np.log(u1)), 2 * math.pi * u2
    expected = np.empty_like(z)
    expected[:, 0::2], expected[:, 1::2] = radius * np.cos(theta), radius * np.sin(theta)
    np.testing.assert_allclose(z, expected, rtol=0, atol=2e-5)


def test_normal_moments():
    z = _C_testing.philox_normal(2024, 1, 2, 0, 250_000).ravel()
    assert np.all(np.isfinite(z)) and np.abs(z).max() <= math.sqrt(48 * math.log(2)) + 1e-5
    assert abs(z.mean()) < 0.006                   # sd of the mean: 1 / 1000
    assert abs(z.var() - 1.0) < 0.01
    assert abs(np.mean(z**4) - 3.0) < 0.05         # kurtosis of a normal
    assert abs(np.mean(np.abs(z) < 1.0) - 0.6827) < 0.003
    assert abs(np.corrcoef(z[0::2], z[1::2])[0, 1]) < 0.006


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (((0, 0, 0), (0, 0)), ValueError),
        (((0, 0, 0, 0), (0,)), ValueError),
        (((0, 0, 0, 2**32), (0, 0)), ValueError),
        (((0, 0, 0, -1), (0, 0)), ValueError),
        (((0, 0, 0, 0.5), (0, 0)), TypeError),
        ((5, (0, 0)), ValueError),
    ],
)
def test_philox4x32_10_bad_arguments(args, error):
    with pytest.raises(error):
        _C_testing.philox4x32_10(*args)


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [
        ((-1, 0, 0, 0, 1), ValueError, "seed"),
        ((2**64, 0, 0, 0, 1), ValueError, "seed"),
        ((0, 2**32, 0, 0, 1), ValueError, "stream_a"),
        ((0, 0, -1, 0, 1), ValueError, "stream_b"),
        ((0, 0, 0, 2**64 - 1, 2), ValueError, "start"),
        ((0, 0, 0, 0, -1), ValueError, "count"),
        ((0.0, 0, 0, 0, 1), TypeError, "seed"),
        ((0, 0, 0, 0, True), TypeError, "count"),
    ],
)
def test_draw_bad_arguments(args, error, name):
    with pytest.raises(error, match=name):
        _C_testing.philox_uint32(*args)


def test_empty_draw():
    assert _C_testing.philox_normal(0, 0, 0, 0, 0).shape == (0, 4)
