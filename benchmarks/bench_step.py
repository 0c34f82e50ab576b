"""The training step: MLP 784 -> 1024 -> 1024 -> 10 (ReLU), batch 256, one SGD-momentum step.

Reported per precision (fp32, bf16, fp16 with a loss scaler): samples/s; the step's GEMM FLOPs
per second as a fraction of the machine's sgemm peak measured in the same run (a 2048^3 GEMM
through the same library); and, when PyTorch is importable, the ratio to the same model and
step in PyTorch on the CPU (same threads; for bf16 also PyTorch under CPU autocast to bf16).
PyTorch's step runs before every round of ours (pytest-benchmark's `setup`), so both see the
same machine load; medians of ROUNDS. `test_bf16_vs_fp32_step` alternates gputrain's fp32 and
bf16 steps the same way.

    python -m pytest benchmarks/bench_step.py --benchmark-only
    # with PyTorch for the ratio (a separate venv: never install torch into the test venv):
    PYTHONPATH=<gputrain build lib> /work/venv-torch/bin/python -m pytest benchmarks/bench_step.py --benchmark-only
    # as on a CPU without AVX-512: ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 GPUTRAIN_BENCH_SIMD=avx2
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import gputrain as gt
from _timing import Timed, pedantic, sgemm_peak, show

BATCH, SIZES = 256, (784, 1024, 1024, 10)
ROUNDS = 30


def step_flops() -> float:
    """GEMM FLOPs of one step: forward, weight gradients, and input gradients except layer 1's."""
    layers = list(zip(SIZES[:-1], SIZES[1:]))
    forward = sum(2 * BATCH * a * b for a, b in layers)
    input_grads = sum(2 * BATCH * a * b for a, b in layers[1:])
    return 2 * forward + input_grads


def batch_data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], BATCH)


def mlp(nn: Any, activation: str = "relu") -> Any:
    """The MLP of SIZES in gputrain.nn or torch.nn, with ReLU or GELU between the Linear layers."""
    act = nn.GELU if activation == "gelu" else nn.ReLU
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(SIZES) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


def gputrain_step(precision: str, activation: str = "relu"):
    gt.random.manual_seed(0)
    model = mlp(gt.nn, activation)
    optimizer = gt.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = gt.amp.GradScaler() if precision == "fp16" else None
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision, scaler=scaler)
    x, y = batch_data()
    return lambda: step(x, y)


def torch_step(autocast_bf16: bool = False, activation: str = "relu"):
    """PyTorch's step on the same model; under CPU autocast to bf16 when autocast_bf16."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    torch.set_num_threads(gt.get_num_threads())
    model = mlp(torch.nn, activation)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = (torch.from_numpy(a) for a in batch_data())

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()

    return step


def torch_baselines(precision: str) -> dict[str, Timed]:
    """PyTorch steps to time beside ours: fp32 always, autocast bf16 for our bf16 (none without torch)."""
    try:
        baselines = {"torch_fp32": Timed(torch_step())}
        if precision == "bf16":
            baselines["torch_autocast_bf16"] = Timed(torch_step(autocast_bf16=True))
    except pytest.skip.Exception:
        return {}
    for baseline in baselines.values():
        baseline.fn()  # warm-up
    return baselines


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_mlp_step(benchmark, gputrain_benchmark, precision):
    step = gputrain_step(precision)
    peak = sgemm_peak()
    baselines = torch_baselines(precision)

    def before_round():
        for baseline in baselines.values():
            baseline()

    rounds = pedantic(benchmark, step, setup=before_round, rounds=ROUNDS, warmup_rounds=3)
    seconds = rounds.median
    metrics = {
        "precision": precision,
        "samples_per_s": BATCH / seconds,
        "step_ms": seconds * 1e3,
        "best_step_ms": rounds.min * 1e3,
        "gemm_gflops": step_flops() / seconds / 1e9,
        "sgemm_peak_gflops": peak / 1e9,
        "fraction_of_sgemm_peak": step_flops() / seconds / peak,
        "threads": gt.get_num_threads(),
        "simd": gt.info()["simd"],
        "load_average": os.getloadavg()[0],
    }
    for name, baseline in baselines.items():
        metrics[f"{name}_step_ms"] = baseline.median() * 1e3
        metrics[f"{name}_best_step_ms"] = baseline.best() * 1e3
        metrics[f"speedup_vs_{name}"] = baseline.median() / seconds
    if not baselines:
        metrics["torch"] = "not installed"
    gputrain_benchmark.record(**metrics)
    show(metrics)


def test_bf16_vs_fp32_step(benchmark, gputrain_benchmark):
    """gputrain's bf16 step against its fp32 step, alternating rounds."""
    fp32 = Timed(gputrain_step("fp32"))
    fp32.fn()
    rounds = pedantic(benchmark, gputrain_step("bf16"), setup=fp32, rounds=ROUNDS, warmup_rounds=3)
    seconds = rounds.median
    metrics = {
        "bf16_step_ms": seconds * 1e3,
        "fp32_step_ms": fp32.median() * 1e3,
        "best_bf16_step_ms": rounds.min * 1e3,
        "best_fp32_step_ms": fp32.best() * 1e3,
        "bf16_speedup_over_fp32": fp32.median() / seconds,
        "cpu_half_gemm": gt.info()["cpu_half_gemm"],
        "threads": gt.get_num_threads(),
        "simd": gt.info()["simd"],
        "load_average": os.getloadavg()[0],
    }
    gputrain_benchmark.record(**metrics)
    show(metrics)
