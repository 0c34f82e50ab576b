"""The deferred optimizer update (gt_optimizer_step_deferred, through the test harness
`_C_testing.optimizer_deferred_on_device`): the update is skipped on the device where the step's inf
flag is set and takes its constants (AdamW's bias corrections, SGD's first step, the lr of a
schedule) from a table indexed by the device's count of applied updates, while the host learns
the skips up to GT_OPTIM_RING - 1 steps late. The result must be the CPU optimizer's bits over
the updates that ran, with the lr of update u = schedule[u], and no wait or allocation per step."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C
from gputrain import _C_testing
from gputrain.nn import Parameter
from gputrain.optim import SGD, AdamW, get_cosine_schedule_with_warmup

from _optim_reference import ulp_diff
from _sim_child import run_with_sim_delays

DEVICES = [pytest.param("cuda:0", marks=pytest.mark.cuda), pytest.param("sim:0", marks=pytest.mark.sim)]
SIZES = [7, 1000, 33, 5001, 16]
RING = 8  # GT_OPTIM_RING
FLAGS = [1, 1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]  # the first steps overflow, as with a large init_scale
CASES = [
    ("adamw", "exact", {"lr": 1e-2, "weight_decay": 0.1}),
    ("adamw", "fast", {"lr": 1e-2, "betas": (0.8, 0.95), "weight_decay": 0.0}),
    ("adamw", "exact", {"lr": 1e-3, "amsgrad": True, "maximize": True, "weight_decay": 0.01}),
    ("sgd", "exact", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}),
    ("sgd", "exact", {"lr": 0.05, "momentum": 0.5, "dampening": 0.2}),
]


def data(steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    total = sum(SIZES)
    return rng.standard_normal(total).astype(np.float32), rng.standard_normal((steps, total)).astype(np.float32)


def schedule(n: int, base: float) -> np.ndarray:
    """lr of update u under warmup + cosine, as the scheduler's look-ahead gives it."""
    opt = SGD([Parameter(np.zeros(1, np.float32))], lr=base)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=3, num_training_steps=n)
    return np.array([row[0] for row in sched.lrs_ahead(n + RING)])


def reference(kind, numerics, hparams, flags, lrs=None) -> tuple[np.ndarray, int]:
    """The CPU optimizer over the steps whose flag is 0, update u at lrs[u]."""
    flat, grads = data(len(flags))
    starts = np.cumsum([0] + SIZES)
    params = [Parameter(flat[a:b].copy()) for a, b in zip(starts[:-1], starts[1:])]
    opt = AdamW(params, numerics=numerics, **hparams) if kind == "adamw" else SGD(params, **hparams)
    applied = 0
    for step, flag in enumerate(flags):
        if flag:
            continue
        if lrs is not None:
            opt.param_groups[0]["lr"] = float(lrs[applied])
        for p, a, b in zip(params, starts[:-1], starts[1:]):
            p.grad = grads[step, a:b].copy()
        opt.step()
        applied += 1
    return np.concatenate([p.data for p in params]), applied


def deferred(kind, numerics, hparams, flags, device="sim:0", **options) -> tuple[np.ndarray, int]:
    params, grads = data(len(flags))
    num_steps = _C_testing.optimizer_deferred_on_device(kind, device, params, SIZES, grads, hparams, flags,
                                                numerics=numerics, **options)
    return params, num_steps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, numerics, hparams", CASES)
@pytest.mark.parametrize("lag", [1, 3, RING - 1])
def test_skips_on_the_device_give_the_cpu_bits(device, kind, numerics, hparams, lag):
    expected, applied = reference(kind, numerics, hparams, FLAGS)
    result, num_steps = deferred(kind, numerics, hparams, FLAGS, device, lag=lag)
    assert num_steps == applied
    assert ulp_diff(result, expected) == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind, numerics, hparams", [CASES[0], CASES[3]])
def test_a_schedule_follows_the_updates_that_ran(device, kind, numerics, hparams):
    lrs = schedule(len(FLAGS), hparams["lr"])
    expected, _ = reference(kind, numerics, hparams, FLAGS, lrs)
    result, _ = deferred(kind, numerics, hparams, FLAGS, device, lr_schedule=lrs, lag=RING - 1)
    assert ulp_diff(result, expected) == 0
    shifted, _ = deferred(kind, numerics, hparams, FLAGS, device, lr_schedule=lrs[1:], lag=RING - 1)
    assert ulp_diff(shifted, expected) != 0  # the table's lr does reach the update


