"""Shared benchmark fixtures (pytest-benchmark supplies `benchmark`).

    def test_something(benchmark, record):
        benchmark(work)
        record(gbps=..., ratio=...)          # -> benchmarks/results/<module>.<test>.json

See _record.py for what a result file holds.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _record  # noqa: E402  (needs the path above under --import-mode=importlib)

from gputrain.testing import pytest_plugin  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # Benchmarks usually run against a build on PYTHONPATH, which has no pytest11 entry point.
    if not config.pluginmanager.has_plugin("gputrain"):
        config.pluginmanager.register(pytest_plugin, "gputrain")


def default_name(node: pytest.Item) -> str:
    """'<module without bench_>.<test name with parameters>', e.g. 'cast.test_convert-f32-bf16'."""
    module = Path(str(node.fspath)).stem.removeprefix("bench_")
    return re.sub(r"[^A-Za-z0-9_.\-]+", "-", f"{module}.{node.name}").strip("-")


@pytest.fixture
def record(request: pytest.FixtureRequest) -> Callable[..., Path]:
    """record(**metrics) saves metrics under this test's name; record(name=..., **metrics) under another."""

    def save(name: str | None = None, **metrics: Any) -> Path:
        return _record.record(name or default_name(request.node), **metrics)

    return save
