"""Bad arguments are refused up front with a clear exception (issue 10, item 9): DataLoader sizes
and timeouts, float class targets, uint16 arrays read as another array's half dtype, and the
shape of an embedding of a 0-d index."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import gputrain as gt
import gputrain.functional as F
from gputrain import nn
from gputrain.data.loader import MAX_NUM_WORKERS

X = np.zeros((64, 16), np.float32)
Y = np.zeros(64, np.int64)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _allocations() -> tuple[int, int]:
    return tuple(gt.memory_stats(device)["num_allocs"] for device in ("cpu", "pinned"))


@pytest.fixture
def nothing_started():
    """Asserts that the test started no thread and allocated nothing from gputrain's pools."""
    threads, allocations = _threads(), _allocations()
    yield
    assert _threads() <= threads  # (a thread of an earlier test may end meanwhile)
    assert _allocations() == allocations


# --- DataLoader ------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefetch_factor", [2**40, 2**62])
def test_huge_prefetch_factor_is_out_of_memory_before_allocating(prefetch_factor, nothing_started):
    with pytest.raises(gt.OutOfMemoryError, match="prefetch_factor"):
        gt.DataLoader((X, Y), batch_size=8, num_workers=2, prefetch_factor=prefetch_factor)


@pytest.mark.parametrize("num_workers", [2**20, MAX_NUM_WORKERS + 1])
def test_num_workers_beyond_the_limit_is_refused_before_any_thread_starts(num_workers, nothing_started):
    with pytest.raises(ValueError, match=f"num_workers={num_workers} is more than gputrain's limit of "
                                         f"{MAX_NUM_WORKERS}"):
        gt.DataLoader((X, Y), batch_size=8, num_workers=num_workers)


def test_num_workers_raised_after_construction_is_refused_when_the_epoch_starts(nothing_started):
    loader = gt.DataLoader((X, Y), batch_size=8, num_workers=1)
    loader.num_workers = 2**20
    with pytest.raises(ValueError, match="more than gputrain's limit"):
        iter(loader)


def test_num_workers_at_the_limit_is_accepted_and_starts_nothing_yet(nothing_started):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than CPUs: PyTorch's warning
        loader = gt.DataLoader((X, Y), batch_size=8, num_workers=MAX_NUM_WORKERS)
    assert loader.num_workers == MAX_NUM_WORKERS


@pytest.mark.parametrize("timeout, error", [(float("nan"), ValueError), (float("inf"), ValueError),
                                            (-1.0, ValueError), ("5", TypeError), (True, TypeError),
                                            (None, TypeError)])
def test_timeout_must_be_a_finite_number_of_seconds(timeout, error, nothing_started):
    with pytest.raises(error, match="timeout"):
        gt.DataLoader((X, Y), batch_size=8, timeout=timeout)


def test_prefetch_factor_zero_with_workers_is_refused_in_the_constructor(nothing_started):
    with pytest.raises(ValueError, match="prefetch_factor must be >= 1"):
        gt.DataLoader((X, Y), batch_size=8, num_workers=2, prefetch_factor=0)


@pytest.fixture
def cpu_limit():
    """Sets the cpu pool's limit to what is reserved now plus the given headroom."""
    reserved = gt.memory_stats("cpu")["reserved_bytes"]
    yield lambda headroom: gt.set_memory_limit(reserved + headroom, device="cpu")
    gt.set_memory_limit(None, device="cpu")


def test_slots_are_checked_against_the_memory_limit(cpu_limit):
    cpu_limit(1 << 20)  # slots of 256 rows x 16 float32 = 16 KiB: 2 x 32 + 2 of them exceed 1 MiB
    with pytest.raises(gt.OutOfMemoryError, match="left under the 'cpu' pool's memory limit"):
        gt.DataLoader((X, Y), batch_size=256, num_workers=2, prefetch_factor=32)
    loader = gt.DataLoader((X, Y), batch_size=256, num_workers=2, prefetch_factor=2)
    assert sum(len(xb) for xb, _ in loader) == 64


