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

import numpy as np
import pytest

import gputrain
from _timing import Timed, pedantic
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


def _triad(arrays) -> None:
    """a = b + s*c over N elements, reusing the state arrays' memory of a discarded optimizer."""
    _C.stream_triad(arrays["triad_a"], arrays["p"], arrays["g"], 0.5)


@pytest.mark.parametrize("numerics", ["exact", "fast"])
@pytest.mark.parametrize("level", SUPPORTED)
def test_adamw_vs_triad(benchmark, gputrain_benchmark, arrays, numerics, level):
    best = SUPPORTED[-1]
    arrays.setdefault("triad_a", np.empty(N, np.float32))
    opt, _ = _optimizer(arrays, numerics=numerics)
    triad = Timed(lambda: _triad(arrays))

    def setup() -> None:
        _C.set_simd_level(best)
        triad()
        _C.set_simd_level(level)

    try:
        ours = pedantic(benchmark, opt.step, setup=setup, rounds=ROUNDS, warmup_rounds=1)
    finally:
        _C.set_simd_level(best)
    adamw_gbps = BYTES_PER_PARAM * N / ours.min / 1e9
    triad_gbps = TRIAD_BYTES * N / triad.best() / 1e9
    gputrain_benchmark.record(
        elements=N, numerics=numerics, simd=level, threads=gputrain.get_num_threads(),
        adamw_GBps=round(adamw_gbps, 2), triad_GBps=round(triad_gbps, 2),
        ratio_best=round(adamw_gbps / triad_gbps, 3),
        ratio_median=round((BYTES_PER_PARAM / TRIAD_BYTES) * triad.median() / ours.median, 3),
        adamw_seconds_min=ours.min)


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
    theirs = Timed(topt.step)
    ours = pedantic(benchmark, opt.step, setup=theirs, rounds=ROUNDS, warmup_rounds=1)
    gputrain_benchmark.record(
        elements=N, numerics=numerics, torch_variant=variant, torch_version=torch.__version__,
        threads=gputrain.get_num_threads(),
        adamw_GBps=round(BYTES_PER_PARAM * N / ours.min / 1e9, 2),
        torch_GBps=round(BYTES_PER_PARAM * N / theirs.best() / 1e9, 2),
        speedup_best=round(theirs.best() / ours.min, 3),
        speedup_median=round(theirs.median() / ours.median, 3))


def test_offload_overlap(benchmark, gputrain_benchmark, arrays):
    """f = 1: every element is staged; compared with the copies alone and the update alone."""
    plain, _ = _optimizer(arrays)
    staging, back = np.empty(N, np.float32), np.empty(N, np.float32)
    update = Timed(plain.step)

    def copies() -> None:
        np.copyto(staging, arrays["g"])  # gradients to the host
        np.copyto(back, staging)  # updated parameters back to the device

    copy = Timed(copies)

    def setup() -> None:
        update()
        copy()

    offloaded, _ = _optimizer(arrays, cpu_offload_fraction=1.0)
    step = pedantic(benchmark, offloaded.step, setup=setup, rounds=ROUNDS, warmup_rounds=1).min
    bound = max(update.best(), copy.best())
    gputrain_benchmark.record(
        elements=N, threads=gputrain.get_num_threads(), offloaded_step_seconds=step,
        update_seconds=update.best(), copy_seconds=copy.best(),
        overlap_efficiency=round(step / bound, 3),
        serial_sum_ratio=round(step / (update.best() + copy.best()), 3),
        memory=offloaded.memory())
