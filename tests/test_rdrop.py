"""R-Drop (Liang et al. 2021): the loss op softmax_xent_rdrop (csrc/ops/rdrop_hd.h, CPU and sim)
against a float64 NumPy reference whose gradient is checked by finite differences, against
PyTorch's autograd of the paper's loss (tests/fixtures/make_rdrop_fixtures.py, run in the side
environment; its numbers are committed), sim against the CPU bit for bit, and the whole
TrainStep(rdrop_alpha=...) against a NumPy step with the model's Philox dropout masks.

The loss: rows i and n + i of 2n logit rows are the two dropout passes of example i, and
    L = mean over counted rows of CE + alpha * mean over counted pairs of (KL(p1||p2) + KL(p2||p1)) / 2
(a pair with an ignore_index target has no KL; an ignored row has no CE)."""

from __future__ import annotations

import copy
import math
import os
import warnings

import numpy as np
import pytest

import _reference as ref
from _mlp_reference import layer_backward, layer_forward, params_of
import gputrain as gt
from gputrain import _C, _C_testing, nn

IGNORE = -100
FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "rdrop", "torch-rdrop.npz")


# --- the float64 NumPy reference ---------------------------------------------------------------

def log_softmax(z: np.ndarray) -> np.ndarray:
    s = z - z.max(-1, keepdims=True)
    return s - np.log(np.exp(s).sum(-1, keepdims=True))


def rdrop_rows(z, t, alpha, smoothing=0.0):
    """Per-row losses (2n,) and the count of rows not ignored, in float64."""
    z = ref.f64(z)
    rows, classes = z.shape
    half = rows // 2
    logp = log_softmax(z)
    counted = t != IGNORE
    safe = np.where(counted, t, 0)
    ce = -(1 - smoothing) * logp[np.arange(rows), safe] - smoothing * logp.mean(-1)
    losses = np.where(counted, ce, 0.0)
    pair = counted[:half] & counted[half:]
    la, lb = logp[:half], logp[half:]
    kl = 0.5 * ((np.exp(la) * (la - lb)).sum(-1) + (np.exp(lb) * (lb - la)).sum(-1))
    losses[:half] += np.where(pair, alpha * kl, 0.0)
    losses[half:] += np.where(pair, alpha * kl, 0.0)
    return losses, int(counted.sum())


def rdrop_loss(z, t, alpha, smoothing=0.0):
    losses, count = rdrop_rows(z, t, alpha, smoothing)
    return losses.sum() / count if count else 0.0


def rdrop_grad(z, t, alpha, smoothing=0.0):
    """d rdrop_loss / d z in float64, by the formula of csrc/ops/rdrop_hd.h."""
    z = ref.f64(z)
    rows, classes = z.shape
    half = rows // 2
    logp = log_softmax(z)
    p = np.exp(logp)
    counted = t != IGNORE
    count = counted.sum()
    y = np.full((rows, classes), smoothing / classes)
    y[np.arange(rows), np.where(counted, t, 0)] += 1 - smoothing
    grad = np.where(counted[:, None], p - y, 0.0)
    pair = (counted[:half] & counted[half:])[:, None]
    pa, pb, d = p[:half], p[half:], logp[:half] - logp[half:]
    ea, eb = (pa * d).sum(-1, keepdims=True), (pb * d).sum(-1, keepdims=True)
    grad[:half] += np.where(pair, alpha * (pa * (d - ea) + pa - pb), 0.0)
    grad[half:] += np.where(pair, alpha * (-pb * (d - eb) + pb - pa), 0.0)
    return grad / count if count else grad * 0.0


def logits_case(pairs=5, classes=6, seed=0, dt="f32", ignored=()):
    rng = np.random.default_rng(seed)
    first = rng.standard_normal((pairs, classes))
    z = np.concatenate([first, first + 0.7 * rng.standard_normal((pairs, classes))])
    t = rng.integers(0, classes, pairs).astype(np.int64)
    t[list(ignored)] = IGNORE
    return ref.to_dtype(z, dt), np.concatenate([t, t])


def run(backend, z, t, alpha, smoothing=0.0, dloss_scale=1.0, dt="f32"):
    """The op on `backend`: (losses, dlogits, count)."""
    losses = np.zeros(len(z), np.float32)
    dlogits = np.zeros_like(z)
    count = _C_testing.run_op(backend, "softmax_xent_rdrop", [losses, dlogits, np.ascontiguousarray(z), t],
                      (z.shape[0], z.shape[1], smoothing, IGNORE, alpha, dloss_scale, dt))
    return losses, dlogits, count


# --- the loss op -------------------------------------------------------------------------------

