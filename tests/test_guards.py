"""Guards: the loss-spike guard (SpikeGuard in TrainStep, LossSpikeCallback in the Trainer) skips an
outlier's update in C, leaving weights, optimizer state and scaler exactly as they were; the GPU
health callback warns, pauses or stops on an injected NVML's temperatures and logs its readings."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import types
from collections import deque, namedtuple

import numpy as np
import pytest

import gputrain as gt

nn = gt.nn


# --- SpikeGuard in TrainStep ---


def batch(seed, rows=16, scale=1.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 8)).astype(np.float32)
    return (x * scale).astype(np.float32), (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)


def run(precision="fp32", guard=None, scaler=False):
    gt.random.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 3))
    opt = gt.optim.AdamW(model.parameters(), lr=1e-2)
    sched = gt.optim.get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=100)
    grad_scaler = gt.amp.GradScaler(init_scale=256.0, growth_interval=1) if scaler else None
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, precision=precision, scheduler=sched,
                        scaler=grad_scaler, spike_guard=guard)
    return model, opt, sched, grad_scaler, step


def snapshot(model, opt, sched, scaler):
    state = opt.state_dict()["state"]
    return ({k: v.copy() for k, v in model.state_dict().items()},
            {i: {k: np.array(v) for k, v in s.items()} for i, s in state.items()}, opt.step_count,
            sched.get_last_lr(), None if scaler is None else scaler.state_dict())


def assert_same(a, b):
    weights_a, state_a, count_a, lr_a, scaler_a = a
    weights_b, state_b, count_b, lr_b, scaler_b = b
    assert all(np.array_equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert all(np.array_equal(state_a[i][k], state_b[i][k]) for i in state_a for k in state_a[i])
    assert (count_a, lr_a, scaler_a) == (count_b, lr_b, scaler_b)


def reference_z(values, value):
    """llm.c's z-score of `value` against a window of earlier values (population std)."""
    window = np.array(values, dtype=np.float64)
    return (value - window.mean()) / window.std()


@pytest.mark.parametrize("precision, scaler", [("fp32", False), ("bf16", False), ("fp16", True)])
def test_an_outlier_update_is_skipped_and_changes_nothing(precision, scaler):
    guard = gt.SpikeGuard(window=6, z_loss=4.0, z_grad_norm=4.0)
    model, opt, sched, grad_scaler, step = run(precision, guard, scaler)
    for seed in range(6):
        assert not step(*batch(seed)).outlier
    before = snapshot(model, opt, sched, grad_scaler)
    dropout_step = model.compiled.step
    out = step(*batch(99, scale=300.0))  # a spike: inputs 300x larger
    assert out.outlier and out.skipped and guard.num_skipped == 1
    assert_same(before, snapshot(model, opt, sched, grad_scaler))
    assert model.compiled.step == dropout_step + 1  # the step happened; only its update did not
    assert guard.last_z[0] > 4.0 or guard.last_z[1] > 4.0
    # The run goes on, and the spike's values are in the window (llm.c's rule).
    assert not step(*batch(7)).outlier
    assert opt.step_count == before[2] + 1


def test_without_a_guard_the_same_spike_is_applied():
    model, opt, sched, grad_scaler, step = run()
    for seed in range(6):
        step(*batch(seed))
    before = snapshot(model, opt, sched, grad_scaler)
    out = step(*batch(99, scale=300.0))
    assert not out.outlier and not out.skipped
    assert opt.step_count == before[2] + 1


def test_the_limits_are_the_z_score_over_the_window_of_earlier_steps():
    guard = gt.SpikeGuard(window=4, z_loss=2.0, z_grad_norm=3.0)
    model, opt, sched, grad_scaler, step = run(guard=guard)
    losses, norms = [], []
    for seed in range(8):
        limits = guard.limits()
        out = step(*batch(seed))
        if len(losses) < 4:
            assert limits == (sys.float_info.max, sys.float_info.max)
            assert math.isnan(guard.last_z[0])
        else:
            window_l, window_n = np.array(losses[-4:]), np.array(norms[-4:])
            assert limits[0] == pytest.approx(window_l.mean() + 2.0 * window_l.std(), rel=1e-12)
            assert limits[1] == pytest.approx(window_n.mean() + 3.0 * window_n.std(), rel=1e-12)
            assert guard.last_z[0] == pytest.approx(reference_z(losses[-4:], out.loss), rel=1e-9)
            assert out.outlier == (out.loss > limits[0] or out.grad_norm > limits[1])
        losses.append(out.loss)
        norms.append(out.grad_norm)
    state = guard.state_dict()
    assert state["losses"] == losses[-4:] and state["grad_norms"] == norms[-4:]


