"""The issue's recipe (the guides' RTX 3060 run) on the simulated device "sim": a model on the
device, fp16 + GradScaler, gradient accumulation 4, AdamW over no-decay parameter groups with
cpu_offload_fraction=0.5, an EMA (on the device or in pinned host memory), and
DataLoader((X, y), shuffle=True, pin_memory=True, num_workers=2, device="sim") feeding the
step DeviceArrays. It must give the CPU run's bits (losses, parameters, optimizer state, scaler,
EMA), also with the sim streams delayed at random; its steps after the first wait at most once
and allocate nothing (gt.device_counters); a checkpoint moves between a sim and a CPU run."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gputrain as gt
from gputrain import memory_plan as mp
from gputrain.data.transfer import DeviceArray
from _sim_child import run_with_sim_delays
from test_sim_knobs import assert_same_bits, make_model

# the CPU run's loader warns that no accelerator pins its memory
pytestmark = [pytest.mark.sim, pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")]
nn = gt.nn
ROWS, BATCH, ACCUMULATION = 1024, 128, 4


def dataset():
    rng = np.random.default_rng(7)
    return rng.standard_normal((ROWS, 12)).astype(np.float32), rng.integers(0, 7, ROWS).astype(np.int64)


class Recipe:
    """The recipe's objects for a model on `device` ("cpu" or "sim"), its EMA at `ema`."""

    def __init__(self, device, ema="device", prefetch_factor=None):
        self.device = device
        self.model = make_model().to(device)
        groups = gt.optim.param_groups_weight_decay(self.model, weight_decay=0.05)
        self.optimizer = gt.optim.AdamW(groups, lr=3e-3, betas=(0.8, 0.95), cpu_offload_fraction=0.5)
        self.scaler = gt.amp.GradScaler(init_scale=2.0**12, growth_interval=2)
        self.ema = gt.optim.EMA(self.model, decay=0.9, location=ema, use_warmup=True)
        self.step = gt.TrainStep(self.model, nn.CrossEntropyLoss(label_smoothing=0.1), self.optimizer,
                                 micro_batches=ACCUMULATION, precision="fp16", max_grad_norm=1.0,
                                 scaler=self.scaler)
        self.loader = gt.DataLoader(dataset(), batch_size=BATCH, shuffle=True, pin_memory=True, num_workers=2,
                                    seed=3, device=None if device == "cpu" else device, prefetch_factor=prefetch_factor)

    def batches(self, epoch, skip=0):
        """The loader's batches of `epoch` after the first `skip`."""
        self.loader.set_epoch(epoch)
        for k, (x, y) in enumerate(self.loader):
            if k >= skip:
                yield x, y

    def train(self, epoch, steps, skip=0, counters=None):
        """`steps` optimizer steps on epoch `epoch`'s batches after the first `skip`; per-step
        outputs, and the sim counters of each step appended to `counters`."""
        outputs = []
        for i, (x, y) in enumerate(self.batches(epoch, skip)):
            if i == steps:
                break
            if counters is not None:
                gt.device_counters("sim", reset=True)
            out = self.step(x, y)
            if not out.skipped:
                self.ema.update()
            if counters is not None:
                counters.append(gt.device_counters("sim", reset=True))
            outputs.append((out.loss, out.grad_norm, out.skipped, out.scale))
        return outputs

    def state(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict(), "ema": self.ema.state_dict()}

    def load(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.ema.load_state_dict(state["ema"])


def test_the_loader_hands_the_step_device_batches_from_its_workers():
    x, y = next(iter(Recipe("sim").loader))
    assert isinstance(x, DeviceArray) and isinstance(y, DeviceArray)
    assert x.shape == (BATCH, 12) and y.shape == (BATCH,)


@pytest.mark.parametrize("ema", ["device", "host"])
def test_the_recipe_on_sim_matches_the_cpu_bit_for_bit(ema):
    cpu, sim = Recipe("cpu", ema), Recipe("sim", ema)
    outputs = [run.train(0, 8) + run.train(1, 4) for run in (cpu, sim)]
    assert len(outputs[0]) == 12
    assert_same_bits(outputs[1], outputs[0], "outputs")
    assert_same_bits(sim.state(), cpu.state())
    assert sim.scaler.get_scale() == cpu.scaler.get_scale() and sim.ema.num_updates == cpu.ema.num_updates


DELAYED = """
from test_recipe_sim import Recipe, assert_same_bits
for ema in ("device", "host"):
    cpu, sim = Recipe("cpu", ema), Recipe("sim", ema)
    assert_same_bits(sim.train(0, 6), cpu.train(0, 6), "outputs")
    averaged = []
    for run in (cpu, sim):  # right after an update (no loader call between): the swap averages its copy
        x, y = next(run.batches(1))
        run.step(x, y)
        run.ema.update()
        with run.ema.average_parameters():
            averaged.append(run.model.state_dict())
        run.step(x, y)
        run.ema.update()
        run.ema.copy_to()  # the same for copy_to
    assert_same_bits(averaged[1], averaged[0], "averaged")
    assert_same_bits(sim.state(), cpu.state())
"""


def test_the_recipe_matches_the_cpu_with_random_stream_delays():
    """With the sim streams delayed at random, work that skipped an event wait would read stale
    memory: the next step's forward racing the offload's copies back (copy_stream.c's
    gt_copy_stream_before_compute), or a host EMA averaging its staging before the parameters'
    copy landed (ema.c's wait_staged, when the swap or copy_to right after an update needs the average)."""
    run_with_sim_delays(DELAYED)


@pytest.mark.parametrize("ema", ["device", "host"])
def test_each_recipe_step_after_the_first_waits_once_and_allocates_nothing(ema):
    run = Recipe("sim", ema)
    counters = []
    run.train(0, 6, counters=counters)
    for c in counters[1:]:  # the first step plans the activations and the optimizer's state
        assert c == counters[1]
        # the one wait: the step record's read, which also covers the offloaded gradients' copies
        # (queued before it on the compute stream) and the host EMA's parameter copy of the step
        # before (its average is done at the next update); the copies back wait on an event
        assert c["syncs"] == 1, c
        assert c["allocs"] == 0 and c["frees"] == 0, c


# Under qemu, and in 2 of 5 loaded native runs, the pinned pool once peaked a slot (7,168 B) above
# the plan: the device transfer handed its copies' host slots back lazily, so a lagging copy
# stream let the loader allocate beyond num_workers * prefetch_factor + 2. Each submit now hands
# them back first (transfer.c's reclaim_all; test_loader_cuda.py's never_holds test checks it).
@pytest.mark.parametrize("prefetch_factor", [None, 4], ids=["prefetch 2", "prefetch 4"])
def test_the_recipe_peaks_at_its_plan_the_device_batches_included(prefetch_factor):
    """The plan of the step, its EMA and its device loader is each pool's peak to the byte: the
    pinned slots (num_workers * prefetch_factor + 2) and, on sim, the three device batches of a
    `for` loop (the batch in hand, the one copied ahead, and the previous one still bound while
    the next copy is queued, which happens from the second batch on)."""
    kinds = ("sim:0", "pinned")
    gc.collect()
    gc.disable()  # an unrelated object freed meanwhile would lower the baseline
    try:
        base = {k: gt.memory_stats(k)["reserved_bytes"] for k in kinds}
        run = Recipe("sim", prefetch_factor=prefetch_factor)
        for k in kinds:
            gt.reset_peak_memory_stats(k)
        plan = mp.plan_step(run.step, (BATCH, 12), ema=run.ema, loader=mp.LoaderSpec.of(run.loader))
        run.train(0, 6)
        growth = {k: gt.memory_stats(k)["peak_reserved_bytes"] - base[k] for k in kinds}
    finally:
        gc.enable()
    batch = gt._C.loader_plan(dataset(), BATCH, 2, prefetch_factor or 2, True, device="sim")
    assert plan["sim:0"]["loader_device_batches"] == 3 * batch["device_batch_bytes"] == batch["device_bytes"]
    assert plan["pinned"]["loader_slots"] == (2 * (prefetch_factor or 2) + 2) * batch["slot_bytes"]
    assert growth == {k: plan.total(k) for k in kinds}, str(plan)


def test_a_host_loader_plans_no_device_batches():
    spec = mp.LoaderSpec.of(gt.DataLoader(dataset(), batch_size=BATCH, num_workers=2, pin_memory=True))
    assert spec.device is None
    planned = gt._C.loader_plan(dataset(), BATCH, 2, 2, True)
    assert (planned["device_pool"], planned["device_batches"], planned["device_bytes"]) == (None, 0, 0)
    with pytest.raises(ValueError, match="device"):
        gt._C.loader_plan(dataset(), BATCH, 2, 2, True, device="nowhere:7")


# ------------------------------------------------------------------ checkpoints between sim and CPU


@pytest.mark.parametrize("ema", ["device", "host"])
def test_a_checkpoint_saved_on_sim_continues_on_the_cpu_bit_identically(ema):
    straight = Recipe("cpu", ema)
    expected = straight.train(0, 8)
    first = Recipe("sim", ema)
    head = first.train(0, 4)
    second = Recipe("cpu", ema)
    second.load(first.state())
    assert_same_bits(head + second.train(0, 4, skip=4), expected, "outputs")
    assert_same_bits(second.state(), straight.state())


@pytest.mark.parametrize("ema", ["device", "host"])
def test_a_checkpoint_saved_on_the_cpu_continues_on_sim_bit_identically(ema):
    straight = Recipe("sim", ema)
    expected = straight.train(0, 8)
    first = Recipe("cpu", ema)
    head = first.train(0, 4)
    second = Recipe("sim", ema)
    second.load(first.state())
    assert_same_bits(head + second.train(0, 4, skip=4), expected, "outputs")
    assert_same_bits(second.state(), straight.state())
