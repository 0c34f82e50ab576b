"""pin_memory=True for Dataset objects: every batch's arrays are copied into slots of the pinned
pool (accounted in gt.memory_stats("pinned") as the array path's slots are), slots are reused
once a batch's arrays are gone, and a batch the caller keeps is never overwritten."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C
from gputrain.data._pinned import PinnedLease


class Samples:
    """Sample i: (8 float32 = i, the int i)."""

    def __init__(self, n=50):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.full(8, i, np.float32), i


class Mixed(Samples):
    """Sample i: a dict with a ragged sequence and a string."""

    def __getitem__(self, i):
        return {"seq": np.arange(i % 4 + 1, dtype=np.int32), "name": f"s{i}"}


def with_objects(samples):
    """default_collate, plus an array of Python objects (left where it is by pinning)."""
    batch = gt.data.default_collate(samples)
    batch["obj"] = np.array([s["name"] for s in samples], object)
    return batch


class Stream(gt.data.IterableDataset):
    def __iter__(self):
        info = gt.data.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return ((np.full(3, i, np.float64), i) for i in range(start, 20, step))


def loader(dataset, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pin_memory without an accelerator
        return gt.DataLoader(dataset, batch_size=4, **options)


def lease(array):
    """The object whose death frees the slot `array` views (None when it views no slot)."""
    base = array.base.base if isinstance(array.base, np.ndarray) else None
    return base if isinstance(base, PinnedLease) else None


def batches(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(data)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_batches_are_copied_into_the_pinned_pool(workers):
    before = gt.memory_stats("pinned")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(loader(Samples(), shuffle=True, seed=1, num_workers=workers, pin_memory=True))
        xb, yb = next(it)
    reference_x, reference_y = next(iter(loader(Samples(), shuffle=True, seed=1)))
    np.testing.assert_array_equal(xb, reference_x)
    np.testing.assert_array_equal(yb, reference_y)
    assert lease(xb) is not None and lease(yb) is lease(xb)
    assert lease(xb).pinned is (_C.cuda_device_count() > 0)
    after = gt.memory_stats("pinned")
    assert after["num_allocs"] - before["num_allocs"] == 1
    assert after["allocated_bytes"] - before["allocated_bytes"] >= xb.nbytes + yb.nbytes
    del it, xb, yb
    gc.collect()
    assert gt.memory_stats("pinned")["allocated_bytes"] == before["allocated_bytes"]


def test_without_pin_memory_batches_stay_out_of_the_pinned_pool():
    before = gt.memory_stats("pinned")["num_allocs"]
    xb, _ = next(iter(loader(Samples(), num_workers=2)))
    assert lease(xb) is None and gt.memory_stats("pinned")["num_allocs"] == before


@pytest.mark.parametrize("workers", [0, 2])
def test_slots_are_reused_and_kept_batches_are_not_overwritten(workers):
    data = loader(Samples(), shuffle=True, seed=2, num_workers=workers, pin_memory=True,
                  persistent_workers=workers > 0)
    plain = loader(Samples(), shuffle=True, seed=2)
    reference = [batches(plain), batches(plain)]  # epochs 0 and 1
    before = gt.memory_stats("pinned")["num_allocs"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for xb, yb in data:  # the batch in hand and the next one: two slots serve all 13
            pass
    assert gt.memory_stats("pinned")["num_allocs"] - before == 2
    kept = batches(data)
    assert len({id(lease(xb)) for xb, _ in kept}) == len(kept) == 13
    for (xb, yb), (rx, ry) in zip(kept, reference[1]):
        np.testing.assert_array_equal(xb, rx)
        np.testing.assert_array_equal(yb, ry)


def test_structures_keep_their_shape_and_only_arrays_are_pinned():
    batch = batches(loader(Mixed(), num_workers=0, pin_memory=True, collate_fn=with_objects))[0]
    plain = next(iter(loader(Mixed(), num_workers=0)))
    assert batch["name"] == plain["name"] == ["s0", "s1", "s2", "s3"]
    assert isinstance(batch["seq"], gt.data.Padded) and lease(batch["seq"].values) is not None
    np.testing.assert_array_equal(batch["seq"].values, plain["seq"].values)
    np.testing.assert_array_equal(batch["seq"].lengths, plain["seq"].lengths)
    assert batch["seq"].values.ctypes.data % 64 == 0 and batch["seq"].lengths.ctypes.data % 64 == 0
    assert batch["obj"].tolist() == batch["name"] and lease(batch["obj"]) is None


def test_an_iterable_dataset_with_workers_is_pinned_too():
    pinned = batches(loader(Stream(), num_workers=2, pin_memory=True))
    plain = batches(loader(Stream(), num_workers=2))
    assert all(lease(x) is not None for x, _ in pinned)
    assert [(x.tolist(), y.tolist()) for x, y in pinned] == [(x.tolist(), y.tolist()) for x, y in plain]


class Growing(Samples):
    """Sample i: i + 1 float64s (batches grow, so slots must be replaced by bigger ones)."""

    def __getitem__(self, i):
        return np.full(i * 40 + 1, i, np.float64)


def test_a_slot_too_small_for_a_batch_is_replaced_by_a_bigger_one():
    gc.collect()
    before = gt.memory_stats("pinned")
    lengths, allocs = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for batch in loader(Growing(40), num_workers=0, pin_memory=True):
            lengths.append(batch.lengths.tolist())
            assert all((row[:n] == row[0]).all() and (row[n:] == 0).all()
                       for row, n in zip(batch.values, batch.lengths))
            allocs.append(gt.memory_stats("pinned")["num_allocs"] - before["num_allocs"])
    assert lengths == [[i * 40 + 1 for i in range(b, b + 4)] for b in range(0, 40, 4)]
    assert 2 < allocs[-1] < 10  # bigger slots as batches grow, fewer than one a batch (25% headroom)
    del batch
    gc.collect()
    assert gt.memory_stats("pinned")["allocated_bytes"] == before["allocated_bytes"]


def test_pinning_that_fails_for_the_memory_limit_loses_no_batch():
    data = loader(Samples(), shuffle=True, seed=4, num_workers=0, pin_memory=True)
    expected = batches(loader(Samples(), shuffle=True, seed=4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = iter(data)
    reserved = gt.memory_stats("pinned")["reserved_bytes"]
    gt.set_memory_limit(reserved + 64, device="pinned")
    try:
        with pytest.raises(_C.OutOfMemoryError):
            next(it)
    finally:
        gt.set_memory_limit(None, device="pinned")
    got = batches(it)
    assert len(got) == len(expected)
    for (xb, yb), (rx, ry) in zip(got, expected):
        np.testing.assert_array_equal(xb, rx)
        np.testing.assert_array_equal(yb, ry)
