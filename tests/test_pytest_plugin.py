"""gputrain's pytest plugin and gputrain.testing: the benchmark example (docs/guides/benchmarking.md) in a quick mode,
the fixtures, markers and assertions. Benchmarks run in inner pytest sessions (pytester), so the
test suite itself never times anything."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gputrain as gt
from gputrain.testing import (
    assert_bit_identical,
    assert_memory_within,
    assert_reproducible,
    assert_step_time_within,
    memory_plan,
    peak_memory,
    time_steps,
)
import _gputrain_pytest as pytest_plugin

pytest_plugins = ["pytester"]

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "bench_my_model.py"
QUICK = ("--benchmark-min-rounds=2", "--benchmark-max-time=0", "-p", "no:cacheprovider")
# What tests/conftest.py does: an in-place build has no pytest11 entry point.
CONFTEST = """
import _gputrain_pytest as pytest_plugin

def pytest_configure(config):
    if not config.pluginmanager.has_plugin("gputrain"):
        config.pluginmanager.register(pytest_plugin, "gputrain")
"""


def mlp_step(seed: int, precision: str = "fp32", steps: int = 3) -> gt.TrainStep:
    """An AdamW step of a small MLP after `steps` steps on data drawn from NumPy's global generator."""
    gt.random.manual_seed(seed)
    np.random.seed(seed)
    model = gt.nn.Sequential(gt.nn.Linear(8, 16), gt.nn.GELU(), gt.nn.Linear(16, 4))
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                        precision=precision)
    x = np.random.standard_normal((32, 8)).astype(np.float32)
    for _ in range(steps):
        step(x, np.arange(32) % 4)
    return step


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    return pytester


# -- the guide's example, quick: JSON with the memory plan and the machine facts ---------------

def test_example_runs_quick_and_json_carries_plan_and_machine(inner: pytest.Pytester) -> None:
    inner.makepyfile(bench_my_model=EXAMPLE.read_text(encoding="utf-8"))
    out = inner.path / "bench.json"
    result = inner.runpytest("--benchmark-only", f"--benchmark-json={out}", *QUICK, "bench_my_model.py")
    result.assert_outcomes(passed=4)
    benchmarks = json.loads(out.read_text())["benchmarks"]
    assert sorted(b["param"] for b in benchmarks) == ["bf16-0", "bf16-2", "fp32-0", "fp32-2"]
    parameters = 784 * 512 + 512 + 512 * 10 + 10
    for bench in benchmarks:
        info = bench["extra_info"]
        assert bench["stats"]["rounds"] == 2
        plan = info["memory_plan"]["cpu"]
        assert plan["parameters"] == plan["gradients"] == 4 * parameters
        assert plan["half_parameters"] == (2 * parameters if bench["param"].startswith("bf16") else 0)
        assert plan["total"] == sum(v for k, v in plan.items() if k != "total")
        assert info["memory_peak_bytes"]["cpu"] >= plan["total"]
        assert info["samples_per_step"] == 256
        assert info["samples_per_s"] == pytest.approx(256 / bench["stats"]["median"])
        machine = info["gputrain_info"]
        facts = gt.info()
        for key in ("version", "cpu_model", "simd", "blas", "blas_kernel", "cuda_available", "num_threads"):
            assert machine[key] == facts[key], key
        assert machine["numpy"] == np.__version__


# -- fixtures, markers and assertions inside a user's session ---------------------------------------