def test_a_nan_loss_is_skipped_while_the_window_fills():
    guard = gt.SpikeGuard(window=8)
    model, opt, sched, grad_scaler, step = run(guard=guard)
    before = snapshot(model, opt, sched, grad_scaler)
    x, y = batch(0)
    x = np.clip(x.astype(np.float64) * 3e38, -3e38, 3e38).astype(np.float32)  # finite; the GEMMs overflow
    out = step(x, y)
    assert out.outlier and not math.isfinite(out.loss)
    assert_same(before, snapshot(model, opt, sched, grad_scaler))
    assert len(guard.state_dict()["losses"]) == 0  # non-finite values stay out of the window


@pytest.mark.parametrize("kwargs, match", [({"window": 1}, "window"), ({"window": 2**31}, "window"),
                                           ({"z_loss": 0}, "z_loss"), ({"z_loss": 10**400}, "z_loss"),
                                           ({"z_grad_norm": math.inf}, "z_grad_norm")])
def test_bad_guard_settings_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gt.SpikeGuard(**kwargs)
    with pytest.raises(TypeError, match="spike_guard"):
        run(guard=deque())


def test_the_c_step_refuses_a_nan_limit():
    model, opt, sched, grad_scaler, step = run()
    with pytest.raises(ValueError, match="guard_loss"):
        gt._C.train_step(gt._C.StepConfig(nn.CrossEntropyLoss()._spec(), optimizer=opt, guard=True), model.compiled,
                         *batch(0), guard_loss=math.nan)


# --- LossSpikeCallback in the Trainer ---


def spiky_loader(spike_batch=14):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((160, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    x[spike_batch * 8:(spike_batch + 1) * 8] *= 500.0
    return gt.DataLoader((x, y), batch_size=8, shuffle=False)


def trainer(tmp_path, callbacks, **kwargs):
    gt.random.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 3))
    options = dict(output_dir=str(tmp_path), learning_rate=1e-2, save_strategy="no", logging_steps=5,
                   disable_tqdm=True, seed=3, num_train_epochs=1, lr_scheduler_type="constant")
    options.update(kwargs)
    return gt.Trainer(model, gt.TrainingArguments(**options), train_dataset=spiky_loader(), callbacks=callbacks)


def test_the_trainer_skips_the_spike_and_logs_the_count(tmp_path, caplog):
    callback = gt.LossSpikeCallback(window=8, z_loss=6.0, z_grad_norm=6.0)
    t = trainer(tmp_path, [callback])
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        t.train()
    assert callback.guard.num_skipped == 1
    assert t.optimizer.step_count == t.state.global_step - 1 == 19
    assert any("step 15: update skipped as a loss spike" in r.getMessage() for r in caplog.records)
    logged = [entry["skipped_updates"] for entry in t.state.log_history if "loss" in entry]
    assert logged == [0, 0, 1, 1]
    with open(os.path.join(tmp_path, "history.jsonl"), encoding="utf-8") as f:
        assert [json.loads(line).get("skipped_updates") for line in f][:4] == [0, 0, 1, 1]


def test_the_guard_window_survives_a_checkpoint_resume(tmp_path):
    pytest.importorskip("safetensors")
    straight = trainer(tmp_path / "a", [gt.LossSpikeCallback(window=8, z_loss=6.0, z_grad_norm=6.0)])
    straight.train()
    first = trainer(tmp_path / "b", [gt.LossSpikeCallback(window=8, z_loss=6.0, z_grad_norm=6.0)],
                    save_strategy="steps", save_steps=12, max_steps=12)
    first.train()
    resumed_cb = gt.LossSpikeCallback(window=8, z_loss=6.0, z_grad_norm=6.0)
    resumed = trainer(tmp_path / "b", [resumed_cb], save_strategy="no")
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-12"))
    assert resumed_cb.guard.state_dict() == straight.callback_handler.callbacks[-1].guard.state_dict()
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), resumed.model.state_dict().items()):
        assert np.array_equal(a, b), name


# --- GPUHealthCallback with an injected NVML ---


