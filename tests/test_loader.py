"""gputrain.DataLoader core: batches equal NumPy gathers for every structure, dtype and layout,
the order does not depend on the worker settings, and zero-copy batches stay valid."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C


def reference_batches(arrays, order, batch_size, drop_last=False):
    """Batches gathered with NumPy fancy indexing."""
    n = len(order)
    stop = n - n % batch_size if drop_last else n
    return [[a[order[s:s + batch_size]] for a in arrays] for s in range(0, stop, batch_size)]


def loader_order(loader):
    """The row order of one epoch, read back from an index array field."""
    return np.concatenate([batch[-1] for batch in loader])


@pytest.fixture
def xy():
    rng = np.random.default_rng(0)
    return rng.standard_normal((103, 7)).astype(np.float32), np.arange(103, dtype=np.int64)


@pytest.mark.parametrize("num_workers", [0, 1, 2])
def test_sequential_batches_equal_numpy(xy, num_workers):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=10, num_workers=num_workers)
    batches = list(loader)
    expected = reference_batches([x, y], np.arange(103), 10)
    assert len(batches) == len(expected) == len(loader) == 11
    for (xb, yb), (xe, ye) in zip(batches, expected):
        np.testing.assert_array_equal(xb, xe)
        np.testing.assert_array_equal(yb, ye)
        assert xb.dtype == np.float32 and yb.dtype == np.int64


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffled_batches_are_a_permutation_gathered_consistently(xy, num_workers):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=5, num_workers=num_workers)
    batches = list(loader)
    order = np.concatenate([yb for _, yb in batches])
    assert sorted(order.tolist()) == list(range(103))
    assert not np.array_equal(order, np.arange(103))
    for xb, yb in batches:
        np.testing.assert_array_equal(xb, x[yb])


def test_each_epoch_has_its_own_order_and_seed_fixes_it(xy):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=1)
    first, second = loader_order(loader), loader_order(loader)
    assert not np.array_equal(first, second)
    again = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=1)
    np.testing.assert_array_equal(loader_order(again), first)
    other = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=2)
    assert not np.array_equal(loader_order(other), first)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("settings", [
    dict(num_workers=0),
    dict(num_workers=1, prefetch_factor=1),
    dict(num_workers=2),
    dict(num_workers=3, prefetch_factor=4),
    dict(num_workers=2, persistent_workers=True),
    dict(num_workers=2, pin_memory=True),
])
def test_order_independent_of_worker_settings(xy, settings):
    x, y = xy
    reference = gt.DataLoader((x, y), batch_size=6, shuffle=True, seed=11)
    loader = gt.DataLoader((x, y), batch_size=6, shuffle=True, seed=11, **settings)
    with pytest.warns(UserWarning) if settings.get("pin_memory") and _C.cuda_device_count() == 0 else _no_warning():
        for _ in range(3):  # three epochs
            np.testing.assert_array_equal(loader_order(loader), loader_order(reference))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_out_of_order_delivery_yields_the_same_batches(xy):
    x, y = xy
    reference = [yb.tolist() for _, yb in gt.DataLoader((x, y), batch_size=4, shuffle=True, seed=3)]
    loader = gt.DataLoader((x, y), batch_size=4, shuffle=True, seed=3, num_workers=3, in_order=False)
    got = [yb.tolist() for _, yb in loader]
    assert sorted(got) == sorted(reference)


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint16, np.int32, np.bool_,
                                   np.complex64, np.dtype([("a", "<i4"), ("b", "<f8")]), np.dtype(">i8"),
                                   np.dtype("U3")])
def test_any_dtype_round_trips(dtype):
    n = 37
    raw = np.arange(n * 6).reshape(n, 2, 3)
    if np.dtype(dtype).names:
        data = np.zeros((n, 2, 3), dtype=dtype)
        data["a"] = raw
        data["b"] = raw * 0.5
    elif np.dtype(dtype).kind == "U":
        data = raw.astype(str).astype(dtype)
    else:
        data = raw.astype(dtype)
    loader = gt.DataLoader(data, batch_size=5, shuffle=True, seed=0, num_workers=2)
    order = gt.data.RandomSampler(n, seed=0).rows(0)
    for batch, expected in zip(loader, reference_batches([data], order, 5)):
        assert batch.dtype == data.dtype and batch.shape[1:] == (2, 3)
        np.testing.assert_array_equal(batch, expected[0])


def test_structures_come_back_as_given(xy):
    x, y = xy
    w = np.linspace(0, 1, 103)
    cases = [
        x,
        (x, y),
        [x, y],
        {"image": x, "label": y},
        (x, {"y": y, "w": w}),
    ]
    for data in cases:
        batch = next(iter(gt.DataLoader(data, batch_size=4)))
        assert type(batch) is type(data)
    batch = next(iter(gt.DataLoader((x, {"y": y, "w": w}), batch_size=4)))
    np.testing.assert_array_equal(batch[1]["w"], w[:4])
    assert list(next(iter(gt.DataLoader({"b": y, "a": x}, batch_size=2))).keys()) == ["b", "a"]


def test_namedtuple_and_tensordataset_like(xy):
    from collections import namedtuple

    x, y = xy
    Pair = namedtuple("Pair", "x y")
    batch = next(iter(gt.DataLoader(Pair(x, y), batch_size=3)))
    assert isinstance(batch, Pair)
    np.testing.assert_array_equal(batch.y, y[:3])

    class TensorDatasetLike:
        def __init__(self, *tensors):
            self.tensors = tensors

    xb, yb = next(iter(gt.DataLoader(TensorDatasetLike(x, y), batch_size=3, shuffle=True, seed=0)))
    np.testing.assert_array_equal(xb, x[yb])


@pytest.mark.parametrize("make", [
    lambda a: np.asfortranarray(a),
    lambda a: a[::2],
    lambda a: a[::-1],
    lambda a: a[:, ::2],
    lambda a: np.broadcast_to(a[:1], a.shape),
])
def test_non_contiguous_inputs(make):
    base = np.arange(60 * 8, dtype=np.float64).reshape(60, 8)
    data = make(base)
    labels = np.arange(len(data))
    loader = gt.DataLoader((data, labels), batch_size=7, shuffle=True, seed=2, num_workers=2)
    for xb, yb in loader:
        np.testing.assert_array_equal(xb, data[yb])


def test_memmap_input(tmp_path):
    path = tmp_path / "rows.bin"
    data = np.memmap(path, dtype=np.float32, mode="w+", shape=(50, 16))
    data[:] = np.arange(50 * 16, dtype=np.float32).reshape(50, 16)
    data.flush()
    mapped = np.memmap(path, dtype=np.float32, mode="r", shape=(50, 16))
    labels = np.arange(50)
    for xb, yb in gt.DataLoader((mapped, labels), batch_size=8, shuffle=True, seed=4, num_workers=2):
        np.testing.assert_array_equal(xb, np.asarray(mapped)[yb])
        assert type(xb) is np.ndarray


@pytest.mark.parametrize("n,batch,drop_last", [(10, 3, False), (10, 3, True), (9, 3, False), (9, 3, True),
                                                (2, 5, False), (2, 5, True), (0, 4, False)])
def test_len_and_last_batch(n, batch, drop_last):
    data = np.arange(n)
    loader = gt.DataLoader(data, batch_size=batch, drop_last=drop_last, num_workers=1)
    batches = list(loader)
    expected = n // batch if drop_last else -(-n // batch)
    assert len(loader) == len(batches) == expected
    if batches:
        sizes = [len(b) for b in batches]
        assert sizes[:-1] == [batch] * (len(sizes) - 1)
        assert sizes[-1] == (batch if drop_last or n % batch == 0 else n % batch)


def test_batch_size_none_yields_single_samples(xy):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=None, num_workers=2)
    items = list(loader)
    assert len(loader) == len(items) == 103
    np.testing.assert_array_equal(items[5][0], x[5])
    assert items[5][1].shape == () and int(items[5][1]) == 5


def test_sampler_array_list_and_iterable(xy):
    x, y = xy
    picks = [5, 0, -1, 7, 7]
    for sampler in (np.array(picks), picks, iter(picks)):
        loader = gt.DataLoader((x, y), batch_size=2, sampler=sampler, num_workers=1)
        got = np.concatenate([yb for _, yb in loader])
        np.testing.assert_array_equal(got, [5, 0, 102, 7, 7])


def test_sampler_out_of_range_raises(xy):
    x, y = xy
    with pytest.raises(IndexError, match="index 103 out of range for 103 samples"):
        list(gt.DataLoader((x, y), batch_size=2, sampler=[0, 103]))


def test_batch_sampler_lists(xy):
    x, y = xy
    lists = [[3, 1], [0], [10, 11, 12, 13, 14], [2]]
    loader = gt.DataLoader((x, y), batch_sampler=lists, num_workers=2)
    assert len(loader) == 4
    assert [yb.tolist() for _, yb in loader] == lists


def test_batches_are_zero_copy_views_of_a_slot(xy):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=16, shuffle=True, seed=0, num_workers=2)
    xb, yb = next(iter(loader))
    assert isinstance(xb.base, _C._LoaderSlot) and xb.base is yb.base and xb.base.rows == 16
    start = xb.base.address
    assert start <= xb.ctypes.data < yb.ctypes.data
    assert xb.flags.c_contiguous and xb.flags.writeable


@pytest.mark.parametrize("num_workers", [0, 2])
def test_held_batches_are_never_overwritten(xy, num_workers):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=4, shuffle=True, seed=9, num_workers=num_workers)
    held = []
    for i, (xb, yb) in enumerate(loader):
        if i % 3 == 0:
            held.append((xb, yb))  # keep a third of the views alive while iterating on
    for xb, yb in held:
        np.testing.assert_array_equal(xb, x[yb])
    kept = list(loader)  # every batch held at once
    np.testing.assert_array_equal(np.concatenate([yb for _, yb in kept]).size, 103)
    for xb, yb in kept:
        np.testing.assert_array_equal(xb, x[yb])


def test_slots_are_recycled_in_a_plain_loop(xy):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=2, num_workers=2, prefetch_factor=2, persistent_workers=True)
    for _ in range(3):
        for xb, yb in loader:
            np.testing.assert_array_equal(xb, x[yb])
    engine = loader._iterator.engine.engine
    stats = engine.stats()
    assert engine.num_rows == 103 and not engine.closed
    assert stats["initial_slots"] == 2 * 2 + 2
    assert stats["num_slots"] == stats["initial_slots"]
    assert stats["batches_gathered"] == 3 * 52
    assert stats["bytes_gathered"] == 3 * 103 * (7 * 4 + 8)
    engine.shutdown()
    assert engine.closed and engine.stats()["batches_gathered"] == 3 * 52  # kept after shutdown
    assert len(list(loader)) == 52  # a fresh engine replaces the closed one


def test_slot_memory_is_returned_when_views_die(xy):
    x, y = xy
    gc.collect()
    before = gt.memory_stats("cpu")["allocated_bytes"]
    loader = gt.DataLoader((x, y), batch_size=8, num_workers=2)
    batches = list(loader)
    assert gt.memory_stats("cpu")["allocated_bytes"] > before  # the held slots
    del batches
    gc.collect()
    assert gt.memory_stats("cpu")["allocated_bytes"] == before


def test_pin_memory_takes_slots_from_the_pinned_pool(xy):
    x, y = xy
    before = gt.memory_stats("pinned")
    loader = gt.DataLoader((x, y), batch_size=8, num_workers=1, pin_memory=True)
    if _C.cuda_device_count() == 0:
        with pytest.warns(UserWarning, match="no accelerator is found"):
            it = iter(loader)
    else:
        it = iter(loader)
    xb, yb = next(it)
    np.testing.assert_array_equal(xb, x[yb])
    after = gt.memory_stats("pinned")
    assert after["num_allocs"] - before["num_allocs"] == 1 * 2 + 2
    if _C.cuda_device_count() == 0:
        assert after["num_pin_fallbacks"] - before["num_pin_fallbacks"] == 4
        assert xb.base.pinned is False


def test_without_workers_slots_are_reused_across_epochs(xy):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=8, shuffle=True, seed=0)
    for batch in loader:
        pass
    del batch
    allocs = gt.memory_stats("cpu")["num_allocs"]
    for _ in range(3):
        for xb, yb in loader:
            np.testing.assert_array_equal(xb, x[yb])
    assert gt.memory_stats("cpu")["num_allocs"] == allocs  # no slot allocated after the first epoch


def test_nested_iteration_of_one_loader(xy):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=50, shuffle=True, seed=0)
    pairs = [(a[1].tolist(), b[1].tolist()) for a in loader for b in loader]
    assert len(pairs) == 9
    outer = [p[0] for p in pairs[::3]]
    assert sorted(sum(outer, [])) == list(range(103))
    for a, b in pairs:
        assert len(a) in (50, 3) and len(b) in (50, 3)


def test_settings_changed_between_epochs_take_effect(xy):
    x, y = xy
    loader = gt.DataLoader((x, y), batch_size=8, num_workers=1, persistent_workers=True)
    list(loader)
    loader.collate_fn = lambda batch: batch[1]
    assert np.concatenate(list(loader)).tolist() == list(range(103))
