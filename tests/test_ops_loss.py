"""CPU losses and norms (csrc/ops/cpu_xent.c, cpu_reduce.c): softmax cross-entropy with label
smoothing and ignore_index, MSE and sum of squares against float64 NumPy, finite-difference
gradients, determinism and bad arguments."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _reference as ref
from gputrain import _C
from gputrain import functional as F

DTYPES = ["f32", "f16", "bf16"]


def randn(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def targets_for(rows, classes, seed, ignored=()):
    t = np.random.default_rng(seed).integers(0, classes, rows)
    t[list(ignored)] = -100
    return t


# --- cross-entropy -------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
def test_cross_entropy_matches_reference(dt, smoothing):
    logits = ref.to_dtype(randn((33, 10), 1, 3.0), dt)
    targets = targets_for(33, 10, 2, ignored=(0, 5, 32))
    loss, dlogits = F.cross_entropy(logits, targets, label_smoothing=smoothing, dloss_scale=2.0)
    losses, grad, count = ref.cross_entropy(logits, targets, smoothing)
    assert count == 30 and dlogits.dtype == logits.dtype
    assert loss == pytest.approx(losses.sum() / count, rel=1e-6)
    ref.assert_close(dlogits, 2.0 * grad, dt, rtol=1e-5 if dt == "f32" else None, atol=1e-7)
    assert not ref.f64(dlogits)[[0, 5, 32]].any()
    per_row = np.empty(33, np.float32)
    assert _C.op_softmax_xent(per_row, None, logits.view(np.uint16) if dt == "bf16" else logits,
                              targets, smoothing, -100, 1.0, dt) == 30
    np.testing.assert_allclose(per_row, losses, rtol=2e-6, atol=1e-6)


def test_cross_entropy_matches_pytorch_formula_by_hand():
    # one row, 3 classes, e = 0.3: (1 - e) * nll + e * mean_j(-log p_j)
    logits = np.array([[1.0, 2.0, 0.5]], np.float32)
    logp = logits[0] - math.log(sum(math.exp(v) for v in logits[0]))
    expected = 0.7 * -logp[1] + 0.3 * -logp.mean()
    loss, _ = F.cross_entropy(logits, np.array([1]), label_smoothing=0.3)
    assert loss == pytest.approx(expected, rel=1e-6)


def test_cross_entropy_backward_matches_finite_differences():
    logits, targets = randn((6, 5), 3, 2.0), np.array([0, 4, -100, 2, 2, 1])
    for smoothing in (0.0, 0.2):
        _, dlogits = F.cross_entropy(logits, targets, label_smoothing=smoothing, dloss_scale=3.0)
        def mean_loss(v):
            losses, _, count = ref.cross_entropy(v, targets, smoothing)
            return 3.0 * losses.sum() / count
        ref.assert_grad(dlogits, ref.numerical_grad(mean_loss, logits, 1.0), rtol=1e-4, atol=1e-6)


def test_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e30, 0.0, -1e30], [88.0, 89.0, 90.0]], np.float32)
    loss, dlogits = F.cross_entropy(logits, np.array([0, 2]))
    assert np.isfinite(loss) and np.isfinite(dlogits).all()
    losses, grad, _ = ref.cross_entropy(logits, np.array([0, 2]))
    assert loss == pytest.approx(losses.mean(), rel=1e-6)
    np.testing.assert_allclose(dlogits, grad, atol=1e-7)


def test_cross_entropy_all_rows_ignored():
    loss, dlogits = F.cross_entropy(randn((3, 4), 4), np.array([7, 7, 7]), ignore_index=7)
    assert math.isnan(loss) and not dlogits.any()


def test_an_all_ignored_micro_batch_adds_zero_to_a_train_steps_loss_and_gradient():
    """The documented difference (gputrain/step.py): the functional gives NaN for a batch with every
    target ignored (as PyTorch); a TrainStep counts such a micro-batch as loss 0 with no gradient,
    still in the divisor, and a step with no counted target reports 0.0 and a zero gradient norm."""
    import gputrain as gt
    model = gt.nn.Sequential(gt.nn.Linear(4, 3))
    before = {k: v.copy() for k, v in model.state_dict().items()}
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.0),
                        micro_batches=2, max_grad_norm=1.0)
    x = randn((4, 4), 3)
    ignored = np.full(4, -100)
    assert math.isnan(F.cross_entropy(model(x), ignored)[0])
    out = step(x, ignored)
    assert (out.loss, out.grad_norm) == (0.0, 0.0)
    assert all(np.array_equal(v, before[k]) for k, v in model.state_dict().items())  # AdamW: 0 / (0 + eps)
    half = np.array([2, 0, -100, -100])  # micro-batch 0 counted, micro-batch 1 all ignored
    expected = F.cross_entropy(model(x[:2]), half[:2])[0] / 2
    assert step(x, half).loss == pytest.approx(expected, rel=1e-6)


def test_cross_entropy_custom_ignore_index_and_int32_targets():
    logits = randn((4, 5), 5)
    targets = np.array([1, 3, 3, 0], dtype=np.int32)
    loss, _ = F.cross_entropy(logits, targets, ignore_index=3)
    losses, _, count = ref.cross_entropy(logits, targets, 0.0, ignore_index=3)
    assert count == 2 and loss == pytest.approx(losses.sum() / 2, rel=1e-6)


@pytest.mark.parametrize("rows, classes, dt", [(4000, 37, "f32"), (40, 1003, "f32"), (40, 1003, "bf16")])
def test_cross_entropy_same_bits_for_any_thread_count_and_simd_level(rows, classes, dt):
    logits = ref.to_dtype(randn((rows, classes), 6, 2.0), dt)
    targets = targets_for(rows, classes, 7, ignored=(3, 39))
    base = F.cross_entropy(logits, targets, label_smoothing=0.1)
    for count in (1, 2):
        with ref.num_threads(count):
            loss, d = F.cross_entropy(logits, targets, label_smoothing=0.1)
            assert loss == base[0] and ref.same_bits(d, base[1])
    for level in ref.simd_levels():
        with ref.simd_level(level):
            loss, d = F.cross_entropy(logits, targets, label_smoothing=0.1)
            assert loss == base[0] and ref.same_bits(d, base[1])


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_cross_entropy_over_a_large_vocabulary_matches_float64(dt):
    """32771 classes (a 32k vocabulary and a tail past the sums' 8 lanes), logits spread wide."""
    logits = ref.to_dtype(randn((6, 32771), 10, 8.0), dt)
    targets = targets_for(6, 32771, 11, ignored=(2,))
    loss, dlogits = F.cross_entropy(logits, targets, label_smoothing=0.1)
    losses, grad, count = ref.cross_entropy(logits, targets, 0.1)
    assert count == 5 and loss == pytest.approx(losses.sum() / count, rel=1e-6)
    ref.assert_close(dlogits, grad, dt, rtol=1e-5 if dt == "f32" else None, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 30), classes=st.integers(1, 40), smoothing=st.floats(0.0, 1.0),
       dt=st.sampled_from(DTYPES))
