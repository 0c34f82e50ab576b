"""The training step's update on the model's device: AdamW/SGD over a device model's parameters
(a _C.ModelOptimizer over its arenas), the loss scaler, clipping and the gradient norm on
device models. The sim tests compare with the CPU bit for bit; the CUDA ones compare a CUDA
model's training with the same model's on the CPU (not yet run on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C

nn = gt.nn
cuda = pytest.mark.cuda
LOSS = ("cross_entropy", 0.0, -100)


def make_model(seed=3):
    gt.random.manual_seed(seed)
    block = nn.Residual(nn.LayerNorm(24), nn.Linear(24, 48), nn.GELU(), nn.Linear(48, 24))
    return nn.Sequential(nn.Linear(12, 24), nn.SiLU(), block, nn.LayerNorm(24), nn.Linear(24, 7))


def batch(step, rows=32):
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((rows, 12)).astype(np.float32), rng.integers(0, 7, rows).astype(np.int64)


def train(model, optimizer, steps, overflow_at=None, **options):
    """Runs `steps` fused steps; step `overflow_at` gets inputs beyond the fp16 range."""
    step = gt.TrainStep(model, nn.CrossEntropyLoss(label_smoothing=0.1), optimizer, **options)
    outputs = []
    for i in range(steps):
        x, y = batch(i)
        outputs.append(step(x * np.float32(1e6) if i == overflow_at else x, y))
    return outputs


# ------------------------------------------------------------------ for_model: the constructor


def test_for_model_is_the_constructor_over_the_model_parameters():
    model = make_model().to("sim")
    optimizer = gt.optim.AdamW.for_model(model, lr=3e-3, cpu_offload_fraction=0.5)
    assert type(optimizer) is gt.optim.AdamW and optimizer.cpu_offload_fraction == 0.5
    assert optimizer.param_groups[0]["params"] == list(model.parameters())
    with pytest.raises(TypeError, match="gputrain.nn.Module"):
        gt.optim.AdamW.for_model(model.compiled)


def test_sgd_on_sim_with_an_overflow_skips_like_the_cpu():
    reference, model = make_model(), make_model().to("sim")
    hyper = {"lr": 0.05, "momentum": 0.9, "nesterov": True}
    scalers = [gt.amp.GradScaler(init_scale=2.0**10, growth_interval=2) for _ in range(2)]
    expected = train(reference, gt.optim.SGD(reference.parameters(), **hyper), 7, overflow_at=3,
                     precision="fp16", scaler=scalers[0])
    got = train(model, gt.optim.SGD.for_model(model, **hyper), 7, overflow_at=3, precision="fp16",
                scaler=scalers[1])
    assert [o.skipped for o in got] == [i == 3 for i in range(7)] == [o.skipped for o in expected]
    assert scalers[1].get_scale() == scalers[0].get_scale() and scalers[1].skipped_steps == 1
    np.testing.assert_array_equal(model.compiled.read_parameters(), reference.compiled.read_parameters())


def test_a_device_optimizer_pushes_the_group_hyperparameters_before_each_step():
    model = make_model().to("sim")
    optimizer = gt.optim.SGD(model.parameters(), lr=0.1)
    optimizer.param_groups[0]["lr"] = 0.0
    before = model.compiled.read_parameters()
    train(model, optimizer, 2)
    np.testing.assert_array_equal(model.compiled.read_parameters(), before)
    optimizer.param_groups[0]["lr"] = -1.0
    with pytest.raises(ValueError, match="Invalid learning rate"):
        train(model, optimizer, 1)


def test_the_model_optimizer_core_refuses_bad_arguments():
    model = make_model().to("sim")
    args = ([0], [0], [{}], [True])
    with pytest.raises(ValueError, match="kind"):
        _C.ModelOptimizer("adam", model.compiled, *args)
    with pytest.raises(TypeError, match="Model"):
        _C.ModelOptimizer("sgd", np.zeros(3, np.float32), *args)
    with pytest.raises(IndexError, match=r"indices\[0\] = 99 is out of range"):
        _C.ModelOptimizer("sgd", model.compiled, [99], [0], [{}], [True])
    with pytest.raises(IndexError, match=r"groups\[0\] = 1 is out of range"):
        _C.ModelOptimizer("sgd", model.compiled, [0], [1], [{}], [True])
    with pytest.raises(ValueError, match="one entry per parameter"):
        _C.ModelOptimizer("sgd", model.compiled, [0, 1], [0], [{}], [True])
    with pytest.raises(ValueError, match="cpu_offload_fraction"):
        _C.ModelOptimizer("adamw", model.compiled, *args, cpu_offload_fraction=1.5)
    with pytest.raises(IndexError, match="group 1"):
        _C.ModelOptimizer("sgd", model.compiled, *args).set_hparams(1, {})
    with pytest.raises(IndexError, match="out of range"):
        _C.ModelOptimizer("sgd", model.compiled, *args).get_state(1)


def test_an_optimizer_for_another_model_is_refused():
    model, other = make_model().to("sim"), make_model().to("sim")
    x, y = batch(0)
    for optimizer in (gt.optim.AdamW(other.parameters()), _C.ModelOptimizer("adamw", other.compiled, [0], [0],
                                                                            [{}], [True])):
        with pytest.raises(ValueError, match="another model"):
            _C.train_step(_C.StepConfig(LOSS, optimizer=optimizer), model.compiled, x, y)
    np.testing.assert_array_equal(model.compiled.read_parameters(), make_model().compiled.read_parameters())


# ------------------------------------------------------------------ CUDA: the update on the device


def run_both(steps, precision, overflow_at=None, **hyper):
    """The same training on the CPU and on CUDA: (outputs, parameters, scaler) for each."""
    results = []
    for device in ("cpu", "cuda"):
        model = make_model().to(device) if device == "cuda" else make_model()
        scaler = gt.amp.GradScaler(init_scale=2.0**12, growth_interval=3) if precision == "fp16" else None
        tf32 = False if device == "cuda" else None  # fp32 GEMMs in fp32, as on the CPU
        outputs = train(model, gt.optim.AdamW.for_model(model, **hyper), steps, overflow_at=overflow_at,
                        precision=precision, max_grad_norm=0.5, scaler=scaler, tf32=tf32)
        results.append((outputs, model.compiled.read_parameters(), scaler))
    return results


@cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_cuda_adamw_for_model_with_clipping_matches_the_cpu(precision):
    (cpu_out, cpu_params, cpu_scaler), (gpu_out, gpu_params, gpu_scaler) = run_both(8, precision, lr=3e-3)
    tolerance = 1e-4 if precision == "fp32" else 2e-2
    np.testing.assert_allclose([o.loss for o in gpu_out], [o.loss for o in cpu_out], rtol=tolerance)
    np.testing.assert_allclose([o.grad_norm for o in gpu_out], [o.grad_norm for o in cpu_out], rtol=tolerance)
    initial = make_model().compiled.read_parameters()
    moved_cpu, moved_gpu = cpu_params - initial, gpu_params - initial
    moved_tolerance = 1e-3 if precision == "fp32" else 5e-2  # AdamW's update follows gradient signs
    assert np.linalg.norm(moved_gpu - moved_cpu) <= moved_tolerance * np.linalg.norm(moved_cpu)
    assert not any(o.skipped for o in gpu_out)
    if precision == "fp16":
        assert gpu_scaler.get_scale() == cpu_scaler.get_scale() == 2.0**14


@cuda
def test_cuda_injected_overflow_is_skipped_and_the_scale_follows_the_cpu():
    (cpu_out, _, cpu_scaler), (gpu_out, gpu_params, gpu_scaler) = run_both(6, "fp16", overflow_at=2, lr=3e-3)
    assert [o.skipped for o in gpu_out] == [i == 2 for i in range(6)] == [o.skipped for o in cpu_out]
    assert np.isnan(gpu_out[2].grad_norm) and np.isfinite(gpu_params).all()
    assert gpu_scaler.get_scale() == cpu_scaler.get_scale() and gpu_scaler.skipped_steps == 1
    assert [o.scale for o in gpu_out] == [o.scale for o in cpu_out]


@cuda
def test_cuda_step_refuses_a_host_optimizer_naming_both_devices():
    model, host = make_model().to("cuda"), make_model()
    x, y = batch(0)
    for optimizer in (gt.optim.SGD(host.parameters(), lr=0.1), gt.optim.AdamW.for_model(host)):
        with pytest.raises(ValueError, match="cuda:0.*cpu|another model"):
            _C.train_step(_C.StepConfig(LOSS, optimizer=optimizer), model.compiled, x, y)


@cuda
def test_cuda_step_reports_the_norm_without_an_optimizer():
    cpu_model, gpu_model = make_model(), make_model().to("cuda")
    x, y = batch(0)
    config = _C.StepConfig(LOSS, want_grad_norm=True)
    norms = [_C.train_step(config, m.compiled, x, y)["grad_norm"] for m in (cpu_model, gpu_model)]
    np.testing.assert_allclose(norms[1], norms[0], rtol=1e-5)
    expected = float(np.sqrt(np.sum(gpu_model.compiled.read_gradients().astype(np.float64) ** 2)))
    np.testing.assert_allclose(norms[1], expected, rtol=1e-12)