@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_numpy_gradient_is_the_finite_difference_one(smoothing):
    z, t = logits_case(pairs=3, classes=4, ignored=(1,))
    t[4] = 2  # one pair with a counted and an ignored row: CE only, no KL
    numeric = ref.numerical_grad(lambda v: np.array(rdrop_loss(v, t, 1.3, smoothing)), ref.f64(z), 1.0)
    np.testing.assert_allclose(rdrop_grad(z, t, 1.3, smoothing), numeric, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("dt, rtol", [("f32", 2e-6), ("bf16", 1e-2), ("f16", 2e-3)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_op_matches_the_numpy_reference(dt, rtol, smoothing):
    z, t = logits_case(pairs=7, classes=9, seed=3, dt=dt, ignored=(2, 5))
    losses, dlogits, count = run("cpu", z, t, 0.8, smoothing, dloss_scale=4.0, dt=dt)
    ref_losses, ref_count = rdrop_rows(z, t, 0.8, smoothing)
    assert count == ref_count == 10
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-6, atol=1e-6)  # f32 losses from dt's logits
    np.testing.assert_allclose(ref.f64(dlogits), 4.0 * rdrop_grad(z, t, 0.8, smoothing), rtol=rtol, atol=rtol * 1e-2)


def test_op_gradient_matches_finite_differences():
    z, t = logits_case(pairs=4, classes=5, seed=7)
    _, dlogits, _ = run("cpu", z, t, 2.0)
    numeric = ref.numerical_grad(lambda v: np.array(rdrop_loss(v, t, 2.0)), ref.f64(z), 1.0)
    ref.assert_grad(dlogits, numeric, rtol=1e-4, atol=1e-7)


def test_ignored_rows_have_no_loss_no_gradient_and_no_kl():
    z, t = logits_case(pairs=4, classes=5, seed=2, ignored=(0, 3))
    t[5] = 1  # pair 1: its first row counted, its second ignored
    t[1] = IGNORE
    losses, dlogits, count = run("cpu", z, t, 5.0)
    ignored = t == IGNORE
    assert count == int((~ignored).sum())
    assert np.all(losses[ignored] == 0) and np.all(dlogits[ignored] == 0)
    plain_losses = np.zeros(len(z), np.float32)
    _C_testing.run_op("cpu", "softmax_xent", [plain_losses, None, z, t], (len(z), z.shape[1], 0.0, IGNORE, 1.0, "f32"))
    assert losses[5] == pytest.approx(plain_losses[5], rel=1e-6)  # a half-ignored pair: cross-entropy only
    assert losses[2] > plain_losses[2]  # a counted pair: its KL added


def test_matches_pytorch_autograd_of_the_papers_loss():
    """Numbers made by torch (fixtures/make_rdrop_fixtures.py): the paper's cross-entropy of both
    passes, its compute_kl_loss with the pads masked, reduced per pair, and autograd's gradient."""
    data = np.load(FIXTURE)
    for case in ("plain", "smoothed", "ignored", "wide"):
        z, t = data[f"{case}/logits"], data[f"{case}/targets"]
        alpha, smoothing = float(data[f"{case}/alpha"]), float(data[f"{case}/smoothing"])
        losses, dlogits, count = run("cpu", z, t, alpha, smoothing)
        assert losses.astype(np.float64).sum() / count == pytest.approx(float(data[f"{case}/loss"]), rel=2e-6), case
        np.testing.assert_allclose(dlogits, data[f"{case}/grad"], rtol=2e-4, atol=2e-8, err_msg=case)
        assert rdrop_loss(z, t, alpha, smoothing) == pytest.approx(float(data[f"{case}/loss"]), rel=1e-12), case


@pytest.mark.sim
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_sim_gives_the_cpu_bits(dt):
    z, t = logits_case(pairs=37, classes=29, seed=11, dt=dt, ignored=(3, 30))
    cpu, sim = run("cpu", z, t, 0.6, 0.1, 2.0, dt), run("sim", z, t, 0.6, 0.1, 2.0, dt)
    assert cpu[2] == sim[2]
    assert ref.same_bits(cpu[0], sim[0]) and ref.same_bits(cpu[1], sim[1])


@pytest.mark.parametrize("args, message", [
    ((7, 4, 0.0, IGNORE, 0.5, 1.0, "f32"), "rows must be even"),
    ((8, 4, 0.0, IGNORE, -0.5, 1.0, "f32"), "rdrop_alpha"),
    ((8, 4, 0.0, IGNORE, math.inf, 1.0, "f32"), "rdrop_alpha"),
])
def test_op_refuses_bad_arguments(args, message):
    rows = args[0]
    z = np.zeros((rows, 4), np.float32)
    with pytest.raises(ValueError, match=message):
        _C_testing.run_op("cpu", "softmax_xent_rdrop", [np.zeros(rows, np.float32), np.zeros_like(z), z,
                                                np.zeros(rows, np.int64)], args)


# --- the training step -------------------------------------------------------------------------

IN, HIDDEN, CLASSES, P = 6, 16, 4, 0.3


def make_model(device="cpu", dropout=P):
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Dropout(dropout), nn.Linear(HIDDEN, CLASSES))
    return model.to(device) if device != "cpu" else model


def step_batch(rows=8, seed=1, seq=()):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, *seq, IN)).astype(np.float32)
    y = rng.integers(0, CLASSES, (rows, *seq)).astype(np.int64)
    y[1] = IGNORE
    return x, y


