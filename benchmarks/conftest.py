"""Benchmarks report through gputrain's pytest plugin (pytest-benchmark supplies `benchmark`).

    def test_something(benchmark, gputrain_benchmark):
        benchmark.pedantic(work, rounds=...)
        gputrain_benchmark.record(gbps=..., ratio=...)   # -> extra_info, beside the machine facts

Results: pytest-benchmark's JSON (--benchmark-json=PATH, or --benchmark-autosave and
--benchmark-compare), whose extra_info holds each benchmark's metrics and gputrain.info().
"""

from __future__ import annotations

import pytest

import _gputrain_pytest as pytest_plugin


def pytest_configure(config: pytest.Config) -> None:
    # Benchmarks usually run against a build on PYTHONPATH, which has no pytest11 entry point.
    if not config.pluginmanager.has_plugin("gputrain"):
        config.pluginmanager.register(pytest_plugin, "gputrain")
