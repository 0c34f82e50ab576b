"""fp32 <-> fp16 / bf16 rounding (csrc/core/half.h through gputrain.cast) against NumPy and
ml_dtypes, bit for bit, on every SIMD level this CPU offers."""

from __future__ import annotations

import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest

import gputrain
from gputrain import _C

LEVELS = ["scalar", "avx2", "avx512"]
AVAILABLE = LEVELS[: LEVELS.index(_C.build_info()["simd_supported"]) + 1]
BEST = AVAILABLE[-1]
ALL_HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


@pytest.fixture(params=AVAILABLE)
def simd_level(request):
    """Runs the test on one SIMD level and restores the best level afterwards."""
    _C.set_simd_level(request.param)
    yield request.param
    _C.set_simd_level(BEST)


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def numpy_f16_bits(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # "invalid value in cast" for NaNs
        return x.astype(np.float16).view(np.uint16)


def ml_dtypes_bf16_bits(x: np.ndarray) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return x.astype(ml_dtypes.bfloat16).view(np.uint16)


def assert_same_bits(actual: np.ndarray, expected: np.ndarray, inputs: np.ndarray) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    if actual.nbytes % 8 == 0 and actual.flags.c_contiguous and expected.flags.c_contiguous:
        if np.array_equal(actual.reshape(-1).view(np.uint64), expected.reshape(-1).view(np.uint64)):   # 4x fewer compares
            return
    elif np.array_equal(actual, expected):
        return
    bad = np.flatnonzero(actual != expected)
    i = bad[0]
    raise AssertionError(f"{bad.size} mismatches; first: input {int(inputs[i]):#010x} -> "
                         f"{int(actual[i]):#06x}, expected {int(expected[i]):#06x}")


# fp32 inputs chosen to sit on every special case of both formats.
EDGE_BITS = [
    0x00000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0x7F800000,      # f32 extremes
    0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x33C00000, 0x33A00000,      # around 2^-25, 2^-24
    0x387FC000, 0x387FDFFF, 0x387FE000, 0x387FF000, 0x387FFFFF, 0x38800000,      # f16 subnormal -> normal
    0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x47800000,                  # 65504, 65520, 65536
    0x3F801000, 0x3F803000, 0x3F801001, 0x3F800FFF,                              # f16 ties at 1.0
    0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7F7F8000, 0x7F7F7FFF,      # bf16 ties, overflow
    0x007F8000, 0x00018000, 0x00008000, 0x00007FFF,                              # bf16 subnormal ties
    0x7F800001, 0x7F801FFF, 0x7F802000, 0x7FA00000, 0x7FBFFFFF, 0x7FC00000,      # NaN payloads
    0x7FC00001, 0x7FFFFFFF, 0x7FFFE000, 0x7F803FFF,
]
EDGE = np.array(EDGE_BITS + [b | 0x80000000 for b in EDGE_BITS], dtype=np.uint32)


def rounding_boundaries() -> np.ndarray:
    """Each fp16 and bf16 value as fp32, each midpoint to its neighbour, and one ulp either side."""
    f16_values = np.sort(np.unique(ALL_HALF.view(np.float16).astype(np.float32).view(np.uint32)))
    finite = ALL_HALF.view(np.float16)[np.isfinite(ALL_HALF.view(np.float16))].astype(np.float64)
    finite = np.unique(finite)
    midpoints = ((finite[1:] + finite[:-1]) / 2).astype(np.float32).view(np.uint32)
    bf16_values = ALL_HALF.astype(np.uint32) << 16
    centres = np.concatenate([f16_values, midpoints, bf16_values, bf16_values | 0x8000])
    around = np.concatenate([centres - 1, centres, centres + 1]).astype(np.uint32)
    return np.concatenate([around, EDGE])


@pytest.fixture(scope="module")
def sample_bits() -> np.ndarray:
    """Several million fp32 patterns: boundaries, uniform bits, and bits with exponents near 1."""
    rng = np.random.default_rng(20240601)
    uniform = rng.integers(0, 1 << 32, size=3_000_001, dtype=np.uint32)
    near_one = rng.integers(0, 1 << 32, size=2_000_003, dtype=np.uint32) & np.uint32(0x807FFFFF)
    near_one |= (rng.integers(96, 146, size=near_one.size, dtype=np.uint32) << 23).astype(np.uint32)
    return np.concatenate([rounding_boundaries(), uniform, near_one])


@pytest.fixture(scope="module")
def sample_references(sample_bits):
    x = f32(sample_bits)
    return numpy_f16_bits(x), ml_dtypes_bf16_bits(x)


def test_f32_to_f16_matches_numpy(simd_level, sample_bits, sample_references):
    result = gputrain.cast(f32(sample_bits), "f16")
    assert result.dtype == np.float16 and result.shape == sample_bits.shape
    assert_same_bits(result.view(np.uint16), sample_references[0], sample_bits)


def test_f32_to_bf16_matches_ml_dtypes(simd_level, sample_bits, sample_references):
    result = gputrain.cast(f32(sample_bits), "bf16")
    assert result.dtype == ml_dtypes.bfloat16
    assert_same_bits(result.view(np.uint16), sample_references[1], sample_bits)


def test_edge_cases_by_hand(simd_level):
    """A few answers written out, so the references themselves are pinned down."""
    cases = {0x477FF000: (0x7C00, 0x4780), 0x477FEFFF: (0x7BFF, 0x4780), 0x33000000: (0x0000, 0x3300),
             0x33000001: (0x0001, 0x3300), 0x3F801000: (0x3C00, 0x3F80), 0x3F803000: (0x3C02, 0x3F80),
             0x7F800001: (0x7C01, 0x7FC0), 0xFFA00000: (0xFD00, 0xFFC0), 0x3F818000: (0x3C0C, 0x3F82),
             0x7F7F8000: (0x7C00, 0x7F80), 0x00018000: (0x0000, 0x0002)}
    x = f32(list(cases))
    f16 = gputrain.cast(x, "f16").view(np.uint16)
    bf16 = gputrain.cast(x, "bf16").view(np.uint16)
    assert [(int(a), int(b)) for a, b in zip(f16, bf16)] == list(cases.values())


def test_every_f16_widens_exactly_and_round_trips(simd_level):
    widened = gputrain.cast(ALL_HALF.view(np.float16), "f32")
    expected = ALL_HALF.view(np.float16).astype(np.float32)
    assert_same_bits(widened.view(np.uint32), expected.view(np.uint32), ALL_HALF)
    back = gputrain.cast(widened, "f16").view(np.uint16)
    assert_same_bits(back, ALL_HALF, ALL_HALF)                 # NaN payloads included
    assert_same_bits(back, numpy_f16_bits(widened), ALL_HALF)


def test_every_bf16_widens_exactly_and_round_trips(simd_level):
    bf16 = ALL_HALF.view(ml_dtypes.bfloat16)
    widened = gputrain.cast(bf16, "f32")
    assert_same_bits(widened.view(np.uint32), bf16.astype(np.float32).view(np.uint32), ALL_HALF)
    back = gputrain.cast(widened, "bf16").view(np.uint16)
    is_nan = np.isnan(bf16.astype(np.float32))
    assert_same_bits(back[~is_nan], ALL_HALF[~is_nan], ALL_HALF[~is_nan])
    assert_same_bits(back[is_nan], (ALL_HALF[is_nan] & 0x8000) | 0x7FC0, ALL_HALF[is_nan])
    assert_same_bits(back, ml_dtypes_bf16_bits(widened), ALL_HALF)


def test_half_to_half_rounds_once(simd_level):
    """f16 -> bf16 and bf16 -> f16 equal widening to f32 and rounding once."""
    f16 = ALL_HALF.view(np.float16)
    to_bf16 = gputrain.cast(f16, "bf16").view(np.uint16)
    assert_same_bits(to_bf16, ml_dtypes_bf16_bits(f16.astype(np.float32)), ALL_HALF)
    to_f16 = gputrain.cast(ALL_HALF.view(ml_dtypes.bfloat16), "f16").view(np.uint16)
    assert_same_bits(to_f16, numpy_f16_bits(ALL_HALF.view(ml_dtypes.bfloat16).astype(np.float32)), ALL_HALF)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 15, 16, 17, 31, 33, 1000, 32768 * 8 + 5])
