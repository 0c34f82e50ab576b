"""TrainStep(sync=False) with a GradScaler on sim: the device skips or applies each update from its
inf flag (gt_optimizer_step_deferred: constants from a table indexed by its count of updates, the
lr of every update ahead from the scheduler's lrs_ahead) and updates its own scaler; the host
resolves the steps in order from their records (the optimizer's pinned ring, after an event) —
its scaler, the optimizer's step counts, scheduler.step() when the update ran — waiting only when
7 are unresolved. The fp16 recipe (a huge init_scale so the first steps overflow and back off, a
short growth_interval so it grows, accumulation 4, no-decay groups, warmup + cosine, clipping)
gives the CPU's bits with sync=True, with no wait and no allocation while steps are queued."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _sim_child import run_with_sim_delays
from test_sim_step import batch, make_model

nn = gt.nn
pytestmark = [pytest.mark.sim, pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")]
STEPS = 16
ROWS = 32


def sim_inputs(steps=STEPS):
    X = np.concatenate([batch(i, ROWS)[0] for i in range(steps)])
    Y = np.concatenate([batch(i, ROWS)[1] for i in range(steps)])
    loader = iter(gt.DataLoader((X, Y), batch_size=ROWS, device="sim"))
    return lambda i: next(loader)


def recipe(device, kind, **options):
    model = make_model().to(device)
    groups = gt.optim.param_groups_weight_decay(model, 0.05)
    if kind == "adamw":
        opt = gt.optim.AdamW(groups, lr=3e-3, betas=(0.8, 0.95), **options)
    else:
        opt = gt.optim.SGD(groups, lr=0.05, momentum=0.9, nesterov=True, **options)
    sched = gt.optim.get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=STEPS)
    scaler = gt.amp.GradScaler(init_scale=2.0**24, growth_interval=2)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=4, precision="fp16",
                        max_grad_norm=0.5, scaler=scaler, scheduler=sched, sync=device == "cpu")
    return model, opt, sched, scaler, step


def run(device, kind, steps=STEPS):
    """The outputs (read at the end), parameters, states and each step's sim counters."""
    model, opt, sched, scaler, step = recipe(device, kind)
    inputs = sim_inputs(steps) if device == "sim" else (lambda i: batch(i, ROWS))
    outs, counts = [], []
    for i in range(steps):
        x, y = inputs(i)
        gt.device_counters("sim", reset=True)  # the loader's copies are not the step's
        outs.append(step(x, y))
        counts.append(gt.device_counters("sim", reset=True))
    results = [repr((o.loss, o.grad_norm, o.skipped, o.scale, o.outlier)) for o in outs]
    states = repr((scaler.state_dict(), opt.state_dict(), sched.state_dict(), scaler.skipped_steps))
    return results, model.compiled.read_parameters(), states, counts, [o.skipped for o in outs]


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_the_fp16_recipe_gives_the_cpu_bits_with_no_wait_while_steps_are_queued(kind):
    cpu, sim = run("cpu", kind), run("sim", kind)
    skipped = cpu[4]
    assert skipped[:2] == [True, True] and not all(skipped) and skipped.count(True) >= 3  # backs off, grows back
    assert sim[0] == cpu[0]  # every step's loss, norm, skip and scale
    np.testing.assert_array_equal(sim[1], cpu[1])
    assert sim[2] == cpu[2]  # scaler, optimizer (step counts, moments) and scheduler states
    for c in sim[3][1:7]:  # after the first step (which plans the activations), fewer than 7 in flight
        assert c["syncs"] == 0 and c["allocs"] == 0 and c["frees"] == 0, c


def test_with_delays_the_bits_are_the_same():
    """GPUTRAIN_SIM_DELAY_US (read once by the sim, so in a child): the host resolves steps while
    later ones are still queued on the device's worker."""
    code = ("import numpy as np, test_sim_deferred_scaler as t\n"
            "cpu, sim = t.run('cpu', 'adamw'), t.run('sim', 'adamw')\n"
            "assert sim[0] == cpu[0] and sim[2] == cpu[2], (sim[0], cpu[0])\n"
            "np.testing.assert_array_equal(sim[1], cpu[1])\n")
    run_with_sim_delays(code)


def test_state_dicts_resolve_the_steps_in_flight_first():
    cpu_model, cpu_opt, _, cpu_scaler, cpu_step = recipe("cpu", "adamw")
    model, opt, _, scaler, step = recipe("sim", "adamw")
    inputs = sim_inputs(5)
    for i in range(5):
        cpu_step(*batch(i, ROWS))
        step(*inputs(i))
    assert opt._core.pending >= 1  # the last step at least: done ones are resolved before the next is queued
    assert repr(opt.state_dict()) == repr(cpu_opt.state_dict())
    assert opt._core.pending == 0
    assert scaler.state_dict() == cpu_scaler.state_dict()


def test_refusals_name_the_argument_and_change_nothing():
    model, opt, sched, scaler, _ = recipe("sim", "adamw")
    with pytest.raises(ValueError, match="spike_guard"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), opt, scaler=scaler, spike_guard=gt.SpikeGuard(), sync=False)
    with pytest.raises(ValueError, match="optimizer"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), None, scaler=scaler, sync=False)
    offloaded = gt.optim.AdamW(model.parameters(), cpu_offload_fraction=0.5)
    with pytest.raises(ValueError, match="cpu_offload_fraction"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), offloaded, scaler=scaler, sync=False)

    class Plateau:
        def step(self) -> None: ...

    with pytest.raises(ValueError, match="scheduler"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), opt, scaler=scaler, scheduler=Plateau(), sync=False)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), opt, micro_batches=4, precision="fp16",
                        scaler=scaler, scheduler=sched, sync=False)
    inputs = sim_inputs(3)
    step(*inputs(0))
    scaler.set_growth_factor(3.0)  # mid-flight
    before = (model.compiled.read_parameters(), opt._core.pending)
    with pytest.raises(ValueError, match="scaler"):
        step(*inputs(1))
    np.testing.assert_array_equal(model.compiled.read_parameters(), before[0])
    assert opt._core.pending == before[1] == 1
    step.synchronize()
    assert opt._core.pending == 0
    step(*inputs(2))  # after synchronize() the new factor is the one the steps assume


def test_an_error_of_the_queued_work_surfaces_at_the_next_read_of_the_device():
    model, _, _, _, step = recipe("sim", "adamw")
    X = np.concatenate([batch(i, ROWS)[0] for i in range(2)])
    Y = np.concatenate([batch(i, ROWS)[1] for i in range(2)])
    Y[40] = 99  # step 1's targets: out of range
    loader = iter(gt.DataLoader((X, Y), batch_size=ROWS, device="sim"))
    outs = [step(*next(loader)) for _ in range(2)]
    assert [o.skipped for o in outs] == [True, True]  # init_scale 2**24 overflows both
    with pytest.raises(IndexError, match="targets"):
        model.compiled.read_parameters()
