"""The device step waits once per optimizer step (csrc/train/step.c, step_device.c): host inputs
are copied on the stream, each micro-batch's mean loss is summed on the device, the scaler's
unscale + inf check and the gradient norm land in the step record, and the host reads that
record back once. On "sim" the results stay bit-identical to the CPU, an overflow is skipped as
there, and an error of the queued work (a target out of range) surfaces at the read, before the
update."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from test_sim_ordering import run_with_delays
from test_sim_step import batch, make_model

nn = gt.nn
pytestmark = pytest.mark.sim


def train(device, steps, loss_fn, make_batch, precision="fp32", overflow_at=None, bad_target_at=None, **options):
    """Per-step results (an exception's type for a refused step), the parameters, the scaler's
    scale and the sim counters of each step."""
    model = make_model().to(device)
    optimizer = gt.optim.AdamW.for_model(model, lr=3e-3, betas=(0.8, 0.95), weight_decay=0.05)
    scaler = gt.amp.GradScaler(init_scale=2.0**12, growth_interval=2) if precision == "fp16" else None
    step = gt.TrainStep(model, loss_fn, optimizer, precision=precision, scaler=scaler, **options)
    outputs, counts = [], []
    for i in range(steps):
        x, y = make_batch(i)
        if i == overflow_at:
            x = x * np.float32(1e6)
        if i == bad_target_at:
            y = y.copy()
            y[5] = 9  # the model has 7 classes
        gt.device_counters("sim", reset=True)
        try:
            outputs.append(step(x, y))
        except IndexError:
            outputs.append(IndexError)
        counts.append(gt.device_counters("sim", reset=True))
    return outputs, model.compiled.read_parameters(), scaler.get_scale() if scaler else None, counts


def assert_same(cpu, sim):
    assert [o is IndexError for o in sim[0]] == [o is IndexError for o in cpu[0]]
    for field in ("loss", "grad_norm", "skipped", "scale"):  # NaN (an overflow's loss) equals NaN
        np.testing.assert_array_equal([getattr(o, field, 0) for o in sim[0]], [getattr(o, field, 0) for o in cpu[0]],
                                      err_msg=field)
    np.testing.assert_array_equal(sim[1], cpu[1])
    assert sim[2] == cpu[2]


def test_fp16_accumulation_4_with_an_overflow_waits_once_per_step_and_matches_the_cpu():
    options = dict(precision="fp16", max_grad_norm=0.5, micro_batches=4, overflow_at=2)
    xent = nn.CrossEntropyLoss(label_smoothing=0.1)
    cpu, sim = (train(d, 5, xent, lambda i: batch(i, 64), **options) for d in ("cpu", "sim"))
    assert_same(cpu, sim)
    assert [o.skipped for o in sim[0]] == [False, False, True, False, False]
    assert sim[2] != 2.0**12  # the scaler backed off (and grew again) as on the CPU
    for c in sim[3][1:]:  # after the first step, which plans the activations
        assert c["syncs"] == 1 and c["allocs"] == 0 and c["frees"] == 0


def test_an_mse_loss_is_summed_on_the_device_with_the_cpu_bits():
    def regression_batch(i):
        x, _ = batch(i)
        return x, np.random.default_rng(i).standard_normal((32, 7)).astype(np.float32)
    cpu, sim = (train(d, 4, nn.MSELoss(), regression_batch, micro_batches=2) for d in ("cpu", "sim"))
    assert_same(cpu, sim)
    assert all(c["syncs"] == 1 for c in sim[3][1:])


def test_a_target_out_of_range_fails_at_the_read_before_the_update():
    options = dict(precision="fp16", max_grad_norm=0.5, micro_batches=2, bad_target_at=1)
    xent = nn.CrossEntropyLoss()
    cpu, sim = (train(d, 3, xent, batch, **options) for d in ("cpu", "sim"))
    assert sim[0][1] is IndexError
    assert_same(cpu, sim)  # nothing of the refused step was applied: the next one matches the CPU's


ACCUMULATION = """
from test_sim_one_sync import train, assert_same, batch
options = dict(precision="fp16", max_grad_norm=0.5, micro_batches=4, overflow_at=1)
xent = nn.CrossEntropyLoss()
assert_same(*(train(d, 3, xent, lambda i: batch(i, 64), **options) for d in ("cpu", "sim")))
"""


def test_queued_input_copies_are_ordered_with_random_delays():
    run_with_delays(ACCUMULATION)


def deferred_run(device, steps, keep, precision="fp32"):
    """Steps with sync=False on `device` (device batches on sim), keeping the outputs of the steps
    in `keep` only; returns them, the parameters and each step's counters."""
    from test_device_counters import device_inputs
    model = make_model().to(device)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=3e-3), precision=precision,
                        micro_batches=4, log_grad_norm=True, sync=False)
    inputs = device_inputs() if device == "sim" else (lambda i: batch(i, 32))
    kept, counts = {}, []
    for i in range(steps):
        x, y = inputs(i)
        gt.device_counters("sim", reset=True)
        out = step(x, y)
        counts.append(gt.device_counters("sim", reset=True))
        if i in keep:
            kept[i] = out
        del out
    return {i: (o.loss, o.grad_norm) for i, o in kept.items()}, model.compiled.read_parameters(), counts


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sync_false_waits_for_nothing_and_reads_the_result_when_asked(precision):
    cpu = deferred_run("cpu", 6, keep=range(6), precision=precision)
    sim = deferred_run("sim", 6, keep={5}, precision=precision)
    assert sim[0] == {5: cpu[0][5]}
    np.testing.assert_array_equal(sim[1], cpu[1])
    for c in sim[2][1:]:
        assert c["syncs"] == 0 and c["allocs"] == 0 and c["frees"] == 0


