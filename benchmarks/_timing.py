"""What every benchmark shares: a baseline timed beside pytest-benchmark's rounds (Timed), the rounds'
times whether or not pytest-benchmark is disabled (pedantic), the sgemm peak, and printing a
benchmark's metrics.

Under ``pytest --benchmark-disable`` pytest-benchmark runs the function once and keeps no stats
(``benchmark.stats`` is None); ``pedantic`` then times that one call itself, so every benchmark
still computes and records its metrics (from one round): CI runs them so as smoke tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import gputrain as gt


class Timed:
    """Calls fn and keeps how long each call took (a pedantic `setup`, timed by itself)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.seconds = fn, []

    def __call__(self) -> None:
        start = time.perf_counter()
        self.fn()
        self.seconds.append(time.perf_counter() - start)

    def median(self) -> float:
        return float(np.median(self.seconds))

    def best(self) -> float:
        return min(self.seconds)


@dataclass
class Rounds:
    """The timed rounds of a benchmark: their seconds, in order, and the function's last result."""

    seconds: list[float]
    result: Any

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    @property
    def min(self) -> float:
        return min(self.seconds)


def pedantic(benchmark: Any, fn: Callable[..., Any], *, setup: Callable[[], Any] | None = None,
             rounds: int, warmup_rounds: int = 0) -> Rounds:
    """benchmark.pedantic(fn, ...) and the seconds of its rounds: pytest-benchmark's, or, when it is
    disabled (it then calls setup and fn once), that one call timed here."""
    if not benchmark.disabled:
        result = benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=warmup_rounds)
        return Rounds(list(benchmark.stats.stats.data), result)
    seconds: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds.append(time.perf_counter() - start)
        return result

    result = benchmark.pedantic(timed, setup=setup, rounds=rounds, warmup_rounds=warmup_rounds)
    return Rounds(seconds, result)


def sgemm_peak(repeats: int = 5) -> float:
    """FLOP/s of a 2048^3 sgemm through gputrain's BLAS (median of `repeats`, after a warm-up)."""
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    gt.functional.gemm(a, a)
    timed = Timed(lambda: gt.functional.gemm(a, a))
    for _ in range(repeats):
        timed()
    return 2 * 2048**3 / timed.median()


def machine() -> dict[str, Any]:
    """The run's threads, SIMD level and load average, for a benchmark's metrics."""
    return {"threads": gt.get_num_threads(), "simd": gt.info()["simd"], "load_average": os.getloadavg()[0]}


def benchmark_op(benchmark: Any, gputrain_benchmark: Any, ours: Callable[[], Any], torch_call: Callable[[], Timed | None],
                 torch_name: str, rounds: int, flops: float, **facts: Any) -> None:
    """Times `ours` (an op's forward and backward, warmed up here) for `rounds`, PyTorch's call
    (torch_call's, None without torch) before each round; records and prints the milliseconds,
    the GEMM FLOP/s (`flops` a call) as a fraction of the sgemm peak, and the ratio to PyTorch."""
    peak = sgemm_peak()
    ours()
    torch = torch_call()
    seconds = pedantic(benchmark, ours, setup=torch, rounds=rounds, warmup_rounds=1)
    metrics = {
        **facts,
        "ms": seconds.median * 1e3,
        "best_ms": seconds.min * 1e3,
        "gflops": flops / seconds.median / 1e9,
        "fraction_of_sgemm_peak": flops / seconds.median / peak,
        **machine(),
    }
    if torch is None:
        metrics["torch"] = "not installed"
    else:
        metrics[f"{torch_name}_ms"] = torch.median() * 1e3
        metrics[f"speedup_vs_{torch_name}"] = torch.median() / seconds.median
    gputrain_benchmark.record(**metrics)
    show(metrics)


def show(metrics: dict[str, Any]) -> None:
    """Prints metrics with floats rounded to 3 digits."""
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in metrics.items()})
