"""What users read when a call fails: the argument and the fix, without the C file:line (kept for
debug mode: gputrain.set_debug(True) or GPUTRAIN_DEBUG=1); and inputs of any memory layout are
accepted, as PyTorch accepts them (model(x), TrainStep(x, y), memory_plan, gputrain.functional)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import _reference as ref
import gputrain as gt
from gputrain import functional as F

nn = gt.nn
LOCATION = re.compile(r"\(\w+\.(c|cu|h):\d+\)")


def model_64():
    gt.random.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 10))


def message(call) -> str:
    with pytest.raises(Exception) as info:
        call()
    return str(info.value)


FAILURES = {
    "features": lambda: model_64()(np.ones((4, 65), np.float32)),
    "inner sizes": lambda: nn.Sequential(nn.Linear(8, 16), nn.Linear(12, 4))(np.ones((2, 8), np.float32)),
    "residual": lambda: nn.Sequential(nn.Residual(nn.Linear(8, 4)))(np.ones((2, 8), np.float32)),
    "embedding": lambda: nn.Sequential(nn.Linear(8, 4), nn.Embedding(3, 4))(np.ones((2, 8), np.float32)),
    "split": lambda: gt.TrainStep(model_64(), nn.CrossEntropyLoss(), micro_batches=3)(
        np.ones((4, 64), np.float32), np.zeros(4, np.int64)),
    "targets": lambda: gt.TrainStep(model_64(), nn.CrossEntropyLoss())(np.ones((4, 64), np.float32),
                                                                        np.zeros(5, np.int64)),
    "overflow": lambda: nn.Embedding(2**32, 2**30),
    "plan": lambda: gt.TrainStep(model_64(), nn.CrossEntropyLoss()).memory_plan((2**62, 64)),
    "label": lambda: gt.TrainStep(model_64(), nn.CrossEntropyLoss())(np.ones((2, 64), np.float32),
                                                                      np.array([0, 10])),
    "device": lambda: _C_model_on("cuda:7"),
}


def _C_model_on(device):
    return gt._C.Model([("linear", 2, 2, True)], 0, device=device)


@pytest.fixture
def debug_off():
    previous = gt.get_debug()
    gt.set_debug(False)
    yield
    gt.set_debug(previous)


@pytest.mark.parametrize("name", list(FAILURES))
def test_messages_carry_no_source_location(debug_off, name):
    text = message(FAILURES[name])
    assert text and not LOCATION.search(text), text


@pytest.mark.parametrize("name", ["features", "overflow", "plan", "split"])
def test_debug_mode_appends_the_source_location(debug_off, name):
    gt.set_debug(True)
    assert gt.get_debug()
    text = message(FAILURES[name])
    assert LOCATION.search(text), text
    gt.set_debug(False)
    assert not LOCATION.search(message(FAILURES[name]))
    with pytest.raises(TypeError, match="enabled must be a bool"):
        gt.set_debug(1)


def test_the_environment_variable_turns_debug_mode_on():
    code = ("import numpy as np, gputrain as gt\n"
            "try:\n    gt.nn.Linear(64, 2)(np.ones((1, 3), np.float32))\n"
            "except ValueError as e:\n    print(gt.get_debug(), e)\n")
    for value, expect in (("1", True), ("0", False), ("", False)):
        env = dict(os.environ, GPUTRAIN_DEBUG=value)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
        assert out.stdout.startswith(str(expect)), out
        assert bool(LOCATION.search(out.stdout)) == expect, out.stdout


@pytest.mark.parametrize("name, pattern", [
    ("features", r"^x: expected 64 features \(the size of the last dimension, read by layer '0' "
                 r"\(Linear\(64, 32\)\)\), got 65$"),
    ("inner sizes", r"^model: layer '1' \(Linear\(12, 4\)\) expects 12 input features, but the layer before "
                    r"it gives 16; make the sizes of consecutive layers agree$"),
    ("residual", r"^model: the block of layer '0' \(Residual\) changes the shape of its input \(last "
                 r"dimension 8 -> 4\); a Residual's block must keep its input's shape$"),
    ("embedding", r"^model: layer '1' \(Embedding\(3, 4\)\) reads int64 ids, .* must be the model's first layer$"),
    ("split", r"^x: a batch of 4 rows does not split into 3 equal micro-batches "
              r"\(micro_batches\); use a batch size divisible by it$"),
    ("targets", r"^y: expected 4 rows of targets to match x, got 5$"),
    ("overflow", r"^parameters of Embedding\(4294967296, 1073741824\): the size overflows .*; use smaller sizes$"),
])
def test_messages_name_the_argument_and_the_fix(debug_off, name, pattern):
    assert re.match(pattern, message(FAILURES[name])), message(FAILURES[name])


def test_out_of_memory_names_the_fix():
    model = model_64()
    model(np.ones((2, 64), np.float32))
    try:
        gt.set_memory_limit(gt.memory_stats("cpu")["reserved_bytes"], "cpu")
        text = message(lambda: model(np.ones((4096, 64), np.float32)))
    finally:
        gt.set_memory_limit(None, "cpu")
    assert "cpu out of memory" in text and "set_memory_limit" in text and "smaller batch" in text


# --- any memory layout ---------------------------------------------------------------------------


def layouts(array):
    """Non-contiguous views holding the same values as `array`."""
    wide = np.zeros(array.shape[:-1] + (array.shape[-1] * 2,), array.dtype)
    wide[..., ::2] = array
    fortran = np.asfortranarray(array)
    flipped = np.ascontiguousarray(array[::-1])[::-1]
    return {"strided": wide[..., ::2], "sliced": np.concatenate([array, array], -1)[..., :array.shape[-1]],
            "fortran": fortran, "reversed": flipped}


@pytest.mark.parametrize("layout", ["strided", "sliced", "fortran", "reversed"])
def test_model_and_step_accept_any_layout(layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    y = rng.integers(0, 10, 6)
    view = layouts(x)[layout]
    assert not view.flags.c_contiguous and np.array_equal(view, x)
    y_view = np.stack([y, y], 1)[:, 0]
    model, twin = model_64(), model_64()
    np.testing.assert_array_equal(model(view), twin(x))
    a = gt.TrainStep(model, nn.CrossEntropyLoss(), micro_batches=2)(view, y_view)
    b = gt.TrainStep(twin, nn.CrossEntropyLoss(), micro_batches=2)(x, y)
    assert (a.loss, a.skipped) == (b.loss, b.skipped)
    for p, q in zip(model.parameters(), twin.parameters()):
        np.testing.assert_array_equal(p.grad, q.grad)
    np.testing.assert_array_equal(view, x)  # the input is not modified
    step = gt.TrainStep(model, nn.CrossEntropyLoss())
    assert step.memory_plan(view) == step.memory_plan(x.shape)


def test_a_too_narrow_slice_says_how_many_features_are_expected():
    x = np.ones((8, 100), np.float32)
    step = gt.TrainStep(model_64(), nn.CrossEntropyLoss())
    for call in (lambda: step.model(x[:, :60]), lambda: step(x[:, :60], np.zeros(8, np.int64))):
        with pytest.raises(ValueError, match="^x: expected 64 features .* got 60$"):
            call()
    with pytest.raises(ValueError, match="^shape: expected 64 features .* got 60$"):
        step.memory_plan(x[:, :60])


def test_embedding_models_accept_strided_ids():
    gt.random.manual_seed(2)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 3))
    ids = np.arange(12, dtype=np.int64).reshape(6, 2) % 10
    np.testing.assert_array_equal(model(ids[:, 1]), model(np.ascontiguousarray(ids[:, 1])))
    np.testing.assert_array_equal(model(ids[:, 1].astype(np.int32)), model(np.ascontiguousarray(ids[:, 1])))


@pytest.mark.parametrize("batch_shape, error, match", [
    (64, TypeError, "batch_shape must be a tuple of ints"),
    ((8, 64.0), TypeError, r"batch_shape\[1\] must be an int"),
    ((8, -64), ValueError, r"batch_shape\[1\] must be >= 0"),
    ((7, 64), ValueError, r"batch_shape \(7, 64\) does not split into 2 equal micro-batches"),
])
def test_memory_plan_checks_its_argument(batch_shape, error, match):
    step = gt.TrainStep(model_64(), nn.CrossEntropyLoss(), micro_batches=2)
    with pytest.raises(error, match=match):
        step.memory_plan(batch_shape)
    assert step.memory_plan((np.int64(8), 64))["total"] > 0


def test_functional_ops_accept_any_layout():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    weight, bias = rng.standard_normal((7, 16)).astype(np.float32), rng.standard_normal(7).astype(np.float32)
    ln_w, ln_b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    targets = rng.integers(0, 7, 5)
    for name, view in layouts(x).items():
        assert ref.same_bits(F.gelu(view), F.gelu(x)), name
        assert ref.same_bits(F.linear(view, weight, bias), F.linear(x, weight, bias)), name
        assert ref.same_bits(F.linear(x, np.asfortranarray(weight), bias[::-1][::-1]), F.linear(x, weight, bias))
        for got, want in zip(F.layer_norm(view, ln_w, ln_b), F.layer_norm(x, ln_w, ln_b)):
            assert ref.same_bits(got, want), name
        logits = F.linear(x, weight, bias)
        (loss_a, grad_a), (loss_b, grad_b) = F.cross_entropy(np.asfortranarray(logits), targets), \
            F.cross_entropy(logits, targets)
        assert loss_a == loss_b and ref.same_bits(grad_a, grad_b)


def test_functional_in_place_buffers_must_be_contiguous():
    dout = np.ones((4, 6), np.float32)
    strided = np.zeros((6, 2), np.float32)[:, 0]
    with pytest.raises(ValueError, match="accumulate_into must be C-contiguous and aligned: it is updated in place"):
        F.bias_backward(dout, accumulate_into=strided)
