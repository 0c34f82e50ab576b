"""Objects behave like Python objects: models, optimizers, EMA, GradScaler, schedules, TrainStep
and DataLoader survive copy.deepcopy and pickle; copies are independent, follow each other
through the memo (an optimizer copied with its model trains the copy), and train bit-identically
to the original."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import gputrain as gt

nn = gt.nn


def deepcopy(obj):
    return copy.deepcopy(obj)


def pickled(obj):
    return pickle.loads(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


COPIERS = [pytest.param(deepcopy, id="deepcopy"), pytest.param(pickled, id="pickle")]


def batch(seed, rows=16):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 8)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)


def build(precision="fp32", ema=False, scaler=False, offload=0.0, checkpointing=False):
    """A model with dropout (its stream must be copied too) and everything that trains it."""
    gt.random.manual_seed(4)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Dropout(0.2), nn.LayerNorm(32), nn.Linear(32, 3))
    opt = gt.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, cpu_offload_fraction=offload)
    sched = gt.optim.get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=20)
    grad_scaler = gt.amp.GradScaler(init_scale=2.0**10) if scaler else None
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, precision=precision, max_grad_norm=1.0,
                        scaler=grad_scaler, scheduler=sched, gradient_checkpointing=checkpointing,
                        micro_batches=2)
    run = {"model": model, "opt": opt, "sched": sched, "step": step, "scaler": grad_scaler}
    if ema:
        run["ema"] = gt.optim.EMA(model, decay=0.9)
    return run


def train(run, seeds):
    losses = []
    for seed in seeds:
        out = run["step"](*batch(seed))
        if "ema" in run:
            run["ema"].update()
        losses.append(out.loss)
    return losses


def assert_same_training_state(a, b):
    for (name, x), (_, y) in zip(a["model"].state_dict().items(), b["model"].state_dict().items()):
        assert np.array_equal(x, y), name
    sa, sb = a["opt"].state_dict(), b["opt"].state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for index, entries in sa["state"].items():
        for key, value in entries.items():
            assert np.array_equal(value, sb["state"][index][key]), (index, key)
    assert a["opt"].step_count == b["opt"].step_count
    assert a["sched"].state_dict() == b["sched"].state_dict()
    assert a["model"].compiled.step == b["model"].compiled.step
    if "ema" in a:
        for x, y in zip(a["ema"].shadow, b["ema"].shadow):
            assert np.array_equal(x, y)


@pytest.mark.parametrize("copier", COPIERS)
@pytest.mark.parametrize("options", [{}, {"ema": True}, {"precision": "bf16", "checkpointing": True},
                                     {"precision": "fp16", "scaler": True}, {"offload": 0.5}],
                         ids=["fp32", "ema", "bf16-ckpt", "fp16-scaler", "offload"])
def test_a_copied_run_trains_bit_identically_and_independently(copier, options):
    original = build(**options)
    train(original, range(3))
    copied = copier(original)
    assert_same_training_state(original, copied)
    # The copy's optimizer, scheduler, EMA and step refer to the copy's model (the memo).
    params = list(copied["model"].parameters())
    assert {id(p) for p in copied["opt"]._params()} == {id(p) for p in params}
    assert not {id(p) for p in params} & {id(p) for p in original["model"].parameters()}
    assert copied["sched"].optimizer is copied["opt"] and copied["step"].model is copied["model"]
    assert copied["step"].optimizer is copied["opt"] and copied["step"].scheduler is copied["sched"]
    if "ema" in options:
        assert {id(p) for p in copied["ema"].params} == {id(p) for p in params}
    if options.get("scaler"):
        assert copied["step"].scaler is copied["scaler"]
        assert copied["scaler"].get_scale() == original["scaler"].get_scale()
    # Training the copy leaves the original as it was ...
    before = {k: v.copy() for k, v in original["model"].state_dict().items()}
    assert train(copied, range(3, 8)) == train(original, range(3, 8))  # ... and both train alike
    assert_same_training_state(original, copied)
    train(copied, [9])
    after = original["model"].state_dict()
    assert any(not np.array_equal(before[k], after[k]) for k in before)  # the original did train
    assert any(not np.array_equal(copied["model"].state_dict()[k], after[k]) for k in after)


@pytest.mark.parametrize("copier", COPIERS)
def test_the_compiled_settings_and_gradients_are_copied(copier):
    run = build(precision="bf16", checkpointing=True)
    train(run, range(2))
    model = run["model"]
    model.eval()
    copied = copier(model)
    assert copied.compiled.precision == "bf16" and copied.compiled.checkpointing
    assert copied.compiled.seed == model.compiled.seed and copied.compiled.step == model.compiled.step
    assert not copied.training and not copied.compiled.training
    x, _ = batch(7)
    assert np.array_equal(copied(x), model(x))
    for (name, p), (_, q) in zip(model.named_parameters(), copied.named_parameters()):
        assert p.grad is not None and np.array_equal(p.grad, q.grad), name
        assert q.grad is not p.grad
    model.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in copier(model).parameters())


@pytest.mark.parametrize("copier", COPIERS)
def test_an_optimizer_copied_before_its_model_follows_the_model_into_its_arenas(copier):
    run = build()
    train(run, range(2))
    copied = copier({"opt": run["opt"], "ema": gt.optim.EMA(run["model"]), "model": run["model"]})
    step = gt.TrainStep(copied["model"], nn.CrossEntropyLoss(), copied["opt"])
    reference = gt.TrainStep(run["model"], nn.CrossEntropyLoss(), run["opt"])
    assert step(*batch(5)).loss == reference(*batch(5)).loss
    for (name, x), (_, y) in zip(run["model"].state_dict().items(), copied["model"].state_dict().items()):
        assert np.array_equal(x, y), name
    copied["ema"].update()
    assert all(p._owner is copied["model"]._compiled for p in copied["ema"].params)


def test_an_optimizer_copied_alone_keeps_its_state_over_standalone_parameters():
    run = build()
    train(run, range(2))
    opt = copy.deepcopy(run["opt"])
    assert opt.step_count == run["opt"].step_count == 2
    assert all(p._owner is None for p in opt._params())
    saved, own = run["opt"].state_dict()["state"], opt.state_dict()["state"]
    assert all(np.array_equal(saved[i]["exp_avg"], own[i]["exp_avg"]) for i in saved)


@pytest.mark.parametrize("copier", COPIERS)
def test_a_submodule_copied_alone_is_a_model_of_its_own(copier):
    run = build()
    train(run, range(2))
    layer = run["model"].layers[0]
    copied = copier(layer)
    assert np.array_equal(copied.weight.data, layer.weight.data)
    x, _ = batch(3)
    np.testing.assert_allclose(copied(x), x @ layer.weight.data.T + layer.bias.data, rtol=1e-5, atol=1e-5)
    copied.weight.data[...] = 0.0
    assert np.any(layer.weight.data != 0.0)


def test_a_model_that_lost_a_layer_refuses_to_be_copied():
    gt.random.manual_seed(0)
    inner = nn.Sequential(nn.Linear(4, 4))
    outer = nn.Sequential(nn.Linear(4, 4))
    outer.compiled  # noqa: B018
    nn.Sequential(outer.layers[0], nn.ReLU()).compiled  # noqa: B018 - takes outer's layer
    with pytest.raises(RuntimeError, match="no longer holds all its parameters"):
        copy.deepcopy(outer)
    assert copy.deepcopy(inner).state_dict().keys() == inner.state_dict().keys()


@pytest.mark.parametrize("copier", COPIERS)
@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_copied_mid_epoch_yields_the_rest_of_the_epoch_and_the_next(copier, workers):
    x, y = batch(0, rows=50)
    loader = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=11, num_workers=workers)
    it = iter(loader)
    for _ in range(3):
        next(it)
    copied = copier(loader)
    assert copied.state_dict() == loader.state_dict()
    rest = [(a.copy(), b.copy()) for a, b in it] + [(a.copy(), b.copy()) for a, b in loader]
    again = [(a.copy(), b.copy()) for a, b in copied] + [(a.copy(), b.copy()) for a, b in copied]
    assert len(rest) == len(again) == 4 + 7
    for (a, b), (c, d) in zip(rest, again):
        assert np.array_equal(a, c) and np.array_equal(b, d)


@pytest.mark.parametrize("copier", COPIERS)
def test_a_grad_scaler_and_a_schedule_copy_their_counters(copier):
    run = build(precision="fp16", scaler=True)
    train(run, range(4))
    scaler, sched = copier((run["scaler"], run["sched"]))
    assert scaler.state_dict() == run["scaler"].state_dict()
    assert sched.state_dict() == run["sched"].state_dict()
    sched.step()
    assert sched.get_last_lr() != run["sched"].get_last_lr()


def test_a_shallow_copy_shares_the_parameters_and_leaves_the_original_working():
    run = build()
    model = run["model"]
    shallow = copy.copy(model)
    assert shallow is not model and shallow.layers is model.layers
    assert [id(p) for p in shallow.parameters()] == [id(p) for p in model.parameters()]
    train(run, range(2))  # the original still trains, and the copy sees it
    model.eval()
    x, _ = batch(1)
    assert np.array_equal(shallow(x), model(x))


@pytest.mark.parametrize("copier", COPIERS)
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_a_device_optimizer_copied_with_its_model_trains_the_copy_bit_identically(copier, kind):
    gt.random.manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 3)).to("sim")
    cls, options = ((gt.optim.AdamW, {"weight_decay": 0.1, "cpu_offload_fraction": 0.5}) if kind == "adamw"
                    else (gt.optim.SGD, {"momentum": 0.9}))
    opt = cls(model.parameters(), lr=1e-2, **options)
    loss = nn.CrossEntropyLoss()
    step = gt.TrainStep(model, loss, opt, max_grad_norm=1.0)
    for seed in range(3):
        step(*batch(seed))
    copied = copier({"opt": opt, "model": model})
    assert copied["opt"].step_count == 3
    copied_step = gt.TrainStep(copied["model"], loss, copied["opt"], max_grad_norm=1.0)
    assert copied["opt"]._core.model is copied["model"].compiled  # followed onto the copy's device arenas
    for seed in range(3, 6):
        assert copied_step(*batch(seed)).loss == step(*batch(seed)).loss
    a, b = opt.state_dict(), copied["opt"].state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i, state in a["state"].items():
        assert state.keys() == b["state"][i].keys() and all(np.array_equal(state[k], b["state"][i][k]) for k in state)
    for (name, x), (_, y) in zip(model.state_dict().items(), copied["model"].state_dict().items()):
        assert np.array_equal(x, y), name


@pytest.mark.parametrize("index, step, slots, error, match", [
    (2, 1, {}, IndexError, "parameter index 2 out of range"),
    (0, -1, {}, ValueError, "step must be >= 0"),
    (0, 1, {"exp_avg": np.zeros(3, np.float32)}, ValueError, "has 3 elements, expected 32"),
    (0, 1, {"momentum_buffer": np.zeros(32, np.float32)}, ValueError, "'momentum_buffer' is not kept"),
])
def test_model_optimizer_set_state_refuses_bad_input_and_changes_nothing(index, step, slots, error, match):
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4)).to("sim")
    opt = gt.optim.AdamW(model.parameters())
    gt.TrainStep(model, nn.CrossEntropyLoss(), opt)(*batch(0))
    before = [opt._core.get_state(i) for i in range(2)]
    with pytest.raises(error, match=match):
        opt._core.set_state(index, step, slots)
    for a, b in zip(before, [opt._core.get_state(i) for i in range(2)]):
        assert a["step"] == b["step"] and all(np.array_equal(a[k], b[k]) for k in a if k != "step")
