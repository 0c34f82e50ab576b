"""Every layer kind as the first, a middle and the last layer of a model, inside a Residual, and in
a Residual that is itself the first or last layer: a training step in fp32, bf16 and fp16, with and
without gradient checkpointing, whose loss and parameter gradients match the float64 NumPy
reference (tests/_mlp_reference.py, with the dropout masks of tests/_reference.py).

The first layer of a model gets no input gradient (the backward passes din = NULL to it); every
layer must cope with that, and so must a Residual or a nested Sequential that holds the first layer.
A crash here would kill pytest, so one test also runs every kind as the first layer in a child
process, where a segfault is reported as a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import _reference as ref
import gputrain as gt
from _mlp_reference import assert_gradients_match, cross_entropy, layer_backward, layer_forward, params_of
from gputrain import _C
from gputrain import _C_testing

nn = gt.nn

WIDTH = 6   # features of every activation (and the number of classes)
ROWS = 5    # rows of the batch
VOCAB = 7   # Embedding rows

KINDS = {
    "linear": lambda: nn.Linear(WIDTH, WIDTH),
    "linear_no_bias": lambda: nn.Linear(WIDTH, WIDTH, bias=False),
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
    "tanh": nn.Tanh,
    "silu": nn.SiLU,
    "dropout": lambda: nn.Dropout(0.3),
    "layernorm": lambda: nn.LayerNorm(WIDTH),
    "layernorm_no_bias": lambda: nn.LayerNorm(WIDTH, bias=False),
    "rmsnorm": lambda: nn.RMSNorm(WIDTH),
    "rmsnorm_no_weight": lambda: nn.RMSNorm(WIDTH, eps=1e-3, elementwise_affine=False),
    "flatten": nn.Flatten,
    "residual": lambda: nn.Residual(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU()),
    "sequential": lambda: nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.Tanh()),
    "embedding": lambda: nn.Embedding(VOCAB, WIDTH),
}


def lin():
    return nn.Linear(WIDTH, WIDTH)


POSITIONS = {
    "first": lambda layer: nn.Sequential(layer, lin()),
    "middle": lambda layer: nn.Sequential(lin(), layer, lin()),
    "last": lambda layer: nn.Sequential(lin(), layer),
    "in_residual": lambda layer: nn.Sequential(lin(), nn.Residual(layer, lin()), lin()),
    "residual_first": lambda layer: nn.Sequential(nn.Residual(layer, lin()), lin()),
    "residual_last": lambda layer: nn.Sequential(lin(), nn.Residual(lin(), layer)),
    "nested_first": lambda layer: nn.Sequential(nn.Sequential(layer, nn.Tanh()), lin()),
    # 3-D activations (N, 2, 3), for Flatten to have something to flatten after the first layer
    "middle_3d": lambda layer: nn.Sequential(nn.Linear(3, 3), layer, lin()),
    "last_3d": lambda layer: nn.Sequential(nn.Linear(3, 3), nn.Tanh(), layer),
}
THREE_D = ("first", "nested_first", "middle_3d", "last_3d")  # Flatten positions fed (N, 2, 3)

#: Embedding turns int64 ids into features: it can only come first.
CASES = [(kind, position) for kind in KINDS for position in POSITIONS
         if (kind != "embedding" or position in ("first", "nested_first"))
         and (kind == "flatten" or not position.endswith("_3d"))]

#: Relative error of the gradients against the float64 reference (norm of the difference over
#: the norm of the reference): one f32 rounding, or a few roundings of each half format.
GRAD_TOLERANCE = {"fp32": 2e-5, "fp16": 1e-2, "bf16": 6e-2}


def build(kind: str, position: str, seed: int = 0) -> nn.Module:
    gt.random.manual_seed(seed)
    return POSITIONS[position](KINDS[kind]())


def batch(kind: str, position: str, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, WIDTH, ROWS)
    if kind == "embedding":
        return rng.integers(0, VOCAB, ROWS), y
    if kind == "flatten" and position in THREE_D:  # (N, 2, 3) -> (N, 6)
        return rng.standard_normal((ROWS, 2, WIDTH // 2)).astype(np.float32), y
    return rng.standard_normal((ROWS, WIDTH)).astype(np.float32), y


def dropout_multipliers(model: nn.Module):
    """The reference's Dropout multipliers for the model's next training step (one micro-batch):
    layer ids in construction (pre-order) order, the model's seed and step, offset 0."""
    layer_ids = {id(m): k for k, m in enumerate(m for m in model.modules() if isinstance(m, nn.Dropout))}
    seed, step = model.compiled.seed, model.compiled.step
    scale = float(np.float32(1.0) / (np.float32(1.0) - np.float32(0.3)))

    def multiplier(layer: nn.Dropout, shape: tuple[int, ...]) -> np.ndarray:
        mask = ref.dropout_mask(int(np.prod(shape)), layer.p, seed, layer_ids[id(layer)], step, 0)
        return mask.reshape(shape) * scale

    return multiplier


def reference_step(model: nn.Module, x: np.ndarray, y: np.ndarray):
    """(loss, {(id(module), name): gradient}) of one training step in float64."""
    params = params_of(model)
    x64 = x if x.dtype == np.int64 else x.astype(np.float64)
    logits, cache = layer_forward(model, x64, params, dropout_multipliers(model))
    loss, dlogits = cross_entropy(logits, y)
    grads: dict = {}
    layer_backward(model, dlogits, cache, params, grads)
    return loss, {(layer, name): g for layer, named in grads.items() for name, g in named.items()}


