"""The loss ops read the loss scale where they run (ops.h: loss_scale, dloss_divisor): a device
step points them at its scaler's scale in device memory (csrc/train/step_device.c's
gt_step_device_scale, queued in before the first loss when the host's scaler differs), and the
gradient's scale f32(scale / micro-batches) is computed there by the CPU's rule
(core/loss_mean.h's gt_dloss_scale). A scale and an accumulation whose quotient is not exact in
fp32 (700 / 3), for the cross-entropy and the MSE, a scale the host changes between steps and an
overflow that backs it off all give the CPU's bits."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from test_sim_step import batch, make_model

nn = gt.nn
pytestmark = pytest.mark.sim
ROWS = 48


def regression_batch(i):
    x, _ = batch(i, ROWS)
    return x, np.random.default_rng(i).standard_normal((ROWS, 7)).astype(np.float32)


def run(device, loss_fn, make_batch, steps=5):
    """fp16 steps, accumulation 3, a scaler of init scale 700 (grown to 1400 at step 2, which overflows) that the host sets to 1001 before
    step 3. The results and the parameters."""
    model = make_model().to(device)
    optimizer = gt.optim.AdamW.for_model(model, lr=3e-3, weight_decay=0.05)
    scaler = gt.amp.GradScaler(init_scale=700.0, growth_interval=2)
    step = gt.TrainStep(model, loss_fn, optimizer, precision="fp16", scaler=scaler, micro_batches=3)
    outputs = []
    for i in range(steps):
        x, y = make_batch(i)
        if i == 2:
            x = x * np.float32(1e6)
        if i == 3:
            scaler.update(1001.0)
        out = step(x, y)
        outputs.append((out.loss, out.skipped, out.scale))
    return outputs, model.compiled.read_parameters()


@pytest.mark.parametrize("loss_fn, make_batch", [(nn.CrossEntropyLoss(label_smoothing=0.1), lambda i: batch(i, ROWS)),
                                                 (nn.MSELoss(), regression_batch)], ids=["xent", "mse"])
def test_a_scale_not_a_power_of_two_over_3_micro_batches_gives_the_cpu_bits(loss_fn, make_batch):
    assert np.float32(700.0) / np.float32(3) != np.float32(700.0) * (np.float32(1) / np.float32(3))
    cpu, sim = run("cpu", loss_fn, make_batch), run("sim", loss_fn, make_batch)
    np.testing.assert_array_equal(np.array(sim[0], dtype=float), np.array(cpu[0], dtype=float))
    np.testing.assert_array_equal(sim[1], cpu[1])
    assert [o[1:] for o in sim[0]] == [(False, 700.0), (False, 700.0), (True, 1400.0), (False, 1001.0),
                                       (False, 1001.0)]
