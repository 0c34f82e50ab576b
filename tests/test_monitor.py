"""gputrain.monitor: NVML-backed GPU statistics (real and with a fake pynvml) and host stats."""

from __future__ import annotations

import sys
import threading
import time
import types
from collections import namedtuple

import numpy as np
import pytest

import gputrain
from gputrain import monitor

MiB = 1 << 20
GPU_KEYS = {"index", "name", "temperature_c", "memory_used_bytes", "memory_total_bytes",
            "utilization_percent", "power_watts"}


def _fake_nvml(init_error: str | None = None, power_supported: bool = True) -> types.ModuleType:
    """A stand-in for pynvml with two GPUs; `init_error` names the NVMLError nvmlInit raises."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    for name in ("LibraryNotFound", "DriverNotLoaded", "NotSupported", "NoPermission", "Unknown"):
        setattr(nvml, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
    nvml.NVMLError = NVMLError
    nvml.NVML_TEMPERATURE_GPU = 0
    nvml.calls = []
    memory = namedtuple("Memory", "total free used")
    rates = namedtuple("Rates", "gpu memory")

    def init() -> None:
        nvml.calls.append("init")
        if init_error:
            raise getattr(nvml, f"NVMLError_{init_error}")(init_error.replace("NotLoaded", " Not Loaded"))

    def power(handle: int) -> int:
        if not power_supported:
            raise nvml.NVMLError_NotSupported("Not Supported")
        return 150_500 + handle

    nvml.nvmlInit = init
    nvml.nvmlShutdown = lambda: nvml.calls.append("shutdown")
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"Fake RTX 3090" if h == 0 else "Fake RTX 3060"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: memory(24 * 2**30, 20 * 2**30, 4 * 2**30 + h)
    nvml.nvmlDeviceGetTemperature = lambda h, sensor: 60 + h
    nvml.nvmlDeviceGetUtilizationRates = lambda h: rates(90 - h, 40)
    nvml.nvmlDeviceGetPowerUsage = power
    return nvml


# --- GPU statistics ---


def test_gpu_stats_agree_with_the_reason_on_this_machine() -> None:
    stats = monitor.gpu_stats()
    reason = monitor.gpu_unavailable_reason()
    assert isinstance(stats, list) and isinstance(reason, str)
    assert (stats == []) == (reason != "")
    for gpu in stats:
        assert set(gpu) == GPU_KEYS
        assert 0 <= gpu["memory_used_bytes"] <= gpu["memory_total_bytes"]


def test_without_the_package_stats_are_empty_and_the_reason_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert monitor.gpu_stats() == []
    assert "pip install 'gputrain[gpu]'" in monitor.gpu_unavailable_reason()


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded"])
def test_without_a_driver_stats_are_empty_and_the_reason_names_the_driver(monkeypatch, error: str) -> None:
    nvml = _fake_nvml(init_error=error)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert monitor.gpu_stats() == []
    reason = monitor.gpu_unavailable_reason()
    assert reason.startswith("no NVIDIA driver (NVML: ")
    assert "shutdown" not in nvml.calls


def test_other_nvml_start_failures_are_reported(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(init_error="Unknown"))
    assert monitor.gpu_stats() == []
    assert monitor.gpu_unavailable_reason().startswith("NVML could not start")


def test_gpu_stats_read_every_device_and_shut_nvml_down(monkeypatch) -> None:
    nvml = _fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    stats = monitor.gpu_stats()
    assert nvml.calls == ["init", "shutdown"]
    assert monitor.gpu_unavailable_reason() == ""
    assert [gpu["index"] for gpu in stats] == [0, 1]
    assert stats[0] == {
        "index": 0, "name": "Fake RTX 3090", "temperature_c": 60,
        "memory_used_bytes": 4 * 2**30, "memory_total_bytes": 24 * 2**30,
        "utilization_percent": 90, "power_watts": 150.5,
    }
    assert stats[1]["name"] == "Fake RTX 3060" and stats[1]["memory_used_bytes"] == 4 * 2**30 + 1


def test_readings_a_board_does_not_offer_are_none(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(power_supported=False))
    stats = monitor.gpu_stats()
    assert [gpu["power_watts"] for gpu in stats] == [None, None]
    assert stats[0]["temperature_c"] == 60


@pytest.mark.cuda
def test_gpu_stats_on_a_gpu() -> None:
    stats = monitor.gpu_stats()
    assert len(stats) >= 1 and monitor.gpu_unavailable_reason() == ""
    assert stats[0]["memory_total_bytes"] > 0 and stats[0]["name"]


# --- host statistics ---


def test_host_stats_are_sane() -> None:
    stats = monitor.host_stats()
    assert stats["rss_bytes"] > 0
    assert stats["peak_rss_bytes"] >= stats["rss_bytes"]
    assert stats["num_threads"] >= 1
    assert stats["cpu_user_s"] + stats["cpu_system_s"] > 0
    assert 0 < stats["memory_available_bytes"] <= stats["memory_total_bytes"]
    assert stats["cpu_count"] >= 1
    assert 0 < stats["cpu_percent"] <= 100 * stats["cpu_count"] + 1


def test_rss_grows_after_touching_a_big_buffer() -> None:
    before = monitor.host_stats()
    buffer = gputrain.Buffer(96 * MiB)
    buffer.numpy()[:] = 1  # touch every page
    after = monitor.host_stats()
    assert after["rss_bytes"] - before["rss_bytes"] >= 64 * MiB
    assert after["peak_rss_bytes"] >= after["rss_bytes"]
    del buffer


def test_cpu_percent_since_an_earlier_sample_sees_a_busy_thread() -> None:
    idle_start = monitor.host_stats()
    time.sleep(0.2)
    idle = monitor.host_stats(since=idle_start)
    busy_start = monitor.host_stats()
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        np.sqrt(np.arange(10_000.0))
    busy = monitor.host_stats(since=busy_start)
    assert busy["cpu_percent"] >= 20  # one busy thread, even on a loaded machine
    assert idle["cpu_percent"] < busy["cpu_percent"]


def test_host_stats_counts_threads() -> None:
    release = threading.Event()
    before = monitor.host_stats()["num_threads"]
    workers = [threading.Thread(target=release.wait) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        assert monitor.host_stats()["num_threads"] >= before + 3
    finally:
        release.set()
        for worker in workers:
            worker.join()


@pytest.mark.parametrize(("since", "error"), [(5, TypeError), ({"wall_s": 1.0}, ValueError)])
def test_host_stats_rejects_a_bad_since(since: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="since must be"):
        monitor.host_stats(since=since)


# --- the background poller ---


def test_monitor_polls_until_stopped() -> None:
    samples: list[dict] = []
    with monitor.Monitor(0.01, samples.append) as poller:
        deadline = time.monotonic() + 5
        while len(samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert poller.running
    assert not poller.running
    assert len(samples) >= 3 and poller.num_samples == len(samples)
    assert set(samples[0]) == {"time", "host", "gpus"}
    assert samples[0]["host"]["rss_bytes"] > 0 and isinstance(samples[0]["gpus"], list)
    assert samples[1]["host"]["cpu_percent"] is not None
    count = len(samples)
    time.sleep(0.05)
    assert len(samples) == count


def test_monitor_stop_reraises_a_failing_callback() -> None:
    def fail(sample: dict) -> None:
        raise KeyError("callback broke")

    poller = monitor.Monitor(0.01, fail, gpus=False).start()
    deadline = time.monotonic() + 5
    while poller.running and time.monotonic() < deadline:
        time.sleep(0.005)
    with pytest.raises(KeyError, match="callback broke"):
        poller.stop()
    poller.stop()  # stopping twice is harmless


def test_monitor_cannot_start_twice() -> None:
    poller = monitor.Monitor(10, lambda sample: None, gpus=False).start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            poller.start()
    finally:
        poller.stop()


@pytest.mark.parametrize(
    ("interval", "callback", "error"),
    [(0, print, ValueError), (-1.0, print, ValueError), ("1", print, TypeError),
     (True, print, TypeError), (1.0, "print", TypeError)],
)
def test_monitor_rejects_bad_arguments(interval: object, callback: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        monitor.Monitor(interval, callback)