USER_TESTS = """
import numpy as np
import pytest
import gputrain as gt
from gputrain.testing import assert_memory_within, assert_step_time_within, time_steps

def make_step():
    model = gt.nn.Sequential(gt.nn.Linear(8, 16), gt.nn.ReLU(), gt.nn.Linear(16, 4))
    return gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1))

X, Y = np.ones((32, 8), np.float32), np.arange(32) % 4

def test_over_budget(gputrain_benchmark):
    result = gputrain_benchmark.train_step(make_step(), X, Y, tokens_per_sample=8)
    assert_memory_within(result, {"cpu": 1024})

def test_within_baseline(gputrain_benchmark):
    step = make_step()
    baseline = time_steps(lambda: step(X, Y), rounds=3)
    result = gputrain_benchmark.train_step(step, X, Y)
    assert result.last.loss > 0
    assert_step_time_within(result, baseline, ratio=1000.0)

def test_any_callable(gputrain_benchmark):
    calls = []
    result = gputrain_benchmark(lambda: calls.append(1), samples_per_step=5, rounds=3, warmup=1,
                                memory_plan={"cpu": {"total": 10}})
    gputrain_benchmark.record(note="mine")
    assert len(calls) == 4 and result.memory_plan == {"cpu": {"total": 10}}

def test_bad_input(gputrain_benchmark):
    step = make_step()
    with pytest.raises(TypeError, match="give the batch as x and y"):
        gputrain_benchmark.train_step(step, X)
    with pytest.raises(TypeError, match="not both"):
        gputrain_benchmark.train_step(step, X, Y, loader=[(X, Y)])
    with pytest.raises(TypeError, match="loader must be re-iterable"):
        gputrain_benchmark.train_step(step, loader=iter([(X, Y)]))
    batches = [(X, Y)]
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        gputrain_benchmark.train_step(step, loader=batches, rounds=0)
    with pytest.raises(TypeError, match="tokens_per_sample must be an int"):
        gputrain_benchmark(lambda: None, samples_per_step=1, tokens_per_sample=1.5)
    with pytest.raises(ValueError, match="memory_plan: 'gpu' is not a memory kind"):
        gputrain_benchmark(lambda: None, samples_per_step=1, memory_plan={"gpu": {}})
    with pytest.raises(TypeError, match="bad: extra_info values must be JSON-serialisable"):
        gputrain_benchmark.record(bad=object())
    assert step.model.compiled.step == 0 and "bad" not in gputrain_benchmark.extra_info

@pytest.mark.cuda
def test_needs_gpu():
    assert gt.cuda.is_available()

@pytest.mark.sim
def test_needs_sim():
    gt.memory_stats("sim")

@pytest.mark.parametrize("gputrain_seed", [7], indirect=True)
def test_seed(gputrain_seed):
    assert gputrain_seed == 7
    assert np.random.random() == np.random.RandomState(7).random_sample()
"""


def test_user_session_budget_fails_and_json(inner: pytest.Pytester) -> None:
    inner.makepyfile(test_user=USER_TESTS)
    out = inner.path / "bench.json"
    result = inner.runpytest("--strict-markers", "-rs", f"--benchmark-json={out}", *QUICK)
    gpu = gt.cuda.is_available()
    result.assert_outcomes(passed=5 + gpu, failed=1, skipped=1 - gpu)  # test_needs_sim runs: sim is built in
    result.stdout.fnmatch_lines(["*test_over_budget*", "E *AssertionError: memory over budget:",
                                 "E *cpu planned: * > budget 1.00 KiB (1,024 bytes); largest regions: *",
                                 "E *cpu allocator peak: * > budget 1.00 KiB (1,024 bytes)"])
    if not gpu:
        reason = re.escape(gt.info()["cuda_unavailable_reason"])
        result.stdout.re_match_lines([rf"SKIPPED .* test_user\.py:\d+: needs a usable CUDA device: {reason}$"])
    benchmarks = {b["name"]: b["extra_info"] for b in json.loads(out.read_text())["benchmarks"]}
    over = benchmarks["test_over_budget"]
    assert over["tokens_per_s"] == pytest.approx(8 * over["samples_per_s"])
    assert over["memory_plan"]["cpu"]["total"] > 1024
    assert benchmarks["test_any_callable"]["note"] == "mine"
    assert benchmarks["test_any_callable"]["samples_per_step"] == 5
    assert "gputrain_info" in benchmarks["test_within_baseline"]


