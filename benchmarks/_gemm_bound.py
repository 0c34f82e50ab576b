"""The ceiling on a speed-up over PyTorch that a model's dense GEMMs leave (encoder_gemm_bound.py,
lora_gemm_bound.py): PyTorch's whole call against its GEMMs alone, through torch and through
gputrain, in interleaved rounds. Whatever else a library does faster, its speed-up over PyTorch
is at most PyTorch's total time over the time of those GEMMs in the fastest library at hand: the
rest would have to take no time at all.

A linear layer's GEMMs are given as (tokens, in features, out features, passes), passes a subset
of "forward" (Y = X W^T), "input" (dX = dY W) and "weight" (dW = dY^T X), with the operand
layouts both libraries' training steps use.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np

import gputrain as gt
from gputrain import functional as F

Linear = tuple[int, int, int, tuple[str, ...]]
FORWARD, TRAINED, FROZEN = ("forward",), ("forward", "input", "weight"), ("forward", "input")


def torch_gemms(torch: Any, precision: str, linears: Sequence[Linear]) -> Callable[[], None]:
    """The GEMMs of `linears` through torch (F.linear, mm), bf16 operands for bf16."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    operands = [(torch.randn(tokens, n_in).to(dtype), torch.randn(n_out, n_in).to(dtype),
                 torch.randn(tokens, n_out).to(dtype), passes)
                for tokens, n_in, n_out, passes in linears]

    def run() -> None:
        with torch.inference_mode():
            for x, w, dy, passes in operands:
                if "forward" in passes:
                    torch.nn.functional.linear(x, w)
                if "input" in passes:
                    torch.mm(dy, w)
                if "weight" in passes:
                    torch.mm(dy.t(), x)

    return run


def gputrain_gemms(precision: str, linears: Sequence[Linear]) -> Callable[[], None]:
    """The same GEMMs through gputrain.functional.gemm (its split GEMMs), the same layouts."""
    rng = np.random.default_rng(0)
    dtype = "bf16" if precision == "bf16" else None

    def operand(*shape: int) -> np.ndarray:
        values = rng.standard_normal(shape, dtype=np.float32)
        return gt.cast(values, "bf16") if dtype else values

    operands = [(operand(tokens, n_in), operand(n_out, n_in), operand(tokens, n_out), passes)
                for tokens, n_in, n_out, passes in linears]

    def run() -> None:
        for x, w, dy, passes in operands:
            if "forward" in passes:
                F.gemm(x, w, trans_b=True, dtype=dtype)
            if "input" in passes:
                F.gemm(dy, w, dtype=dtype)
            if "weight" in passes:
                F.gemm(dy, x, trans_a=True, dtype=dtype)

    return run


def medians(calls: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """Milliseconds of each call, one warm-up each, then `rounds` rounds taking turns; medians."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) * 1e3 for name, values in times.items()}


def report(heading: str, ms: dict[str, float], what: Sequence[str]) -> None:
    """The times, then for each `w` of `what` the ceiling from ms["torch w"], ms["torch w
    GEMMs"] and ms["gputrain w GEMMs"]."""
    print(f"{heading}, threads {gt.get_num_threads()}, {gt.info()['blas_config']}")
    for name, value in ms.items():
        print(f"  {name:<24} {value:8.0f} ms")
    for w in what:
        total, theirs, ours = ms[f"torch {w}"], ms[f"torch {w} GEMMs"], ms[f"gputrain {w} GEMMs"]
        print(f"  {w}: GEMMs are {theirs / total:.0%} of PyTorch's time; speed-up over PyTorch "
              f"at most {total / min(theirs, ours):.2f}x (with gputrain's GEMMs: {total / ours:.2f}x)")
