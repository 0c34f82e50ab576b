"""gputrain.device_counters: the device interface counts host syncs, launches (its own calls and
every op of the op table it hands out), bytes copied and device allocations the same way for
every backend (csrc/core/device_backend.c); here on "sim", for the MLP of test_sim_step. A device
step queues everything (host inputs copied on the stream, the losses summed on the device, the
scaler's unscale + inf check and the gradient norm into the step record) and waits once: the
read of the record (csrc/train/step_device.c). The loss scaler's state lives on the device, where
its growth/backoff runs; it is copied in only when the host's differs."""

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


RESET = 32        # bytes of zeros queued into the step record (loss sum, norm, count, mse, flag)
RECORD_HEAD = 32  # what the host reads back, once per step
FP16_CLIP = {"max_grad_norm": 0.5, "precision": "fp16", "scaler": True}


@pytest.mark.parametrize("options, launches", [
    ({}, 37),                                                 # 35 per micro-batch (2 of them copies), reset, adamw
    ({"max_grad_norm": 0.5}, 38),                             # + the sum of squares
    (FP16_CLIP, 42),                                          # + 2 casts, unscale, scaler update (no state copy)
    ({"micro_batches": 2}, 72),
    (dict(FP16_CLIP, micro_batches=4), 150),
])
def test_a_step_from_numpy_waits_once_and_allocates_nothing(options, launches):
    x, y = batch(0, ROWS)
    for c in counts_per_step(make_step(**options), lambda i: batch(i, ROWS)):
        assert c["allocs"] == 0 and c["frees"] == 0
        assert c["syncs"] == 1 and c["launches"] == launches
        assert c["h2d_bytes"] == x.nbytes + y.nbytes + RESET  # no scaler state: it stays on the device
        assert c["d2h_bytes"] == RECORD_HEAD
        assert c["d2d_bytes"] == 0


@pytest.mark.parametrize("options, launches", [
    ({}, 35), ({"max_grad_norm": 0.5}, 36), (FP16_CLIP, 40),
    ({"micro_batches": 2}, 68), (dict(FP16_CLIP, micro_batches=4), 142),
])
def test_device_batches_move_no_batch_bytes_in_the_step(options, launches):
    for c in counts_per_step(make_step(**options), device_inputs()):
        assert c["allocs"] == 0 and c["frees"] == 0
        assert c["syncs"] == 1 and c["launches"] == launches
        assert c["h2d_bytes"] == RESET and c["d2h_bytes"] == RECORD_HEAD


def test_every_op_of_the_op_table_counts_as_a_launch():
    step = make_step(micro_batches=2)
    one, = counts_per_step(make_step(), lambda i: batch(i, ROWS), steps=1)
    two, = counts_per_step(step, lambda i: batch(i, ROWS), steps=1)
    per_micro_batch = two["launches"] - one["launches"]
    assert per_micro_batch == 35  # x, y copies; the forward, softmax_xent, the loss sum and the backward ops


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


@pytest.mark.parametrize("precision, accumulation", [("fp32", 1), ("fp16", 4)])
def test_a_gpt_step_waits_once_and_allocates_nothing(precision, accumulation):
    """The issue's GPT step on sim (tied LM head, attention, position embeddings, no-decay groups,
    clipping; fp16 with a GradScaler and accumulation 4): one wait, no allocation per step."""
    gt.random.manual_seed(0)
    model = gt.models.GPT(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32).to("sim")
    optimizer = gt.optim.AdamW(gt.optim.param_groups_weight_decay(model, 0.1), lr=1e-3)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, precision=precision, max_grad_norm=1.0,
                        micro_batches=accumulation,
                        scaler=gt.amp.GradScaler() if precision == "fp16" else None)
    rng = np.random.default_rng(0)
    ids = [(rng.integers(0, 65, (8, 32)), rng.integers(0, 65, (8, 32))) for _ in range(4)]
    for counts in counts_per_step(step, lambda i: ids[i]):
        assert (counts["syncs"], counts["allocs"], counts["frees"], counts["d2h_bytes"]) == (1, 0, 0, RECORD_HEAD)