def check_step(kind: str, position: str, precision: str, checkpointing: bool) -> None:
    model = build(kind, position)
    x, y = batch(kind, position)
    loss, expected = reference_step(model, x, y)
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision,
                       gradient_checkpointing=checkpointing)(x, y)
    tolerance = GRAD_TOLERANCE[precision]
    assert out.loss == pytest.approx(loss, rel=tolerance, abs=tolerance)
    checked = assert_gradients_match(model, lambda module, name: expected[(id(module), name)], tolerance)
    assert checked == len(expected) and checked == len(list(model.parameters()))


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind, position", CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_training_step_gradients_in_every_position(kind, position, precision, checkpointing):
    check_step(kind, position, precision, checkpointing)


def test_every_kind_first_trains_in_a_child_process():
    """The reproducer of the LayerNorm-first crash (exit 139) and its siblings, with AdamW and
    several steps, out of process so that a segfault fails this test instead of killing pytest."""
    code = textwrap.dedent(f"""
        import numpy as np
        import gputrain as gt
        from gputrain.nn import *
        from gputrain.optim import AdamW
        m = Sequential(LayerNorm(4), Linear(4, 3))
        out = gt.TrainStep(m, CrossEntropyLoss(), AdamW(m.parameters()))(np.ones((2, 4), np.float32), np.array([0, 1]))
        assert np.isfinite(out.loss)
        import test_layer_positions as t
        for kind in t.KINDS:
            for position in ("first", "residual_first", "nested_first"):
                if kind == "embedding" and position == "residual_first":
                    continue
                for precision in ("fp32", "bf16", "fp16"):
                    for checkpointing in (False, True):
                        model = t.build(kind, position)
                        x, y = t.batch(kind, position)
                        step = gt.TrainStep(model, CrossEntropyLoss(), AdamW(model.parameters()),
                                            precision=precision, gradient_checkpointing=checkpointing)
                        for _ in range(2):
                            assert np.isfinite(step(x, y).loss)
        print("ok")
    """)
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(gt.__file__)))  # installed or in place
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_dir, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            cwd=os.path.dirname(__file__), env=env)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.strip() == "ok"


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_layernorm_backward_op_without_din_gives_the_same_parameter_gradients(dt):
    rows, cols = 9, 13
    rng = np.random.default_rng(3)
    x = ref.to_dtype(rng.standard_normal((rows, cols)), dt)
    weight, bias = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    mean, rstd = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    raw = (lambda a: a.view(np.uint16)) if dt == "bf16" else (lambda a: a)
    _C.op_layernorm_forward(raw(np.empty_like(x)), mean, rstd, raw(x), weight, bias, 1e-5, dt)
    dout = ref.to_dtype(rng.standard_normal((rows, cols)), dt)
    grads = []
    for din in (raw(np.empty_like(x)), None):
        dweight, dbias = np.zeros(cols, np.float32), np.zeros(cols, np.float32)
        _C.op_layernorm_backward(din, dweight, dbias, raw(dout), raw(x), weight, mean, rstd, dt)
        grads.append((dweight, dbias))
    assert ref.same_bits(grads[0][0], grads[1][0]) and ref.same_bits(grads[0][1], grads[1][1])
    assert np.abs(grads[1][0]).sum() > 0


@pytest.mark.parametrize("op, arrays", [
    ("activation_backward", lambda x: [None, x, x]),
    ("dropout_backward", lambda x: [None, x]),
])
def test_backward_ops_accept_no_input_gradient(op, arrays):
    x = np.ones(8, np.float32)
    args = (8, 0, "f32") if op == "activation_backward" else (8, 0.5, 1, 0, 0, 0, "f32")
    assert _C_testing.run_op("cpu", op, arrays(x), args) is None


cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
def test_cuda_backward_ops_accept_no_input_gradient(dt):
    rows, cols = 33, 20
    rng = np.random.default_rng(4)
    x = ref.to_dtype(rng.standard_normal((rows, cols)), dt)
    weight, bias = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    mean, rstd = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    _C_testing.run_op("cpu", "layernorm_forward", [np.zeros_like(x), mean, rstd, x, weight, bias],
                      (rows, cols, 1e-5, dt))
    dout = ref.to_dtype(rng.standard_normal((rows, cols)), dt)
    with_din = [np.zeros_like(x), np.zeros(cols, np.float32), np.zeros(cols, np.float32), dout, x, weight, mean, rstd]
    without = [None] + [a.copy() for a in with_din[1:]]
    _C_testing.run_op("cuda", "layernorm_backward", with_din, (rows, cols, dt, False))
    _C_testing.run_op("cuda", "layernorm_backward", without, (rows, cols, dt, False))
    assert ref.same_bits(with_din[1], without[1]) and ref.same_bits(with_din[2], without[2])
    n = rows * cols
    assert _C_testing.run_op("cuda", "activation_backward", [None, dout, x], (n, 1, dt)) is None
    assert _C_testing.run_op("cuda", "dropout_backward", [None, dout], (n, 0.5, 1, 0, 0, 0, dt)) is None


@cuda
@pytest.mark.parametrize("kind", ["layernorm", "residual", "dropout", "relu", "flatten"])
def test_cuda_model_with_any_first_layer_trains_like_the_cpu(kind):
    x, y = batch(kind, "first")
    losses = []
    for device in ("cpu", "cuda"):
        model = build(kind, "first").to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model))
        losses.append([step(x, y).loss for _ in range(3)])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
