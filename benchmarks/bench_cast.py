"""Bulk fp32 <-> bf16 / fp16 conversion (gputrain.cast) against memcpy of the same source bytes.

Bandwidth counts bytes read + bytes written. Before every timed round of a conversion, one
memcpy of the source array (gt_cast with equal dtypes: memcpy in the same OpenMP chunks and
threads) is timed in pedantic's setup, so conversion and baseline are measured in the same run
under the same machine load; `ratio` = conversion GB/s / memcpy GB/s, from medians. Each case
runs with one thread and with all of gputrain's threads (the memcpy uses the same count).
NumPy's `astype(np.float16)` / `astype(np.float32)` and ml_dtypes' bfloat16 `astype` (both
single-threaded, allocating their result as users call them) are measured the same way as peers.

    python -m pytest benchmarks/bench_cast.py --benchmark-only

GPUTRAIN_BENCH_CAST_MIB sets the size of the fp32 array (default 64 MiB).
"""

from __future__ import annotations

import os
import warnings
from typing import Callable

import ml_dtypes
import numpy as np
import pytest

import gputrain
from _timing import Timed, pedantic
from gputrain import _C

MIB = int(os.environ.get("GPUTRAIN_BENCH_CAST_MIB", 64))
N = MIB * (1 << 20) // 4
ROUNDS = 25
THREADS = gputrain.get_num_threads()
LEVELS = ["scalar", "avx2", "avx512"]
SUPPORTED = LEVELS[: LEVELS.index(gputrain.info()["simd_supported"]) + 1]
NUMPY_TYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16)}


@pytest.fixture(scope="module")
def arrays() -> dict[str, np.ndarray]:
    """The same N values in each format (values a network holds: normal with a spread of scales)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(N) * np.exp2(rng.integers(-8, 8, N))).astype(np.float32)
    return {"f32": x, "f16": x.astype(np.float16), "bf16": x.astype(ml_dtypes.bfloat16)}


@pytest.fixture(params=SUPPORTED)
def simd_level(request):
    _C.set_simd_level(request.param)
    yield request.param
    _C.set_simd_level(SUPPORTED[-1])


@pytest.fixture(params=sorted({1, THREADS}), ids=lambda n: f"{n}thr")
def threads(request):
    """One thread (NumPy's peers are single-threaded) and all of gputrain's threads."""
    gputrain.set_num_threads(request.param)
    yield request.param
    gputrain.set_num_threads(THREADS)


def measure(benchmark, src_name: str, src: np.ndarray, dst_bytes: int, convert: Callable[[], object]) -> dict:
    """Times `convert` with a memcpy of `src` before each round; returns bandwidths and ratio."""
    copy_out = np.empty_like(src)
    memcpy = Timed(lambda: gputrain.cast(src, src_name, out=copy_out))  # equal dtypes: a chunked OpenMP memcpy
    median = pedantic(benchmark, convert, setup=memcpy, rounds=ROUNDS, warmup_rounds=2).median
    moved = src.nbytes + dst_bytes
    copy_median = memcpy.median()
    metrics = {
        "elements": int(src.size),
        "bytes_read": int(src.nbytes),
        "bytes_written": int(dst_bytes),
        "threads": gputrain.get_num_threads(),
        "rounds": ROUNDS,
        "median_s": median,
        "memcpy_median_s": copy_median,
        "GBps": round(moved / median / 1e9, 2),
        "memcpy_GBps": round(2 * src.nbytes / copy_median / 1e9, 2),
    }
    metrics["ratio_to_memcpy"] = round(metrics["GBps"] / metrics["memcpy_GBps"], 3)
    benchmark.extra_info.update(metrics)
    return metrics


@pytest.mark.parametrize(("src", "dst"), [("f32", "bf16"), ("f32", "f16"), ("bf16", "f32"), ("f16", "f32")])
def test_gputrain_cast(benchmark, gputrain_benchmark, arrays, simd_level, threads, src, dst):
    source = arrays[src]
    out = np.empty(N, NUMPY_TYPES[dst])
    metrics = measure(benchmark, src, source, out.nbytes, lambda: gputrain.cast(source, dst, out=out))
    assert np.array_equal(out.view(np.uint8), source.astype(NUMPY_TYPES[dst]).view(np.uint8))
    gputrain_benchmark.record(simd=simd_level, **metrics)


PEERS = {
    "numpy_astype_f32_to_f16": ("f32", np.float16),
    "numpy_astype_f16_to_f32": ("f16", np.float32),
    "ml_dtypes_astype_f32_to_bf16": ("f32", ml_dtypes.bfloat16),
    "ml_dtypes_astype_bf16_to_f32": ("bf16", np.float32),
}


@pytest.mark.parametrize("peer", list(PEERS))
def test_peer_astype(benchmark, gputrain_benchmark, arrays, peer):
    """Single-threaded peers, against a single-threaded memcpy."""
    gputrain.set_num_threads(1)
    src, target = PEERS[peer]
    source = arrays[src]

    def convert() -> np.ndarray:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return source.astype(target)

    try:
        metrics = measure(benchmark, src, source, N * np.dtype(target).itemsize, convert)
    finally:
        gputrain.set_num_threads(THREADS)
    gputrain_benchmark.record(peer=peer, **metrics)