def reference_step(model, params, x, y, alpha, micro_batches, lr):
    """One SGD step of R-Drop in float64 on `params` (updated in place); returns the loss."""
    seed, step = model.compiled.seed, model.compiled.step
    rows = len(x) // micro_batches
    grads_total: dict = {}
    loss = 0.0
    for m in range(micro_batches):
        xm, ym = x[m * rows:(m + 1) * rows], y[m * rows:(m + 1) * rows]
        x2, y2 = np.concatenate([xm, xm]), np.concatenate([ym, ym])

        def multiplier(layer, shape, m=m):
            n = int(np.prod(shape))
            keep = ref.dropout_mask(n, layer.p, seed, 0, step, m * n)
            return keep.reshape(shape) * float(np.float32(1.0) / np.float32(1.0 - layer.p))

        logits, cache = layer_forward(model, ref.f64(x2), params, multiplier)
        flat, targets = logits.reshape(-1, logits.shape[-1]), y2.reshape(-1)  # (2b, T, C): pairs (i, t), (b + i, t)
        loss += rdrop_loss(flat, targets, alpha) / micro_batches
        grads: dict = {}
        dlogits = (rdrop_grad(flat, targets, alpha) / micro_batches).reshape(logits.shape)
        layer_backward(model, dlogits, cache, params, grads)
        for layer, named in grads.items():
            for name, g in named.items():
                grads_total.setdefault(layer, {}).setdefault(name, 0.0)
                grads_total[layer][name] = grads_total[layer][name] + g
    for layer, named in grads_total.items():
        for name, g in named.items():
            params[layer][name] = params[layer][name] - lr * g
    return loss


@pytest.mark.parametrize("seq", [(), (3,)], ids=["rows", "sequences"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_step_matches_the_numpy_step_after_two_steps(micro_batches, seq):
    model = make_model()
    params = params_of(model)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.5),
                        micro_batches=micro_batches, rdrop_alpha=1.5)
    for seed in (1, 2):
        x, y = step_batch(seed=seed, seq=seq)
        expected = reference_step(model, params, x, y, 1.5, micro_batches, 0.5)
        out = step(x, y)
        assert out.loss == pytest.approx(expected, rel=1e-5)
    for module in model.modules():
        for name in module._param_names:
            np.testing.assert_allclose(module._params[name].data, params[id(module)][name], rtol=1e-5, atol=1e-6)


def test_rdrop_changes_the_step_and_its_loss_is_ce_plus_kl():
    """With dropout the two passes differ: the R-Drop loss exceeds the passes' mean cross-entropy
    (the KL is >= 0) and alpha changes the update."""
    x, y = step_batch()
    weights = []
    for alpha in (0.0, 2.0):
        model = make_model()
        gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.5), rdrop_alpha=alpha)(x, y)
        weights.append(model[0].weight.data.copy())
    assert not np.array_equal(weights[0], weights[1])
    model = make_model()
    params = params_of(model)
    loss = reference_step(model, copy.deepcopy(params), x, y, 2.0, 1, 0.0)
    ce = reference_step(model, params, x, y, 0.0, 1, 0.0)
    assert loss > ce


def test_alpha_zero_is_exactly_the_plain_step():
    """rdrop_alpha=0 does not stack the batch: the plain step, bit for bit, and its plan."""
    x, y = step_batch()
    results = []
    for kwargs in ({}, {"rdrop_alpha": 0.0}):
        model = make_model()
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2), **kwargs)
        losses = [step(x, y).loss for _ in range(2)]
        results.append((losses, [p.data.copy() for p in model.parameters()], step.memory_plan((8, IN))))
    assert results[0][0] == results[1][0] and results[0][2] == results[1][2]
    assert all(np.array_equal(a, b) for a, b in zip(results[0][1], results[1][1]))


def test_memory_plan_counts_the_doubled_rows():
    model = make_model()
    rdrop = gt.TrainStep(model, nn.CrossEntropyLoss(), micro_batches=2, rdrop_alpha=1.0)
    plain = gt.TrainStep(make_model(), nn.CrossEntropyLoss(), micro_batches=2)
    assert rdrop.memory_plan((8, IN)) == plain.memory_plan((16, IN))
    assert rdrop.memory_plan((8, IN))["activations"] == 2 * plain.memory_plan((8, IN))["activations"]


