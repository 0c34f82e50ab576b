"""The loss scaler's state on the device (csrc/train/step_device.c): a device model keeps it in
its step scratch, where the unscale reads it and its growth/backoff runs (core/scaler_rules.h,
the CPU's rules) behind the inf check, so a step copies no scaler state in. The host's
GradScaler makes the same update from the record's inf flag; whenever the two may differ (the
host changed the scaler, a spike guard skipped the host's update, another scaler is used, a
step failed) the next step copies the host's state in first. Every case gives the CPU's bits."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from test_sim_step import batch, make_model

nn = gt.nn
pytestmark = pytest.mark.sim
SCALER_BYTES = 56  # the state copied in when the device's is not known to equal the host's


def run(device, changes, steps=7, overflow_at=2, guard=None):
    """fp16 steps with a GradScaler (growth every 2 finite steps, an overflow at `overflow_at`);
    before step i, changes[i](scaler) if given. Results, parameters, scaler state and the scaler
    bytes each step copied in (sim)."""
    model = make_model().to(device)
    optimizer = gt.optim.AdamW.for_model(model, lr=3e-3)
    scaler = gt.amp.GradScaler(init_scale=2.0**12, growth_interval=2)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, precision="fp16", scaler=scaler,
                        micro_batches=2, spike_guard=guard)
    outputs, copied = [], []
    for i in range(steps):
        x, y = batch(i)
        if i == overflow_at:
            x = x * np.float32(1e6)
        if i in changes:
            changes[i](scaler)
        gt.device_counters("sim", reset=True)
        out = step(x, y)
        outputs.append((out.loss, out.skipped, out.scale, out.outlier))
        copied.append(gt.device_counters("sim")["h2d_bytes"] - x.nbytes - y.nbytes - 32)
    return outputs, model.compiled.read_parameters(), scaler.state_dict(), copied


def assert_same(cpu, sim):
    np.testing.assert_array_equal(np.array(sim[0], dtype=float), np.array(cpu[0], dtype=float))
    np.testing.assert_array_equal(sim[1], cpu[1])
    assert sim[2] == cpu[2]


def test_the_scaler_backs_off_and_grows_on_the_device_and_is_copied_in_once():
    cpu, sim = run("cpu", {}), run("sim", {})
    assert_same(cpu, sim)
    assert [o[1] for o in sim[0]] == [False, False, True, False, False, False, False]
    assert [o[2] for o in sim[0]] == [2.0**12, 2.0**12, 2.0**13, 2.0**12, 2.0**12, 2.0**13, 2.0**13]  # grew, backed off
    assert sim[3] == [SCALER_BYTES] + [0] * 6


def test_a_scaler_the_host_changed_is_copied_in_before_the_next_step():
    changes = {3: lambda s: s.update(2.0**5), 5: lambda s: s.load_state_dict(
        dict(s.state_dict(), scale=2.0**9, _growth_tracker=1))}
    cpu, sim = run("cpu", changes), run("sim", changes)
    assert_same(cpu, sim)
    assert sim[0][3][2] == 2.0**5 and sim[0][5][2] == 2.0**9
    assert sim[3] == [SCALER_BYTES, 0, 0, SCALER_BYTES, 0, SCALER_BYTES, 0]


def test_a_spike_guards_skipped_scaler_update_is_undone_by_the_next_copy():
    """An outlier leaves the host's scaler as it was, while the device's update already ran."""
    def guarded(device):
        guard = gt.SpikeGuard(window=2, z_loss=0.01, z_grad_norm=None)
        return run(device, {}, steps=6, overflow_at=None, guard=guard)
    cpu, sim = guarded("cpu"), guarded("sim")
    assert_same(cpu, sim)
    outliers = [i for i, o in enumerate(sim[0][:-1]) if o[3]]
    assert outliers
    assert all(sim[3][i + 1] == SCALER_BYTES for i in outliers)
