"""CUDA ops never wait for their stream (issue 11, item 3): ids, targets and lengths are checked by
kernels into the backend's error slot, which the host reads when it next waits (the step's record
read), and the losses' count and sum stay on the device. A CUDA step therefore waits once, like
sim's, and a bad id or target fails at that wait with the CPU's message, before the update.

The `cuda` tests need a GPU (none has run them yet); the source check runs everywhere."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import gputrain as gt
from test_sim_step import batch, make_model

nn = gt.nn
cuda = pytest.mark.cuda
CUDA_DIR = pathlib.Path(__file__).resolve().parent.parent / "cuda"
# The files allowed to wait: the backend's own synchronize/copy (ops_table.cu) and sum_squares,
# whose result is a host value (ops_reduce.cu; a WAIT op of GT_OP_LIST).
MAY_WAIT = {"ops_table.cu", "ops_reduce.cu"}
WAITS = re.compile(r"cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy\(|DeviceToHost|"
                   r"gt_cuda_fixed_order_sum|gt_cuda_add_parts")


def test_cuda_op_files_queue_without_waiting():
    files = sorted(CUDA_DIR.glob("ops_*.cu"))
    assert len(files) > 5
    waiting = {f.name: WAITS.findall(f.read_text()) for f in files if f.name not in MAY_WAIT}
    assert {name: found for name, found in waiting.items() if found} == {}


def counts_per_step(device, step, inputs, steps=3):
    """The device counters of each of `steps` steps after a first one (which plans)."""
    step(*inputs(0))
    out = []
    for i in range(1, steps + 1):
        args = inputs(i)
        gt.device_counters(device, reset=True)
        step(*args)
        out.append(gt.device_counters(device, reset=True))
    return out


@cuda
@pytest.mark.parametrize("precision, accumulation", [("fp32", 1), ("fp16", 4)])
def test_a_cuda_gpt_step_waits_once(precision, accumulation):
    gt.random.manual_seed(0)
    model = gt.models.GPT(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=32).to("cuda")
    optimizer = gt.optim.AdamW(gt.optim.param_groups_weight_decay(model, 0.1), lr=1e-3)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, precision=precision, max_grad_norm=1.0,
                        micro_batches=accumulation,
                        scaler=gt.amp.GradScaler() if precision == "fp16" else None)
    rng = np.random.default_rng(0)
    ids = [(rng.integers(0, 65, (8, 32)), rng.integers(0, 65, (8, 32))) for _ in range(4)]
    for counts in counts_per_step("cuda", step, lambda i: ids[i]):
        assert (counts["syncs"], counts["allocs"], counts["frees"]) == (1, 0, 0)


def embedding_run(device, bad_id_at=None, bad_target_at=None):
    """Per-step losses (or the error's message), the parameters after each step and each step's
    device counters (none on the CPU)."""
    gt.random.manual_seed(5)
    model = nn.Sequential(nn.Embedding(50, 16), nn.LayerNorm(16), nn.Linear(16, 7)).to(device)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-2),
                        micro_batches=2)
    outputs, params, counts = [], [], []
    for i in range(4):
        ids = np.random.default_rng(i).integers(0, 50, 32).astype(np.int64)
        labels = ids % 7
        if i == bad_id_at:
            ids[3] = 50
        if i == bad_target_at:
            labels[5] = 9
        if device != "cpu":
            gt.device_counters(device, reset=True)
        try:
            outputs.append(step(ids, labels).loss)
        except IndexError as e:
            outputs.append(str(e))
        params.append(model.compiled.read_parameters())
        if device != "cpu":
            counts.append(gt.device_counters(device, reset=True))
    return outputs, params, counts


@cuda
@pytest.mark.parametrize("bad, message", [("bad_id_at", "ids[3] = 50 is out of range [0, 50)"),
                                          ("bad_target_at",
                                           "targets[5] = 9 is out of range [0, 7) (ignore_index -100)")])
def test_a_bad_id_or_target_fails_at_the_steps_one_wait_with_the_cpu_message(bad, message):
    cpu, gpu = embedding_run("cpu", **{bad: 2}), embedding_run("cuda", **{bad: 2})
    assert gpu[0][2] == cpu[0][2] == message
    np.testing.assert_array_equal(gpu[1][2], gpu[1][1])  # the failed step updated nothing
    np.testing.assert_allclose(gpu[0][3], cpu[0][3], rtol=1e-4)  # the next step runs normally
    assert [c["syncs"] for c in gpu[2][1:]] == [1, 1, 1]


@cuda
def test_an_mse_step_waits_once_on_cuda():
    model = make_model().to("cuda")
    step = gt.TrainStep(model, nn.MSELoss(), gt.optim.AdamW.for_model(model, lr=3e-3),
                        micro_batches=2)

    def inputs(i):
        x, _ = batch(i, 32)
        return x, np.zeros((32, 7), np.float32)

    for counts in counts_per_step("cuda", step, inputs):
        assert counts["syncs"] == 1
