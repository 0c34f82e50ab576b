"""Loss scaler: unscale + inf check over a 100M-element fp32 gradient arena, against a plain read.

The baseline is `_C.scaler_read_baseline` at the best SIMD level: the same OpenMP blocks and
vector loads as the unscale pass, summed, nothing stored (NumPy's sum is single-threaded and
pairwise, so it is not a fair read). Each benchmark round of the unscale is preceded by one timed baseline read
of the same bytes (in pedantic's setup), so both are measured in the same run and under the
same machine load. Bandwidth is counted in gradient bytes per second (4 bytes per element),
so a ratio of 1.0 means the unscale costs no more than reading the arena once.

    python -m pytest benchmarks/bench_scaler.py

Results: pytest-benchmark's JSON (--benchmark-json=PATH), whose extra_info holds these metrics
and the machine facts, with its load average (gputrain_benchmark.record, benchmarks/conftest.py).

GPUTRAIN_BENCH_SCALER_N sets a smaller arena for a quick run.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain
from _timing import Timed, pedantic
from gputrain import _C
from gputrain.amp import GradScaler

N = int(os.environ.get("GPUTRAIN_BENCH_SCALER_N", 100_000_000))
ROUNDS = 20
LEVELS = ["scalar", "avx2", "avx512"]
SUPPORTED = LEVELS[: LEVELS.index(gputrain.info()["simd_supported"]) + 1]


@pytest.fixture(scope="module")
def arena() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(N).astype(np.float32)


@pytest.fixture(params=SUPPORTED)
def simd_level(request):
    best = gputrain.info()["simd_supported"]
    _C.set_simd_level(request.param)
    yield request.param
    _C.set_simd_level(best)


@pytest.mark.parametrize("mode", ["unscale", "check_only"])
def test_unscale_inf_check_vs_read(benchmark, gputrain_benchmark, arena, simd_level, mode):
    """mode 'unscale': scale 2**16 (read, multiply, write); 'check_only': scale 1 (no multiply)."""
    if mode == "unscale":  # alternate 2**16 and 2**-16 so the values never drift into subnormals
        scalers = [GradScaler(init_scale=2.0**16), GradScaler(init_scale=2.0**-16)]
    else:
        scalers = [GradScaler(init_scale=1.0)]
    read = Timed(lambda: _C.scaler_read_baseline(arena))
    passes = iter(range(1 << 30))

    def read_once() -> None:  # always at the best SIMD level: the machine's read bandwidth
        _C.set_simd_level(SUPPORTED[-1])
        read()
        _C.set_simd_level(simd_level)

    def unscale_once() -> bool:
        return scalers[next(passes) % len(scalers)]._unscale([arena])

    rounds = pedantic(benchmark, unscale_once, setup=read_once, rounds=ROUNDS, warmup_rounds=1)
    assert rounds.result is False
    gradient_bytes = arena.nbytes
    unscale_gbps = gradient_bytes / rounds.min / 1e9
    read_gbps = gradient_bytes / read.best() / 1e9
    median_ratio = read.median() / rounds.median
    metrics = {
        "elements": N,
        "mode": mode,
        "simd": simd_level,
        "threads": gputrain.get_num_threads(),
        "unscale_GBps": round(unscale_gbps, 2),
        "read_baseline_GBps": round(read_gbps, 2),
        "ratio_best": round(unscale_gbps / read_gbps, 3),
        "ratio_median": round(median_ratio, 3),
    }
    gputrain_benchmark.record(**metrics)
