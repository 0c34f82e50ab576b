"""The loss scaler's C core: the fused unscale + inf check and the update rules.

References are NumPy emulations of PyTorch's rules: inv_scale = float32(1 / float64(scale)),
g * inv_scale in float32, and scale updates formed in float64 and rounded once to float32.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import gputrain
from gputrain import _C
from gputrain.amp import GradScaler

LEVELS = ["scalar", "avx2", "avx512"]
SUPPORTED = LEVELS[: LEVELS.index(gputrain.info()["simd_supported"]) + 1]
FLT_MAX = float(np.finfo(np.float32).max)
NONFINITE_BITS = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0x7F800000, 0xFF800000]  # NaNs, +Inf, -Inf


@pytest.fixture(params=SUPPORTED)
def simd_level(request):
    """Runs the test at one SIMD level, then restores the best one."""
    best = gputrain.info()["simd_supported"]
    _C.set_simd_level(request.param)
    yield request.param
    _C.set_simd_level(best)


def reference_unscale(grad: np.ndarray, scale: float) -> np.ndarray:
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        inv_scale = np.float32(1.0 / np.float64(np.float32(scale)))
        return grad.copy() if inv_scale == np.float32(1.0) else np.float32(grad) * inv_scale


def emulate_update(scale, tracker, found_inf, growth, backoff, interval, min_scale=0.0):
    """PyTorch's _amp_update_scale_ in NumPy (float64 products rounded to float32) + min_scale."""
    scale = np.float32(scale)
    with np.errstate(over="ignore"):
        if found_inf:
            backed_off = np.float32(np.float64(scale) * np.float64(backoff))
            return max(backed_off, np.float32(min_scale)), 0
        successful = tracker + 1
        if successful == interval:
            grown = np.float32(np.float64(scale) * np.float64(growth))
            return (grown if np.isfinite(grown) else scale), 0
        return scale, successful


