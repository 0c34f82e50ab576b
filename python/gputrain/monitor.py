"""gputrain.monitor: GPU health through NVML and the host process's resource use.

GPU statistics come from NVML through the `nvidia-ml-py` package (`pip install
'gputrain[gpu]'`). They never raise for a missing package, library or driver:
`gpu_stats()` then returns `[]` and `gpu_unavailable_reason()` says why, e.g.
"no NVIDIA driver (NVML: NVML Shared Library Not Found)". Host statistics come from
/proc and the standard library (no psutil). `Monitor` polls both from a background thread,
as training guides recommend doing every few minutes.
"""

from __future__ import annotations

import importlib
import os
import resource
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

_NO_PACKAGE = "nvidia-ml-py is not installed (pip install 'gputrain[gpu]')"


def _open_nvml(pynvml: Any = None) -> tuple[Any, str]:
    """Imports pynvml (or takes the module-like object given) and initialises NVML:
    (module, "") or (None, reason)."""
    if pynvml is None:
        try:
            pynvml = importlib.import_module("pynvml")
        except ImportError:
            return None, _NO_PACKAGE
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        if isinstance(err, (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded)):
            return None, f"no NVIDIA driver (NVML: {err})"
        return None, f"NVML could not start ({err})"
    return pynvml, ""


def _optional(pynvml: ModuleType, read: Callable[[], Any]) -> Any:
    """A reading the GPU may not offer (power on some boards): None when NVML says so."""
    try:
        return read()
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission):
        return None


