"""The one-call training step: accumulation, set_to_none, gradient checkpointing, clipping,
and training MLPs to a target accuracy on scikit-learn's digits."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _digits import digits

nn = gt.nn


def block_model(dropout=0.1, seed=5):
    gt.random.manual_seed(seed)
    def block():
        return nn.Residual(nn.LayerNorm(32), nn.Linear(32, 64), nn.GELU(), nn.Dropout(dropout), nn.Linear(64, 32))
    return nn.Sequential(nn.Linear(20, 32), block(), block(), nn.LayerNorm(32), nn.Linear(32, 4))


def batch(rows=32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 20)).astype(np.float32), rng.integers(0, 4, rows)


def train(model, steps, **step_options):
    optimizer = gt.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(label_smoothing=0.1), optimizer, **step_options)
    losses = []
    for i in range(steps):
        x, y = batch(seed=i)
        losses.append(step(x, y).loss)
    return losses


def grads_of(model):
    return [p.grad.copy() for p in model.parameters()]


def test_accumulation_equals_the_full_batch_gradient():
    x, y = batch(32)
    a, b = block_model(dropout=0.0), block_model(dropout=0.0)
    full = gt.TrainStep(a, nn.CrossEntropyLoss())(x, y)
    accumulated = gt.TrainStep(b, nn.CrossEntropyLoss(), micro_batches=4)(x, y)
    assert accumulated.loss == pytest.approx(full.loss, rel=1e-6)
    for ga, gb in zip(grads_of(a), grads_of(b)):
        np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-7)


def test_set_to_none_is_bit_identical_to_zeroing():
    a, b = block_model(), block_model()
    losses_a = train(a, 6, set_to_none=True, micro_batches=2)
    losses_b = train(b, 6, set_to_none=False, micro_batches=2)
    assert losses_a == losses_b
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert np.array_equal(pa.data, pb.data)
        assert np.array_equal(pa.grad, pb.grad)


def test_checkpointing_is_bit_identical_and_shrinks_activations():
    a, b = block_model(), block_model()
    losses_a = train(a, 5, gradient_checkpointing=False)
    losses_b = train(b, 5, gradient_checkpointing=True)
    assert losses_a == losses_b
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert np.array_equal(pa.data, pb.data)
    plain = a.compiled.plan((32, 20), checkpointing=False)
    checkpointed = a.compiled.plan((32, 20), checkpointing=True)
    kept_plain = plain["activations"] + plain["recompute"]
    kept_checkpointed = checkpointed["activations"] + checkpointed["recompute"]
    assert kept_checkpointed < kept_plain
    assert b.compiled.current_plan["activations"] == checkpointed["activations"]


def test_plan_is_exact_and_allocated_once():
    model = block_model()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), micro_batches=2)
    plan = step.memory_plan((32, 20))
    before = gt.memory_stats("cpu")["num_allocs"]
    x, y = batch(32)
    step(x, y)
    step(x, y)
    assert gt.memory_stats("cpu")["num_allocs"] - before == 1  # the activation arena, once
    assert model.compiled.current_plan == plan
    assert plan["parameters"] == 4 * model.num_parameters()


def test_clipping_caps_the_update_and_reports_the_norm():
    model = block_model(dropout=0.0)
    x, y = batch()
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), log_grad_norm=True)(x, y)
    norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads_of(model)))
    assert out.grad_norm == pytest.approx(norm, rel=1e-6)
    clipped = block_model(dropout=0.0)
    before = [p.data.copy() for p in clipped.parameters()]
    sgd = gt.optim.SGD(clipped.parameters(), lr=1.0)
    gt.TrainStep(clipped, nn.CrossEntropyLoss(), sgd, max_grad_norm=0.01)(x, y)
    update = np.sqrt(sum(float(((p.data - b).astype(np.float64) ** 2).sum()) for p, b in zip(clipped.parameters(), before)))
    assert update == pytest.approx(0.01, rel=1e-3)


def test_step_rejects_bad_batches():
    step = gt.TrainStep(block_model(), nn.CrossEntropyLoss(), micro_batches=3)
    x, y = batch(32)
    with pytest.raises(ValueError, match="micro-batches"):
        step(x, y)
    with pytest.raises(ValueError, match="micro_batches"):
        gt.TrainStep(block_model(), nn.CrossEntropyLoss(), micro_batches=0)
    with pytest.raises(ValueError, match="precision"):
        gt.TrainStep(block_model(), nn.CrossEntropyLoss(), precision="fp8")
    with pytest.raises(TypeError, match="model"):
        gt.TrainStep("model", nn.CrossEntropyLoss())


def test_mlp_reaches_97_percent_on_digits():
    x_train, y_train, x_test, y_test = digits()
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    for epoch in range(30):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order) - 31, 32):
            idx = order[i:i + 32]
            step(x_train[idx], y_train[idx])
    accuracy = (model.eval()(x_test).argmax(1) == y_test).mean()
    assert accuracy >= 0.97, accuracy