def test_disabled_benchmarks_still_run_one_step_and_plan(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import numpy as np
        import gputrain as gt

        def test_step(gputrain_benchmark):
            model = gt.nn.Sequential(gt.nn.Linear(8, 4))
            step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1))
            result = gputrain_benchmark.train_step(step, np.ones((16, 8), np.float32), np.zeros(16, np.int64))
            assert result.seconds is None and result.samples_per_s is None
            assert result.memory_plan["cpu"]["parameters"] == 4 * (8 * 4 + 4)
            assert model.compiled.step == 1
    """)
    inner.runpytest("--benchmark-disable", *QUICK).assert_outcomes(passed=1)


def test_peaks_exclude_garbage_of_earlier_tests(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import gc
        import numpy as np
        import gputrain as gt

        def test_leaves_a_model_in_a_reference_cycle():
            gc.disable()  # only an explicit collection frees it
            big = gt.nn.Sequential(gt.nn.Linear(2048, 2048), gt.nn.ReLU(), gt.nn.Linear(2048, 2))
            assert big.num_parameters() > 4 << 20

        def test_small_step(gputrain_benchmark):
            try:
                model = gt.nn.Sequential(gt.nn.Linear(8, 4))
                step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1))
                result = gputrain_benchmark.train_step(step, np.ones((16, 8), np.float32), np.zeros(16, np.int64))
            finally:
                gc.enable()
            assert result.memory_peaks["cpu"] < 1 << 20
    """)
    inner.runpytest("-p", "no:randomly", *QUICK).assert_outcomes(passed=2)


