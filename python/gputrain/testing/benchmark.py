"""Benchmarking whole optimizer steps through pytest-benchmark (the gputrain_benchmark fixture).

A step is benchmarked properly: its memory plan is taken before anything is timed, warm-up steps
run untimed (arenas allocated, threads started, caches warm), then every timed round is one whole
optimizer step. What a result depends on goes into pytest-benchmark's ``extra_info`` (so
``--benchmark-json`` and ``--benchmark-compare`` carry it): samples/s (tokens/s), the plan and
the allocator's peaks per memory kind, and the machine facts of ``python -m gputrain``.
pytest-benchmark is not imported here: the fixture hands in its ``benchmark`` object.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import gputrain
from gputrain.step import TrainStep
from gputrain.testing import memory


def machine_facts() -> dict[str, Any]:
    """What a measurement depends on besides the code: gputrain.info() (CPU and SIMD level, BLAS
    and its kernel, CUDA, threads, versions), the GPUs' names, NumPy and Python versions, load."""
    facts = gputrain.info()
    facts["gpus"] = [gputrain.cuda.get_device_name(i) for i in range(gputrain.cuda.device_count())]
    facts["numpy"] = np.__version__
    facts["python"] = platform.python_version()
    facts["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return facts


def time_steps(step: Callable[[], Any], *, rounds: int = 10, warmup: int = 1) -> float:
    """Median seconds of `step()` over `rounds` calls after `warmup` untimed ones: a baseline
    measured in the same run as a benchmark (pytest-benchmark times one function per test)."""
    _check_count(rounds, "rounds", 1)
    _check_count(warmup, "warmup", 0)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _check_count(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_run(tokens_per_sample: Any, warmup: Any, rounds: Any) -> None:
    if tokens_per_sample is not None:
        _check_count(tokens_per_sample, "tokens_per_sample", 1)
    _check_count(warmup, "warmup", 0)
    if rounds is not None:
        _check_count(rounds, "rounds", 1)


def _seconds_of(value: Any, name: str) -> float:
    seconds = getattr(value, "seconds", value)
    if seconds is None:
        raise ValueError(f"{name}: no timing (benchmarks are disabled: --benchmark-disable)")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"{name} must be a benchmark result or seconds > 0, got {value!r}")
    return float(seconds)


def assert_step_time_within(result: Any, baseline: Any, *, ratio: float) -> None:
    """Assert `result`'s step time is at most `ratio` times `baseline`'s (both a gputrain_benchmark
    result or seconds per step, e.g. from time_steps() in the same run)."""
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not (ratio > 0 and math.isfinite(ratio)):
        raise ValueError(f"ratio must be a positive finite number, got {ratio!r}")
    seconds, base = _seconds_of(result, "result"), _seconds_of(baseline, "baseline")
    if seconds > ratio * base:
        raise AssertionError(f"step takes {seconds * 1e3:.3f} ms = {seconds / base:.3f}x the baseline's "
                             f"{base * 1e3:.3f} ms, above the allowed {ratio}x")


@dataclass(frozen=True)
class StepResult:
    """What gputrain_benchmark measured (the same numbers are in the benchmark's extra_info)."""

    seconds: float | None                    # median seconds per optimizer step (None: benchmarks disabled)
    samples_per_s: float | None              # samples per step / median step seconds
    tokens_per_s: float | None               # samples_per_s * tokens_per_sample (None without it)
    memory_plan: dict[str, dict[str, int]]   # exact bytes per region, per memory kind
    memory_peaks: dict[str, int]             # allocator's peak reserved bytes per memory kind, during the run
    last: Any                                # what the last step returned (a StepOutput for train_step)


class StepBenchmark:
    """The gputrain_benchmark fixture: whole optimizer steps timed by pytest-benchmark's pedantic.

    ``train_step(step, x, y)`` (or ``loader=``) benchmarks a gputrain.TrainStep; calling the
    fixture, ``gputrain_benchmark(fn, samples_per_step=n)``, benchmarks any callable that makes one
    optimizer step; ``record(**metrics)`` adds a test's own metrics to extra_info. Rounds: enough
    steps to fill --benchmark-max-time, at least --benchmark-min-rounds (or ``rounds=``).
    """

    def __init__(self, benchmark: Any, *, min_rounds: int, max_time: float) -> None:
        self.benchmark = benchmark
        self.min_rounds = min_rounds
        self.max_time = max_time
        self.record()

    @property
    def extra_info(self) -> dict[str, Any]:
        """pytest-benchmark's extra_info dict of this benchmark (written to its JSON)."""
        return self.benchmark.extra_info

    def record(self, **metrics: Any) -> None:
        """Add `metrics` (JSON-serialisable values) and the current machine facts to extra_info."""
        for name, value in metrics.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as error:
                raise TypeError(f"{name}: extra_info values must be JSON-serialisable ({error})") from None
        self.extra_info.update(metrics)
        self.extra_info["gputrain_info"] = machine_facts()

    def __call__(self, step: Callable[[], Any], *, samples_per_step: int, tokens_per_sample: int | None = None,
                 memory_plan: Mapping[str, Mapping[str, int]] | None = None, warmup: int = 2,
                 rounds: int | None = None) -> StepResult:
        """Benchmark `step()`, one whole optimizer step on `samples_per_step` samples, which must
        return when its work is done (a TrainStep does: it reads the loss); `memory_plan` (per
        memory kind) is recorded as given."""
        if not callable(step):
            raise TypeError(f"step must be callable, not {type(step).__name__}")
        _check_count(samples_per_step, "samples_per_step", 1)
        _check_run(tokens_per_sample, warmup, rounds)

        def one_step() -> tuple[Any, int]:
            return step(), samples_per_step

        plan = {memory.check_kind(kind, "memory_plan"): dict(regions)
                for kind, regions in (memory_plan or {}).items()}
        return self._measure(one_step, plan, tokens_per_sample, warmup, rounds)

    def train_step(self, step: TrainStep, x: np.ndarray | None = None, y: np.ndarray | None = None, *,
                   loader: Iterable[Any] | None = None, tokens_per_sample: int | None = None,
                   warmup: int = 2, rounds: int | None = None) -> StepResult:
        """Benchmark `step` on the batch (x, y), or on the batches of `loader` (an (x, y) per
        item; a new epoch starts when it runs out), fetching included in the step's time.
        With --benchmark-disable, one step runs (no warm-up) and only the memory is recorded."""
        if not isinstance(step, TrainStep):
            raise TypeError(f"step must be a gputrain.TrainStep, not {type(step).__name__}")
        if loader is not None and (x is not None or y is not None):
            raise TypeError("give the batch x, y or loader=, not both")
        if loader is None and (x is None or y is None):
            raise TypeError("give the batch as x and y, or batches as loader=")
        if isinstance(loader, Iterator):
            raise TypeError("loader must be re-iterable (a DataLoader or a list of batches), not an iterator")
        _check_run(tokens_per_sample, warmup, rounds)
        batches = _epochs(loader) if loader is not None else None
        first = next(batches) if batches is not None else (x, y)
        plan = memory.memory_plan(step, np.shape(first[0]))
        pending = [first]

        def one_step() -> tuple[Any, int]:
            bx, by = pending.pop() if pending else (next(batches) if batches is not None else (x, y))
            return step(bx, by), len(bx)

        return self._measure(one_step, plan, tokens_per_sample, warmup, rounds)

    def _measure(self, one_step: Callable[[], tuple[Any, int]], plan: dict[str, dict[str, int]],
                 tokens_per_sample: int | None, warmup: int, rounds: int | None) -> StepResult:
        if self.benchmark.disabled:  # pytest-benchmark's --benchmark-disable: run the step once
            warmup = 0
        kinds = sorted(set(memory.memory_kinds()) | set(plan))
        gc.collect()  # earlier tests' models (reference cycles) must not count in this run's peaks
        memory.reset_peak_memory(kinds)
        warm_times = []
        for _ in range(warmup):
            start = time.perf_counter()
            one_step()
            warm_times.append(time.perf_counter() - start)
        if rounds is None:
            estimate = statistics.median(warm_times) if warm_times else 0.0
            rounds = max(self.min_rounds, math.ceil(self.max_time / estimate) if estimate > 0 else 1)
        samples: list[int] = []

        def timed() -> Any:
            last, count = one_step()
            samples.append(count)
            return last

        last = self.benchmark.pedantic(timed, rounds=rounds, warmup_rounds=0, iterations=1)
        stats = getattr(self.benchmark, "stats", None)
        seconds = stats.stats.median if stats is not None else None
        samples_per_s = statistics.mean(samples) / seconds if seconds else None
        tokens_per_s = samples_per_s * tokens_per_sample if samples_per_s and tokens_per_sample else None
        result = StepResult(seconds, samples_per_s, tokens_per_s, plan, memory.peak_memory(kinds), last)
        per_step = samples[0] if len(set(samples)) == 1 else statistics.mean(samples)
        metrics = {"samples_per_step": per_step, "samples_per_s": samples_per_s, "warmup_steps": warmup}
        if tokens_per_sample is not None:
            metrics.update(tokens_per_sample=tokens_per_sample, tokens_per_s=tokens_per_s)
        self.record(**metrics, memory_plan=result.memory_plan, memory_peak_bytes=result.memory_peaks)
        return result


def _epochs(loader: Iterable[Any]) -> Iterator[Any]:
    """The loader's items, epoch after epoch (a fresh iter() each time it runs out)."""
    while True:
        empty = True
        for item in loader:
            empty = False
            yield item
        if empty:
            raise ValueError("loader: yields no batches")