def random_grads(rng: np.random.Generator, n: int) -> np.ndarray:
    """Normal values at many magnitudes, with subnormals, zeros and extremes mixed in."""
    g = (rng.standard_normal(n) * np.exp2(rng.integers(-140, 120, n))).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1.17e-38, FLT_MAX, -FLT_MAX, 1.0], np.float32)
    g[rng.integers(0, n, max(1, n // 50))] = rng.choice(special, max(1, n // 50))
    return g


# ---- unscale: bit-identical to NumPy ----

@pytest.mark.parametrize("scale", [65536.0, 3.0, 0.1, 1.0, 2.0**-100, 1e-45, 7.1e37, FLT_MAX])
@pytest.mark.parametrize("n", [1, 15, 17, 1000, 70_001])
def test_unscale_is_bit_identical_to_numpy(simd_level, scale, n):
    rng = np.random.default_rng(n)
    grad = random_grads(rng, n)
    expected = reference_unscale(grad, scale)
    assert GradScaler(init_scale=scale).unscale_arrays([grad]) is False  # the inputs are all finite
    assert np.array_equal(grad.view(np.uint32), expected.view(np.uint32))


def test_unscale_of_nonfinite_values_matches_numpy(simd_level):
    grad = np.array([np.inf, -np.inf, np.nan, 2.0, -0.0] * 7, np.float32)
    expected = reference_unscale(grad, 3.0)
    assert GradScaler(init_scale=3.0).unscale_arrays([grad]) is True
    assert np.array_equal(grad, expected, equal_nan=True)


def test_inv_scale_is_float64_reciprocal_rounded_to_float32():
    rng = np.random.default_rng(0)
    for scale in np.exp2(rng.uniform(-149, 127.9, 2000)).astype(np.float32):
        with np.errstate(over="ignore"):
            expected = np.float32(1.0 / np.float64(scale))
        assert GradScaler(init_scale=float(scale))._inv_scale == float(expected)


def test_scale_one_leaves_every_bit_alone(simd_level):
    grad = np.array([np.nan, -0.0, 1e-45, 3.5, -np.inf], np.float32)
    grad.view(np.uint32)[0] = 0x7FA00001  # a signalling NaN with a payload
    before = grad.copy()
    assert GradScaler(init_scale=1.0).unscale_arrays([grad]) is True
    assert np.array_equal(grad.view(np.uint32), before.view(np.uint32))


# ---- the inf check: every position class, every small size, every SIMD level ----

def test_nonfinite_found_first_middle_last_for_every_size(simd_level):
    scaler = GradScaler(init_scale=2.0)
    arena = np.empty(3000, np.float32)
    for n in range(1, 3001):
        view = arena[:n]
        view.fill(1.0)
        assert scaler._unscale([view]) is False, n
        assert np.all(view == np.float32(0.5))
        for pos in {0, n // 2, n - 1}:
            for bits in (0x7FC00000, 0x7F800000, 0xFF800000):
                view.fill(1.0)
                view.view(np.uint32)[pos] = bits
                assert scaler._unscale([view]) is True, (n, pos, hex(bits))


@pytest.mark.parametrize("bits", NONFINITE_BITS)
def test_every_nan_and_inf_encoding_is_found(simd_level, bits):
    for n in (1, 8, 16, 33, 200):
        grad = np.ones(n, np.float32)
        grad.view(np.uint32)[n - 1] = bits
        assert GradScaler(init_scale=4.0).unscale_arrays([grad]) is True


def test_extreme_finite_values_are_not_flagged(simd_level):
    finite = np.array([FLT_MAX, -FLT_MAX, 1e-45, -1e-45, 0.0, -0.0, 1.17549435e-38], np.float32)
    for scale in (1.0, 2.0, 0.5):
        grad = np.tile(finite, 40)
        assert GradScaler(init_scale=scale).unscale_arrays([grad]) is False


@pytest.mark.parametrize("threads", [1, 2])
def test_parallel_pass_finds_inf_at_block_edges(simd_level, threads):
    n = 200_003
    original = gputrain.get_num_threads()
    gputrain.set_num_threads(threads)
    try:
        scaler = GradScaler(init_scale=8.0)
        for pos in (0, 16_383, 16_384, 100_001, n - 1):
            grad = np.full(n, 8.0, np.float32)
            grad[pos] = -np.inf
            assert scaler._unscale([grad]) is True
            assert np.count_nonzero(grad == 1.0) == n - 1
        grad = np.full(n, 8.0, np.float32)
        assert scaler._unscale([grad]) is False and np.all(grad == 1.0)
    finally:
        gputrain.set_num_threads(original)


def test_found_inf_is_or_of_all_arrays_and_all_are_unscaled(simd_level):
    arrays = [np.full(n, 6.0, np.float32) for n in (3, 40_000, 1, 70_000)]
    arrays[2][0] = np.nan
    assert GradScaler(init_scale=2.0).unscale_arrays(arrays) is True
    assert all(np.all(a == 3.0) for i, a in enumerate(arrays) if i != 2)
    assert GradScaler(init_scale=2.0).unscale_arrays([]) is False


# ---- update rules against the float32/float64 emulation ----

@pytest.mark.parametrize("seed", range(6))
def test_long_random_trajectories_match_emulation(seed):
    rng = np.random.default_rng(seed)
    growth = float(rng.choice([2.0, 1.5, 3.7, 1.0001, 1e30]))
    backoff = float(rng.choice([0.5, 0.123, 0.9999, 1e-30]))
    interval = int(rng.choice([1, 2, 3, 7, 50]))
    min_scale = float(rng.choice([0.0, 0.0, 1e-3]))
    init = float(np.float32(rng.uniform(0.5, 4.0) * 2.0 ** rng.integers(-20, 40)))
    scaler = GradScaler(init, growth, backoff, interval, min_scale=min_scale or None)
    scale, tracker, skipped, consecutive = np.float32(init), 0, 0, 0
    for found_inf in rng.random(20_000) < rng.choice([0.02, 0.3, 0.7]):
        scale, tracker = emulate_update(scale, tracker, bool(found_inf), growth, backoff, interval, min_scale)
        skipped, consecutive = skipped + found_inf, (consecutive + 1) * found_inf
        scaler._update(bool(found_inf))
        assert scaler._scale == float(scale) and scaler._growth_tracker == tracker
    assert (scaler.skipped_steps, scaler.consecutive_skipped_steps) == (skipped, consecutive)


def test_trajectory_through_the_public_api_matches_emulation():
    """Scaled gradients overflow when the scale is too large (plus injected NaN/Inf)."""
    rng = np.random.default_rng(7)
    scaler = GradScaler(init_scale=1024.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
    scale, tracker, overflows = np.float32(1024.0), 0, 0
    for inject in rng.random(3000) < 0.05:
        true_grad = (rng.standard_normal(37) * 1e30).astype(np.float32)
        with np.errstate(over="ignore"):
            grad = true_grad * scale
        if inject:
            grad[rng.integers(37)] = rng.choice([np.nan, np.inf, -np.inf])
        found_inf = not np.isfinite(grad).all()
        overflows += found_inf and not inject
        expected = reference_unscale(grad, float(scale))
        assert scaler.unscale_arrays([grad]) == found_inf
        assert np.array_equal(grad, expected, equal_nan=True)
        scaler.update()
        scale, tracker = emulate_update(scale, tracker, found_inf, 2.0, 0.5, 3)
        assert scaler.get_scale() == float(scale) and scaler._get_growth_tracker() == tracker
    assert overflows > 100 and 1.0 < scale < 2.0**40  # it hovered at the overflow edge


@pytest.mark.parametrize("growth", [2.0, 1.5, 1.1])
def test_growth_stops_below_float32_max_and_never_reaches_inf(growth):
    scaler = GradScaler(init_scale=2.0**120, growth_factor=growth, growth_interval=1)
    scale = np.float32(2.0**120)
    for _ in range(200):
        scaler._update(False)
        scale, _ = emulate_update(scale, 0, False, growth, 0.5, 1)
        assert scaler._scale == float(scale)
    assert np.isfinite(np.float32(scaler._scale))
    assert scaler._scale > FLT_MAX / growth / 1.0001 and scaler._growth_tracker == 0


@pytest.mark.parametrize("backoff", [0.5, 0.3, 0.9])
def test_backoff_walks_through_subnormals_to_zero(backoff):
    scaler = GradScaler(init_scale=1.0, backoff_factor=backoff)
    scale, seen_subnormal = np.float32(1.0), False
    for _ in range(2000):
        scaler._update(True)
        scale, _ = emulate_update(scale, 0, True, 2.0, backoff, 2000)
        assert scaler._scale == float(scale)
        seen_subnormal |= 0 < scale < np.finfo(np.float32).tiny
    assert seen_subnormal and (scaler._scale == 0.0 or backoff > 0.5)  # 0.9 sticks at 4 * 2**-149
    grad = np.array([1.0, 0.0], np.float32)
    expected = reference_unscale(grad, scaler._scale)
    # As in PyTorch the check looks at the scaled gradients, before the multiply by inv_scale.
    assert scaler.unscale_arrays([grad]) is False
    assert np.array_equal(grad, expected, equal_nan=True) and not np.isfinite(grad).any()


def test_min_scale_floors_the_backoff():
    scaler = GradScaler(init_scale=4.0, min_scale=1.5)
    for expected in (2.0, 1.5, 1.5):
        scaler._update(True)
        assert scaler._scale == expected
    assert scaler.min_scale == 1.5 and GradScaler().min_scale is None


def test_tracker_past_a_lowered_interval_keeps_counting_like_pytorch():
    scaler = GradScaler(init_scale=8.0, growth_interval=10)
    for _ in range(5):
        scaler._update(False)
    scaler.set_growth_interval(3)
    scaler._update(False)
    assert scaler._growth_tracker == 6 and scaler._scale == 8.0
    scaler._configure(growth_tracker=2**31 - 1)
    scaler._update(False)  # int32 wrap as in PyTorch's tensor, not C undefined behaviour
    assert scaler._growth_tracker == -(2**31)


# ---- the C entry points: argument checks, references, baseline ----

@pytest.mark.parametrize("bad, error, match", [
    (np.ones(4, np.float64), TypeError, "float32"),
    (np.ones(4, np.int32), TypeError, "float32"),
    (np.ones(4, np.float16), TypeError, "float32"),
    (np.ones(4, ">f4"), TypeError, "float32"),
    ([1.0, 2.0], TypeError, "float32"),
    (np.ones((4, 4), np.float32)[:, 0], ValueError, "C-contiguous"),
    (np.frombuffer(bytes(16), np.float32), ValueError, "writeable"),
])
def test_unscale_rejects_arrays_it_cannot_unscale_in_place(bad, error, match):
    good = np.full(4, 2.0, np.float32)
    with pytest.raises(error, match=match):
        GradScaler(init_scale=2.0).unscale_arrays([good, bad])
    assert np.all(good == 2.0)  # checked before anything is written


def test_unscale_rejects_non_sequences():
    scaler = GradScaler()
    with pytest.raises(TypeError, match="list"):
        scaler.unscale_arrays(np.ones(3, np.float32))
    with pytest.raises(TypeError, match="list or tuple"):
        scaler._unscale({np.ones(3, np.float32).tobytes()})
    with pytest.raises(TypeError):
        scaler.unscale_arrays(5)


def test_unscale_holds_no_references():
    scaler = GradScaler(init_scale=1.0)
    grads = [np.ones(10, np.float32), np.ones(100_000, np.float32)]
    before = [sys.getrefcount(g) for g in grads]
    for _ in range(1000):
        scaler._unscale(grads)
        scaler._unscale(tuple(grads))
    assert [sys.getrefcount(g) for g in grads] == before


def test_read_baseline_sums_without_writing(simd_level):
    x = np.random.default_rng(1).random(300_001).astype(np.float32)
    before = x.copy()
    assert _C.scaler_read_baseline(x) == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5)
    assert np.array_equal(x, before)
    assert _C.scaler_read_baseline(np.zeros(0, np.float32)) == 0.0
    with pytest.raises(TypeError, match="float32"):
        _C.scaler_read_baseline(np.ones(3))


# ---- the CUDA kernels against the CPU path (need a GPU) ----

@pytest.mark.cuda
@pytest.mark.parametrize("n", [1, 3, 4, 5, 1023, 4096, 100_003, 3_000_001])
@pytest.mark.parametrize("scale", [65536.0, 3.0, 1.0, 1e-45])
def test_cuda_unscale_matches_cpu_bit_for_bit(n, scale):
    grad = random_grads(np.random.default_rng(n), n)
    grad[n // 3] = np.inf if n > 100 else grad[n // 3]
    on_cpu, on_gpu = grad.copy(), grad.copy()
    found_cpu = GradScaler(init_scale=scale).unscale_arrays([on_cpu])
    found_gpu = _C.scaler_cuda_run(GradScaler(init_scale=scale), on_gpu)
    assert found_gpu == found_cpu
    assert np.array_equal(on_gpu.view(np.uint32), on_cpu.view(np.uint32))


@pytest.mark.cuda
def test_cuda_finds_nonfinite_first_middle_last():
    scaler = GradScaler(init_scale=2.0)
    for n in list(range(1, 70)) + [1000, 4097, 1 << 20]:
        assert _C.scaler_cuda_run(scaler, np.ones(n, np.float32)) is False
        for pos in {0, n // 2, n - 1}:
            for bits in (0x7FC00000, 0x7F800000, 0xFF800000):
                grad = np.ones(n, np.float32)
                grad.view(np.uint32)[pos] = bits
                assert _C.scaler_cuda_run(scaler, grad) is True, (n, pos, hex(bits))


@pytest.mark.cuda
@pytest.mark.parametrize("init, growth, backoff, interval", [
    (1024.0, 2.0, 0.5, 3), (2.0**120, 1.5, 0.5, 1), (1.0, 2.0, 0.3, 2000), (3.0, 1.7, 0.123, 2)])
def test_cuda_update_kernel_follows_the_cpu_trajectory(init, growth, backoff, interval):
    rng = np.random.default_rng(11)
    on_cpu = GradScaler(init, growth, backoff, interval)
    on_gpu = GradScaler(init, growth, backoff, interval)
    p_inf = 1.0 if interval == 2000 else 0.2
    for found_inf in rng.random(300) < p_inf:
        grad = np.ones(8, np.float32)
        grad[3] = np.nan if found_inf else 1.0
        assert _C.scaler_cuda_run(on_gpu, grad, update=True) == found_inf
        on_cpu._update(bool(found_inf))
        assert (on_gpu._scale, on_gpu._growth_tracker) == (on_cpu._scale, on_cpu._growth_tracker)
    assert on_gpu.skipped_steps == on_cpu.skipped_steps


def test_cuda_run_checks_its_arguments():
    with pytest.raises(TypeError, match="GradScaler"):
        _C.scaler_cuda_run(object(), np.ones(2, np.float32))
    with pytest.raises(TypeError, match="float32"):
        _C.scaler_cuda_run(GradScaler(), np.ones(2))
    if _C.cuda_device_count() == 0:
        with pytest.raises(gputrain.CudaError, match="CUDA"):
            _C.scaler_cuda_run(GradScaler(), np.ones(2, np.float32))
