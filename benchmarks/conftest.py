"""Benchmarks report through gputrain's pytest plugin (pytest-benchmark supplies `benchmark`).

    def test_something(benchmark, gputrain_benchmark):
        benchmark.pedantic(work, rounds=...)
        gputrain_benchmark.record(gbps=..., ratio=...)   # -> extra_info, beside the machine facts

Results: pytest-benchmark's JSON (--benchmark-json=PATH, or --benchmark-autosave and
--benchmark-compare), whose extra_info holds each benchmark's metrics and gputrain.info().
Benchmarks time their rounds through _timing.pedantic, so that under --benchmark-disable each
still runs once and records its metrics: a smoke test (tests/test_benchmarks_smoke.py).
"""

from __future__ import annotations

import os

import pytest

import _gputrain_pytest as pytest_plugin


def pytest_configure(config: pytest.Config) -> None:
    # Benchmarks usually run against a build on PYTHONPATH, which has no pytest11 entry point.
    if not config.pluginmanager.has_plugin("gputrain"):
        config.pluginmanager.register(pytest_plugin, "gputrain")
    # GPUTRAIN_BENCH_SIMD=avx2 runs gputrain at that level (as on a CPU without AVX-512); give
    # PyTorch ATEN_CPU_CAPABILITY=avx2 and oneDNN's GEMMs ONEDNN_MAX_CPU_ISA=AVX2 to match.
    if os.environ.get("GPUTRAIN_BENCH_SIMD"):
        import gputrain

        gputrain._C.set_simd_level(os.environ["GPUTRAIN_BENCH_SIMD"])
