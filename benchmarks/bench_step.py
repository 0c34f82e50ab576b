"""The training step: MLP 784 -> 1024 -> 1024 -> 10 (ReLU), batch 256, one SGD-momentum step.

Reported per precision (fp32, bf16, fp16 with a loss scaler): samples/s; the step's GEMM FLOPs
per second as a fraction of the machine's sgemm peak measured in the same run (a 2048^3 GEMM
through the same OpenBLAS); and, when PyTorch is importable, the ratio to the same model and
step in PyTorch on the CPU (same threads), timed in the same run.

    python -m pytest benchmarks/bench_step.py --benchmark-only
    # with PyTorch for the ratio (a separate venv: never install torch into the test venv):
    PYTHONPATH=<gputrain build lib> /work/venv-torch/bin/python -m pytest benchmarks/bench_step.py --benchmark-only
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import gputrain as gt

BATCH, SIZES = 256, (784, 1024, 1024, 10)
ROUNDS = 30


def step_flops() -> float:
    """GEMM FLOPs of one step: forward, weight gradients, and input gradients except layer 1's."""
    layers = list(zip(SIZES[:-1], SIZES[1:]))
    forward = sum(2 * BATCH * a * b for a, b in layers)
    input_grads = sum(2 * BATCH * a * b for a, b in layers[1:])
    return 2 * forward + input_grads


def sgemm_peak() -> float:
    """FLOP/s of a 2048^3 sgemm through gputrain's BLAS (median of 5)."""
    a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
    gt.functional.gemm(a, a)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        gt.functional.gemm(a, a)
        times.append(time.perf_counter() - start)
    return 2 * 2048**3 / float(np.median(times))


def batch_data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((BATCH, SIZES[0])).astype(np.float32), rng.integers(0, SIZES[-1], BATCH)


def gputrain_step(precision: str):
    gt.random.manual_seed(0)
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(gt.nn.Linear(a, b))
        if i < len(SIZES) - 2:
            layers.append(gt.nn.ReLU())
    model = gt.nn.Sequential(*layers)
    optimizer = gt.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = gt.amp.GradScaler() if precision == "fp16" else None
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision, scaler=scaler)
    x, y = batch_data()
    return lambda: step(x, y)


def torch_step():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    torch.set_num_threads(gt.get_num_threads())
    layers = []
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(SIZES) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = (torch.from_numpy(a) for a in batch_data())

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        optimizer.step()

    return step


def median_seconds(fn, rounds: int = ROUNDS) -> float:
    fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_mlp_step(benchmark, gputrain_benchmark, precision):
    step = gputrain_step(precision)
    peak = sgemm_peak()
    benchmark.pedantic(step, rounds=ROUNDS, warmup_rounds=3)
    seconds = benchmark.stats.stats.median
    metrics = {
        "precision": precision,
        "samples_per_s": BATCH / seconds,
        "step_ms": seconds * 1e3,
        "gemm_gflops": step_flops() / seconds / 1e9,
        "sgemm_peak_gflops": peak / 1e9,
        "fraction_of_sgemm_peak": step_flops() / seconds / peak,
        "threads": gt.get_num_threads(),
    }
    try:
        torch_seconds = median_seconds(torch_step())
        metrics["torch_samples_per_s"] = BATCH / torch_seconds
        metrics["speedup_vs_torch_fp32"] = torch_seconds / seconds
    except pytest.skip.Exception:
        metrics["torch"] = "not installed"
    gputrain_benchmark.record(**metrics)
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in metrics.items()})
