"""Memory per memory kind ('cpu', 'pinned', 'cuda:N', 'sim:N'): a step's exact plan, the allocator's
measured peaks, and an assertion that both stay within a budget."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gputrain import _C
from gputrain.memory import format_bytes, memory_stats
from gputrain.step import TrainStep

_KIND = re.compile(r"^(cpu|pinned|cuda:\d+|sim:\d+)$")
_LARGEST_REGIONS = 3  # regions named in a failure message, largest first


def memory_kinds() -> list[str]:
    """Every memory kind of this process: 'cpu', 'pinned' and each usable 'cuda:N'."""
    return ["cpu", "pinned", *(f"cuda:{i}" for i in range(_C.cuda_device_count()))]


def memory_plan(step: TrainStep, batch_shape: Sequence[int] | np.ndarray) -> dict[str, dict[str, int]]:
    """The exact bytes of every region a step allocates for a batch of this shape, under the memory
    kind they live in (the model's device), e.g. ``{"cpu": {"parameters": ..., "total": ...}}``."""
    if not isinstance(step, TrainStep):
        raise TypeError(f"step must be a gputrain.TrainStep, not {type(step).__name__}")
    return {step.model.compiled.device: dict(step.memory_plan(batch_shape))}


def peak_memory(kinds: Iterable[str] | None = None) -> dict[str, int]:
    """The allocator's peak reserved bytes per memory kind since its last
    gputrain.reset_peak_memory_stats (default: every kind of memory_kinds())."""
    return {kind: int(memory_stats(check_kind(kind, "kinds"))["peak_reserved_bytes"])
            for kind in (memory_kinds() if kinds is None else kinds)}


def reset_peak_memory(kinds: Iterable[str] | None = None) -> None:
    """Reset the allocator's peaks of these memory kinds (default: all) to their current use."""
    for kind in memory_kinds() if kinds is None else kinds:
        _C.reset_peak_memory_stats(device=check_kind(kind, "kinds"))


def check_kind(kind: Any, name: str) -> str:
    """`kind` if it names a memory kind, else ValueError naming the argument `name`."""
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise ValueError(f"{name}: {kind!r} is not a memory kind ('cpu', 'pinned', 'cuda:N' or 'sim:N')")
    return kind


def _check_budget(budget: Any) -> dict[str, int]:
    if not isinstance(budget, Mapping) or not budget:
        raise TypeError("budget must be a non-empty dict of bytes per memory kind, e.g. {'cpu': 64 << 20}")
    checked = {}
    for kind, limit in budget.items():
        check_kind(kind, "budget")
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
            raise ValueError(f"budget[{kind!r}] must be a number of bytes >= 0, got {limit!r}")
        checked[kind] = int(limit)
    return checked


def _plan_total(regions: Mapping[str, int]) -> int:
    return int(regions["total"]) if "total" in regions else int(sum(regions.values()))


def _usage(source: Any) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(plan per kind, measured peak per kind) of what assert_memory_within was given."""
    plan, peaks = getattr(source, "memory_plan", None), getattr(source, "memory_peaks", None)
    if isinstance(plan, Mapping) and isinstance(peaks, Mapping):  # a benchmark's StepResult
        return dict(plan), dict(peaks)
    if isinstance(source, TrainStep):
        compiled = source.model.compiled
        if compiled.current_plan is None:
            raise ValueError("source: this TrainStep has not run a step, so it has no memory plan yet; "
                             "pass gputrain.testing.memory_plan(step, batch_shape) instead")
        return {compiled.device: dict(compiled.current_plan)}, {}
    if not isinstance(source, Mapping) or not source:
        raise TypeError("source must be a TrainStep, a gputrain_benchmark result, a plan per memory kind "
                        "({'cpu': {'parameters': ..., ...}}) or peaks per memory kind ({'cpu': bytes}), "
                        f"not {type(source).__name__}")
    for kind in source:
        if isinstance(kind, str) and not _KIND.match(kind):
            raise ValueError(f"source: {kind!r} is not a memory kind ('cpu', 'pinned', 'cuda:N' or 'sim:N'); a plan "
                             "from TrainStep.memory_plan() does not say where it lives: use "
                             "gputrain.testing.memory_plan(step, batch_shape)")
        check_kind(kind, "source")
    if all(isinstance(value, Mapping) for value in source.values()):
        return {kind: dict(regions) for kind, regions in source.items()}, {}
    return {}, {kind: int(value) for kind, value in source.items()}


def _over(kind: str, what: str, used: int, limit: int, regions: Mapping[str, int] | None) -> str:
    line = (f"{kind} {what}: {format_bytes(used)} ({used:,} bytes) > budget "
            f"{format_bytes(limit)} ({limit:,} bytes)")
    if regions:
        largest = sorted(((v, k) for k, v in regions.items() if k != "total"), reverse=True)
        line += "; largest regions: " + ", ".join(f"{k} {format_bytes(v)}" for v, k in largest[:_LARGEST_REGIONS])
    return line


def assert_memory_within(source: Any, budget: Mapping[str, int]) -> None:
    """Assert that planned and measured memory fit `budget` (bytes per memory kind).

    `source` is a gputrain_benchmark result (its exact plan and the allocator's peaks measured
    while it ran), a TrainStep that has run (the plan of its last step), a plan per memory kind
    (``gputrain.testing.memory_plan(step, shape)``) or peaks per memory kind
    (``gputrain.testing.peak_memory()``). Kinds the source does not use count as 0 bytes; kinds
    the budget does not name are not checked. Raises AssertionError naming every kind over
    budget, with the largest planned regions.
    """
    limits = _check_budget(budget)
    plan, peaks = _usage(source)
    failures = []
    for kind, limit in limits.items():
        if kind in plan and _plan_total(plan[kind]) > limit:
            failures.append(_over(kind, "planned", _plan_total(plan[kind]), limit, plan[kind]))
        if peaks.get(kind, 0) > limit:
            failures.append(_over(kind, "allocator peak", peaks[kind], limit, None))
    if failures:
        raise AssertionError("memory over budget:\n  " + "\n  ".join(failures))
