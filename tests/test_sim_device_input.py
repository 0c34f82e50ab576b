"""TrainStep and forward read the loader's DeviceArrays where they are on a device model: no host
round trip, the step's stream waits for the batch's copy event, and a batch returns to the loader
only after an event recorded after the step that read it (csrc/data/transfer.c). On "sim" with
random delays in every stream worker, a missing wait shows as poisoned (NaN) values."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain.data.transfer import DeviceArray
from test_sim_ordering import run_with_delays
from test_sim_step import make_model

nn = gt.nn
pytestmark = pytest.mark.sim

# No clipping, no grad-norm log, no scaler: the step returns with its backward (which reads x)
# still queued, so the batch's release races with it unless the copy stream waits for the step.
LOADER_VS_NUMPY = """
import sys
from test_sim_step import make_model
rng = np.random.default_rng(0)
X = rng.standard_normal((256, 12)).astype(np.float32)
Y = rng.integers(0, 7, 256).astype(np.int64)

def train(device, accumulation, precision):
    model = make_model().to("sim")
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=3e-3),
                        micro_batches=accumulation, precision=precision)
    loader = gt.DataLoader((X, Y), batch_size=32, shuffle=True, seed=1, device=device, num_workers=1)
    losses = [step(xb, yb).loss for epoch in range(3) for xb, yb in loader]
    return losses, model.compiled.read_parameters()

for accumulation, precision in ((1, "fp32"), (2, "bf16")):
    (loss_d, params_d), (loss_h, params_h) = train("sim", accumulation, precision), train(None, accumulation, precision)
    assert np.isfinite(params_d).all(), "poisoned parameters: a batch was released before the step read it"
    np.testing.assert_array_equal(loss_d, loss_h)
    np.testing.assert_array_equal(params_d, params_h)
"""


def test_device_batches_train_bit_identically_to_numpy_with_random_delays():
    run_with_delays(LOADER_VS_NUMPY)


def device_batch(device="sim", n=16):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n, 12)).astype(np.float32)
    Y = rng.integers(0, 7, n).astype(np.int64)
    xb, yb = next(iter(gt.DataLoader((X, Y), batch_size=n, device=device)))
    return X, Y, xb, yb


def test_forward_reads_a_device_array_as_its_numpy_copy():
    model = make_model().to("sim")
    X, _, xb, _ = device_batch()
    np.testing.assert_array_equal(model(xb), model(X))


def make_step(device="sim"):
    model = make_model().to(device)
    return gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=1e-3)), model


@pytest.mark.parametrize("case, error, words", [
    ("x on sim:1", ValueError, ["x: a DeviceArray on sim:1", "model is on sim:0"]),
    ("y on sim:1", ValueError, ["y: a DeviceArray on sim:1"]),
    ("x int64", TypeError, ["x: expected a DeviceArray of float32", "int64"]),
    ("y float32", TypeError, ["y: expected a DeviceArray of int64"]),
])
def test_a_device_array_of_another_device_or_dtype_is_refused_naming_it(case, error, words):
    step, model = make_step()
    before = model.compiled.read_parameters()
    X, Y, xb, yb = device_batch()
    _, _, xb1, yb1 = device_batch("sim:1")
    args = {"x on sim:1": (xb1, yb), "y on sim:1": (xb, yb1), "x int64": (yb, yb), "y float32": (xb, xb)}[case]
    with pytest.raises(error) as info:
        step(*args)
    for word in words:
        assert word in str(info.value)
    np.testing.assert_array_equal(model.compiled.read_parameters(), before)
    assert np.isfinite(step(xb, yb).loss)  # the step still works after the refusal


def test_a_device_array_of_another_shape_is_refused_naming_it():
    step, _ = make_step()
    X, Y, xb, yb = device_batch(n=16)
    _, _, _, yb8 = device_batch(n=8)
    with pytest.raises(ValueError, match="rows"):
        step(xb, yb8)
    narrow = DeviceArray(xb._owner, 0, (16, 5), np.dtype(np.float32), "sim", 0)  # the model takes 12 features
    with pytest.raises(ValueError, match="x"):
        make_model().to("sim")(narrow)
    outside = DeviceArray(xb._owner, 0, (16, 100), np.dtype(np.float32), "sim", 0)
    with pytest.raises(ValueError, match="x: the DeviceArray's 6400 bytes at offset 0 lie outside"):
        step(outside, yb)


def test_a_cpu_model_refuses_a_device_array():
    step, _ = make_step("cpu")
    _, _, xb, yb = device_batch()
    with pytest.raises(ValueError, match="x: a DeviceArray on sim:0, but the model is on cpu"):
        step(xb, yb)
