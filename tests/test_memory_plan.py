"""The Trainer's complete memory plan (byte-exact against the allocator's peaks, per memory kind)
and auto_find_batch_size: fitting the plan to a memory limit, and refitting after an
OutOfMemoryError in a step, with the same trained bits as a run configured that way."""

from __future__ import annotations

import contextlib
import gc
import logging

import numpy as np
import pytest

import gputrain as gt
from gputrain import memory_plan as mp

nn = gt.nn
KINDS = ("cpu", "pinned")


def data(rows=100, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 10)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)


def model(dropout=0.1):
    gt.random.manual_seed(1)
    block = nn.Residual(nn.LayerNorm(16), nn.Linear(16, 32), nn.GELU(), nn.Dropout(dropout), nn.Linear(32, 16))
    return nn.Sequential(nn.Linear(10, 16), block, nn.LayerNorm(16), nn.Linear(16, 3))


def args(tmp_path, **kwargs):
    options = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, learning_rate=1e-2, save_strategy="no",
                   logging_steps=50, disable_tqdm=True, seed=3, device="cpu", max_steps=1)
    options.update(kwargs)
    return gt.TrainingArguments(**options)


@contextlib.contextmanager
def measured(kinds=KINDS):
    """The growth of each pool's peak over its reserved bytes at entry (no GC inside: an
    unrelated object freed meanwhile would lower the baseline). Peaks count from entry, or
    from the last reset_peaks() (a model's layers compile one by one before their container
    compiles them all: that transient is not the training run's)."""
    gc.collect()
    gc.disable()
    base = {k: gt.memory_stats(k)["reserved_bytes"] for k in kinds}
    reset_peaks(kinds)
    growth: dict[str, int] = {}
    try:
        yield growth
    finally:
        growth.update({k: gt.memory_stats(k)["peak_reserved_bytes"] - base[k] for k in kinds})
        gc.enable()


def reset_peaks(kinds=KINDS):
    for k in kinds:
        gt.reset_peak_memory_stats(k)


@pytest.fixture
def memory_limit():
    yield lambda limit: gt.set_memory_limit(limit, "cpu")
    gt.set_memory_limit(None, "cpu")