class FakeNVML(types.SimpleNamespace):
    """A pynvml stand-in whose GPU 0 reports the next of `temperatures` at each reading."""

    def __init__(self, temperatures, init_error=None):
        class NVMLError(Exception):
            pass

        super().__init__(NVMLError=NVMLError, NVML_TEMPERATURE_GPU=0, calls=[])
        for name in ("LibraryNotFound", "DriverNotLoaded", "NotSupported", "NoPermission"):
            setattr(self, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
        self.temperatures = list(temperatures)
        self.readings = 0
        self.init_error = init_error

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error:
            raise self.NVMLError_DriverNotLoaded("Driver Not Loaded")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return "Fake RTX 3090"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return namedtuple("Memory", "total free used")(24 << 30, 20 << 30, 4 << 30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        index = min(self.readings, len(self.temperatures) - 1)
        self.readings += 1
        return self.temperatures[index]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return namedtuple("Rates", "gpu memory")(97, 40)

    def nvmlDeviceGetPowerUsage(self, handle):
        return 312_000


class FakeTime:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def health(temperatures, **kwargs):
    nvml, clock = FakeNVML(temperatures), FakeTime()
    options = dict(check_interval_s=0, nvml=nvml, clock=clock.clock, sleep=clock.sleep, poll_interval_s=30)
    options.update(kwargs)
    return gt.GPUHealthCallback(**options), nvml, clock


def test_health_warns_once_per_excursion_and_logs_the_readings(tmp_path, caplog):
    callback, nvml, clock = health([70, 81, 82, 75, 80, 70])
    t = trainer(tmp_path, [callback], max_steps=10)
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        t.train()
    assert t.state.global_step == 10 and callback.num_warnings == 2 and clock.sleeps == []
    warnings = [r.getMessage() for r in caplog.records if "°C" in r.getMessage()]
    assert warnings[0].startswith("GPU 0 at 81 °C") and warnings[1].startswith("GPU 0 at 80 °C")
    logged = [entry for entry in t.state.log_history if "loss" in entry]
    assert logged[0]["gpu_temperature_c"] == 70 and logged[0]["gpu_utilization_percent"] == 97
    assert logged[0]["gpu_power_watts"] == 312.0 and logged[0]["gpu_memory_used_bytes"] == 4 << 30
    assert nvml.calls == ["init", "shutdown"]


def test_health_pauses_until_the_gpu_cools_below_the_warning(tmp_path, caplog):
    callback, nvml, clock = health([70, 86, 84, 81, 79, 70])
    t = trainer(tmp_path, [callback], max_steps=6)
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        t.train()
    assert t.state.global_step == 6  # training went on after the pause
    assert clock.sleeps == [30, 30, 30] and callback.num_pauses == 1 and callback.paused_s == 90
    assert any("pausing until it is below 80 °C" in r.getMessage() for r in caplog.records)
    assert t.state.log_history[0]["gpu_paused_s"] == 90


def test_health_stops_after_the_longest_pause(tmp_path):
    pytest.importorskip("safetensors")
    callback, nvml, clock = health([70, 90, 88], max_pause_s=100)
    t = trainer(tmp_path, [callback], max_steps=10, save_strategy="steps", save_steps=100)
    t.train()
    assert t.state.global_step == 2 and clock.sleeps == [30, 30, 30, 30]
    assert os.path.isdir(tmp_path / "checkpoint-2")  # stopped with a checkpoint


def test_health_stops_at_once_with_action_stop(tmp_path):
    callback, nvml, clock = health([70, 70, 85], action="stop")
    t = trainer(tmp_path, [callback], max_steps=10)
    t.train()
    assert t.state.global_step == 3 and clock.sleeps == []


def test_health_checks_at_most_every_interval(tmp_path):
    callback, nvml, clock = health([70], check_interval_s=5.0)
    t = trainer(tmp_path, [callback], max_steps=10, logging_steps=100)
    t.train()
    assert nvml.readings == 1 + 1  # the first step's check and the final log's reading


def test_without_a_driver_or_the_package_it_warns_and_training_runs(tmp_path, caplog, monkeypatch):
    broken = FakeNVML([70], init_error=True)
    callback = gt.GPUHealthCallback(nvml=broken)
    t = trainer(tmp_path, [callback], max_steps=3)
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        t.train()
    assert t.state.global_step == 3 and "no NVIDIA driver" in callback.unavailable_reason
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    callback = gt.GPUHealthCallback()
    trainer(tmp_path, [callback], max_steps=2).train()
    assert "pip install 'gputrain[gpu]'" in callback.unavailable_reason
    assert sum("GPU health checks are off" in r.getMessage() for r in caplog.records) >= 1
    with pytest.raises(RuntimeError, match="required=True.*no NVIDIA driver"):
        gt.GPUHealthCallback(nvml=FakeNVML([70], init_error=True), required=True)


@pytest.mark.parametrize("kwargs, match", [
    ({"warn_temperature": 90, "stop_temperature": 85}, "stop_temperature"),
    ({"action": "sleep"}, "action"), ({"max_pause_s": 0}, "max_pause_s"), ({"device_index": -1}, "device_index"),
    ({"check_interval_s": -1}, "check_interval_s")])
def test_bad_health_settings_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gt.GPUHealthCallback(**kwargs)


def test_health_on_this_machine_reads_the_gpu_or_says_why_not(tmp_path):
    callback = gt.GPUHealthCallback(check_interval_s=0)
    t = trainer(tmp_path, [callback], max_steps=3)
    t.train()
    assert t.state.global_step == 3
    if gt.monitor.gpu_unavailable_reason():
        assert callback.unavailable_reason and callback.last_reading is None
    else:
        assert callback.last_reading is not None and "gpu_memory_used_bytes" in t.state.log_history[-1]