def test_cross_entropy_any_shape(rows, classes, smoothing, dt):
    logits = ref.to_dtype(randn((rows, classes), 8, 3.0), dt)
    targets = targets_for(rows, classes, 9)
    loss, dlogits = F.cross_entropy(logits, targets, label_smoothing=smoothing)
    losses, grad, count = ref.cross_entropy(logits, targets, float(np.float32(smoothing)))
    assert loss == pytest.approx(losses.sum() / count, rel=1e-5, abs=1e-6)
    ref.assert_close(dlogits, grad, dt, rtol=1e-5 if dt == "f32" else None, atol=1e-7)


def test_cross_entropy_bad_arguments():
    logits = randn((3, 4), 10)
    with pytest.raises(IndexError, match=r"targets\[1\] = 4 is out of range \[0, 4\)"):
        F.cross_entropy(logits, np.array([0, 4, 1]))
    with pytest.raises(IndexError, match=r"targets\[2\] = -1"):
        F.cross_entropy(logits, np.array([0, 1, -1]))
    with pytest.raises(ValueError, match=r"targets must have shape \(3,\)"):
        F.cross_entropy(logits, np.array([0, 1]))
    with pytest.raises(TypeError, match="targets must be an integer array"):
        F.cross_entropy(logits, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="label_smoothing must be <= 1"):
        F.cross_entropy(logits, np.array([0, 1, 2]), label_smoothing=1.5)
    with pytest.raises(ValueError, match="logits must be 2-D"):
        F.cross_entropy(randn(4, 11), np.array([0]))
    bad = logits.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="logits contains NaN"):
        F.cross_entropy(bad, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="logits contains NaN"):
        F.cross_entropy(bad.astype(ref.BF16), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="label_smoothing: must be in"):
        _C.op_softmax_xent(np.empty(3, np.float32), None, logits, np.array([0, 1, 2]), 2.0, -100, 1.0, "f32")