@pytest.mark.sim
def test_with_delays_the_bits_are_the_same():
    """Stream workers delayed at random (read once per process: a child runs it): the table's copy,
    the updates and the count keep their stream order whatever the host does meanwhile."""
    code = ("import test_sim_deferred_update as t\n"
            "from _optim_reference import ulp_diff\n"
            "for case in (t.CASES[0], t.CASES[3]):\n"
            "    lrs = t.schedule(len(t.FLAGS), case[2]['lr'])\n"
            "    expected, _ = t.reference(*case, t.FLAGS, lrs)\n"
            "    result, _ = t.deferred(*case, t.FLAGS, lr_schedule=lrs, lag=t.RING - 1)\n"
            "    assert ulp_diff(result, expected) == 0\n")
    run_with_sim_delays(code)


def counters(steps: int) -> dict:
    flags = (FLAGS * 2)[:steps]
    _C_testing.device_counters("sim", reset=True)
    deferred("adamw", "exact", CASES[0][2], flags, lag=RING - 1)
    return _C_testing.device_counters("sim", reset=True)


@pytest.mark.sim
def test_no_wait_and_no_allocation_per_step():
    short, long = counters(2), counters(RING - 1)  # lag RING - 1: nothing resolved before the end
    assert long["syncs"] - short["syncs"] == RING - 3  # at the end, one event wait per step to resolve
    assert long["allocs"] == short["allocs"]
    per_step = (long["launches"] - short["launches"]) / (RING - 3)
    assert per_step == 4  # the table's copy, one update kernel (one run), the count, the result's copy


@pytest.mark.sim
def test_bad_arguments():
    params, grads = data(3)
    with pytest.raises(ValueError, match="lag"):
        _C_testing.optimizer_deferred_on_device("sgd", "sim:0", params, SIZES, grads, {}, [0, 0, 0], lag=RING + 1)
    with pytest.raises(ValueError, match="found_inf"):
        _C_testing.optimizer_deferred_on_device("sgd", "sim:0", params, SIZES, grads, {}, [0, 0])
    with pytest.raises(ValueError, match="lr_schedule"):
        _C_testing.optimizer_deferred_on_device("sgd", "sim:0", params, SIZES, grads, {}, [0, 0, 0], lr_schedule=[0.1])
    with pytest.raises(ValueError, match=r"lrs\[0\]\[0\]"):
        _C_testing.optimizer_deferred_on_device("sgd", "sim:0", params, SIZES, grads, {}, [0, 0, 0],
                                        lr_schedule=[-1.0] * 20)
    with pytest.raises(ValueError, match="accelerator"):
        _C_testing.optimizer_deferred_on_device("sgd", "cpu", params, SIZES, grads, {}, [0, 0, 0])


@pytest.mark.sim
@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_every_device_optimizer_that_may_defer_plans_its_table_per_group(kind):
    # The table is part of the device arena of every optimizer that may run deferred steps (whole
    # state on the device), a row per group: the plan with the real groups is what it allocates.
    model = gt.nn.Sequential(gt.nn.Linear(6, 5), gt.nn.LayerNorm(5), gt.nn.Linear(5, 2)).to("sim")
    groups = gt.optim.param_groups_weight_decay(model, 0.1)
    groups = [groups[0], {"params": groups[1]["params"][:1]}, {"params": groups[1]["params"][1:]}]
    make = AdamW if kind == "adamw" else SGD
    built = make(groups, lr=0.01).memory()
    numels = [p.numel() for group in groups for p in group["params"]]
    planned = _C.optimizer_plan(kind, numels, [{}] * 3, device="sim:0")
    assert planned["device_bytes"] == built["device_bytes"]
    assert planned["pinned_bytes"] == built["host_bytes"] == RING * 64  # the ring of the steps' results
    one_group = _C.optimizer_plan(kind, numels, [{}], device="sim:0")["device_bytes"]
    assert one_group < built["device_bytes"]  # three rows of constants need more than one
    offloaded = _C.optimizer_plan(kind, numels, [{}] * 3, device="sim:0", cpu_offload_fraction=1.0)
    assert offloaded["device_bytes"] == 0  # an offloaded optimizer cannot defer: no table, no ring
    assert offloaded["pinned_bytes"] == _C.optimizer_plan(kind, numels, [{}] * 3, cpu_offload_fraction=1.0)[
        "pinned_bytes"]