@pytest.mark.sim
def test_sim_step_gives_the_cpu_bits():
    x, y = step_batch()
    weights = []
    for device in ("cpu", "sim"):
        model = make_model(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD.for_model(model, lr=0.5), micro_batches=2,
                            rdrop_alpha=0.7)
        losses = [step(x, y).loss for _ in range(2)]
        weights.append((losses, [np.asarray(p.data).copy() for p in model.parameters()]))
    assert weights[0][0] == weights[1][0]
    assert all(ref.same_bits(a, b) for a, b in zip(weights[0][1], weights[1][1]))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_step_is_close_to_f32(precision):
    x, y = step_batch()
    losses = []
    for prec in ("fp32", precision):
        model = make_model()
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.5),
                            precision=prec, rdrop_alpha=1.0)
        losses.append(step(x, y).loss)
    assert losses[1] == pytest.approx(losses[0], rel=3e-2)


# --- refusals ----------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha, error", [(-0.5, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                                          ("0.5", TypeError), (True, TypeError)])
def test_bad_alpha_is_refused(alpha, error):
    with pytest.raises(error, match="rdrop_alpha"):
        gt.TrainStep(make_model(), nn.CrossEntropyLoss(), rdrop_alpha=alpha)


def test_mse_and_sync_false_are_refused_and_no_dropout_warns():
    with pytest.raises(ValueError, match="rdrop_alpha.*CrossEntropyLoss only"):
        gt.TrainStep(make_model(), nn.MSELoss(), rdrop_alpha=1.0)
    with pytest.raises(ValueError, match="rdrop_alpha.*sync=True"):
        gt.TrainStep(make_model(), nn.CrossEntropyLoss(), rdrop_alpha=1.0, sync=False)
    with pytest.warns(UserWarning, match="rdrop_alpha.*no dropout"):
        gt.TrainStep(make_model(dropout=0.0), nn.CrossEntropyLoss(), rdrop_alpha=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gt.TrainStep(make_model(), nn.CrossEntropyLoss(), rdrop_alpha=1.0)


def test_the_c_step_checks_its_loss_spec():
    model = make_model()
    x, y = step_batch()
    with pytest.raises(ValueError, match="rdrop_alpha"):
        _C.StepConfig(("cross_entropy", 0.0, IGNORE, -1.0))
    with pytest.raises(ValueError, match="rdrop_alpha.*cross-entropy only"):
        _C.train_step(_C.StepConfig(("mse", 0.0, 0, 1.0)), model.compiled, x, np.zeros((8, CLASSES), np.float32))
    with pytest.raises(ValueError, match="rdrop_alpha.*stacked"):
        _C.train_step(_C.StepConfig(("cross_entropy", 0.0, IGNORE, 1.0)), model.compiled, x[:7], y[:7])


def test_bad_batches_are_refused_before_stacking():
    step = gt.TrainStep(make_model(), nn.CrossEntropyLoss(), micro_batches=3, rdrop_alpha=1.0)
    x, y = step_batch(rows=9)
    with pytest.raises(ValueError, match="y: expected 9 rows"):
        step(x, y[:8])
    step.micro_batches = 2  # 9 rows stacked would split into 2 micro-batches of wrongly paired rows
    with pytest.raises(ValueError, match="x: a batch of 9 rows does not split into 2"):
        step(x, y)

    class OnDevice:
        __cuda_array_interface__ = {}

    with pytest.raises(ValueError, match="x: rdrop_alpha stacks the batch"):
        step(OnDevice(), y)


def test_training_arguments_take_rdrop_alpha():
    assert gt.TrainingArguments(output_dir="/tmp/rdrop-args", rdrop_alpha=0.5).rdrop_alpha == 0.5
    with pytest.raises(ValueError, match="rdrop_alpha"):
        gt.TrainingArguments(output_dir="/tmp/rdrop-args", rdrop_alpha=-1.0)


def test_the_trainer_runs_rdrop_and_says_so(tmp_path):
    """TrainingArguments(rdrop_alpha) reaches the Trainer's TrainStep; the start-up block names it and
    the memory plan is that of the stacked micro-batches."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, IN)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-2,
                                save_strategy="no", disable_tqdm=True, seed=3, max_steps=4, logging_steps=2,
                                rdrop_alpha=0.5)
    trainer = gt.Trainer(make_model(), args, train_dataset=(x, y))
    assert trainer._step.rdrop_alpha == 0.5
    assert "R-Drop = alpha 0.5" in trainer._startup_block()
    assert trainer.memory_plan().micro_batch_shape == (16, IN)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert losses and all(math.isfinite(v) for v in losses)