def test_every_length_and_tail(simd_level, length):
    """Vector bodies, scalar tails and the parallel split all agree with the references."""
    rng = np.random.default_rng(length)
    bits = rng.integers(0, 1 << 32, size=length, dtype=np.uint32)
    bits[::3] = EDGE[np.arange(bits[::3].size) % EDGE.size]
    x = f32(bits)
    assert_same_bits(gputrain.cast(x, "f16").view(np.uint16), numpy_f16_bits(x), bits)
    assert_same_bits(gputrain.cast(x, "bf16").view(np.uint16), ml_dtypes_bf16_bits(x), bits)
    h = (bits & 0xFFFF).astype(np.uint16)
    assert_same_bits(gputrain.cast(h.view(np.float16), "f32").view(np.uint32),
                     h.view(np.float16).astype(np.float32).view(np.uint32), h)
    assert_same_bits(gputrain.cast(h, "f32", src_dtype="bf16").view(np.uint32), h.astype(np.uint32) << 16, h)


def test_unaligned_buffers(simd_level):
    raw = np.random.default_rng(1).integers(0, 1 << 32, size=4097, dtype=np.uint32)
    storage = np.zeros(raw.nbytes + 4, dtype=np.uint8)
    x = storage[2:2 + raw.nbytes].view(np.uint16)              # 2-byte aligned uint16 view
    x[:] = raw.view(np.uint16)
    out = np.zeros(raw.size * 2 + 1, dtype=np.float32)[1:]
    result = gputrain.cast(x, "f32", src_dtype="f16", out=out)
    assert result is out
    assert_same_bits(out.view(np.uint32), x.view(np.float16).astype(np.float32).view(np.uint32), x)