def test_without_pytest_benchmark_the_fixture_says_so_and_other_tests_run(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        def test_bench(gputrain_benchmark):
            pass

        def test_plain(gputrain_seed):
            assert gputrain_seed == 0
    """)
    result = inner.runpytest("-p", "no:benchmark", *QUICK[2:])
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*gputrain_benchmark needs pytest-benchmark: pip install pytest-benchmark*"])


def test_cuda_marker_of_a_module_without_gputrain_is_left_alone(inner: pytest.Pytester) -> None:
    inner.makepyfile("""
        import pytest

        @pytest.mark.cuda
        def test_someone_elses_gpu_test():
            pass
    """)
    inner.runpytest(*QUICK).assert_outcomes(passed=1)


def test_loading_the_plugin_imports_neither_gputrain_nor_numpy() -> None:
    code = ("import sys, _gputrain_pytest; "
            "print(sorted(m for m in ('gputrain', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "[]"


def test_entry_point_registers_the_plugin() -> None:
    try:
        dist = importlib.metadata.distribution("gputrain")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("gputrain is not installed (in-place build): only an installed package has entry points")
    points = {ep.name: ep.value for ep in dist.entry_points if ep.group == "pytest11"}
    assert points == {"gputrain": "_gputrain_pytest"}


def test_markers_skip_with_reasons() -> None:
    reason = pytest_plugin.cuda_skip_reason()
    assert (reason is None) == gt.cuda.is_available()
    if reason is not None:
        assert reason.endswith(gt.cuda.unavailable_reason())
    assert pytest_plugin.sim_skip_reason() is None  # the simulated device is always built


@pytest.mark.parametrize("gputrain_seed", [0, 123], indirect=True)
def test_seed_fixture_seeds_gputrain_and_numpy(gputrain_seed: int) -> None:
    drawn = (gt.random.next_seed(), np.random.random())
    gt.random.manual_seed(gputrain_seed)
    assert drawn == (gt.random.next_seed(), np.random.RandomState(gputrain_seed).random_sample())


# -- memory budgets --------------------------------------------------------------------------------

def test_memory_budget_from_plan_and_step() -> None:
    step = mlp_step(0)
    plan = memory_plan(step, (32, 8))
    total = plan["cpu"]["total"]
    assert plan == {"cpu": step.memory_plan((32, 8))}
    for source in (plan, step):
        assert_memory_within(source, {"cpu": total, "cuda:0": 0})
        with pytest.raises(AssertionError, match=rf"cpu planned: .* \({total:,} bytes\) > budget .* "
                                                 rf"\({total - 1:,} bytes\); largest regions: "):
            assert_memory_within(source, {"cpu": total - 1})


def test_memory_budget_from_measured_peaks() -> None:
    gt.reset_peak_memory_stats()
    mlp_step(0)
    peaks = peak_memory(["cpu"])
    assert peaks["cpu"] >= memory_plan(mlp_step(0), (32, 8))["cpu"]["total"]
    assert_memory_within(peaks, {"cpu": peaks["cpu"]})
    with pytest.raises(AssertionError, match="cpu allocator peak: "):
        assert_memory_within(peaks, {"cpu": peaks["cpu"] - 1})


@pytest.mark.parametrize(("source", "budget", "error", "message"), [
    ("step", {"gpu": 1}, ValueError, "budget: 'gpu' is not a memory kind"),
    ("step", {"cpu": -1}, ValueError, r"budget\['cpu'\] must be a number of bytes >= 0"),
    ("step", {}, TypeError, "budget must be a non-empty dict"),
    ("flat", {"cpu": 1}, ValueError, "source: 'parameters' is not a memory kind.*memory_plan"),
    ("fresh", {"cpu": 1}, ValueError, "has not run a step"),
    (3, {"cpu": 1}, TypeError, "source must be a TrainStep"),
])
def test_memory_budget_bad_input(source, budget, error, message) -> None:
    step = mlp_step(0, steps=0 if source == "fresh" else 1)
    given = {"step": step, "fresh": step, "flat": step.memory_plan((32, 8))}.get(source, source)
    with pytest.raises(error, match=message):
        assert_memory_within(given, budget)


# -- determinism -----------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_reproducible_same_seed(precision: str) -> None:
    step = assert_reproducible(lambda: mlp_step(5, precision), seed=5)
    assert isinstance(step, gt.TrainStep)


def test_bit_identical_reads_a_for_model_optimizer_state() -> None:
    def run(lr: float) -> gt.TrainStep:
        gt.random.manual_seed(0)
        model = gt.nn.Sequential(gt.nn.Linear(8, 4))
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW.for_model(model, lr=lr))
        step(np.ones((4, 8), np.float32), np.arange(4))
        return step

    assert_bit_identical(run(1e-2), run(1e-2))
    with pytest.raises(AssertionError, match=r"at model\['0\.weight'\]\[0, 0\].*\n.*more entries differ: "
                                             r"model\['0\.bias'\], optimizer\['param_groups'\]\[0\]\['lr'\]"):
        assert_bit_identical(run(1e-2), run(2e-2))


def test_bit_identical_fails_when_seed_differs() -> None:
    with pytest.raises(AssertionError, match=r"first difference \(a vs b\) at model\['0\.weight'\]\[0, 0\]: "
                                             r"\S+ vs \S+ \(bits 0x[0-9a-f]+ vs 0x[0-9a-f]+\); \d+ of 128 elements"):
        assert_bit_identical(mlp_step(0), mlp_step(1))


def test_reproducible_fails_when_the_factory_is_not_seeded() -> None:
    def unseeded() -> gt.TrainStep:  # same weights, data from an unseeded generator
        gt.random.manual_seed(0)
        model = gt.nn.Sequential(gt.nn.Linear(8, 4))
        step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2))
        step(np.random.default_rng().standard_normal((16, 8)).astype(np.float32), np.arange(16) % 4)
        return step

    with pytest.raises(AssertionError, match=r"\(run 1 vs run 2\) at model\['0\.weight'\]"):
        assert_reproducible(unseeded)


def test_bit_identical_optimizer_state_and_structure() -> None:
    a, b = mlp_step(0), mlp_step(0)
    assert_bit_identical(a, b)
    b(np.zeros((32, 8), np.float32), np.zeros(32, np.int64))
    with pytest.raises(AssertionError, match=r"at state\[0\]\['step'\]: 3\.0 vs 4\.0"):
        assert_bit_identical(a.optimizer, b.optimizer)
    with pytest.raises(AssertionError, match=r"only in b: z\n.*at x\[1\]: 0\.0 vs -0\.0"):
        assert_bit_identical({"x": np.zeros(2)}, {"x": np.array([0.0, -0.0]), "z": 1})


# -- speed relative to a baseline of the same run ----------------------------------------------------

def test_step_time_within_ratio() -> None:
    assert_step_time_within(0.012, 0.010, ratio=1.25)
    with pytest.raises(AssertionError, match=r"13\.000 ms = 1\.300x the baseline's 10\.000 ms, above the "
                                             r"allowed 1\.25x"):
        assert_step_time_within(0.013, 0.010, ratio=1.25)
    with pytest.raises(ValueError, match="ratio must be a positive finite number"):
        assert_step_time_within(0.013, 0.010, ratio=0)
    assert time_steps(lambda: None, rounds=3) >= 0
