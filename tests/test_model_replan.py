"""Re-plans that fail leave the model exactly as it was: a precision switch, a new batch shape, a
bad input shape and a move to another device build their new arenas first and swap them in only
on success (csrc/nn/model.c), so an out-of-memory error in the middle changes no precision, frees
no arena the model still points into, and keeps the current activation plan.

Each test lowers the CPU memory limit below what is already reserved, so that any new allocation
is refused; the limit is removed afterwards."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gputrain as gt
from gputrain.nn import module as nn_module

nn = gt.nn
OOM = gt.OutOfMemoryError
PRECISIONS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


@pytest.fixture
def memory_limit():
    yield lambda limit: gt.set_memory_limit(limit, "cpu")
    gt.set_memory_limit(None, "cpu")


def reserved() -> int:
    """The pool's reserved bytes of live models: earlier tests' models not yet collected would count,
    and be freed inside the call that should run out of memory."""
    gc.collect()
    return gt.memory_stats("cpu")["reserved_bytes"]


def make_model(seed=0):
    gt.random.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Residual(nn.LayerNorm(256), nn.Linear(256, 256)),
                         nn.Linear(256, 10))


def batch(rows=32, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, 64)).astype(np.float32), rng.integers(0, 10, rows)


def snapshot(model, x):
    compiled = model.compiled
    return {"precision": compiled.precision, "plan": compiled.current_plan, "out": model(x),
            "state": model.state_dict(), "checkpointing": compiled.checkpointing}


def assert_unchanged(model, x, before):
    after = snapshot(model, x)
    assert after["precision"] == before["precision"]
    assert after["plan"] == before["plan"]
    assert after["checkpointing"] == before["checkpointing"]
    np.testing.assert_array_equal(after["out"], before["out"])
    for name, value in before["state"].items():
        np.testing.assert_array_equal(after["state"][name], value)


@pytest.mark.parametrize("first, second", [("bf16", "fp16"), ("fp32", "bf16"), ("fp32", "fp16"),
                                           ("fp16", "bf16")])
def test_a_precision_switch_out_of_memory_leaves_the_model_as_it_was(memory_limit, first, second):
    model, twin = make_model(), make_model()
    x, y = batch()
    steps = [gt.TrainStep(m, nn.CrossEntropyLoss(), gt.optim.AdamW(m.parameters(), lr=1e-3), precision=first)
             for m in (model, twin)]
    for step in steps:
        step(x, y)
    before = snapshot(model, x)
    held = reserved()
    memory_limit(int(0.5 * held))
    with pytest.raises(OOM, match="cpu out of memory"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), steps[0].optimizer, precision=second)
    assert reserved() == held
    assert_unchanged(model, x, before)  # the forward reads the old half copy: still allocated
    memory_limit(None)
    for _ in range(2):  # training goes on as if the switch had never been asked for
        a, b = steps[0](x, y), steps[1](x, y)
        assert a.loss == b.loss
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(p.data, q.data)
        assert np.all(np.isfinite(p.data))


def test_a_new_batch_shape_out_of_memory_keeps_the_current_plan(memory_limit):
    model = make_model()
    step = gt.TrainStep(model, nn.CrossEntropyLoss())
    x, y = batch(32)
    step(x, y)
    before = snapshot(model, x)
    memory_limit(int(0.5 * reserved()))
    big_x, big_y = batch(512)
    with pytest.raises(OOM):
        step(big_x, big_y)
    with pytest.raises(OOM):
        model(big_x)
    assert_unchanged(model, x, before)
    step(x, y)  # the old shape needs no new memory


@pytest.mark.parametrize("bad", [np.ones((32, 63), np.float32), np.ones((32, 2, 64), np.float32)[:, :, :5]])
def test_a_bad_input_shape_keeps_the_current_plan(memory_limit, bad):
    model = make_model()
    x, y = batch(32)
    gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
    before = snapshot(model, x)
    memory_limit(int(0.5 * reserved()))
    with pytest.raises(ValueError, match="x: expected 64 features"):
        model(bad)
    with pytest.raises(ValueError, match="x: expected 64 features"):
        gt.TrainStep(model, nn.CrossEntropyLoss())(bad, y)
    assert_unchanged(model, x, before)


def test_a_new_shape_that_fits_only_without_the_old_arena_is_still_planned(memory_limit):
    """Under a limit that holds one plan but not two at once (the smaller last batch of an epoch,
    or an auto batch size), the re-plan frees the old arena first and succeeds."""
    model = make_model()
    step = gt.TrainStep(model, nn.CrossEntropyLoss())
    x64, y64 = batch(64)
    step(x64, y64)
    plan64 = model.compiled.current_plan
    memory_limit(reserved())
    x16, y16 = batch(16)
    assert np.isfinite(step(x16, y16).loss)
    assert model.compiled.current_plan["activations"] < plan64["activations"]
    step(x64, y64)  # and back
    assert model.compiled.current_plan == plan64
    model.compiled.checkpointing = True
    step(x64, y64)
    model.compiled.checkpointing = False
    step(x64, y64)


@pytest.fixture
def simulated_device(monkeypatch):
    """Models compiled for device 'sim' are CPU models reached only through host copies, as a
    CUDA model is (the Python device path of .to())."""
    original = nn_module._Compiled.__init__

    def compile_for(self, spec, seed, device, precision="f32", plan_only=False):
        original(self, spec, seed, "cpu" if device == "sim:0" else device, precision, plan_only=plan_only)
        if device == "sim:0":  # Module.to passes the canonical name
            self.device, self.on_host, self.params_flat, self.grads_flat = "sim:0", False, None, None

    monkeypatch.setattr(nn_module._Compiled, "__init__", compile_for)


def test_a_move_out_of_memory_leaves_the_model_where_it_was(memory_limit, simulated_device):
    model = make_model()
    x, y = batch(32)
    gt.TrainStep(model, nn.CrossEntropyLoss(), precision="bf16")(x, y)
    before = snapshot(model, x)
    params = model.num_parameters() * 4
    memory_limit(reserved() + 2 * params + 1024)  # room for the f32 arenas, not the bf16 copy too
    with pytest.raises(OOM):
        model.to("sim")
    assert model._compiled.device == "cpu"
    assert_unchanged(model, x, before)
    memory_limit(None)
    model.to("sim")
    assert model._compiled.device == "sim:0" and model.compiled.precision == "bf16"
    np.testing.assert_array_equal(model(x), before["out"])
