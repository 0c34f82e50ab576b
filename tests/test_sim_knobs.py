"""Every knob of the training step on a model on the simulated device "sim", with the same
Python objects as on the CPU: AdamW/SGD over model.parameters() or parameter groups (weight
decay / no-decay, LLRD, a schedule), cpu_offload_fraction (the host share of the state in
pinned memory, its update overlapped with the device's through the copy stream), EMA on the
device or in pinned host memory, clipping, fp16 with GradScaler, gradient accumulation, and
state_dict()/load_state_dict() of model, optimizer, scaler and EMA moving between a CPU run
and a sim run. Each is compared with the same run on the CPU bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _sim_child import run_with_sim_delays

pytestmark = pytest.mark.sim
nn = gt.nn


def make_model(seed=11):
    gt.random.manual_seed(seed)
    block = nn.Residual(nn.LayerNorm(24), nn.Linear(24, 48), nn.GELU(), nn.Linear(48, 24))
    return nn.Sequential(nn.Linear(12, 24), nn.SiLU(), block, nn.LayerNorm(24), nn.Linear(24, 7))


def batch(step, rows=32):
    rng = np.random.default_rng(500 + step)
    return rng.standard_normal((rows, 12)).astype(np.float32), rng.integers(0, 7, rows).astype(np.int64)


class Run:
    """A model on `device` with the recipe's objects: no-decay groups (or LLRD), AdamW (or SGD)
    with cpu_offload_fraction, a schedule, optionally fp16 + GradScaler and an EMA."""

    def __init__(self, device, *, fraction=0.0, precision="fp32", ema=None, llrd=False, kind="adamw",
                 accumulation=4, chunk=64, clip=0.5):
        self.model = make_model().to(device)
        if llrd:
            groups = gt.optim.param_groups_llrd(self.model, lr=3e-3, llrd=0.7, weight_decay=0.05)
        else:
            groups = gt.optim.param_groups_weight_decay(self.model, weight_decay=0.05)
        if kind == "adamw":
            self.optimizer = gt.optim.AdamW(groups, lr=3e-3, betas=(0.8, 0.95), cpu_offload_fraction=fraction,
                                            offload_chunk_numel=chunk)
        else:
            self.optimizer = gt.optim.SGD(groups, lr=0.05, momentum=0.9, nesterov=True)
        self.schedule = gt.optim.get_scheduler("cosine", self.optimizer, num_warmup_steps=2, num_training_steps=20)
        self.scaler = gt.amp.GradScaler(init_scale=2.0**12, growth_interval=2) if precision == "fp16" else None
        self.ema = gt.optim.EMA(self.model, decay=0.9, location=ema, use_warmup=True) if ema else None
        self.step = gt.TrainStep(self.model, nn.CrossEntropyLoss(label_smoothing=0.1), self.optimizer,
                                 micro_batches=accumulation, precision=precision, max_grad_norm=clip,
                                 scaler=self.scaler, scheduler=self.schedule)

    def train(self, steps, first=0, overflow_at=None):
        outputs = []
        for i in range(first, first + steps):
            x, y = batch(i)
            out = self.step(x * np.float32(1e6) if i == overflow_at else x, y)
            if self.ema is not None and not out.skipped:
                self.ema.update()
            outputs.append((out.loss, out.grad_norm, out.skipped, out.scale))
        return outputs

    def state(self):
        """Everything the next steps depend on, as host arrays and plain values."""
        state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "schedule": self.schedule.state_dict()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
        return state

    def load(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])


def assert_same_bits(a, b, path="state"):
    """a and b equal, arrays bit for bit (NaN == NaN), dicts and lists walked."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_same_bits(a[key], b[key], f"{path}[{key!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for index, (x, y) in enumerate(zip(a, b)):
            assert_same_bits(x, y, f"{path}[{index}]")
    elif isinstance(a, (np.ndarray, np.generic)):
        x, y = np.asarray(a), np.asarray(b)
        assert x.dtype == y.dtype and x.shape == y.shape, path
        assert x.tobytes() == y.tobytes(), path
    else:
        assert a == b or (a != a and b != b), f"{path}: {a!r} != {b!r}"


def same_run(steps=6, overflow_at=None, **options):
    cpu, sim = Run("cpu", **options), Run("sim", **options)
    outputs = cpu.train(steps, overflow_at=overflow_at), sim.train(steps, overflow_at=overflow_at)
    assert_same_bits(outputs[1], outputs[0], "outputs")
    assert_same_bits(sim.state(), cpu.state())
    return cpu, sim


# ------------------------------------------------------------------ parameters of a device model


def test_a_device_model_has_its_parameters_as_host_copies():
    model = make_model().to("sim")
    named = dict(model.named_parameters())
    assert list(named) == list(make_model().state_dict())
    weight = named["0.weight"]
    assert weight.device == "sim:0" and weight.shape == (24, 12) and weight.numel() == 288
    assert weight is model[0].weight and list(model.parameters())[0] is weight
    assert_same_bits(weight.data, model.state_dict()["0.weight"])
    with pytest.raises(ValueError, match="read-only"):
        weight.data[0, 0] = 1.0
    weight.data = np.full((24, 12), 0.5, np.float32)  # assigning writes the device memory
    assert (model.state_dict()["0.weight"] == 0.5).all()
    assert weight.grad is None
    gt.TrainStep(model, nn.CrossEntropyLoss())(*batch(0))  # no optimizer: gradients only
    assert_same_bits(weight.grad, model.compiled.read_gradients()[:288].reshape(24, 12))
    model.to("cpu")  # the same object follows the model back into host memory
    assert weight.device == "cpu" and weight.data.flags.writeable and weight is model[0].weight


# ------------------------------------------------------------------ sim == CPU, knob by knob


@pytest.mark.parametrize("llrd", [False, True])
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_groups_no_decay_llrd_and_schedule_on_sim_match_the_cpu(kind, llrd):
    cpu, sim = same_run(kind=kind, llrd=llrd)
    lrs = [group["lr"] for group in sim.optimizer.param_groups]
    assert len(lrs) == (7 if llrd else 2) and (len(set(lrs)) > 1) == llrd
    assert {g["weight_decay"] for g in sim.optimizer.param_groups} == {0.0, 0.05}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_offload_on_sim_matches_the_cpu(fraction, precision):
    overflow_at = 2 if precision == "fp16" else None  # a skipped step: the scaler backs off on both
    cpu, sim = same_run(fraction=fraction, precision=precision, overflow_at=overflow_at)
    memory = sim.optimizer.memory()
    total = sim.model.num_parameters()
    assert memory["host_numel"] == round(fraction * total) and memory["device_numel"] == total - memory["host_numel"]
    if fraction:
        assert memory == cpu.optimizer.memory()
    else:  # the sim optimizer may run deferred steps: its table and its results' ring come with it
        groups = [{}] * len(sim.optimizer.param_groups)
        planned = gt._C.optimizer_plan("adamw", [total], groups, device="sim:0")
        assert (memory["device_bytes"], memory["host_bytes"]) == (planned["device_bytes"], planned["pinned_bytes"])
        assert memory["device_bytes"] > cpu.optimizer.memory()["device_bytes"] and memory["host_bytes"] > 0
    if precision == "fp16":
        assert sim.scaler.skipped_steps == 1 and sim.scaler.get_scale() == cpu.scaler.get_scale()


@pytest.mark.parametrize("location", ["device", "host"])
def test_ema_of_a_sim_model_matches_the_cpu(location):
    cpu, sim = same_run(ema=location, fraction=0.5, precision="fp16")
    assert sim.ema.num_updates == cpu.ema.num_updates == 6
    x, _ = batch(99)
    sim.model.eval()
    cpu.model.eval()
    with sim.ema.average_parameters(), cpu.ema.average_parameters():
        assert_same_bits(sim.model(x), cpu.model(x))
        averaged = sim.model.state_dict()
    assert_same_bits(averaged, dict(zip(averaged, cpu.ema.shadow)))
    assert not np.array_equal(averaged["0.weight"], sim.model.state_dict()["0.weight"])


def test_clip_grad_norm_and_a_standalone_step_on_sim_match_the_cpu():
    results = []
    for device in ("cpu", "sim"):
        model = make_model().to(device)
        optimizer = gt.optim.AdamW(gt.optim.param_groups_weight_decay(model, 0.1), lr=1e-2, cpu_offload_fraction=0.5)
        gt.TrainStep(model, nn.CrossEntropyLoss())(*batch(0))  # gradients, no update
        norm = optimizer.clip_grad_norm_(0.1)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        zeroed = model.compiled.read_gradients()
        results.append((norm, model.state_dict(), optimizer.state_dict(), zeroed))
    assert_same_bits(results[1], results[0])
    assert results[1][0] > 0.1 and not results[1][3].any()


def test_an_optimizer_built_before_the_move_follows_the_model_to_sim():
    reference = Run("cpu", fraction=0.5)
    reference.train(6)
    moved = Run("cpu", fraction=0.5)
    moved.train(3)
    moved.model.to("sim")  # the same Parameters: the optimizer and EMA re-point at the device arenas
    moved.train(3, first=3)
    assert isinstance(moved.optimizer._core, gt._C.ModelOptimizer)
    assert_same_bits(moved.state(), reference.state())


# ------------------------------------------------------------------ checkpoints between CPU and sim


def test_a_checkpoint_moves_cpu_to_sim_to_cpu_bit_identically():
    options = dict(fraction=0.5, precision="fp16", ema="host")
    straight = Run("cpu", **options)
    straight.train(9, overflow_at=4)
    first = Run("cpu", **options)
    first.train(3, overflow_at=4)
    second = Run("sim", **options)
    second.load(first.state())
    second.train(3, first=3, overflow_at=4)
    third = Run("cpu", **options)
    third.load(second.state())
    third.train(3, first=6, overflow_at=4)
    assert_same_bits(third.state(), straight.state())


def test_a_checkpoint_moves_sim_to_cpu_to_sim_bit_identically():
    options = dict(fraction=1.0, ema="device", llrd=True)
    straight = Run("sim", **options)
    straight.train(6)
    first = Run("sim", **options)
    first.train(3)
    second = Run("cpu", **options)
    second.load(first.state())
    back = Run("sim", **options)
    back.load(second.state())
    back.train(3, first=3)
    assert_same_bits(back.state(), straight.state())


# ------------------------------------------------------------------ bad inputs change nothing


def test_parameters_of_another_model_are_refused_and_nothing_changes():
    model, other = make_model().to("sim"), make_model(seed=12).to("sim")
    optimizer = gt.optim.AdamW(other.parameters(), cpu_offload_fraction=0.5)
    with pytest.raises(ValueError, match="optimizer: its parameter 0 .* of another model"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer)
    before = (model.state_dict(), other.state_dict(), optimizer.state_dict())
    with pytest.raises(ValueError, match="optimizer: its parameters belong to another model"):
        gt._C.train_step(gt._C.StepConfig(("cross_entropy", 0.0, -100), optimizer=optimizer), model.compiled, *batch(0))
    assert_same_bits((model.state_dict(), other.state_dict(), optimizer.state_dict()), before)


def test_parameters_on_two_devices_or_of_two_device_models_are_refused():
    cpu_model, sim_model, sim_other = make_model(), make_model().to("sim"), make_model().to("sim:1")
    mixed = [*cpu_model.parameters(), *sim_model.parameters()]
    with pytest.raises(ValueError, match=r"params: .* one device, found \['cpu', 'sim:0'\]"):
        gt.optim.AdamW(mixed)
    with pytest.raises(ValueError, match=r"params: .* one device, found \['cpu', 'sim:0'\]"):
        gt.optim.EMA(mixed)
    two_models = make_model().to("sim")
    with pytest.raises(ValueError, match="params: parameters of 2 models on 'sim:0'"):
        gt.optim.SGD([*sim_model.parameters(), *two_models.parameters()], lr=0.1)
    optimizer = gt.optim.AdamW(sim_model.parameters(), cpu_offload_fraction=0.5)
    gt.TrainStep(sim_model, nn.CrossEntropyLoss(), optimizer)(*batch(0))
    before = (optimizer.state_dict(), len(optimizer.param_groups))
    with pytest.raises(ValueError, match=r"params: .* one device, found \['sim:0', 'sim:1'\]"):
        optimizer.add_param_group({"params": list(sim_other.parameters())})
    assert_same_bits((optimizer.state_dict(), len(optimizer.param_groups)), before)


def test_a_bad_optimizer_state_dict_leaves_a_device_optimizer_as_it_was():
    run = Run("sim", fraction=0.5)
    run.train(2)
    before = run.optimizer.state_dict()
    bad = run.optimizer.state_dict()
    bad["state"][3]["exp_avg_sq"] = -bad["state"][3]["exp_avg_sq"] - 1.0
    with pytest.raises(ValueError, match=r"state_dict\['state'\]\[3\]\['exp_avg_sq'\]"):
        run.optimizer.load_state_dict(bad)
    assert_same_bits(run.optimizer.state_dict(), before)
    with pytest.raises(RuntimeError, match="grad: this parameter lives on 'sim:0'"):
        run.model[0].weight.grad = np.zeros((24, 12), np.float32)


# ------------------------------------------------------------------ ordering, with random delays


RECIPE = """
import gputrain as gt
from test_sim_knobs import Run, assert_same_bits
for options in (dict(fraction=0.5, precision="fp16", ema="host", chunk=32),
                dict(fraction=0.5, clip=None, chunk=32)):  # no host sync between backward and offload
    cpu, sim = Run("cpu", **options), Run("sim", **options)
    assert_same_bits(sim.train(4, overflow_at=2), cpu.train(4, overflow_at=2), "outputs")
    assert_same_bits(sim.state(), cpu.state())
"""


def test_the_recipe_on_sim_matches_the_cpu_with_random_delays():
    """The offload pipeline's copies wait for the backward through an event (copy_stream.c's
    gt_copy_stream_after_compute); with the stream workers delayed at random, a copy that did
    not wait would read the gradients before the backward wrote them. Without clipping or a
    scaler nothing else orders them (the norm and the inf check wait for the device)."""
    run_with_sim_delays(RECIPE)


def test_the_recipe_counts_its_device_work_per_step():
    """fp16 + GradScaler, accumulation 4, AdamW with no-decay groups and cpu_offload_fraction=0.5,
    EMA in pinned host memory: no device allocation after the first step, and a fixed number of
    host syncs, launches and bytes per optimizer step (benchmarks/README.md lists them)."""
    run = Run("sim", fraction=0.5, precision="fp16", ema="host", chunk=1 << 20)
    run.train(1)
    per_step = []
    for i in range(1, 4):
        gt.device_counters("sim", reset=True)
        run.train(1, first=i)
        per_step.append(gt.device_counters("sim"))
    assert per_step[0] == per_step[1] == per_step[2]
    counters = per_step[0]
    assert counters["allocs"] == 0 and counters["frees"] == 0
    offloaded = run.optimizer.memory()["host_numel"] * 4
    assert counters["d2h_bytes"] >= offloaded and counters["h2d_bytes"] >= offloaded


def test_the_trainer_on_sim_with_ema_llrd_and_offload_matches_the_cpu(tmp_path):
    """The Trainer builds the same LLRD/no-decay groups, offloading AdamW and EMA for a model on
    sim as on the CPU (it refused ema_decay and llrd on a device before)."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((96, 12)).astype(np.float32), rng.integers(0, 7, 96)
    results = []
    for device in ("cpu", "sim"):
        model = make_model()
        args = gt.TrainingArguments(output_dir=str(tmp_path / device), num_train_epochs=2,
                                    per_device_train_batch_size=8, gradient_accumulation_steps=4,
                                    learning_rate=1e-2, weight_decay=0.05, llrd=0.8, ema_decay=0.9,
                                    cpu_offload_fraction=0.5, fp16=True, max_grad_norm=1.0, device=device,
                                    save_strategy="no", dataloader_pin_memory=False, seed=3)
        trainer = gt.Trainer(model, args, train_dataset=(x, y))
        output = trainer.train()
        assert trainer.optimizer.cpu_offload_fraction == 0.5 and len(trainer.optimizer.param_groups) > 2
        results.append((output.training_loss, output.global_step, model.state_dict(), trainer.ema.state_dict(),
                        trainer.optimizer.state_dict()))
    assert results[0][1] == 6
    assert_same_bits(results[1], results[0])


def counters_of_a_step(run, first):
    gt.device_counters("sim", reset=True)
    run.train(1, first=first)
    return gt.device_counters("sim")


def test_offload_waits_once_per_chunk_not_once_per_parameter():
    """With no-decay groups the offloaded elements are many small runs (biases, norm weights):
    they share staging chunks. The first two chunks are copied on the compute stream before the
    step record's read, which covers them, and the copies back are ordered for the device by an
    event: a step whose offloaded share fits two chunks adds no wait, however many parameters it
    holds; each further chunk adds one."""
    runs = {f: Run("sim", fraction=f, chunk=1 << 20) for f in (0.0, 0.5, 1.0)}
    counters = {}
    for fraction, run in runs.items():
        run.train(1)
        counters[fraction] = counters_of_a_step(run, 1)
    assert counters[0.0]["syncs"] == counters[0.5]["syncs"] == counters[1.0]["syncs"] == 1
    small = Run("sim", fraction=0.5, chunk=256)  # 1480 offloaded elements: 6 chunks, 2 staged ahead
    small.train(1)
    assert counters_of_a_step(small, 1)["syncs"] - counters[0.0]["syncs"] == 6 - 2
