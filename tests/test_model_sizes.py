"""Sizes too large for any memory: every byte count of a model and of its plan is overflow-checked
(csrc/core/alloc.h gt_size_*), so huge layers and batch shapes raise OutOfMemoryError or
ValueError before anything is allocated, instead of wrapping around to a small size (a segfault
on the first use, a 160-byte plan for a 2**62-row batch, or a 16 GiB memset before failing)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C

nn = gt.nn
OOM = gt.OutOfMemoryError


@pytest.fixture
def memory_limit():
    """Sets a CPU memory limit for the test; removes it afterwards."""
    yield lambda limit: gt.set_memory_limit(limit, "cpu")
    gt.set_memory_limit(None, "cpu")


def test_the_reported_huge_layers_raise_instead_of_crashing_in_a_child_process():
    code = textwrap.dedent("""
        import gputrain as gt
        nn = gt.nn
        for text in ["nn.Linear(2**31, 2**31, bias=False)", "nn.Linear(2**32, 2**30, bias=False)",
                     "nn.Embedding(2**32, 2**30)", "nn.Linear(2**31, 2**31)"]:
            try:
                eval(text)
            except (ValueError, gt.OutOfMemoryError) as e:
                print(type(e).__name__)
            else:
                print("built", text)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.split() == ["ValueError", "ValueError", "OutOfMemoryError", "ValueError"]


@pytest.mark.parametrize("make, error, match", [
    (lambda: nn.Linear(2**31, 2**31, bias=False), ValueError,
     r"in_features: 2147483648 is more than 2147483647, the largest matrix dimension .*Linear\(2147483648, "),
    (lambda: nn.Linear(2**32, 2**30, bias=False), ValueError, "in_features: 4294967296"),
    (lambda: nn.Linear(2**31, 2**31), ValueError, "in_features"),
    (lambda: nn.Linear(4, 2**31), ValueError, "out_features: 2147483648"),
    (lambda: nn.Embedding(2**32, 2**30), OOM, r"parameters of Embedding\(4294967296, 1073741824\): the size overflows"),
    (lambda: nn.Embedding(2**31, 2**31), OOM, "overflows"),
    (lambda: nn.LayerNorm(2**62), OOM, r"parameters of LayerNorm\(4611686018427387904\)"),
    (lambda: _C.Model([("embedding", 2**30, 2**29)] * 4, 0), OOM, "overflows"),  # only the sum overflows
    (lambda: _C.Model([("linear", 2**31 - 1, 2**31 - 1, True)] * 3, 0), OOM, "overflows"),
])
def test_huge_layers_raise_before_allocating_anything(make, error, match):
    before = gt.memory_stats("cpu")
    with pytest.raises(error, match=match):
        make()
    after = gt.memory_stats("cpu")
    assert after["num_allocs"] == before["num_allocs"] and after["peak_reserved_bytes"] == before["peak_reserved_bytes"]


def small_step(model=None, steps=1):
    gt.random.manual_seed(0)
    model = model or nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    return gt.TrainStep(model, nn.CrossEntropyLoss(), micro_batches=steps)


@pytest.mark.parametrize("shape, error, match", [
    ((2**62, 4), OOM, "shape: the buffers for a batch of this shape: the size overflows"),
    ((2**61, 4), OOM, "overflows"),
    ((2**40, 4), ValueError, r"shape: 1099511627776 rows per micro-batch are more than the GEMMs of layer '0' "
                             r"\(Linear\(4, 8\)\) can take \(2147483647\); use a smaller batch or more "
                             "micro_batches"),
    ((2**70, 4), OOM, r"shape\[0\]: .* too large"),
    ((4, 2**62), OOM, "overflows"),
])
def test_memory_plan_of_a_huge_batch_raises(shape, error, match):
    step = small_step()
    with pytest.raises(error, match=match):
        step.memory_plan(shape)


def test_memory_plan_of_a_huge_batch_without_gemms_overflows_in_the_activations():
    step = small_step(nn.Sequential(nn.LayerNorm(4), nn.Tanh()))
    with pytest.raises(OOM, match="overflows"):
        step.memory_plan((2**60, 4))
    step = small_step(nn.Sequential(nn.Flatten(), nn.Linear(4, 3)))
    with pytest.raises(OOM, match="Flatten"):
        step.model.compiled.plan((0, 2**40, 2**40))
    step = small_step(nn.Sequential(nn.Embedding(10, 2**20), nn.Tanh()))
    with pytest.raises(OOM, match="activations of layer '0'"):
        step.memory_plan((2**42,))


def test_memory_plan_splits_into_micro_batches_before_checking_the_gemm_limit():
    plan = small_step(steps=2**10).memory_plan((2**30, 4))
    assert plan["activations"] > 2**20 * 8 * 4 and plan["total"] > plan["activations"]


def test_a_failed_plan_leaves_the_model_planned_and_working():
    step = small_step()
    x, y = np.ones((6, 4), np.float32), np.arange(6) % 3
    step(x, y)
    model = step.model
    out, plan = model(x), model.compiled.current_plan
    for shape in [(2**62, 4), (2**40, 4), (6, 5)]:
        with pytest.raises((ValueError, OOM)):
            step.memory_plan(shape)
    assert model.compiled.current_plan == plan
    np.testing.assert_array_equal(model(x), out)
    step(x, y)


@pytest.mark.parametrize("steps", [1, 2])
def test_a_huge_broadcast_batch_is_refused_before_it_is_copied(steps):
    """A (2**40, 4) view of one row is 16 TiB once copied: the plan refuses the micro-batch first."""
    step = small_step(steps=steps)
    x = np.broadcast_to(np.ones((1, 4), np.float32), (2**40, 4))
    y = np.broadcast_to(np.zeros(1, np.int64), (2**40,))
    with pytest.raises(ValueError, match="x: .* rows per micro-batch are more than the GEMMs"):
        step(x, y)
    with pytest.raises(ValueError, match="x: .* rows per micro-batch"):
        step.model(x)
    step(np.ones((4, 4), np.float32), np.zeros(4, np.int64))  # still usable


def test_a_huge_broadcast_batch_over_the_memory_limit_raises_out_of_memory(memory_limit):
    step = small_step(nn.Sequential(nn.LayerNorm(4), nn.Tanh()))
    x = np.broadcast_to(np.ones((1, 4), np.float32), (2**36, 4))  # 1 TiB once copied
    y = np.broadcast_to(np.zeros(1, np.int64), (2**36,))
    memory_limit(1 << 30)
    with pytest.raises(OOM, match="cpu out of memory: tried to allocate .*set_memory_limit"):
        step(x, y)
    with pytest.raises(OOM, match="cpu out of memory"):
        step.model(x)


@pytest.mark.parametrize("make", [lambda: nn.Linear(2**64, 1), lambda: nn.Linear(1, 2**70),
                                  lambda: nn.Embedding(2**64, 2), lambda: nn.LayerNorm(2**64),
                                  lambda: gt.Buffer(2**64)])
def test_sizes_beyond_64_bits_are_a_value_error(make):
    with pytest.raises(ValueError, match="too large"):
        make()
