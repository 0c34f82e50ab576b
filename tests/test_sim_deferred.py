"""TrainStep(sync=False) with clipping: max_grad_norm's coefficient is computed on the device from
the step record's gradient sum of squares and applied to the gradients in place there
(csrc/train/step_device.c's gt_step_device_clip, core/clip_rules.h), so a deferred step still
waits for nothing and gives the CPU's bits. A spike guard is still refused: its next limits are
made from the step's result on the host (a GradScaler: tests/test_sim_deferred_scaler.py)."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from test_device_counters import device_inputs
from test_recipe_sim import ACCUMULATION, Recipe
from test_sim_knobs import assert_same_bits
from test_sim_ordering import run_with_delays
from test_sim_step import batch, make_model

nn = gt.nn
pytestmark = [pytest.mark.sim, pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")]
MAX_NORM = 0.05  # below every step's gradient norm here: each update is clipped


def optimizer_for(model, kind):
    if kind == "adamw":
        return gt.optim.AdamW.for_model(model, lr=3e-3, weight_decay=0.05)
    return gt.optim.SGD.for_model(model, lr=0.1, momentum=0.9, nesterov=True)


def clipped_run(device, kind, steps=5, max_grad_norm=MAX_NORM):
    """Steps on `device` (sync=False with device batches on sim); the last output's (loss, norm),
    the parameters and each step's sim counters (the outputs of earlier steps are dropped unread)."""
    model = make_model().to(device)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer_for(model, kind), micro_batches=4,
                        max_grad_norm=max_grad_norm, sync=device == "cpu")
    inputs = device_inputs() if device == "sim" else (lambda i: batch(i, 32))
    counts = []
    for i in range(steps):
        x, y = inputs(i)
        gt.device_counters("sim", reset=True)
        out = step(x, y)
        counts.append(gt.device_counters("sim", reset=True))
    return (out.loss, out.grad_norm), model.compiled.read_parameters(), counts


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_sync_false_clips_on_the_device_with_the_cpu_bits_and_waits_for_nothing(kind):
    cpu, sim = clipped_run("cpu", kind), clipped_run("sim", kind)
    assert sim[0] == cpu[0] and sim[0][1] > MAX_NORM  # the last step's loss and norm; it was clipped
    np.testing.assert_array_equal(sim[1], cpu[1])
    unclipped = clipped_run("cpu", kind, max_grad_norm=None)
    assert not np.array_equal(unclipped[1], cpu[1])  # the clip changed the parameters
    for c in sim[2][1:]:  # after the first step, which plans the activations
        assert c["syncs"] == 0 and c["allocs"] == 0 and c["frees"] == 0, c


def test_a_deferred_clipped_step_leaves_the_gradients_clipped():
    model = make_model().to("sim")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer_for(model, "adamw"), max_grad_norm=MAX_NORM,
                        sync=False)
    out = step(*device_inputs()(0))
    grads = model.compiled.read_gradients()
    assert out.grad_norm > MAX_NORM
    np.testing.assert_allclose(np.sqrt(np.sum(grads.astype(np.float64) ** 2)), MAX_NORM, rtol=1e-5)


class DeferredRecipe(Recipe):
    """The recipe (no-decay groups, offload, EMA, clipping, accumulation 4) without its GradScaler,
    in bf16, with sync=False on sim; EMA.update() after every step (nothing is skipped)."""

    def __init__(self, device, ema, offload):
        super().__init__(device, ema)
        groups = gt.optim.param_groups_weight_decay(self.model, weight_decay=0.05)
        self.optimizer = gt.optim.AdamW(groups, lr=3e-3, betas=(0.8, 0.95), cpu_offload_fraction=offload)
        self.step = gt.TrainStep(self.model, nn.CrossEntropyLoss(label_smoothing=0.1), self.optimizer,
                                 micro_batches=ACCUMULATION, precision="bf16", max_grad_norm=1.0,
                                 sync=device == "cpu")

    def run(self, steps):
        """The last output's (loss, norm) and the sim counters of each step."""
        counts = []
        for i, (x, y) in enumerate(self.batches(0)):
            if i == steps:
                break
            gt.device_counters("sim", reset=True)
            out = self.step(x, y)
            self.ema.update()
            counts.append(gt.device_counters("sim", reset=True))
        return (out.loss, out.grad_norm), counts


@pytest.mark.parametrize("ema", ["device", "host"])
@pytest.mark.parametrize("offload", [0.0, 0.5])
def test_the_recipe_without_a_scaler_runs_deferred_with_the_cpu_bits(ema, offload):
    cpu, sim = DeferredRecipe("cpu", ema, offload), DeferredRecipe("sim", ema, offload)
    expected, _ = cpu.run(6)
    last, counts = sim.run(6)
    assert last == expected
    assert_same_bits(sim.state(), cpu.state())
    for c in counts[1:]:
        # host work on device data may wait for it, once: the offloaded share's update for its gradients'
        # copy, a host EMA (at its next update, unless the copy is done) for the parameters' copy; a
        # device-only recipe never waits
        host_work = offload > 0 or ema == "host"
        assert c["syncs"] <= int(host_work) and c["allocs"] == 0 and c["frees"] == 0, c


DELAYED = """
from test_sim_deferred import DeferredRecipe, assert_same_bits
for ema, offload in (("device", 0.5), ("host", 0.0)):
    cpu, sim = DeferredRecipe("cpu", ema, offload), DeferredRecipe("sim", ema, offload)
    assert sim.run(5)[0] == cpu.run(5)[0]
    assert_same_bits(sim.state(), cpu.state())
"""


def test_the_deferred_clip_is_ordered_with_random_stream_delays():
    """The clip is queued after the sum of squares it reads and before the update and the offload's
    gradient copies that read its result; with the sim streams delayed at random, work not ordered
    behind it would read unclipped gradients."""
    run_with_delays(DELAYED, delay_us=300)
