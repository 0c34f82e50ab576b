"""Accuracy of the activations built on core/vmath.h (branch-free exp, normal CDF and tanh) over a
dense sweep of [-20, 20] plus the edge cases, against float64 references, in ulps, for every
SIMD level; and bit-identical results across the levels.

Bounds (f32, measured maxima in brackets; the libm-based code these replace measured gelu 196
forward and 66 backward, in the left tail, where its erfc argument -x / sqrt 2 was rounded):
  forward, ulps of the result: gelu 10 [8.4, at x ~ -13.1 where Phi(x) is subnormal; 4.6 for
  x > -13], gelu_tanh 8 [3.0], silu 4 [3.0], tanh 2 [1.5].
  backward (dout = 1), ulps of the sum of the magnitudes of the terms, since the derivatives cross
  zero (gelu' at x ~ -0.75, silu' at x ~ -1.28) where no f32 formula keeps relative accuracy:
  gelu 10 [8.8; 2.9 for x > -13], gelu_tanh 8 [5.2], silu 5 [4.0], tanh 2 [1.7].
silu below x = -87 and gelu_tanh below x = -10 have subnormal intermediates (see normal_range):
there the error is bounded in absolute terms, by 1e-42.
gelu_tanh's argument u = sqrt(2/pi) (x + 0.044715 x^3) is rounded to f32 by the definition of the
f32 formula, so its reference is taken at that rounded argument.
f16 and bf16: within one ulp of the dtype of the reference rounded to it (the op rounds an f32
result that is a few f32 ulps off, which can fall on the other side of a rounding boundary).
"""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
import gputrain.functional as F

FORWARD_BOUND = {"gelu": 10.0, "gelu_tanh": 8.0, "silu": 4.0, "tanh": 2.0}
BACKWARD_BOUND = {"gelu": 10.0, "gelu_tanh": 8.0, "silu": 5.0, "tanh": 2.0}
KINDS = list(FORWARD_BOUND)
TAIL_ABS_ERROR = 1e-42  # outside normal_range (about 700 times the smallest f32 subnormal)
SMALLEST = {"f16": 2.0**-24, "bf16": 2.0**-133}  # the smallest subnormal of each half dtype
C_F32, K_F32 = np.float32(0.79788456080286535588), np.float32(0.044715)  # activation.h's constants
EDGES = np.array([0.0, -0.0, 1e-40, -1e-40, 1e-45, -1e-45, 1e-30, -1e-30, 0.625, -0.625, 0.75, -0.75,
                  13.1, -13.1, 15.0, -15.0, 88.7, -88.7, 104.0, -104.0, 1e30, -1e30, 3.4e38, -3.4e38],
                 dtype=np.float32)
SWEEP = np.concatenate([np.linspace(-20, 20, 1_000_001, dtype=np.float32), EDGES])


def normal_range(x: np.ndarray, kind: str) -> np.ndarray:
    """Where the formula's intermediates stay normal f32: exp(-|x|) of silu below x = -87.3 and
    sigmoid(2u) of gelu_tanh below x = -10 are subnormal or 0, and the products that follow lose
    relative accuracy (the libm-based formulas did too); the results there are below 1e-42."""
    xd = ref.f64(x)
    if kind == "silu":
        return ~(xd < -87.0)
    if kind == "gelu_tanh":
        return ~(xd < -10.0)
    return np.ones(x.shape, dtype=bool)