CONFIGS = {
    "fp32": {},
    "bf16": {"bf16": True},
    "fp16 with its scaler": {"fp16": True},
    "offload 0.5": {"cpu_offload_fraction": 0.5},
    "ema": {"ema_decay": 0.9},
    "accumulation": {"gradient_accumulation_steps": 4},
    "checkpointing": {"gradient_checkpointing": True, "bf16": True},
    "workers": {"dataloader_num_workers": 2, "dataloader_prefetch_factor": 3},
    "sgd": {"optim": "sgd"},
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=list(CONFIGS))
def test_each_pool_peaks_at_the_plan_after_the_first_step(tmp_path, config):
    x, y = data()
    with measured() as growth:
        m = model()
        reset_peaks()
        trainer = gt.Trainer(m, args(tmp_path, **config), train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
    assert trainer.state.global_step == 1
    for kind in KINDS:
        assert growth[kind] == plan.total(kind), (kind, str(plan))
        if kind in plan:
            assert plan[kind]["total"] == sum(v for k, v in plan[kind].items() if k != "total")
    regions = plan["cpu"]
    assert regions["parameters"] == regions["gradients"] > 0
    assert regions["loader_slots"] > 0 and regions["activations"] > 0
    assert ("half_parameters" in regions) == (config.get("bf16", False) or config.get("fp16", False))
    assert ("ema" in regions) == ("ema_decay" in config)
    assert regions["step_scratch"] > 0  # the step's record and scaler state: the CPU takes the device step
    assert ("optimizer_state" in regions) == (config.get("optim") != "sgd")
    assert ("pinned" in plan) == ("cpu_offload_fraction" in config)


@pytest.mark.parametrize("config", [{}, {"fp16": True}, {"bf16": True, "gradient_accumulation_steps": 2},
                                    {"fp16": True, "cpu_offload_fraction": 0.5, "ema_decay": 0.9, "llrd": 0.8}],
                         ids=["fp32", "fp16 with its scaler", "bf16 accumulation", "offload 0.5, ema, llrd"])
def test_a_sim_device_run_peaks_at_the_plan(tmp_path, config):
    # The device pool holds the model's arenas, the backend's and the step's scratch blocks
    # and the optimizer state; the loader's slots are pinned. The model is moved first: a move
    # briefly holds the CPU arenas and a staging copy, before the run the plan describes.
    x, y = data()
    m = model().to("sim")
    gc.collect()
    assert gt.memory_stats("sim:0")["reserved_bytes"] > 0  # the moved model's arenas, in the plan too
    with measured() as growth:
        gt.reset_peak_memory_stats("sim:0")
        trainer = gt.Trainer(m, args(tmp_path, device="sim", **config), train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
        device_peak = gt.memory_stats("sim:0")["peak_reserved_bytes"]
    assert trainer.state.global_step == 1
    assert device_peak == plan.total("sim:0"), str(plan)
    for kind in KINDS:
        assert growth[kind] == plan.total(kind), (kind, str(plan))
    assert plan["sim:0"]["step_scratch"] > 0 and plan["sim:0"]["parameters"] > 0



def test_the_plan_is_made_before_anything_is_allocated_and_prints_every_kind(tmp_path):
    x, y = data()
    trainer = gt.Trainer(model(), args(tmp_path, cpu_offload_fraction=0.5, ema_decay=0.9), train_dataset=(x, y))
    allocs = {k: gt.memory_stats(k)["num_allocs"] for k in KINDS}
    plan = trainer.memory_plan()
    assert {k: gt.memory_stats(k)["num_allocs"] for k in KINDS} == allocs
    text = str(plan)
    for needle in ("cpu (device)", "pinned (pinned host)", "optimizer_offload", "ema", "loader_slots",
                   "gradient_checkpointing=True", f"{plan.total('cpu'):,} bytes"):
        assert needle in text
    with_checkpointing = gt.Trainer(model(), args(tmp_path, gradient_checkpointing=True), train_dataset=(x, y))
    other = with_checkpointing.memory_plan()
    assert plan.alternatives["activation arena with gradient_checkpointing=True"] == other.activation_arena


@pytest.mark.parametrize("ema_location", ["device", "host"])
def test_a_train_steps_plan_is_its_peak_with_optimizer_scaler_and_ema(ema_location):
    x, y = data(16)
    with measured() as growth:
        m = model()
        reset_peaks()
        optimizer = gt.optim.AdamW(m.parameters(), amsgrad=True, cpu_offload_fraction=0.3, offload_chunk_numel=100)
        step = gt.TrainStep(m, nn.CrossEntropyLoss(), optimizer, micro_batches=2, precision="fp16",
                            gradient_checkpointing=True, scaler=gt.amp.GradScaler())
        ema = gt.optim.EMA(m, location=ema_location)
        plan = mp.plan_step(step, x, ema=ema)
        step(x, y)
        ema.update()
    assert {k: growth[k] for k in KINDS} == {k: plan.total(k) for k in KINDS}, str(plan)
    assert plan["pinned"]["optimizer_offload"] > 0 and ("ema" in plan["pinned"]) == (ema_location == "host")
    assert plan.micro_batch_shape == (8, 10)
    with pytest.raises(ValueError, match="equal micro-batches"):
        mp.plan_step(step, (15, 10))


def test_each_nesting_level_s_backward_scratch_holds_that_level_s_largest_gradient():
    """Two ping-pong buffers per nesting level, each sized by the outputs of that level's children
    (not its last: that gradient is the caller's), not by the model's largest activation."""
    def aligned(n: int) -> int:
        return -(-n // 64) * 64

    model = gt.nn.Sequential(gt.nn.Linear(16, 32), gt.nn.Residual(gt.nn.Sequential(
        gt.nn.Linear(32, 1024), gt.nn.GELU(), gt.nn.Linear(1024, 32))), gt.nn.Linear(32, 4096))
    step = gt.TrainStep(model, gt.nn.MSELoss(), gt.optim.AdamW(model.parameters()))
    plan = step.memory_plan((8, 16))
    outer, inner = 8 * 32 * 4, 8 * 1024 * 4  # level 0: the first Linear's and the Residual's outputs
    assert plan["backward_scratch"] == 2 * aligned(outer) + 2 * aligned(inner)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    step(x, np.zeros((8, 4096), np.float32))  # trains within the plan (sim: the peak, tests above)


def test_the_plans_of_the_parts_are_what_they_allocate():
    m = model()
    params = list(m.parameters())
    numels = [p.numel() for p in params]
    planned = gt._C.optimizer_plan("adamw", numels, [{"amsgrad": True}], cpu_offload_fraction=0.3,
                                   offload_chunk_numel=100)
    built = gt.optim.AdamW(params, amsgrad=True, cpu_offload_fraction=0.3, offload_chunk_numel=100).memory()
    assert (planned["device_bytes"], planned["pinned_bytes"]) == (built["device_bytes"], built["host_bytes"])
    for location in ("device", "host"):
        shadow = gt._C.ema_plan(numels, on_host=location == "host")
        assert shadow == {"pool": "pinned" if location == "host" else "cpu",
                          "bytes": gt.optim.EMA(m, location=location).memory()["bytes"]}
    with pytest.raises(ValueError, match="numels"):
        gt._C.optimizer_plan("adamw", [-1], [{}])
    with pytest.raises(ValueError, match="kind"):
        gt._C.optimizer_plan("lamb", numels, [{}])
    with pytest.raises(gt.OutOfMemoryError, match="numels"):
        gt._C.optimizer_plan("adamw", [2**62, 2**62], [{}])


def test_a_run_over_the_limit_fails_at_construction_without_auto_find_batch_size(tmp_path, memory_limit):
    x, y = data()
    m = model()
    memory_limit(gt.memory_stats("cpu")["reserved_bytes"] + 4096)
    with pytest.raises(gt.OutOfMemoryError, match="auto_find_batch_size=True") as info:
        gt.Trainer(m, args(tmp_path, per_device_train_batch_size=32), train_dataset=(x, y))
    assert "loader_slots" in str(info.value) and "cpu: needs" in str(info.value)


def fitted_run(tmp_path, limit_for, caplog, steps=8, **config):
    """A run whose memory_limit is set so that only `limit_for`'s plan fits."""
    x, y = data()
    baseline = gt.memory_stats("cpu")["reserved_bytes"]
    m = model()
    reset_peaks()
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        trainer = gt.Trainer(m, args(tmp_path, max_steps=steps, auto_find_batch_size=True,
                                           memory_limit=baseline + limit_for, **config), train_dataset=(x, y))
        trainer.train()
    return trainer


def reference_run(tmp_path, steps=8, **config):
    x, y = data()
    trainer = gt.Trainer(model(), args(tmp_path, max_steps=steps, **config), train_dataset=(x, y))
    trainer.train()
    return trainer


def assert_same_bits(a, b):
    for name, value in a.model.state_dict().items():
        assert np.array_equal(value, b.model.state_dict()[name]), name


def test_auto_find_batch_size_shrinks_the_micro_batch_and_trains_the_bits_of_a_run_that_fits(tmp_path, caplog,
                                                                                                memory_limit):
    # the effective batch stays 32 rows a step: 4 micro-batches of 8 instead of 1 of 32
    reference = reference_run(tmp_path / "ref", per_device_train_batch_size=8, gradient_accumulation_steps=4)
    needed = reference.memory_plan().total("cpu")
    with measured() as growth:
        fitted = fitted_run(tmp_path / "fit", needed, caplog, per_device_train_batch_size=32)
    assert fitted._micro_cap == 8 and fitted.memory_plan().total("cpu") == needed
    assert growth["cpu"] <= needed  # the limit held, the last short group included
    assert_same_bits(fitted, reference)
    assert fitted.state.global_step == reference.state.global_step == 8  # 2 epochs of 4 steps
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "exceeds the memory limit" in message and "micro-batches of 8 rows instead of 32" in message
    assert "the same 32 rows per step" in message


def test_auto_find_batch_size_raises_the_offload_fraction_when_micro_batches_are_not_enough(tmp_path, caplog,
                                                                                              memory_limit):
    reference = reference_run(tmp_path / "ref", steps=3, per_device_train_batch_size=1, gradient_accumulation_steps=8,
                              cpu_offload_fraction=0.5)
    needed = reference.memory_plan().total("cpu")
    fitted = fitted_run(tmp_path / "fit", needed, caplog, steps=3, per_device_train_batch_size=8)
    assert (fitted._micro_cap, fitted.optimizer.cpu_offload_fraction) == (1, 0.5)
    assert_same_bits(fitted, reference)
    assert "cpu_offload_fraction 0.5 instead of 0" in " ".join(r.getMessage() for r in caplog.records)


def test_auto_find_batch_size_offloads_the_state_of_a_sim_model_when_micro_batches_are_not_enough(tmp_path, caplog):
    x, y = data()
    reference = gt.Trainer(model(), args(tmp_path / "ref", device="sim", max_steps=3, per_device_train_batch_size=1,
                                         gradient_accumulation_steps=8, cpu_offload_fraction=0.5),
                           train_dataset=(x, y))
    reference.train()
    needed, expected = reference.memory_plan().total("sim:0"), reference.model.state_dict()
    del reference
    gc.collect()
    baseline = gt.memory_stats("sim:0")["reserved_bytes"]
    try:
        with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
            fitted = gt.Trainer(model(), args(tmp_path / "fit", device="sim", max_steps=3, auto_find_batch_size=True,
                                              memory_limit=baseline + needed, per_device_train_batch_size=8),
                                train_dataset=(x, y))
            fitted.train()
    finally:
        gt.set_memory_limit(None, "sim:0")
    assert (fitted._micro_cap, fitted.optimizer.cpu_offload_fraction) == (1, 0.5)
    for name, value in fitted.model.state_dict().items():
        assert np.array_equal(value, expected[name]), name
    assert "cpu_offload_fraction 0.5 instead of 0" in " ".join(r.getMessage() for r in caplog.records)


def hog(trainer, rows):
    """A gputrain block that leaves the first step room for micro-batches of `rows` rows only."""
    plan = trainer.memory_plan()
    room = trainer._plan_for(rows, 0.0).activation_arena
    return gt.Buffer(plan.activation_arena - room, "cpu")


def test_an_out_of_memory_step_is_refitted_once_and_no_update_is_lost_or_repeated(tmp_path, caplog, memory_limit):
    reference = reference_run(tmp_path / "ref", per_device_train_batch_size=8, gradient_accumulation_steps=4)
    x, y = data()
    baseline = gt.memory_stats("cpu")["reserved_bytes"]
    trainer = gt.Trainer(model(), args(tmp_path, max_steps=8, per_device_train_batch_size=32,
                                       auto_find_batch_size=True), train_dataset=(x, y))
    memory_limit(baseline + trainer.memory_plan().total("cpu"))  # the plan fits, until another block takes room
    other = hog(trainer, 8)
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        trainer.train()
    del other
    assert trainer._micro_cap == 8 and trainer.state.global_step == 8
    assert trainer.optimizer.step_count == 8 and trainer.model.compiled.step == 8
    assert_same_bits(trainer, reference)
    assert "a step ran out of memory" in " ".join(r.getMessage() for r in caplog.records)


def test_without_auto_find_an_out_of_memory_step_changes_nothing(tmp_path, memory_limit):
    x, y = data()
    baseline = gt.memory_stats("cpu")["reserved_bytes"]
    trainer = gt.Trainer(model(), args(tmp_path, per_device_train_batch_size=32), train_dataset=(x, y))
    before = {k: v.copy() for k, v in trainer.model.state_dict().items()}
    memory_limit(baseline + trainer.memory_plan().total("cpu"))
    other = hog(trainer, 16)
    with pytest.raises(gt.OutOfMemoryError):
        trainer.train()
    del other
    assert trainer.state.global_step == 0 and trainer.optimizer.step_count == 0 and trainer.model.compiled.step == 0
    assert trainer.lr_scheduler.last_epoch == 0
    for name, value in trainer.model.state_dict().items():
        assert np.array_equal(value, before[name]), name


def test_an_out_of_memory_step_no_micro_batch_fits_propagates(tmp_path, memory_limit):
    x, y = data()
    baseline = gt.memory_stats("cpu")["reserved_bytes"]
    trainer = gt.Trainer(model(), args(tmp_path, per_device_train_batch_size=32, auto_find_batch_size=True),
                         train_dataset=(x, y))
    memory_limit(baseline + trainer.memory_plan().total("cpu"))
    other = gt.Buffer(trainer.memory_plan().activation_arena, "cpu")  # not even one row fits
    with pytest.raises(gt.OutOfMemoryError):
        trainer.train()
    del other
    assert trainer.state.global_step == 0 and trainer.optimizer.step_count == 0


def test_fit_tries_the_divisors_of_a_step_then_offload():
    seen = []

    class Plan(dict):
        def __init__(self, rows, offload):
            super().__init__()
            self.rows, self.offload = rows, offload

        def over(self, available):
            seen.append((self.rows, self.offload))
            return {} if self.rows * (1 - self.offload) <= available["cpu"] else {"cpu": 1}

    assert mp.micro_batch_sizes(24, 24) == [24, 12, 8, 6, 4, 3, 2, 1]
    assert mp.micro_batch_sizes(24, 10) == [8, 6, 4, 3, 2, 1]
    assert mp.fit(Plan, {"cpu": 5}, mp.micro_batch_sizes(24, 24), 0.0, True)[:2] == (4, 0.0)
    assert seen == [(24, 0.0), (12, 0.0), (8, 0.0), (6, 0.0), (4, 0.0)]
    assert mp.fit(Plan, {"cpu": 0.5}, [4, 2, 1], 0.0, True)[:2] == (1, 0.5)
    assert mp.fit(Plan, {"cpu": 0.5}, [4, 2, 1], 0.0, False) is None



def test_auto_find_batch_size_splits_the_groups_of_a_ready_dataloader(tmp_path, caplog, memory_limit):
    x, y = data()
    reference = reference_run(tmp_path / "ref", per_device_train_batch_size=8, gradient_accumulation_steps=4)

    def loader():
        return gt.DataLoader((x, y), batch_size=16, shuffle=True, seed=3)

    probe = gt.Trainer(model(), args(tmp_path / "probe", gradient_accumulation_steps=2), train_dataset=loader())
    needed = probe._plan_for(8, 0.0).total("cpu")
    baseline = gt.memory_stats("cpu")["reserved_bytes"]
    m = model()
    with caplog.at_level(logging.WARNING, logger="gputrain.trainer"):
        fitted = gt.Trainer(m, args(tmp_path / "fit", max_steps=8, gradient_accumulation_steps=2,
                                    auto_find_batch_size=True, memory_limit=baseline + needed),
                            train_dataset=loader())
        fitted.train()
    assert fitted._micro_cap == 8
    assert_same_bits(fitted, reference)
    assert "micro-batches of 8 rows instead of 16" in " ".join(r.getMessage() for r in caplog.records)


def test_a_whole_run_peaks_at_the_plan_the_short_last_steps_included(tmp_path, memory_limit):
    x, y = data(100)  # steps of 32 rows, each epoch's last one of 4: it reuses the activation arena
    with measured() as growth:
        m = model()
        reset_peaks()
        trainer = gt.Trainer(m, args(tmp_path, per_device_train_batch_size=32, num_train_epochs=2, max_steps=-1),
                             train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
    assert trainer.state.global_step == 8
    assert growth["cpu"] == plan.total("cpu")
    baseline = gt.memory_stats("cpu")["reserved_bytes"]
    m = model()
    ooms = gt.memory_stats("cpu")["num_ooms"]
    memory_limit(baseline + plan.total("cpu"))
    gt.Trainer(m, args(tmp_path, per_device_train_batch_size=32, num_train_epochs=2, max_steps=-1),
               train_dataset=(x, y)).train()
    assert gt.memory_stats("cpu")["num_ooms"] == ooms  # not even a refusal


def test_a_resumed_run_keeps_the_micro_batches_auto_find_chose(tmp_path, caplog, memory_limit):
    pytest.importorskip("safetensors")
    reference = reference_run(tmp_path / "ref", per_device_train_batch_size=8, gradient_accumulation_steps=4)
    needed = reference.memory_plan().total("cpu")
    fitted = fitted_run(tmp_path / "fit", needed, caplog, per_device_train_batch_size=32, save_strategy="steps",
                        save_steps=4)
    memory_limit(None)
    x, y = data()
    resumed = gt.Trainer(model(), args(tmp_path / "fit", max_steps=8, per_device_train_batch_size=32,
                                       auto_find_batch_size=True, save_strategy="steps", save_steps=4),
                         train_dataset=(x, y))
    assert resumed._micro_cap == 32  # with no limit, nothing to fit
    resumed.train(resume_from_checkpoint=str(tmp_path / "fit" / "checkpoint-4"))
    assert resumed._micro_cap == 8
    assert_same_bits(resumed, fitted)
    assert_same_bits(resumed, reference)


def test_the_planners_refuse_bad_arguments_naming_them():
    x = np.zeros((3, 2), np.float32)
    with pytest.raises(gt.OutOfMemoryError, match="num_workers \\* prefetch_factor"):
        gt._C.loader_plan((x,), 4, 2**40, 2**40)
    with pytest.raises(ValueError, match="prefetch_factor"):
        gt._C.loader_plan((x,), 4, 2, 0)
    with pytest.raises(ValueError, match="numels\\[0\\]"):
        gt._C.ema_plan([1.5])
    with pytest.raises(ValueError, match="cpu_offload_fraction"):
        gt._C.optimizer_plan("adamw", [10], [{}], cpu_offload_fraction=float("nan"))
    with pytest.raises(TypeError, match="precision"):
        mp.plan_training(model(), (4, 10), precision=16)
    with pytest.raises(ValueError, match="precision"):
        mp.plan_training(model(), (4, 10), precision="fp8")
    with pytest.raises(ValueError):
        mp.plan_training(model(), (4, 11))  # the model takes 10 features
    assert gt._C.loader_plan((x,), 4, 3, 2)["num_slots"] == 3 * 2 + 2
