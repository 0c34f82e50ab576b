"""The C optimizer on a device (`_C_testing.optimizer_on_device`): on "cpu" it matches the Python
optimizers; on "cuda:0" (tests marked cuda) and on the simulated "sim:0" the AdamW/SGD kernels,
the offload pipeline (copy stream and events) and the sum of squares give the CPU's bits."""

from __future__ import annotations

import numpy as np
import pytest

from gputrain import _C
from gputrain import _C_testing
from gputrain.nn import Parameter
from gputrain.optim import SGD, AdamW

from _optim_reference import ulp_diff

SIZES = [7, 1000, 33, 70_001, 16]
STEPS = 6
DEVICES = [pytest.param("cuda:0", marks=pytest.mark.cuda), pytest.param("sim:0", marks=pytest.mark.sim)]

CASES = [
    ("adamw", "exact", {"lr": 1e-2, "weight_decay": 0.1}),
    ("adamw", "fast", {"lr": 1e-2, "betas": (0.8, 0.95), "weight_decay": 0.0}),
    ("adamw", "exact", {"lr": 1e-3, "amsgrad": True, "maximize": True, "weight_decay": 0.01}),
    ("sgd", "exact", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    ("sgd", "exact", {"lr": 0.05, "momentum": 0.5, "dampening": 0.2}),
]


def _data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    total = sum(SIZES)
    return rng.standard_normal(total).astype(np.float32), rng.standard_normal((STEPS, total)).astype(np.float32)


def _on(device: str, kind: str, numerics: str, hparams: dict, **options) -> np.ndarray:
    params, grads = _data()
    _C_testing.optimizer_on_device(kind, device, params, SIZES, grads, hparams, numerics=numerics, **options)
    return params


@pytest.mark.parametrize("kind, numerics, hparams", CASES)
def test_on_cpu_matches_the_python_optimizer(kind, numerics, hparams):
    flat, grads = _data()
    starts = np.cumsum([0] + SIZES)
    params = [Parameter(flat[a:b].copy()) for a, b in zip(starts[:-1], starts[1:])]
    opt = AdamW(params, numerics=numerics, **hparams) if kind == "adamw" else SGD(params, **hparams)
    for step in range(STEPS):
        for p, a, b in zip(params, starts[:-1], starts[1:]):
            p.grad = grads[step, a:b].copy()
        opt._pending_coef = 0.5
        opt.step()
    result = _on("cpu", kind, numerics, hparams, grad_coef=0.5, cpu_offload_fraction=0.4, offload_chunk_numel=999)
    assert ulp_diff(result, np.concatenate([p.data for p in params])) == 0


def test_bad_arguments():
    params, grads = _data()
    with pytest.raises(ValueError, match="kind"):
        _C_testing.optimizer_on_device("adam", "cpu", params, SIZES, grads, {})
    with pytest.raises(ValueError, match="sizes add up"):
        _C_testing.optimizer_on_device("sgd", "cpu", params, SIZES[:-1], grads, {})
    with pytest.raises(ValueError, match="shape"):
        _C_testing.optimizer_on_device("sgd", "cpu", params, SIZES, grads[:, :5], {})
    with pytest.raises(TypeError, match="params"):
        _C_testing.optimizer_on_device("sgd", "cpu", params.astype(np.float64), SIZES, grads, {})
    with pytest.raises(ValueError, match="device"):
        _C_testing.optimizer_on_device("sgd", "tpu", params, SIZES, grads, {})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, numerics, hparams", CASES)
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_device_gives_the_cpu_bits(device, kind, numerics, hparams, fraction):
    expected = _on("cpu", kind, numerics, hparams, grad_coef=0.7)
    result = _on(device, kind, numerics, hparams, grad_coef=0.7, cpu_offload_fraction=fraction,
                 offload_chunk_numel=4096)
    assert ulp_diff(result, expected) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 17, 65_537, 3_000_001])
def test_device_sum_of_squares_gives_the_cpu_bits(device, n):
    x = (np.random.default_rng(n).standard_normal(n) * 5).astype(np.float32)
    assert _C_testing.grad_sumsq_on_device(x, device) == _C_testing.grad_sumsq_on_device(x, "cpu") == _C.grad_sumsq(x)