def f32_ulps(actual: np.ndarray, reference: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """|actual - reference| in f32 ulps of scale (2^-149 below the normal range)."""
    exponent = np.floor(np.log2(np.maximum(np.abs(scale), 2.0**-126)))
    return np.abs(ref.f64(actual) - reference) / 2.0 ** (exponent - 23)


@np.errstate(all="ignore")
def forward_reference(x: np.ndarray, kind: str) -> np.ndarray:
    """act(x) in float64; gelu_tanh at its f32-rounded argument 2u."""
    if kind != "gelu_tanh":
        return ref.activation(x, kind)
    x32 = np.asarray(x, dtype=np.float32)
    two_u = ref.f64(np.float32(2.0) * (C_F32 * (x32 + K_F32 * x32 * x32 * x32)))
    return ref.f64(x) / (1.0 + np.exp(-two_u))


@np.errstate(all="ignore")
def backward_reference(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(act'(x), the sum of the magnitudes of its terms) in float64."""
    xd = ref.f64(x)
    if kind == "gelu":
        cdf, x_pdf = 0.5 * ref._erfc(-xd / np.sqrt(2.0)), xd * np.exp(-0.5 * xd * xd) / np.sqrt(2.0 * np.pi)
        return cdf + x_pdf, cdf + np.abs(x_pdf)
    if kind == "gelu_tanh":
        x32 = np.asarray(x, dtype=np.float32)
        two_u = ref.f64(np.float32(2.0) * (C_F32 * (x32 + K_F32 * x32 * x32 * x32)))
        du = ref.f64(C_F32 * (np.float32(1.0) + np.float32(3.0) * K_F32 * x32 * x32))
        s, one_minus_s = 1.0 / (1.0 + np.exp(-two_u)), 1.0 / (1.0 + np.exp(two_u))
        slope = 2.0 * xd * s * one_minus_s * du
        return s + slope, s + np.abs(slope)
    if kind == "silu":
        s, one_minus_s = 1.0 / (1.0 + np.exp(-xd)), 1.0 / (1.0 + np.exp(xd))
        return s * (1.0 + xd * one_minus_s), s * (1.0 + np.abs(xd) * one_minus_s)
    t = np.tanh(xd)
    return 1.0 - t * t, np.ones_like(xd)


def assert_specials_match(actual: np.ndarray, reference: np.ndarray, kind: str) -> np.ndarray:
    """NaN and inf exactly where the reference has them; returns the mask of finite references."""
    actual64 = ref.f64(actual)
    assert np.array_equal(np.isnan(actual64), np.isnan(reference)), kind
    infinite = np.isinf(reference)
    assert np.array_equal(actual64[infinite], reference[infinite]), kind
    return np.isfinite(reference)


@pytest.mark.parametrize("level", ref.simd_levels())
@pytest.mark.parametrize("kind", KINDS)
def test_forward_within_ulp_bound(kind, level):
    with ref.simd_level(level):
        out = F.activation(SWEEP, kind)
    reference = forward_reference(SWEEP, kind)
    finite = assert_specials_match(out, reference, kind)
    checked = finite & normal_range(SWEEP, kind)
    errors = f32_ulps(out[checked], reference[checked], reference[checked])
    assert errors.max() <= FORWARD_BOUND[kind], (kind, SWEEP[checked][errors.argmax()], errors.max())
    tails = finite & ~checked
    assert (np.abs(ref.f64(out[tails]) - reference[tails]) <= TAIL_ABS_ERROR).all(), kind


@pytest.mark.parametrize("level", ref.simd_levels())
@pytest.mark.parametrize("kind", KINDS)
def test_backward_within_ulp_bound(kind, level):
    with ref.simd_level(level):
        din = F.activation_backward(np.ones_like(SWEEP), SWEEP, kind)
    reference, scale = backward_reference(SWEEP, kind)
    finite = assert_specials_match(din, reference, kind)
    checked = finite & normal_range(SWEEP, kind)
    errors = f32_ulps(din[checked], reference[checked], scale[checked])
    assert errors.max() <= BACKWARD_BOUND[kind], (kind, SWEEP[checked][errors.argmax()], errors.max())
    tails = finite & ~checked
    assert (np.abs(ref.f64(din[tails]) - reference[tails]) <= TAIL_ABS_ERROR).all(), kind


def test_special_values():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    assert np.signbit(F.activation(x, "tanh")[4]) and np.signbit(F.activation(x, "gelu")[4])
    np.testing.assert_array_equal(F.activation(x, "tanh"), [np.nan, 1.0, -1.0, 0.0, 0.0])
    np.testing.assert_array_equal(F.activation(x, "gelu"), [np.nan, np.inf, np.nan, 0.0, 0.0])
    np.testing.assert_array_equal(F.activation_backward(np.ones_like(x), x, "gelu"),
                                  [np.nan, np.nan, np.nan, 0.5, 0.5])
    np.testing.assert_array_equal(F.activation(x, "silu"), [np.nan, np.inf, np.nan, 0.0, 0.0])


def half_sweep(dt: str) -> np.ndarray:
    """Every value of dtype dt in [-20, 20], plus the edge cases rounded to dt."""
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    values = bits.view(ref.NUMPY_TYPES[dt])
    values = values[np.abs(ref.f64(values)) <= 20.0]
    return np.concatenate([values, ref.to_dtype(EDGES, dt)])


def assert_half_close(actual: np.ndarray, reference: np.ndarray, scale: np.ndarray, dt: str,
                      bound: float, checked: np.ndarray) -> None:
    """Within one ulp of dt (or its smallest subnormal) of the reference rounded to dt, plus the
    f32 bound in ulps of scale."""
    rounded = ref.f64(ref.to_dtype(reference, dt))
    tolerance = ref.ULP[dt] * np.abs(rounded) + SMALLEST[dt] + bound * 2.0**-23 * scale
    with np.errstate(invalid="ignore"):
        close = np.abs(ref.f64(actual) - rounded) <= tolerance
    assert close[checked].all(), ref.f64(actual)[checked & ~close][:5]


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
@np.errstate(over="ignore", invalid="ignore")  # edge cases overflow f16; NaN casts
def test_half_dtypes_within_one_ulp_of_rounded_reference(kind, dt):
    x = half_sweep(dt)
    in_range = normal_range(x, kind)
    out = F.activation(x, kind)
    reference = forward_reference(x, kind)
    finite = assert_specials_match(out, reference, kind)
    assert_half_close(out, reference, np.abs(reference), dt, FORWARD_BOUND[kind], finite & in_range)
    din = F.activation_backward(np.ones_like(x), x, kind)
    reference, scale = backward_reference(x, kind)
    finite = assert_specials_match(din, reference, kind)
    assert_half_close(din, reference, scale, dt, BACKWARD_BOUND[kind], finite & in_range)


@pytest.mark.parametrize("dt", ["f32", "f16"])
@np.errstate(over="ignore", invalid="ignore")  # edge cases overflow f16; NaN casts
def test_same_bits_at_every_simd_level(dt):
    x = ref.to_dtype(SWEEP, dt)
    dout = ref.to_dtype(np.linspace(-2, 2, x.size, dtype=np.float32), dt)
    for kind in KINDS:
        base_fwd, base_bwd = F.activation(x, kind), F.activation_backward(dout, x, kind)
        for level in ref.simd_levels():
            with ref.simd_level(level):
                assert ref.same_bits(F.activation(x, kind), base_fwd), (kind, level)
                assert ref.same_bits(F.activation_backward(dout, x, kind), base_bwd), (kind, level)
