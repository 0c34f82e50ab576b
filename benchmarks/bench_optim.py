"""AdamW update over N fp32 parameters (default 100M): GB/s at 28 bytes per parameter (read p, g,
m, v; write p, m, v), as a ratio to STREAM's triad measured in the same run, and to PyTorch's
CPU AdamW (foreach and fused) when PyTorch is installed; and the offloaded step's overlap.

    python -m pytest benchmarks/bench_optim.py

Baselines, each timed before every round of the update (pedantic's setup), so both see the
same machine load:
  - triad: `_C.stream_triad` (a = b + s*c, all threads, one OpenMP region, best SIMD level),
    12 bytes per element as STREAM counts it;
  - PyTorch: torch.optim.AdamW(foreach=True) and (fused=True) on the same-size tensor, with
    torch.set_num_threads equal to ours (ratio = PyTorch's time / ours).
Offload: with cpu_offload_fraction=1 every element goes through the staging pipeline. On this
GPU-less machine the "device" is the CPU, so the copies (gradients to the staging buffers,
updated values back, on the copy thread) compete with the update for the same cores and memory:
overlap efficiency = offloaded step time / max(copy time, update time), where copy time is a
single-threaded copy of the same bytes (what the copy thread does) and update time is the f=0 step.

GPUTRAIN_BENCH_OPTIM_N sets a smaller N for a quick run. Results: --benchmark-json's
extra_info (gputrain_benchmark.record).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import gputrain
from gputrain import _C
from gputrain.nn import Parameter
from gputrain.optim import AdamW

N = int(os.environ.get("GPUTRAIN_BENCH_OPTIM_N", 100_000_000))
ROUNDS = 5
BYTES_PER_PARAM = 28
TRIAD_BYTES = 12
LEVELS = ["scalar", "avx2", "avx512"]
SUPPORTED = LEVELS[: LEVELS.index(gputrain.info()["simd_supported"]) + 1]


@pytest.fixture(scope="module")
def arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"p": rng.standard_normal(N, dtype=np.float32), "g": rng.standard_normal(N, dtype=np.float32)}


def _optimizer(arrays, **options) -> tuple[AdamW, Parameter]:
    p = Parameter(arrays["p"])
    p.grad = arrays["g"]
    return AdamW([p], lr=1e-6, weight_decay=0.0, **options), p


def _triad(arrays, seconds: list[float]) -> None:
    """a = b + s*c over N elements, reusing the state arrays' memory of a discarded optimizer."""
    a, b, c = arrays["triad_a"], arrays["p"], arrays["g"]
    start = time.perf_counter()
    _C.stream_triad(a, b, c, 0.5)
    seconds.append(time.perf_counter() - start)


@pytest.mark.parametrize("numerics", ["exact", "fast"])
@pytest.mark.parametrize("level", SUPPORTED)
def test_adamw_vs_triad(benchmark, gputrain_benchmark, arrays, numerics, level):
    best = SUPPORTED[-1]
    arrays.setdefault("triad_a", np.empty(N, np.float32))
    opt, _ = _optimizer(arrays, numerics=numerics)
    triad_seconds: list[float] = []

    def setup() -> None:
        _C.set_simd_level(best)
        _triad(arrays, triad_seconds)
        _C.set_simd_level(level)

    try:
        benchmark.pedantic(opt.step, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    finally:
        _C.set_simd_level(best)
    adamw_gbps = BYTES_PER_PARAM * N / benchmark.stats.stats.min / 1e9
    triad_gbps = TRIAD_BYTES * N / min(triad_seconds) / 1e9
    gputrain_benchmark.record(
        elements=N, numerics=numerics, simd=level, threads=gputrain.get_num_threads(),
        adamw_GBps=round(adamw_gbps, 2), triad_GBps=round(triad_gbps, 2),
        ratio_best=round(adamw_gbps / triad_gbps, 3),
        ratio_median=round((BYTES_PER_PARAM / TRIAD_BYTES) * float(np.median(triad_seconds))
                           / benchmark.stats.stats.median, 3),
        adamw_seconds_min=benchmark.stats.stats.min)


@pytest.mark.parametrize("variant", ["foreach", "fused"])
@pytest.mark.parametrize("numerics", ["exact", "fast"])
def test_adamw_vs_pytorch(benchmark, gputrain_benchmark, arrays, numerics, variant):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(gputrain.get_num_threads())
    tp = torch.nn.Parameter(torch.from_numpy(arrays["p"].copy()))
    tp.grad = torch.from_numpy(arrays["g"].copy())
    topt = torch.optim.AdamW([tp], lr=1e-6, weight_decay=0.0, **{variant: True})
    topt.step()  # state allocated outside the timing
    opt, _ = _optimizer(arrays, numerics=numerics)
    torch_seconds: list[float] = []

    def setup() -> None:
        start = time.perf_counter()
        topt.step()
        torch_seconds.append(time.perf_counter() - start)

    benchmark.pedantic(opt.step, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    ours = benchmark.stats.stats
    gputrain_benchmark.record(
        elements=N, numerics=numerics, torch_variant=variant, torch_version=torch.__version__,
        threads=gputrain.get_num_threads(),
        adamw_GBps=round(BYTES_PER_PARAM * N / ours.min / 1e9, 2),
        torch_GBps=round(BYTES_PER_PARAM * N / min(torch_seconds) / 1e9, 2),
        speedup_best=round(min(torch_seconds) / ours.min, 3),
        speedup_median=round(float(np.median(torch_seconds)) / ours.median, 3))


def test_offload_overlap(benchmark, gputrain_benchmark, arrays):
    """f = 1: every element is staged; compared with the copies alone and the update alone."""
    plain, _ = _optimizer(arrays)
    update_seconds, copy_seconds = [], []
    staging, back = np.empty(N, np.float32), np.empty(N, np.float32)

    def setup() -> None:
        start = time.perf_counter()
        plain.step()
        update_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        np.copyto(staging, arrays["g"])  # gradients to the host
        np.copyto(back, staging)  # updated parameters back to the device
        copy_seconds.append(time.perf_counter() - start)

    offloaded, _ = _optimizer(arrays, cpu_offload_fraction=1.0)
    benchmark.pedantic(offloaded.step, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    step = benchmark.stats.stats.min
    bound = max(min(update_seconds), min(copy_seconds))
    gputrain_benchmark.record(
        elements=N, threads=gputrain.get_num_threads(), offloaded_step_seconds=step,
        update_seconds=min(update_seconds), copy_seconds=min(copy_seconds),
        overlap_efficiency=round(step / bound, 3),
        serial_sum_ratio=round(step / (min(update_seconds) + min(copy_seconds)), 3),
        memory=offloaded.memory())
