"""What the model benchmarks (bench_gpt.py, bench_cnn.py, bench_decoder_step.py, bench_encoder_step.py,
bench_lora_step.py) share: gputrain's and PyTorch's AdamW steps on the same model, a baseline step
timed beside ours, and the metrics each reports."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

import gputrain as gt
from _timing import Rounds, Timed, machine, pedantic, sgemm_peak, show


def gputrain_adamw_step(model: Any, x: Any, y: Any, lr: float, weight_decay: float,
                        precision: str) -> Callable[[], Any]:
    """One gputrain AdamW step (a TrainStep) of `model` on (x, y) with cross-entropy."""
    optimizer = gt.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)
    return lambda: step(x, y)


def torch_adamw_step(torch: Any, model: Any, x: Any, y: Any, lr: float, weight_decay: float,
                     autocast_bf16: bool) -> Callable[[], None]:
    """One PyTorch AdamW step of `model` on (x, y) with cross-entropy over the last dimension
    (optionally under CPU autocast to bf16), using gputrain's thread count."""
    torch.set_num_threads(gt.get_num_threads())
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    return torch_train_step(torch, optimizer, lambda: model(x), lambda logits: logits_loss(torch, logits, y),
                            autocast_bf16)


def logits_loss(torch: Any, logits: Any, y: Any) -> Any:
    """cross_entropy of `logits` (in float32) against `y` over the last dimension."""
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def torch_train_step(torch: Any, optimizer: Any, forward: Callable[[], Any], loss: Callable[[Any], Any],
                     autocast_bf16: bool) -> Callable[[], None]:
    """A PyTorch training step: zero_grad(set_to_none=True), `forward()` (under CPU autocast to bf16
    when autocast_bf16), `loss` of its output, backward, optimizer.step()."""

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_bf16):
            output = forward()
        loss(output).backward()
        optimizer.step()

    return step


def torch_fused_adamw(torch: Any, params: Any, lr: float, weight_decay: float) -> tuple[Any, str]:
    """torch.optim.AdamW(fused=True) where this PyTorch has a fused CPU AdamW, else foreach; and which."""
    try:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True), "fused"
    except (RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True), "foreach"


def env_int(name: str, default: int) -> int:
    """The integer environment variable `name`, else `default` (the benchmarks' size knobs)."""
    return int(os.environ.get(name, default))


def torch_baseline(precision: str, torch_step: Callable[[bool], Callable[[], None]]) -> tuple[str, Timed] | None:
    """PyTorch's step to time beside ours (autocast bf16 for our bf16), warmed up; None without torch."""
    try:
        name, baseline = ("torch_autocast_bf16", Timed(torch_step(True))) if precision == "bf16" \
            else ("torch_fp32", Timed(torch_step(False)))
    except pytest.skip.Exception:
        return None
    baseline.fn()  # warm-up
    return name, baseline


def benchmark_step(benchmark: Any, gputrain_benchmark: Any, precision: str, step: Callable[[], Any],
                   torch_step: Callable[[bool], Callable[[], None]], rounds: int, unit: str,
                   units_per_step: float, flops: float, **facts: Any) -> None:
    """Times gputrain's `step` for `rounds` (after the sgemm peak), PyTorch's step before each round,
    and reports both (report)."""
    peak = sgemm_peak()
    baseline = torch_baseline(precision, torch_step)
    timed = pedantic(benchmark, step, setup=baseline[1] if baseline else None, rounds=rounds, warmup_rounds=1)
    report(timed, gputrain_benchmark, baseline, unit, units_per_step, flops, peak, precision=precision, **facts)


def benchmark_beside(benchmark: Any, gputrain_benchmark: Any, step: Callable[[], Any],
                     baseline: tuple[str, Callable[[], Any]], rounds: int, unit: str, units_per_step: float,
                     flops: float, **facts: Any) -> None:
    """Times gputrain's `step` for `rounds` (after the sgemm peak), the named baseline step (warmed up
    here) before each round, and reports both (report)."""
    peak = sgemm_peak()
    name, baseline_step = baseline
    timed_baseline = Timed(baseline_step)
    timed_baseline.fn()  # warm-up
    timed = pedantic(benchmark, step, setup=timed_baseline, rounds=rounds, warmup_rounds=1)
    report(timed, gputrain_benchmark, (name, timed_baseline), unit, units_per_step, flops, peak, **facts)


def report(rounds: Rounds, gputrain_benchmark: Any, baseline: tuple[str, Timed] | None, unit: str,
           units_per_step: float, flops: float, peak: float, **facts: Any) -> None:
    """Records and prints the step's rate in `unit`/s (over `rounds`), its GEMM rate as a fraction of
    the sgemm peak, and the ratio to PyTorch's step timed in the same rounds."""
    seconds = rounds.median
    metrics = {
        **facts,
        f"{unit}_per_s": units_per_step / seconds,
        "step_ms": seconds * 1e3,
        "best_step_ms": rounds.min * 1e3,
        "gemm_gflops": flops / seconds / 1e9,
        "sgemm_peak_gflops": peak / 1e9,
        "fraction_of_sgemm_peak": flops / seconds / peak,
        **machine(),
    }
    if baseline is None:
        metrics["torch"] = "not installed"
    else:
        name, timed = baseline
        metrics[f"{name}_{unit}_per_s"] = units_per_step / timed.median()
        metrics[f"{name}_step_ms"] = timed.median() * 1e3
        metrics[f"speedup_vs_{name}"] = timed.median() / seconds
    gputrain_benchmark.record(**metrics)
    show(metrics)
