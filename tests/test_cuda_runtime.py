"""The CUDA runtime scaffolding: availability, device query, streams, events, copies, TF32.

Tests without the `cuda` mark run everywhere and check the behaviour that matches the
machine (no driver here: clear CudaError/RuntimeError; on a GPU machine: the call works).
`cuda`-marked tests need a device and are skipped without one (tests/conftest.py).
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

import gputrain
from gputrain import _C
from gputrain import cuda

MiB = 1 << 20


def _compiled() -> bool:
    return bool(gputrain.info()["cuda_compiled"])


# --- availability and build facts (every machine) ---


def test_availability_is_consistent() -> None:
    assert cuda.is_available() == (cuda.device_count() > 0)
    assert gputrain.info()["cuda_available"] == cuda.is_available()
    reason = cuda.unavailable_reason()
    assert isinstance(reason, str)
    assert (reason == "") == cuda.is_available()


def test_info_reports_cuda_runtime_and_reason() -> None:
    facts = gputrain.info()
    assert facts["cuda_unavailable_reason"] == cuda.unavailable_reason()
    assert facts["cuda_runtime_version"] == cuda.runtime_version()
    if facts["cuda_compiled"]:
        assert cuda.is_compiled()
        assert cuda.runtime_version() >= 11000
    else:
        assert cuda.runtime_version() == 0
        assert "not compiled" in cuda.unavailable_reason()


def test_unavailable_reason_says_what_is_missing() -> None:
    reason = cuda.unavailable_reason()
    if cuda.is_available():
        assert reason == ""
    elif not _compiled():
        assert "not compiled" in reason
    else:
        assert "driver" in reason or "device" in reason


DEVICE_CALLS = {
    "get_device_properties": lambda: cuda.get_device_properties(0),
    "get_device_name": lambda: cuda.get_device_name("cuda:0"),
    "synchronize": lambda: cuda.synchronize(0),
    "set_device": lambda: cuda.set_device(0),
    "current_device": cuda.current_device,
    "Stream": lambda: cuda.Stream(0),
    "Event": lambda: cuda.Event(0, timing=False),
    "cublas_tf32": lambda: _C.cuda_cublas_tf32(0),
}


@pytest.mark.parametrize("name", sorted(DEVICE_CALLS))
def test_device_calls_raise_clear_cuda_error_without_device(name: str) -> None:
    call = DEVICE_CALLS[name]
    if cuda.is_available():
        call()
        return
    with pytest.raises(gputrain.CudaError, match="not available|not compiled") as info:
        call()
    assert isinstance(info.value, RuntimeError)
    assert cuda.unavailable_reason() in str(info.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda: gputrain.memory_stats("cuda"),
        lambda: gputrain.memory_stats("cuda:0"),
        lambda: gputrain.set_memory_limit(MiB, device="cuda:0"),
        lambda: gputrain.reset_peak_memory_stats(device="cuda:0"),
        lambda: cuda.memory_stats(0),
        lambda: gputrain.Buffer(64, device="cuda:0"),
    ],
)
def test_memory_functions_with_cuda_device(call) -> None:
    if cuda.is_available():
        call()
        gputrain.set_memory_limit(None, device="cuda:0")
        return
    with pytest.raises(RuntimeError, match="not available"):
        call()


def test_pinned_buffer_falls_back_and_is_counted() -> None:
    before = gputrain.memory_stats("pinned")
    buffer = gputrain.Buffer(4096, device="pinned")
    after = gputrain.memory_stats("pinned")
    assert buffer.device == "pinned"
    assert after["allocated_bytes"] == before["allocated_bytes"] + 4096
    if cuda.is_available():
        assert buffer.pinned
        assert after["num_pin_fallbacks"] == before["num_pin_fallbacks"]
    else:
        assert not buffer.pinned
        assert after["num_pin_fallbacks"] == before["num_pin_fallbacks"] + 1
    view = buffer.numpy()
    view[:] = 7
    assert int(view.sum()) == 7 * 4096
    del view, buffer
    assert gputrain.memory_stats("pinned")["allocated_bytes"] == before["allocated_bytes"]


def test_tf32_choice_is_recorded_without_device() -> None:
    if not _compiled():
        with pytest.raises(gputrain.CudaError, match="not compiled"):
            _C.cuda_set_tf32(True)
        return
    original = _C.cuda_tf32_enabled()
    try:
        _C.cuda_set_tf32(True)
        assert _C.cuda_tf32_enabled() is True
        _C.cuda_set_tf32(False)
        assert _C.cuda_tf32_enabled() is False
    finally:
        _C.cuda_set_tf32(original)


# --- bad arguments (every machine) ---


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: cuda.get_device_properties(1.5), TypeError, "device must be"),
        (lambda: cuda.get_device_properties(True), TypeError, "device must be"),
        (lambda: cuda.get_device_properties("gpu:0"), ValueError, "'cuda' or 'cuda:N'"),
        (lambda: cuda.get_device_properties("cuda:x"), ValueError, "'cuda' or 'cuda:N'"),
        (lambda: cuda.get_device_properties(-1), ValueError, "index"),
        (lambda: cuda.synchronize(-2), ValueError, "index"),
        (lambda: cuda.set_device(None), TypeError, "device must be"),
        (lambda: _C.cuda_get_device_properties(2**40), ValueError, "index must be in"),
        (lambda: cuda.Stream(device=-1), ValueError, "device must be in"),
        (lambda: cuda.Stream(device="cuda:0"), TypeError, "device must be an int"),
        (lambda: cuda.Event(device=99), ValueError, "device must be in"),
        (lambda: _C.cuda_set_tf32(1), TypeError, "enabled must be a bool"),
        (lambda: cuda.copy(1, gputrain.Buffer(8)), TypeError, "dst must be a gputrain.Buffer"),
        (lambda: cuda.copy(gputrain.Buffer(8), np.zeros(8)), TypeError, "src must be a gputrain.Buffer"),
        (lambda: cuda.copy(gputrain.Buffer(8), gputrain.Buffer(8)), ValueError, "at least one must be a CUDA"),
        (lambda: cuda.copy(gputrain.Buffer(8), gputrain.Buffer(8), nbytes=-1), ValueError, "nbytes must be >= 0"),
        (lambda: cuda.copy(gputrain.Buffer(8), gputrain.Buffer(16)), ValueError, "do not fit"),
        (lambda: cuda.copy(gputrain.Buffer(8), gputrain.Buffer(8), nbytes="8"), TypeError, "nbytes must be"),
        (lambda: cuda.memset(gputrain.Buffer(8), 0), ValueError, "must be a CUDA buffer"),
        (lambda: cuda.memset(gputrain.Buffer(8), 256), ValueError, "value must be in 0..255"),
        (lambda: cuda.memset(gputrain.Buffer(8), 1.0), TypeError, "value must be an int"),
        (lambda: cuda.memset(gputrain.Buffer(8), 0, nbytes=9), ValueError, "do not fit"),
    ],
)
def test_bad_arguments_raise_clear_errors(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_failing_copies_do_not_leak_references() -> None:
    dst, src = gputrain.Buffer(64), gputrain.Buffer(64)
    before = sys.getrefcount(dst), sys.getrefcount(src)
    for _ in range(200):
        with pytest.raises(ValueError):
            _C.cuda_copy(dst, src)
    assert (sys.getrefcount(dst), sys.getrefcount(src)) == before


def test_device_index_forms() -> None:
    assert cuda._device_index(3) == 3
    assert cuda._device_index("cuda") == 0
    assert cuda._device_index("cuda:2") == 2


# --- on a GPU ---


@pytest.mark.cuda
def test_device_properties_and_selection() -> None:
    props = cuda.get_device_properties(0)
    assert props.name and props.name == cuda.get_device_name(0)
    assert props.total_memory > 0 and props.multi_processor_count > 0
    assert props.warp_size == 32 and props.major >= 5
    assert cuda.get_device_capability("cuda:0") == (props.major, props.minor)
    cuda.set_device(0)
    assert cuda.current_device() == 0
    cuda.synchronize()
    assert cuda.driver_version() > 0
    with pytest.raises(ValueError, match="does not exist"):
        cuda.get_device_properties(cuda.device_count())


@pytest.mark.cuda
def test_cuda_allocation_accounting_and_limit() -> None:
    before = cuda.memory_stats(0)
    buffer = gputrain.Buffer(3 * MiB + 5, device="cuda:0")
    during = cuda.memory_stats(0)
    assert buffer.device == "cuda:0"
    assert during["allocated_bytes"] == before["allocated_bytes"] + 3 * MiB + 5
    assert during["active_blocks"] == before["active_blocks"] + 1
    with pytest.raises(TypeError, match="CUDA buffer"):
        buffer.numpy()
    gputrain.set_memory_limit(during["reserved_bytes"] + MiB, device="cuda:0")
    try:
        with pytest.raises(gputrain.OutOfMemoryError, match="cuda:0 out of memory"):
            gputrain.Buffer(2 * MiB, device="cuda:0")
    finally:
        gputrain.set_memory_limit(None, device="cuda:0")
    del buffer
    assert cuda.memory_stats(0)["allocated_bytes"] == before["allocated_bytes"]


def _host_buffer(data: np.ndarray, device: str = "cpu") -> gputrain.Buffer:
    buffer = gputrain.Buffer(data.nbytes, device=device)
    buffer.numpy()[:] = data.view(np.uint8)
    return buffer


@pytest.mark.cuda
def test_sync_copies_round_trip_through_the_device() -> None:
    data = np.random.default_rng(0).integers(0, 256, size=MiB + 3, dtype=np.uint8)
    src = _host_buffer(data)
    on_device = gputrain.Buffer(data.nbytes, device="cuda:0")
    other = gputrain.Buffer(data.nbytes, device="cuda:0")
    back = gputrain.Buffer(data.nbytes)
    cuda.copy(on_device, src)
    cuda.copy(other, on_device)
    cuda.copy(back, other)
    np.testing.assert_array_equal(back.numpy(), data)
    partial = gputrain.Buffer(data.nbytes)
    partial.numpy()[:] = 0
    cuda.copy(partial, other, nbytes=100)
    np.testing.assert_array_equal(partial.numpy()[:100], data[:100])
    assert not partial.numpy()[100:].any()


@pytest.mark.cuda
def test_async_copies_round_trip_on_a_stream_and_keep_buffers_alive() -> None:
    data = np.random.default_rng(1).integers(0, 256, size=4 * MiB, dtype=np.uint8)
    stream = cuda.Stream(0)
    assert stream.device == "cuda:0" and stream.num_pending == 0
    src = _host_buffer(data, device="pinned")
    on_device = gputrain.Buffer(data.nbytes, device="cuda:0")
    back = gputrain.Buffer(data.nbytes, device="pinned")
    cuda.copy(on_device, src, stream=stream)
    assert stream.num_pending == 2
    del src  # the stream keeps it alive until it is idle
    cuda.copy(back, on_device, stream=stream)
    stream.synchronize()
    assert stream.num_pending == 0 and stream.query()
    np.testing.assert_array_equal(back.numpy(), data)


@pytest.mark.cuda
def test_memset_sync_and_async() -> None:
    buffer = gputrain.Buffer(MiB, device="cuda:0")
    back = gputrain.Buffer(MiB)
    cuda.memset(buffer, 0xAB)
    stream = cuda.Stream()
    cuda.memset(buffer, 0x01, nbytes=1000, stream=stream)
    stream.synchronize()
    cuda.copy(back, buffer)
    host = back.numpy()
    assert (host[:1000] == 1).all() and (host[1000:] == 0xAB).all()


@pytest.mark.cuda
def test_events_order_and_time_work_across_streams() -> None:
    producer, consumer = cuda.Stream(0), cuda.Stream(0)
    start, done = cuda.Event(0), cuda.Event(0)
    buffer = gputrain.Buffer(64 * MiB, device="cuda:0")
    back = gputrain.Buffer(64 * MiB, device="pinned")
    start.record(producer)
    cuda.memset(buffer, 0x5A, stream=producer)
    done.record(producer)
    consumer.wait_event(done)
    cuda.copy(back, buffer, stream=consumer)
    consumer.synchronize()
    assert done.query() and start.query()
    done.synchronize()
    assert start.elapsed_time(done) >= 0.0
    assert (back.numpy() == 0x5A).all()


@pytest.mark.cuda
def test_event_misuse_raises() -> None:
    sync_only = cuda.Event(0, timing=False)
    timed = cuda.Event(0)
    stream = cuda.Stream(0)
    sync_only.record(stream)
    timed.record(stream)
    stream.synchronize()
    assert not sync_only.timing
    with pytest.raises(ValueError, match="without timing"):
        sync_only.elapsed_time(timed)
    with pytest.raises(TypeError, match="CudaStream"):
        timed.record(None)
    with pytest.raises(TypeError, match="CudaEvent"):
        timed.elapsed_time(stream)
    with pytest.raises(TypeError, match="CudaEvent"):
        stream.wait_event(timed.timing)


@pytest.mark.cuda
def test_tf32_switch_sets_the_cublas_math_mode() -> None:
    original = _C.cuda_tf32_enabled()
    try:
        _C.cuda_set_tf32(True)
        assert _C.cuda_cublas_tf32(0) is True
        _C.cuda_set_tf32(False)
        assert _C.cuda_cublas_tf32(0) is False
    finally:
        _C.cuda_set_tf32(original)


@pytest.mark.cuda
def test_streams_with_pending_work_are_collected_safely() -> None:
    for _ in range(20):
        stream = cuda.Stream(0)
        src = gputrain.Buffer(MiB, device="pinned")
        dst = gputrain.Buffer(MiB, device="cuda:0")
        cuda.copy(dst, src, stream=stream)
        del stream, src, dst
    gc.collect()
    cuda.synchronize(0)
