"""Device batches: DataLoader(device="cuda") copies each slot to the GPU on a copy stream.
Every test runs on the simulated device "sim" too (its copies run on worker threads, so the
ordering of the copy stream and its events is exercised); the `cuda` ones need a GPU. The
last test checks the refusal without one."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gputrain as gt
from gputrain.data.transfer import DeviceArray

X = np.random.default_rng(0).standard_normal((203, 5, 3)).astype(np.float32)
Y = np.arange(203, dtype=np.int64)


DEVICES = [pytest.param("cuda", marks=pytest.mark.cuda), pytest.param("sim", marks=pytest.mark.sim)]


def host(batch):
    return [a.numpy() for a in batch]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("settings", [dict(num_workers=0), dict(num_workers=2, pin_memory=True),
                                      dict(num_workers=2, persistent_workers=True, in_order=False)])
def test_device_batches_equal_host_batches(device, settings):
    loader = gt.DataLoader((X, Y), batch_size=16, shuffle=True, seed=3, device=device, **settings)
    seen = []
    for epoch in range(2):
        for xb, yb in loader:
            assert isinstance(xb, DeviceArray) and xb.shape[1:] == (5, 3) and xb.dtype == np.float32
            interface = getattr(xb, f"__{device}_array_interface__")  # sim arrays are no CUDA memory
            assert interface["shape"] == xb.shape and interface["typestr"] == "<f4" and interface["version"] == 3
            x, y = xb.numpy(), yb.numpy()
            np.testing.assert_array_equal(x, X[y])
            seen.extend(y.tolist())
    assert sorted(seen) == sorted(list(range(203)) * 2)


@pytest.mark.parametrize("device", DEVICES)
def test_held_device_batches_are_never_overwritten(device):
    loader = gt.DataLoader((X, Y), batch_size=8, shuffle=True, seed=1, num_workers=2, pin_memory=True,
                           device=device)
    batches = list(loader)
    for xb, yb in batches:
        np.testing.assert_array_equal(xb.numpy(), X[yb.numpy()])
    order = np.concatenate([yb.numpy() for _, yb in batches])
    reference = np.concatenate([yb for _, yb in gt.DataLoader((X, Y), batch_size=8, shuffle=True, seed=1)])
    np.testing.assert_array_equal(order, reference)


@pytest.mark.parametrize("device", DEVICES)
def test_hook_results_and_structures_move_to_the_device(device):
    loader = gt.DataLoader({"x": X, "y": Y}, batch_size=10, device=f"{device}:0",
                           collate_fn=lambda b: {"x2": b["x"] * 2, "y": b["y"]})
    batch = next(iter(loader))
    assert set(batch) == {"x2", "y"}
    np.testing.assert_array_equal(batch["x2"].numpy(), X[:10] * 2)
    np.testing.assert_array_equal(batch["y"].numpy(), Y[:10])


@pytest.mark.parametrize("device", DEVICES)
def test_device_memory_returns_when_batches_die(device):
    gc.collect()
    before = gt.memory_stats(f"{device}:0")["allocated_bytes"]
    loader = gt.DataLoader((X, Y), batch_size=32, num_workers=1).to(device)
    batches = list(loader)
    assert gt.memory_stats(f"{device}:0")["allocated_bytes"] > before
    del batches, loader
    gc.collect()
    assert gt.memory_stats(f"{device}:0")["allocated_bytes"] == before


@pytest.mark.parametrize("device", DEVICES)
def test_resume_counts_only_delivered_device_batches(device):
    loader = gt.DataLoader((X, Y), batch_size=16, shuffle=True, seed=4, device=device)
    it = iter(loader)
    for _ in range(3):
        next(it)  # the copy of the fourth is already queued
    state = loader.state_dict()
    assert state["batches_yielded"] == 3
    resumed = gt.DataLoader((X, Y), batch_size=16, shuffle=True, seed=4)
    resumed.load_state_dict(state)
    expected = [yb.numpy().tolist() for _, yb in it]
    assert [yb.tolist() for _, yb in resumed] == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("settings", [dict(num_workers=2), dict(num_workers=2, prefetch_factor=1, in_order=False),
                                      dict(num_workers=0)], ids=["2 workers", "unordered", "no workers"])
@pytest.mark.parametrize("keep", [False, True], ids=["for loop", "all batches kept"])
def test_a_device_loader_never_holds_more_slots_than_planned(device, settings, keep):
    """The transfer hands back a copy's host slot before queuing the next copy (transfer.c's
    reclaim_all), so a device loader holds num_workers * prefetch_factor + 2 slots, its plan,
    however the copy stream lags and however many device batches the caller keeps. When the
    transfer handed slots back lazily, the loader allocated up to 2 more within an epoch or two
    (the recipe's pinned pool peaked a slot above its plan)."""
    gc.collect()
    gc.disable()  # an unrelated object freed meanwhile would lower the baseline
    try:
        base = gt.memory_stats("pinned")["reserved_bytes"]
        gt.reset_peak_memory_stats("pinned")
        loader = gt.DataLoader((X, Y), batch_size=8, shuffle=True, seed=5, pin_memory=True, device=device,
                               persistent_workers=settings["num_workers"] > 0, **settings)
        for epoch in range(12):
            loader.set_epoch(epoch)
            it = iter(loader)
            kept = [batch for batch in it] if keep else [None for _ in it]
            stats = it.engine.engine.stats()
            assert stats["num_slots"] == stats["initial_slots"], (epoch, stats)
            del kept
        peak = gt.memory_stats("pinned")["peak_reserved_bytes"] - base
    finally:
        gc.enable()
    workers = settings["num_workers"]
    planned = gt._C.loader_plan((X, Y), 8, workers, settings.get("prefetch_factor", 2), True, device=device)
    assert stats["initial_slots"] == planned["num_slots"] == workers * settings.get("prefetch_factor", 2) + 2
    assert peak == planned["bytes"]  # the pinned pool's (a slot whose page locking is refused counts there too)


def test_transfer_needs_a_device():
    it = iter(gt.DataLoader(Y, batch_size=4, num_workers=1))
    if gt.cuda.is_available():
        assert gt._C.LoaderTransfer(it.engine.engine, 0).stream != 0
    else:
        with pytest.raises(gt.CudaError, match="CUDA"):
            gt._C.LoaderTransfer(it.engine.engine, 0)
    with pytest.raises(TypeError, match="engine must be a LoaderEngine"):
        gt._C.LoaderTransfer(object(), 0)
