"""The benchmarks (benchmarks/) as smoke tests: CI may run them under `pytest --benchmark-disable`,
where pytest-benchmark calls each function once and keeps no stats (`benchmark.stats` is None),
so every benchmark must still compute and record its metrics (benchmarks/_timing.pedantic). Run in
a subprocess with the benchmarks' own pytest configuration, at small sizes where a benchmark has a
knob; the quick test takes a few benchmarks, the slow one all of them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gputrain

ROOT = Path(__file__).resolve().parent.parent
SMALL = {  # the size knobs of benchmarks/bench_*.py
    "GPUTRAIN_BENCH_CAST_MIB": "1", "GPUTRAIN_BENCH_SCALER_N": "100000", "GPUTRAIN_BENCH_OPTIM_N": "100000",
    "GPT_BENCH_LAYERS": "1", "GPT_BENCH_EMBD": "32", "GPT_BENCH_HEADS": "2", "GPT_BENCH_T": "16",
    "GPT_BENCH_BATCH": "2", "GPT_BENCH_ROUNDS": "2", "CNN_BENCH_IMAGE": "8", "CNN_BENCH_CHANNELS": "4,8",
    "CNN_BENCH_BATCH": "4", "CNN_BENCH_ROUNDS": "2",
    "DECODER_BENCH_LAYERS": "1", "DECODER_BENCH_T": "16", "DECODER_BENCH_VOCAB": "512", "DECODER_BENCH_ROUNDS": "1",
    "ENCODER_BENCH_LAYERS": "1", "ENCODER_BENCH_T": "16", "ENCODER_BENCH_BATCH": "2", "ENCODER_BENCH_VOCAB": "512",
    "ENCODER_BENCH_ROUNDS": "1",
    "LORA_BENCH_LAYERS": "1", "LORA_BENCH_T": "16", "LORA_BENCH_VOCAB": "512", "LORA_BENCH_ROUNDS": "1",
    "QLINEAR_BENCH_M": "16", "QLINEAR_BENCH_SCALE": "64", "QLINEAR_BENCH_ROUNDS": "1",
}


def run_benchmarks(*targets: str) -> None:
    pytest.importorskip("pytest_benchmark")
    package_root = str(Path(gputrain.__file__).resolve().parent.parent)  # this gputrain, built or installed
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **SMALL, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--benchmark-disable",
                           *targets], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_some_benchmarks_run_with_benchmark_disable():
    """A benchmark of each kind of timing: rounds beside a timed setup, a setup that returns the
    function's arguments, and the function's own result."""
    run_benchmarks("benchmarks/bench_step.py::test_bf16_vs_fp32_step", "benchmarks/bench_scaler.py",
                   "benchmarks/bench_optim.py::test_offload_overlap", "benchmarks/bench_gpt.py")


@pytest.mark.slow
def test_all_benchmarks_run_with_benchmark_disable():
    run_benchmarks("benchmarks")