def test_batch_sampler_batches_are_checked_when_the_epoch_starts(cpu_limit, nothing_started):
    loader = gt.DataLoader((X, Y), batch_sampler=[[0] * 100_000], num_workers=1)
    cpu_limit(1 << 20)
    with pytest.raises(gt.OutOfMemoryError, match="100000 rows"):
        iter(loader)


# --- targets, dtypes, shapes -------------------------------------------------------------------------


@pytest.mark.parametrize("targets", [[0.7, 1.9], [0.0, 1.0], [True, False], ["0", "1"]])
def test_class_targets_must_be_integers_not_truncated(targets):
    model = nn.Sequential(nn.Linear(4, 3))
    before = model.state_dict()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="y: expected integer class indices"):
        step(np.ones((2, 4), np.float32), targets)
    assert all(np.array_equal(before[k], v) for k, v in model.state_dict().items())
    assert np.isfinite(step(np.ones((2, 4), np.float32), [0, 2]).loss)  # integer lists still work


def test_inputs_given_as_lists_must_be_real_numbers():
    model = nn.Sequential(nn.Linear(2, 3))
    with pytest.raises(TypeError, match="x: expected real numbers"):
        model([[1j, 2j]])
    assert model([[1, 2]]).shape == (1, 3)


def _half(shape=(4, 6)) -> np.ndarray:
    return np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float16).reshape(shape)


def _bits(shape=(4, 6)) -> np.ndarray:
    return _half(shape).view(np.uint16)


# Every functional op with two activation arrays: (call, name of the second argument).
PAIRS = [
    (lambda a, b, **kw: F.add(a, b, **kw), "b"),
    (lambda a, b, **kw: F.activation_backward(a, b, "gelu", **kw), "x"),
    (lambda a, b, **kw: F.relu_backward(a, b, **kw), "x"),
    (lambda a, b, **kw: F.linear_backward(a, b, np.ones((6, 6), np.float32), **kw), "x"),
    (lambda a, b, **kw: F.layer_norm_backward(a, b, np.ones(6, np.float32), np.zeros(4, np.float32),
                                              np.ones(4, np.float32), **kw), "x"),
]


@pytest.mark.parametrize("call, second", PAIRS)
def test_uint16_bits_are_never_read_as_the_other_arrays_dtype(call, second):
    with pytest.raises(TypeError, match=f"{second} is a uint16 array: pass dtype="):
        call(_half(), _bits())
    with pytest.raises(TypeError, match="is a uint16 array: pass dtype="):
        call(_bits(), _half())
    with pytest.raises(TypeError, match="share one dtype|but dtype="):
        call(_half(), _half().astype(np.float32))
    call(_bits(), _bits(), dtype="f16")  # explicit: fine
    call(_half(), _bits(), dtype="f16")


def test_add_of_f16_and_uint16_does_not_reinterpret_integers():
    with pytest.raises(TypeError, match="b is a uint16 array"):
        F.add(np.ones(3, np.float16), np.array([1, 2, 3], np.uint16))


def test_gemm_accumulator_bits_need_an_explicit_dtype():
    a, b = _half((2, 3)), _half((3, 2))
    with pytest.raises(TypeError, match="c is a uint16 array"):
        F.gemm(a, b, beta=1.0, c=np.zeros((2, 2), np.uint16))
    with pytest.raises(TypeError, match="c holds"):
        F.gemm(a, b, beta=1.0, c=np.zeros((2, 2), np.uint16), dtype="bf16")
    out = F.gemm(a, b, beta=1.0, c=np.zeros((2, 2), np.uint16), out_dtype="f16")
    assert out.dtype == np.float16 and out.shape == (2, 2)


@pytest.mark.parametrize("index", [np.int64(2), 2, np.array(2)])
def test_embedding_of_a_0d_index_has_shape_dim_as_pytorch(index):
    table = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = F.embedding(index, table)
    assert out.shape == (4,)
    assert np.array_equal(out, table[2])
    grad = F.embedding_backward(np.ones(4, np.float32), index, 3)
    assert np.array_equal(grad, np.array([[0] * 4, [0] * 4, [1] * 4], np.float32))
