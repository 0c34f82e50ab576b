"""gputrain's pytest plugin, registered as ``gputrain`` through the package's pytest11 entry point.

A top-level module (as hypothesis's ``_hypothesis_pytestplugin``), so that loading it in every
pytest run of an environment where gputrain is installed imports neither gputrain nor NumPy:
gputrain is imported only by a test that uses one of the fixtures below, or when a test module
that itself imports gputrain has a ``cuda``/``sim`` marker. A ``cuda`` marker in a test module
that does not use gputrain (a PyTorch project's, say) is left alone.

- ``gputrain_benchmark``: whole optimizer steps benchmarked with pytest-benchmark, with samples/s,
  the memory plan, the allocator's peaks and the machine facts in ``extra_info``
  (gputrain.testing.benchmark.StepBenchmark);
- ``gputrain_seed``: gputrain's and NumPy's generators seeded for each test (0, or the value of
  ``@pytest.mark.parametrize("gputrain_seed", [...], indirect=True)``); yields the seed;
- markers ``cuda`` (skipped without a usable CUDA device, saying why) and ``sim`` (skipped when
  this build has no simulated device 'sim').

Importing the plugin does no work beyond its definitions; pytest-benchmark is never imported
here, and a test that uses gputrain_benchmark without it fails saying how to install it.
Assertions for tests live in gputrain.testing.
"""

from __future__ import annotations

from collections.abc import Iterator

import types
from typing import Any

import pytest

# pytest-benchmark registers itself as "benchmark" (entry point) or by module name (-p).
_PYTEST_BENCHMARK = ("benchmark", "pytest_benchmark.plugin")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs a usable CUDA device; skipped without one, saying why")
    config.addinivalue_line("markers", "sim: needs gputrain's simulated device 'sim'; skipped when this build has none")
    if not any(config.pluginmanager.has_plugin(name) for name in _PYTEST_BENCHMARK):
        config.pluginmanager.register(_NoPytestBenchmark(), "gputrain-no-pytest-benchmark")


def cuda_skip_reason() -> str | None:
    """Why `cuda`-marked tests cannot run here, or None when a CUDA device is usable."""
    import gputrain

    if gputrain.cuda.is_available():
        return None
    return f"needs a usable CUDA device: {gputrain.info()['cuda_unavailable_reason']}"


def sim_skip_reason() -> str | None:
    """Why `sim`-marked tests cannot run here, or None when the build has the 'sim' device."""
    import gputrain

    try:
        gputrain.memory_stats("sim")
    except ValueError as error:
        return f"needs gputrain's simulated device 'sim', which this build does not have ({error})"
    return None


def uses_gputrain(item: pytest.Item) -> bool:
    """Whether the test's module imported gputrain, or something from it, at its top level."""
    module = getattr(item, "module", None)
    return module is not None and any(_from_gputrain(value) for value in vars(module).values())


def _from_gputrain(value: Any) -> bool:
    name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
    return isinstance(name, str) and name.split(".")[0] == "gputrain"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, reason_of in (("cuda", cuda_skip_reason), ("sim", sim_skip_reason)):
        marked = [item for item in items
                  if item.get_closest_marker(marker) is not None and uses_gputrain(item)]
        reason = reason_of() if marked else None
        for item in marked if reason else ():
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def gputrain_seed(request: pytest.FixtureRequest) -> Iterator[int]:
    """gputrain.random.manual_seed and numpy.random.seed with this test's seed (default 0)."""
    from gputrain.testing import determinism

    seed = getattr(request, "param", 0)
    determinism.seed_all(seed)
    yield seed


@pytest.fixture
def gputrain_benchmark(request: pytest.FixtureRequest, benchmark: object) -> Any:
    """Whole optimizer steps timed by pytest-benchmark (a gputrain.testing.benchmark.StepBenchmark)."""
    from gputrain.testing import benchmark as _benchmark

    options = {"min_rounds": request.config.getoption("benchmark_min_rounds"),
               "max_time": request.config.getoption("benchmark_max_time")}
    marker = request.node.get_closest_marker("benchmark")
    options.update({k: v for k, v in (marker.kwargs if marker else {}).items() if k in options})
    return _benchmark.StepBenchmark(benchmark, min_rounds=int(options["min_rounds"]),
                                    max_time=float(options["max_time"]))


class _NoPytestBenchmark:
    """Registered only without pytest-benchmark: its `benchmark` fixture says what is missing."""

    @pytest.fixture
    def benchmark(self) -> None:
        pytest.fail("gputrain_benchmark needs pytest-benchmark: pip install pytest-benchmark "
                    "(or gputrain[test]), and do not disable it with -p no:benchmark", pytrace=False)
