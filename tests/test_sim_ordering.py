"""Ordering and lifetime on the simulated device "sim", with random delays in every stream
worker (GPUTRAIN_SIM_DELAY_US, read once per process, so each check runs in a fresh
interpreter): a missing event wait or stream synchronisation shows as poisoned (NaN) or stale
values. Each check compares with the CPU bit for bit; the last test shows that the poisoning of
released device batches makes a read through a kept pointer visible."""

from __future__ import annotations

import ctypes
import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gputrain as gt

pytestmark = pytest.mark.sim
TESTS = os.path.dirname(os.path.abspath(__file__))

COMMON = """
import numpy as np, gputrain as gt
from gputrain import _C_testing
nn = gt.nn
"""

LOADER = """
X = np.random.default_rng(0).standard_normal((203, 5, 3)).astype(np.float32)
Y = np.arange(203, dtype=np.int64)
for settings in (dict(num_workers=0), dict(num_workers=2, pin_memory=True)):
    loader = gt.DataLoader((X, Y), batch_size=16, shuffle=True, seed=3, device="sim", **settings)
    for epoch in range(2):
        seen = []
        for xb, yb in loader:
            y = yb.numpy()
            np.testing.assert_array_equal(xb.numpy(), X[y])
            seen.extend(y.tolist())
        assert sorted(seen) == list(range(203))
"""

TRAINING = """
from test_sim_step import run, assert_same_run
for precision in ("fp32", "fp16"):
    options = dict(steps=4, precision=precision, max_grad_norm=0.5, micro_batches=2, overflow_at=2)
    assert_same_run(run("cpu", **options), run("sim", **options))
"""

OFFLOAD = """
rng = np.random.default_rng(0)
sizes = [7, 1000, 33, 70_001, 16]
params = rng.standard_normal(sum(sizes)).astype(np.float32)
grads = rng.standard_normal((4, sum(sizes))).astype(np.float32)
results = []
for device, fraction in (("cpu", 0.0), ("sim:0", 0.5), ("sim:1", 1.0)):
    p = params.copy()
    _C_testing.optimizer_on_device("adamw", device, p, sizes, grads, {"lr": 1e-2, "weight_decay": 0.1}, grad_coef=0.7,
                           cpu_offload_fraction=fraction, offload_chunk_numel=4096)
    results.append(p)
np.testing.assert_array_equal(results[1], results[0])
np.testing.assert_array_equal(results[2], results[0])
"""


def run_with_delays(script: str, delay_us: int = 200) -> None:
    env = dict(os.environ, GPUTRAIN_SIM_DELAY_US=str(delay_us))
    env["PYTHONPATH"] = os.pathsep.join([TESTS, *sys.path])
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(COMMON + script)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def test_loader_batches_arrive_in_order_with_random_delays():
    run_with_delays(LOADER)


def test_training_is_bit_identical_to_the_cpu_with_random_delays():
    run_with_delays(TRAINING)


def test_offload_pipeline_is_bit_identical_to_the_cpu_with_random_delays():
    run_with_delays(OFFLOAD)


def read_raw(address: int, nbytes: int) -> np.ndarray:
    """What a consumer that kept the device pointer reads (sim memory is host memory)."""
    return np.frombuffer(ctypes.string_at(address, nbytes), np.float32)


def test_a_released_device_batch_is_poisoned():
    X = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    it = iter(gt.DataLoader(X, batch_size=8, device="sim"))  # two batches: nothing refills the first
    first = next(it)
    address, nbytes = first.address, first.nbytes
    np.testing.assert_array_equal(first.numpy(), X[:8])  # waits for the copy stream
    np.testing.assert_array_equal(read_raw(address, nbytes), X[:8].ravel())
    del first  # the batch returns to the loader: whatever reads it later is a use after release
    gc.collect()
    np.testing.assert_array_equal(next(it).numpy(), X[8:])  # the copy stream has run the release too
    stale = read_raw(address, nbytes)
    assert np.isnan(stale).all() and (stale.view(np.uint32) == 0xFFFFFFFF).all()