# --- MSE and sum of squares ----------------------------------------------------------------------


@pytest.mark.parametrize("dt", DTYPES)
def test_mse_matches_reference(dt):
    pred, target = ref.to_dtype(randn((20, 7), 20), dt), randn((20, 7), 21)
    loss, dpred = F.mse_loss(pred, target, dloss_scale=0.5)
    ref_loss, ref_grad = ref.mse(pred, target)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    ref.assert_close(dpred, 0.5 * ref_grad, dt, rtol=1e-6 if dt == "f32" else None)


def test_mse_backward_matches_finite_differences():
    pred, target = randn((4, 3), 22), randn((4, 3), 23)
    _, dpred = F.mse_loss(pred, target)
    numeric = ref.numerical_grad(lambda v: np.array(ref.mse(v, target)[0]), pred, 1.0)
    ref.assert_grad(dpred, numeric)


def test_mse_and_sum_squares_same_bits_for_any_thread_count_and_simd_level():
    pred, target = randn(1_000_003, 24), randn(1_000_003, 25)
    base_mse, base_ssq = F.mse_loss(pred, target), F.sum_squares(pred)
    for count in (1, 2):
        with ref.num_threads(count):
            loss, d = F.mse_loss(pred, target)
            assert loss == base_mse[0] and ref.same_bits(d, base_mse[1])
            assert F.sum_squares(pred) == base_ssq
    for level in ref.simd_levels():
        with ref.simd_level(level):
            assert F.mse_loss(pred, target)[0] == base_mse[0]
            assert F.sum_squares(pred) == base_ssq


def test_sum_squares_matches_reference():
    for n in (0, 1, 7, 8, 9, 16383, 16385, 200_001):
        x = randn(n, n)
        assert F.sum_squares(x) == pytest.approx(float(np.sum(ref.f64(x) ** 2)), rel=1e-12, abs=0.0)
    big = np.full(10, 1e30, np.float32)  # squares overflow f32 but not the double accumulator
    assert F.sum_squares(big) == pytest.approx(10 * float(np.float32(1e30)) ** 2, rel=1e-12)


def test_mse_and_sum_squares_bad_arguments():
    pred = randn((3, 2), 26)
    with pytest.raises(ValueError, match=r"target must have shape \(3, 2\)"):
        F.mse_loss(pred, randn((2, 3), 27))
    with pytest.raises(TypeError, match="target must be float32"):
        F.mse_loss(pred, pred.astype(np.float64))
    with pytest.raises(ValueError, match="pred must not be empty"):
        F.mse_loss(np.zeros(0, np.float32), np.zeros(0, np.float32))
    bad = pred.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="pred contains NaN"):
        F.mse_loss(bad, pred)
    with pytest.raises(ValueError, match="target contains NaN"):
        F.mse_loss(pred, bad)
    with pytest.raises(TypeError, match="x must be float32"):
        F.sum_squares(pred.astype(np.float16))
    with pytest.raises(ValueError, match="n: the mean squared error needs n >= 1"):
        _C.op_mse(None, np.zeros(0, np.float32), np.zeros(0, np.float32), 1.0, "f32")
