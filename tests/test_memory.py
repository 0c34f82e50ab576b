"""The allocator's accounting, limits and out-of-memory behaviour, per pool."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import gputrain
from gputrain import _C


@pytest.fixture(autouse=True)
def no_limits():
    gc.collect()
    for device in ("cpu", "pinned"):
        gputrain.set_memory_limit(None, device=device)
    yield
    for device in ("cpu", "pinned"):
        gputrain.set_memory_limit(None, device=device)


def test_allocation_is_accounted_exactly():
    before = gputrain.memory_stats("cpu")
    buffer = gputrain.Buffer(1000)
    during = gputrain.memory_stats("cpu")
    assert during["allocated_bytes"] - before["allocated_bytes"] == 1000
    assert during["reserved_bytes"] - before["reserved_bytes"] == 1024  # 64-byte alignment
    assert during["num_allocs"] == before["num_allocs"] + 1
    assert during["active_blocks"] == before["active_blocks"] + 1
    del buffer
    after = gputrain.memory_stats("cpu")
    assert after["allocated_bytes"] == before["allocated_bytes"]
    assert after["num_frees"] == before["num_frees"] + 1


def test_peak_tracks_the_highest_use_and_resets():
    gputrain.reset_peak_memory_stats("cpu")
    base = gputrain.memory_stats("cpu")["allocated_bytes"]
    big = gputrain.Buffer(1 << 20)
    del big
    stats = gputrain.memory_stats("cpu")
    assert stats["peak_allocated_bytes"] >= base + (1 << 20)
    gputrain.reset_peak_memory_stats("cpu")
    assert gputrain.memory_stats("cpu")["peak_allocated_bytes"] == stats["allocated_bytes"]


def test_over_the_limit_raises_with_the_numbers_and_changes_nothing():
    used = gputrain.memory_stats("cpu")["reserved_bytes"]
    gputrain.set_memory_limit(used + 4096, device="cpu")
    before = gputrain.memory_stats("cpu")
    with pytest.raises(gputrain.OutOfMemoryError) as info:
        gputrain.Buffer(8192)
    message = str(info.value)
    assert "8192 bytes" in message and f"{used} bytes" in message and f"{used + 4096} bytes" in message
    assert isinstance(info.value, MemoryError)
    after = gputrain.memory_stats("cpu")
    assert after["num_ooms"] == before["num_ooms"] + 1
    for key in ("allocated_bytes", "reserved_bytes", "num_allocs", "active_blocks", "peak_reserved_bytes"):
        assert after[key] == before[key], key
    ok = gputrain.Buffer(4096)  # still fits exactly
    assert ok.nbytes == 4096


def test_memory_fraction_sets_a_limit_from_physical_memory():
    gputrain.set_memory_fraction(0.5, device="cpu")
    limit = gputrain.memory_stats("cpu")["limit_bytes"]
    import os

    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert limit == int(total * 0.5)


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, float("nan")])
def test_memory_fraction_out_of_range(fraction):
    with pytest.raises(ValueError, match="fraction"):
        gputrain.set_memory_fraction(fraction, device="cpu")


def test_pinned_memory_falls_back_and_is_accounted_separately():
    cpu_before = gputrain.memory_stats("cpu")
    pinned_before = gputrain.memory_stats("pinned")
    buffer = gputrain.Buffer(4096, device="pinned")
    pinned = gputrain.memory_stats("pinned")
    assert pinned["allocated_bytes"] == pinned_before["allocated_bytes"] + 4096
    assert gputrain.memory_stats("cpu")["allocated_bytes"] == cpu_before["allocated_bytes"]
    if _C.cuda_device_count() == 0:
        assert buffer.pinned is False
        assert pinned["num_pin_fallbacks"] == pinned_before["num_pin_fallbacks"] + 1
    view = buffer.numpy()
    view[:] = 7
    assert view.sum() == 7 * 4096
    assert buffer.address % 64 == 0


def test_pinned_limit_is_separate_from_cpu_limit():
    gputrain.set_memory_limit(0, device="pinned")
    with pytest.raises(gputrain.OutOfMemoryError, match="pinned"):
        gputrain.Buffer(64, device="pinned")
    assert gputrain.Buffer(64, device="cpu").nbytes == 64


def test_numpy_view_keeps_the_buffer_alive():
    view = gputrain.Buffer(256).numpy()
    view[:] = np.arange(256, dtype=np.uint8)
    gc.collect()
    assert int(view.sum()) == sum(range(256))


def test_memory_summary_lists_pools():
    text = gputrain.memory_summary("cpu")
    assert "cpu" in text and "pinned" in text and "allocated" in text


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: gputrain.Buffer(0), ValueError, "nbytes"),
        (lambda: gputrain.Buffer(-5), ValueError, "nbytes"),
        (lambda: gputrain.Buffer("x"), TypeError, "integer"),
        (lambda: gputrain.Buffer(64, device="tpu"), ValueError, "device"),
        (lambda: gputrain.Buffer(64, device=3), TypeError, "device"),
        (lambda: gputrain.Buffer(64, device="cuda:0"), RuntimeError, "not available"),
        (lambda: gputrain.Buffer(1 << 62), gputrain.OutOfMemoryError, "out of memory"),
        (lambda: gputrain.set_memory_limit(-1, device="cpu"), ValueError, "limit"),
        (lambda: gputrain.set_memory_limit(1.5, device="cpu"), TypeError, "limit"),
        (lambda: gputrain.set_memory_limit(True, device="cpu"), TypeError, "limit"),
        (lambda: gputrain.set_memory_fraction("half", device="cpu"), TypeError, "fraction"),
        (lambda: gputrain.memory_stats("cuda:99"), ValueError, "device"),
        (lambda: gputrain.memory_stats("gpu"), ValueError, "device"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()
