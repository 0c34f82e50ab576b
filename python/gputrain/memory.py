"""Memory accounting: limits, statistics and a printable summary, per device."""

from __future__ import annotations

from gputrain import _C


def _default_device(device: str | None) -> str:
    if device is not None:
        return device
    return "cuda:0" if _C.cuda_device_count() > 0 else "cpu"


def set_memory_limit(limit: int | None, device: str | None = None) -> None:
    """Cap the bytes gputrain may reserve on `device` (None removes the cap)."""
    _C.set_memory_limit(limit, device=_default_device(device))


def set_memory_fraction(fraction: float, device: str | None = None) -> None:
    """Cap reserved bytes at `fraction` of the device's memory, like
    torch.cuda.set_per_process_memory_fraction."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction must be a float, not {type(fraction).__name__}")
    _C.set_memory_fraction(float(fraction), device=_default_device(device))


def memory_stats(device: str | None = None) -> dict[str, int | None]:
    """The allocator's statistics for `device` ('cpu', 'pinned', 'cuda:N', 'sim:N')."""
    return _C.memory_stats(device=_default_device(device))


def reset_peak_memory_stats(device: str | None = None) -> None:
    """Reset the peak statistics of `device` to the current values."""
    _C.reset_peak_memory_stats(device=_default_device(device))


def device_counters(device: str, reset: bool = False) -> dict[str, int]:
    """What gputrain asked of an accelerator ('cuda:N', 'sim:N') through its device interface
    since the last reset, counted the same way for every backend: `syncs` (host waits: blocking
    copies and fills, stream/event synchronisations, the gradient-norm read), `launches` (work
    queued: asynchronous copies, fills and the training step's optimizer/scaler/EMA kernels; the
    model's layer ops are not counted), `h2d_bytes`, `d2h_bytes`, `d2d_bytes`, `allocs` and
    `frees` (device allocations). `reset=True` zeroes them after reading."""
    return _C.device_counters(device, reset=reset)


def format_bytes(n: int | None) -> str:
    """1536 -> '1.50 KiB'; None -> 'none'."""
    if n is None:
        return "none"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def memory_summary(device: str | None = None) -> str:
    """A table of the allocator's statistics for `device` and for pinned host memory."""
    devices = [_default_device(device)]
    if "pinned" not in devices:
        devices.append("pinned")
    rows = [f"{'pool':<8} {'allocated':>12} {'reserved':>12} {'peak':>12} {'limit':>12} {'allocs':>8} {'ooms':>6}"]
    for name in devices:
        s = _C.memory_stats(device=name)
        rows.append(
            f"{name:<8} {format_bytes(s['allocated_bytes']):>12} {format_bytes(s['reserved_bytes']):>12} "
            f"{format_bytes(s['peak_reserved_bytes']):>12} {format_bytes(s['limit_bytes']):>12} "
            f"{s['num_allocs']:>8} {s['num_ooms']:>6}"
        )
    return "\n".join(rows)