def _device_stats(pynvml: ModuleType, index: int) -> dict[str, Any]:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = pynvml.nvmlDeviceGetName(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    temperature = _optional(pynvml, lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    utilization = _optional(pynvml, lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    milliwatts = _optional(pynvml, lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    return {
        "index": index,
        "name": name.decode() if isinstance(name, bytes) else name,
        "temperature_c": temperature,
        "memory_used_bytes": int(memory.used),
        "memory_total_bytes": int(memory.total),
        "utilization_percent": utilization,
        "power_watts": None if milliwatts is None else milliwatts / 1000.0,
    }


def gpu_stats() -> list[dict[str, Any]]:
    """One dict per NVIDIA GPU, in NVML order:

    index, name, temperature_c, memory_used_bytes, memory_total_bytes (bytes used and
    installed, by every process), utilization_percent (share of the last sample period a
    kernel ran), power_watts. A reading the board does not offer is None.
    Returns [] when NVML cannot be used; `gpu_unavailable_reason()` then says why.
    """
    pynvml, _ = _open_nvml()
    if pynvml is None:
        return []
    try:
        return [_device_stats(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    finally:
        pynvml.nvmlShutdown()


def gpu_unavailable_reason() -> str:
    """Why `gpu_stats()` returns [] ("" when NVML answers)."""
    pynvml, reason = _open_nvml()
    if pynvml is not None:
        pynvml.nvmlShutdown()
    return reason


def _read_key_values(path: str) -> dict[str, str]:
    """'Key:   value' lines of a /proc file; {} where /proc does not exist."""
    try:
        with open(path, encoding="ascii") as file:
            return {key: value.strip() for key, _, value in (line.partition(":") for line in file)}
    except OSError:
        return {}


def _kib(fields: dict[str, str], key: str) -> int | None:
    """A '1234 kB' field in bytes, or None when absent."""
    value = fields.get(key)
    return int(value.split()[0]) * 1024 if value else None


def _process_age_s() -> float | None:
    """Seconds since this process started (from /proc), or None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as file:
            fields_after_name = file.read().rpartition(")")[2].split()
        with open("/proc/uptime", encoding="ascii") as file:
            uptime_s = float(file.read().split()[0])
    except OSError:
        return None
    start_ticks = int(fields_after_name[19])  # field 22 of proc(5), counted from field 3
    return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")


def _peak_rss_bytes(status: dict[str, str]) -> int:
    peak = _kib(status, "VmHWM")
    if peak is not None:
        return peak
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss if sys.platform == "darwin" else max_rss * 1024


def _cpu_percent(cpu_s: float, wall_s: float, since: dict[str, Any] | None) -> float | None:
    """Process CPU use in percent of one core, since `since` or since the process started."""
    if since is not None:
        busy_s = cpu_s - (since["cpu_user_s"] + since["cpu_system_s"])
        elapsed_s = wall_s - since["wall_s"]
    else:
        busy_s, elapsed_s = cpu_s, _process_age_s()
    if elapsed_s is None or elapsed_s <= 0:
        return None
    return 100.0 * busy_s / elapsed_s


def host_stats(since: dict[str, Any] | None = None) -> dict[str, Any]:
    """Resource use of this process and the host's memory:

    rss_bytes and peak_rss_bytes (resident memory now and at its highest), num_threads,
    cpu_user_s and cpu_system_s (process CPU times), wall_s (a monotonic clock),
    cpu_percent (CPU time over wall time in percent of one core: since `since`, an earlier
    result of host_stats, or since the process started), cpu_count, memory_total_bytes and
    memory_available_bytes. A value the platform does not offer is None.
    """
    if since is not None and not isinstance(since, dict):
        raise TypeError(f"since must be a dict returned by host_stats() or None, not {type(since).__name__}")
    if since is not None and not {"cpu_user_s", "cpu_system_s", "wall_s"} <= since.keys():
        raise ValueError("since must be a dict returned by host_stats()")
    wall_s = time.monotonic()
    times = os.times()
    status = _read_key_values("/proc/self/status")
    meminfo = _read_key_values("/proc/meminfo")
    threads = status.get("Threads")
    return {
        "rss_bytes": _kib(status, "VmRSS"),
        "peak_rss_bytes": _peak_rss_bytes(status),
        "num_threads": int(threads) if threads else None,
        "cpu_user_s": times.user,
        "cpu_system_s": times.system,
        "wall_s": wall_s,
        "cpu_percent": _cpu_percent(times.user + times.system, wall_s, since),
        "cpu_count": os.cpu_count(),
        "memory_total_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
        "memory_available_bytes": _kib(meminfo, "MemAvailable"),
    }


class Monitor:
    """Samples host and GPU statistics every `interval_s` seconds on a background thread and
    hands each sample to `callback`:

        {"time": time.time(), "host": host_stats(since=previous host sample), "gpus": gpu_stats()}

    The first sample is taken at start(). If sampling or the callback raises, polling stops
    and stop() re-raises that exception. Use as a context manager or call start()/stop().
    """

    def __init__(self, interval_s: float, callback: Callable[[dict[str, Any]], None], gpus: bool = True) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)):
            raise TypeError(f"interval_s must be a number, not {type(interval_s).__name__}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        if not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        self.interval_s = float(interval_s)  # seconds between samples
        self.callback = callback  # receives each sample dict
        self.gpus = gpus  # whether samples include gpu_stats()
        self.num_samples = 0  # samples handed to the callback so far
        self.error: BaseException | None = None  # what stopped polling early, if anything
        self._stop = threading.Event()  # set by stop()
        self._thread: threading.Thread | None = None  # the poller while running

    def _sample(self, previous: dict[str, Any] | None) -> dict[str, Any]:
        return {"time": time.time(), "host": host_stats(since=previous), "gpus": gpu_stats() if self.gpus else []}

    def _run(self) -> None:
        previous = None
        try:
            while True:
                sample = self._sample(previous)
                self.callback(sample)
                self.num_samples += 1
                previous = sample["host"]
                if self._stop.wait(self.interval_s):
                    return
        except Exception as err:  # handed to the thread that calls stop()
            self.error = err

    def start(self) -> Monitor:
        """Start polling; returns self."""
        if self._thread is not None:
            raise RuntimeError("Monitor is already running")
        self._stop.clear()
        self.error = None
        self._thread = threading.Thread(target=self._run, name="gputrain-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and wait for the thread; re-raises an exception that stopped it."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        if self.error is not None:
            raise self.error

    @property
    def running(self) -> bool:
        """True while the polling thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


__all__ = ["Monitor", "gpu_stats", "gpu_unavailable_reason", "host_stats"]
