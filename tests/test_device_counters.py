"""gputrain.device_counters: the device interface counts host syncs, launches, bytes copied and
device allocations the same way for every backend (csrc/core/device_backend.c); here on "sim",
for the MLP of test_sim_step. The sync counts pin where the current device step waits:
one blocking copy per host input and target, one loss read-back per micro-batch, the
gradient-norm read when clipping, and the scaler's copy-in and found_inf read-back."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from test_sim_step import batch, make_model

nn = gt.nn
pytestmark = pytest.mark.sim
ROWS = 32


def make_step(precision="fp32", scaler=False, **options):
    model = make_model().to("sim")
    return gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=3e-3), precision=precision,
                        scaler=gt.amp.GradScaler() if scaler else None, **options)


def counts_per_step(step, inputs, steps=3):
    """The counters of each of `steps` steps after a first one (which plans the activations)."""
    step(*inputs(0))
    gt.device_counters("sim", reset=True)
    out = []
    for i in range(1, steps + 1):
        args = inputs(i)
        gt.device_counters("sim", reset=True)  # the loader's copies are not the step's
        step(*args)
        out.append(gt.device_counters("sim", reset=True))
    return out


def device_inputs():
    X = np.concatenate([batch(i, ROWS)[0] for i in range(8)])
    Y = np.concatenate([batch(i, ROWS)[1] for i in range(8)])
    loader = iter(gt.DataLoader((X, Y), batch_size=ROWS, device="sim"))
    return lambda i: next(loader)


@pytest.mark.parametrize("options, syncs, launches, h2d_extra, d2h_extra", [
    ({}, 3, 1, 0, 0),                                          # x, y copies; loss read-back; adamw
    ({"max_grad_norm": 0.5}, 4, 2, 0, 0),                      # + the gradient norm's read
    ({"max_grad_norm": 0.5, "precision": "fp16", "scaler": True}, 6, 3, 64, 4),  # + scaler in, found_inf out
    ({"gradient_accumulation_steps": 2}, 6, 1, 0, 0),          # x, y, loss per micro-batch
])
def test_counts_per_step_with_numpy_inputs(options, syncs, launches, h2d_extra, d2h_extra):
    x, y = batch(0, ROWS)
    for c in counts_per_step(make_step(**options), lambda i: batch(i, ROWS)):
        assert c["allocs"] == 0 and c["frees"] == 0
        assert c["syncs"] == syncs and c["launches"] == launches
        assert c["h2d_bytes"] == x.nbytes + y.nbytes + h2d_extra
        assert c["d2h_bytes"] == ROWS * 4 + d2h_extra  # the per-row losses
        assert c["d2d_bytes"] == 0


@pytest.mark.parametrize("options, syncs", [({}, 1), ({"max_grad_norm": 0.5}, 2), ({"gradient_accumulation_steps": 2}, 2)])
def test_device_batches_move_no_bytes_to_the_device_in_the_step(options, syncs):
    for c in counts_per_step(make_step(**options), device_inputs()):
        assert c["allocs"] == 0 and c["frees"] == 0
        assert c["h2d_bytes"] == 0 and c["syncs"] == syncs
        assert c["d2h_bytes"] == ROWS * 4


def test_the_loader_counts_its_copies_and_allocations():
    X = np.zeros((64, 12), np.float32)
    gt.device_counters("sim", reset=True)
    it = iter(gt.DataLoader(X, batch_size=16, device="sim"))
    first = next(it)  # this batch and the next one are copied (one ahead)
    c = gt.device_counters("sim")
    assert c["allocs"] == 2 and c["launches"] >= 2 and c["h2d_bytes"] == 2 * first.nbytes
    del first, it


def test_reset_zeroes_and_devices_are_counted_apart():
    make_step()(*batch(0, ROWS))
    gt.device_counters("sim:1", reset=True)
    assert gt.device_counters("sim:0", reset=True)["syncs"] > 0
    assert set(gt.device_counters("sim:0").values()) == {0}
    make_step()(*batch(0, ROWS))
    assert set(gt.device_counters("sim:1").values()) == {0}


def test_counters_need_an_accelerator():
    with pytest.raises(ValueError, match="device: counters are kept for accelerators"):
        gt.device_counters("cpu")
