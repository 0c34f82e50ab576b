"""The device code path on the simulated device "sim": a model moved with .to("sim") trains with
TrainStep, the for_model optimizers, GradScaler, clipping and gradient accumulation through the
same C code a model on cuda:N runs (csrc/train/step_device.c, the device interface's kernels and
copies), with the CPU op table doing the arithmetic on the sim streams' worker threads. Every
result must be bit-identical to the same run on the CPU."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C

nn = gt.nn
pytestmark = pytest.mark.sim
LOSS = ("cross_entropy", 0.0, -100)


def make_model(seed=3, dropout=0.0):
    gt.random.manual_seed(seed)
    block = nn.Residual(nn.LayerNorm(24), nn.Linear(24, 48), nn.GELU(), nn.Dropout(dropout), nn.Linear(48, 24))
    return nn.Sequential(nn.Linear(12, 24), nn.SiLU(), block, nn.LayerNorm(24), nn.Linear(24, 7))


def batch(step, rows=32):
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((rows, 12)).astype(np.float32), rng.integers(0, 7, rows).astype(np.int64)


def run(device, steps=6, precision="fp32", kind="adamw", overflow_at=None, dropout=0.0, **options):
    """Trains on `device`; step `overflow_at` gets inputs beyond the fp16 range. Returns the step
    results, the final parameters and the scaler."""
    model = make_model(dropout=dropout).to(device)
    if kind == "adamw":
        optimizer = gt.optim.AdamW.for_model(model, lr=3e-3, betas=(0.8, 0.95), weight_decay=0.05)
    else:
        optimizer = gt.optim.SGD.for_model(model, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    scaler = gt.amp.GradScaler(init_scale=2.0**12, growth_interval=2) if precision == "fp16" else None
    step = gt.TrainStep(model, nn.CrossEntropyLoss(label_smoothing=0.1), optimizer, precision=precision,
                        scaler=scaler, **options)
    outputs = []
    for i in range(steps):
        x, y = batch(i)
        outputs.append(step(x * np.float32(1e6) if i == overflow_at else x, y))
    return outputs, model.compiled.read_parameters(), scaler


def assert_same_run(cpu, sim):
    (cpu_out, cpu_params, cpu_scaler), (sim_out, sim_params, sim_scaler) = cpu, sim
    for field in ("loss", "grad_norm", "skipped", "scale"):  # NaN (a norm not computed) equals NaN
        np.testing.assert_array_equal([getattr(o, field) for o in sim_out], [getattr(o, field) for o in cpu_out],
                                      err_msg=field)
    np.testing.assert_array_equal(sim_params, cpu_params)
    if cpu_scaler is not None:
        assert sim_scaler.get_scale() == cpu_scaler.get_scale()
        assert sim_scaler.skipped_steps == cpu_scaler.skipped_steps


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_training_on_sim_is_bit_identical_to_the_cpu(precision, kind):
    options = dict(precision=precision, kind=kind, max_grad_norm=0.5, micro_batches=2)
    cpu, sim = run("cpu", **options), run("sim", **options)
    assert_same_run(cpu, sim)
    assert not np.array_equal(sim[1], make_model().compiled.read_parameters())  # it trained


def test_an_overflow_is_skipped_on_sim_as_on_the_cpu():
    options = dict(steps=7, precision="fp16", overflow_at=3, max_grad_norm=1.0)
    cpu, sim = run("cpu", **options), run("sim", **options)
    assert [o.skipped for o in sim[0]] == [i == 3 for i in range(7)]
    assert np.isnan(sim[0][3].grad_norm) and np.isfinite(sim[1]).all()
    assert_same_run(cpu, sim)


def test_dropout_masks_on_sim_match_the_cpu():
    assert_same_run(run("cpu", 4, dropout=0.25), run("sim", 4, dropout=0.25))


def test_a_sim_model_keeps_its_memory_in_the_sim_pool():
    gc.collect()  # earlier tests' objects in reference cycles must not be freed while this one measures
    before_sim, before_cpu = gt.memory_stats("sim:0")["allocated_bytes"], gt.memory_stats("cpu")["allocated_bytes"]
    model = make_model().to("sim")
    x, y = batch(0)
    _C.train_step(_C.StepConfig(LOSS, want_grad_norm=True), model.compiled, x, y)
    assert gt.memory_stats("sim:0")["allocated_bytes"] > before_sim
    assert gt.memory_stats("cpu")["allocated_bytes"] == before_cpu
    assert model.compiled.device == "sim:0"


def test_forward_gradients_and_norm_without_an_optimizer_match_the_cpu():
    cpu_model, sim_model = make_model(), make_model().to("sim:1")
    x, y = batch(0)
    config = _C.StepConfig(LOSS, want_grad_norm=True)
    results = [_C.train_step(config, m.compiled, x, y) for m in (cpu_model, sim_model)]
    assert results[1] == results[0]
    np.testing.assert_array_equal(sim_model.compiled.read_gradients(), cpu_model.compiled.read_gradients())
    np.testing.assert_array_equal(sim_model.eval()(x), cpu_model.eval()(x))


def test_sim_devices_are_named_and_checked():
    assert gt.nn.Sequential(nn.Linear(2, 2)).to("sim").compiled.device == "sim:0"
    with pytest.raises(ValueError, match="'sim:7' does not exist"):
        make_model().to("sim:7")
    with pytest.raises(ValueError, match="sim:x"):
        gt.memory_stats("sim:x")


def test_a_host_optimizer_is_refused_for_a_sim_model():
    model, host = make_model().to("sim"), make_model()
    x, y = batch(0)
    before = model.compiled.read_parameters()
    with pytest.raises(ValueError, match="sim:0 but this optimizer's parameters are host"):
        _C.train_step(_C.StepConfig(LOSS, optimizer=gt.optim.SGD(host.parameters(), lr=0.1)), model.compiled, x, y)
    np.testing.assert_array_equal(model.compiled.read_parameters(), before)


def test_a_sim_buffer_is_not_viewed_by_numpy():
    buffer = _C.Buffer(64, device="sim")
    assert buffer.device == "sim:0"
    with pytest.raises(TypeError, match="cannot be viewed as a NumPy array"):
        buffer.numpy()


def test_a_sim_model_state_round_trips_through_the_cpu():
    model = make_model()
    step = gt.TrainStep(model.to("sim"), nn.CrossEntropyLoss(), gt.optim.SGD.for_model(model, lr=0.1))
    step(*batch(0))
    trained = model.compiled.read_parameters()
    other = make_model(seed=9)
    other.load_state_dict(model.state_dict())
    np.testing.assert_array_equal(other.compiled.read_parameters(), trained)
    np.testing.assert_array_equal(model.to("cpu").compiled.read_parameters(), trained)
    np.testing.assert_array_equal(model.to("sim:1").compiled.read_parameters(), trained)


def test_the_trainer_on_sim_matches_the_cpu(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((96, 12)).astype(np.float32), rng.integers(0, 7, 96)
    results = []
    for device in ("cpu", "sim"):
        model = make_model()
        args = gt.TrainingArguments(output_dir=str(tmp_path / device), num_train_epochs=2,
                                    per_device_train_batch_size=16, gradient_accumulation_steps=2,
                                    learning_rate=1e-2, fp16=True, max_grad_norm=1.0, device=device,
                                    save_strategy="no", dataloader_pin_memory=False, seed=3)
        output = gt.Trainer(model, args, train_dataset=(x, y)).train()
        results.append((output.training_loss, output.global_step, model.compiled.read_parameters()))
    assert results[1][:2] == results[0][:2] and results[0][1] == 6
    np.testing.assert_array_equal(results[1][2], results[0][2])


def test_training_arguments_name_the_sim_device():
    assert gt.TrainingArguments(output_dir="unused", device="sim:1").device == "sim:1"
    with pytest.raises(ValueError, match="'sim' or 'sim:N', got 'tpu'"):
        gt.TrainingArguments(output_dir="unused", device="tpu")


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_an_error_in_a_sim_stream_worker_reaches_the_caller(device):
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3)).to(device)
    with pytest.raises(IndexError, match=r"ids\[1\] = 12 is out of range \[0, 10\)"):
        model(np.array([[1, 12]], dtype=np.int64))
    gt.random.manual_seed(0)
    expected = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))(np.array([[1, 2]], dtype=np.int64))
    np.testing.assert_array_equal(model(np.array([[1, 2]], dtype=np.int64)), expected)  # the stream goes on


def test_a_step_on_sim_allocates_nothing_after_the_first():
    model = make_model().to("sim")
    scaler = gt.amp.GradScaler(init_scale=2.0**12)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-3), precision="fp16",
                        scaler=scaler, max_grad_norm=1.0, micro_batches=2)
    step(*batch(0))  # plans and allocates the activations
    before = {kind: gt.memory_stats(kind)["num_allocs"] for kind in ("sim:0", "cpu", "pinned")}
    for i in range(1, 4):
        step(*batch(i))
    assert {kind: gt.memory_stats(kind)["num_allocs"] for kind in before} == before


def test_memory_budgets_name_the_sim_pool():
    from gputrain.testing import assert_memory_within, memory_plan

    model = make_model().to("sim")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD.for_model(model, lr=0.1))
    step(*batch(0))
    total = memory_plan(step, (32, 12))["sim:0"]["total"]
    assert_memory_within(step, {"sim:0": total, "cpu": 0})
    with pytest.raises(AssertionError, match="sim:0 planned"):
        assert_memory_within(step, {"sim:0": total - 1})