def test_sync_false_reads_a_kept_result_before_its_record_is_reused():
    cpu, sim = deferred_run("cpu", 5, keep=range(5)), deferred_run("sim", 5, keep=range(5))
    assert sim[0] == cpu[0]  # every step's loss and norm, although the device keeps two records
    assert [c["syncs"] for c in sim[2]] == [0, 0, 1, 1, 1]  # step k reads step k - 2's kept output


def test_sync_false_refuses_what_needs_the_result_on_the_host():
    model = make_model().to("sim")
    optimizer = gt.optim.AdamW.for_model(model)
    with pytest.raises(ValueError, match="spike_guard: sync=False cannot take a spike guard"):
        gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, sync=False, spike_guard=gt.SpikeGuard())
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, sync=False)
    before = model.compiled.read_parameters()
    with pytest.raises(ValueError, match="x: sync=False takes DeviceArrays"):
        step(*batch(0))
    np.testing.assert_array_equal(model.compiled.read_parameters(), before)


def embedding_run(device, bad_id_at=None):
    gt.random.manual_seed(5)
    model = nn.Sequential(nn.Embedding(50, 16), nn.LayerNorm(16), nn.Linear(16, 7)).to(device)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-2),
                        micro_batches=2)
    outputs, syncs = [], []
    for i in range(4):
        ids = np.random.default_rng(i).integers(0, 50, 32).astype(np.int64)
        labels = ids % 7
        if i == bad_id_at:
            ids[3] = 50
        gt.device_counters("sim", reset=True)
        try:
            outputs.append(step(ids, labels).loss)
        except IndexError as e:
            outputs.append(str(e))
        syncs.append(gt.device_counters("sim")["syncs"])
    return outputs, model.compiled.read_parameters(), syncs


def test_an_embedding_model_waits_once_and_a_bad_id_fails_before_the_update():
    cpu, sim = embedding_run("cpu", bad_id_at=2), embedding_run("sim", bad_id_at=2)
    assert sim[0] == cpu[0] and sim[0][2] == "ids[3] = 50 is out of range [0, 50)"
    np.testing.assert_array_equal(sim[1], cpu[1])
    assert sim[2][1:] == [1, 1, 1]