ZERO_BELOW = 0x33000000      # fp32 magnitudes below 2^-25 round to a signed fp16 zero
INF_FROM = 0x477FF000        # magnitudes from 65520 up to inf round to a signed fp16 inf
SLOW_CHUNK = 1 << 24


class ChunkReferences:
    """One chunk of fp32 patterns with their NumPy fp16 and ml_dtypes bf16 bits (reused buffers)."""

    def __init__(self) -> None:
        self.bits = np.empty(SLOW_CHUNK, np.uint32)
        self.f16 = np.empty(SLOW_CHUNK, np.float16)
        self.bf16 = np.empty(SLOW_CHUNK, ml_dtypes.bfloat16)

    def fill(self, start: int) -> ChunkReferences:
        """Patterns start..start+2^24-1. NumPy converts out-of-range values ~50x slower than
        in-range ones (it raises the underflow / overflow flag per element), so in chunks wholly
        inside the signed-zero or signed-inf region NumPy checks that constant on every 4099th
        input and the constant is the reference."""
        np.add(np.arange(SLOW_CHUNK, dtype=np.uint32), np.uint32(start), out=self.bits)
        x = self.bits.view(np.float32)
        sign = 0x8000 if start >= 1 << 31 else 0
        low, high = start & 0x7FFFFFFF, (start & 0x7FFFFFFF) + SLOW_CHUNK
        constant = None
        if high <= ZERO_BELOW:
            constant = sign
        elif INF_FROM <= low and high <= 0x7F800000:
            constant = sign | 0x7C00
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if constant is None:
                np.copyto(self.f16, x, casting="unsafe")
            else:
                assert np.all(numpy_f16_bits(x[::4099]) == constant)
                self.f16.view(np.uint16).fill(constant)
            np.copyto(self.bf16, x, casting="unsafe")
        return self


@pytest.mark.slow
def test_all_float32_inputs():
    """Every one of the 2^32 fp32 patterns, on every SIMD level, against NumPy and ml_dtypes
    (the next chunk's references are computed on a second thread while this one is checked)."""
    f16_out, bf16_out = np.empty(SLOW_CHUNK, np.uint16), np.empty(SLOW_CHUNK, np.uint16)
    buffers = [ChunkReferences(), ChunkReferences()]
    starts = range(0, 1 << 32, SLOW_CHUNK)
    start_time = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(buffers[0].fill, starts[0])
            for k, start in enumerate(starts):
                chunk = pending.result()
                if start + SLOW_CHUNK < 1 << 32:
                    pending = pool.submit(buffers[(k + 1) % 2].fill, start + SLOW_CHUNK)
                x = chunk.bits.view(np.float32)
                for level in AVAILABLE:
                    _C.set_simd_level(level)
                    _C.cast(x, "f16", out=f16_out)
                    _C.cast(x, "bf16", out=bf16_out)
                    assert_same_bits(f16_out, chunk.f16.view(np.uint16), chunk.bits)
                    assert_same_bits(bf16_out, chunk.bf16.view(np.uint16), chunk.bits)
    finally:
        _C.set_simd_level(BEST)
    print(f"all 2^32 inputs x {len(AVAILABLE)} levels: {time.perf_counter() - start_time:.1f} s")
