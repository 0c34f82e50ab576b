"""How much faster than PyTorch a BERT-base evaluation or training step can be on this CPU: the
share of PyTorch's time that is its GEMMs, and the same GEMMs through gputrain's library.

bench_encoder_step.py times the whole evaluation and step against transformers + torch. Both
spend most of it in the same dense GEMMs: per layer the Q, K, V and output projections and the
two MLP matrices on every token (forward), and for a step their input gradients (dY W) and
weight gradients (dY^T X) too. Whatever else a library does faster, its speed-up over PyTorch
is at most PyTorch's total time over the time of these GEMMs alone in the fastest library at
hand: the rest would have to take no time at all. This script measures, in interleaved rounds at
one thread count (medians):

- PyTorch's evaluation (inference_mode) and training step (fused AdamW), as in
  bench_encoder_step.py, with autocast for bf16;
- those GEMMs alone through torch (F.linear, mm), in the precision (bf16 operands for bf16);
- the same GEMMs through gputrain (gputrain.functional.gemm: its split GEMMs over oneDNN).

and prints each bound. Run it in the side venv that has torch, transformers and gputrain:

    ENCODER_BENCH_THREADS=1 ENCODER_BENCH_LAYERS=12 python benchmarks/encoder_gemm_bound.py bf16
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gputrain as gt  # noqa: E402
from _model_bench import torch_fused_adamw, torch_train_step  # noqa: E402
from bench_encoder_step import BATCH, CONFIG, LAYERS, LR, SEQ, WEIGHT_DECAY, torch_model  # noqa: E402
from gputrain import functional as F  # noqa: E402

ROUNDS = int(os.environ.get("ENCODER_BENCH_ROUNDS", "5"))


def layer_shapes() -> list[tuple[int, int]]:
    """(in, out) features of each linear layer of one encoder layer: Q, K, V, output, up, down."""
    hidden, inner = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    return [(hidden, hidden)] * 4 + [(hidden, inner), (inner, hidden)]


def torch_gemms(torch: Any, precision: str, step: bool) -> Callable[[], None]:
    """The evaluation's (or step's) GEMMs of every layer through torch."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    tokens = BATCH * SEQ
    operands = [(torch.randn(tokens, n_in).to(dtype), torch.randn(n_out, n_in).to(dtype),
                 torch.randn(tokens, n_out).to(dtype)) for n_in, n_out in layer_shapes()]

    def run() -> None:
        with torch.inference_mode():
            for _ in range(LAYERS):
                for x, w, dy in operands:
                    torch.nn.functional.linear(x, w)
                    if step:
                        torch.mm(dy, w)
                        torch.mm(dy.t(), x)

    return run


def gputrain_gemms(precision: str, step: bool) -> Callable[[], None]:
    """The same GEMMs through gputrain.functional.gemm, with the same operand layouts."""
    rng = np.random.default_rng(0)
    tokens = BATCH * SEQ

    def operand(*shape: int) -> np.ndarray:
        values = rng.standard_normal(shape, dtype=np.float32)
        return gt.cast(values, "bf16") if precision == "bf16" else values

    operands = [(operand(tokens, n_in), operand(n_out, n_in), operand(tokens, n_out))
                for n_in, n_out in layer_shapes()]
    dtype = "bf16" if precision == "bf16" else None

    def run() -> None:
        for _ in range(LAYERS):
            for x, w, dy in operands:
                F.gemm(x, w, trans_b=True, dtype=dtype)
                if step:
                    F.gemm(dy, w, dtype=dtype)
                    F.gemm(dy, x, trans_a=True, dtype=dtype)

    return run


def torch_eval_and_step(precision: str) -> tuple[Any, Callable[[], None], Callable[[], None]]:
    """torch and bench_encoder_step.py's PyTorch evaluation and training step."""
    torch, evaluated, inputs, _ = torch_model(training=False)
    bf16 = precision == "bf16"

    def evaluate() -> None:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            evaluated(**inputs)

    _, trained, train_inputs, labels = torch_model(training=True)
    optimizer, _ = torch_fused_adamw(torch, trained.parameters(), LR, WEIGHT_DECAY)
    step = torch_train_step(torch, optimizer, lambda: trained(**train_inputs, labels=labels).loss,
                            lambda loss: loss, bf16)
    return torch, evaluate, step


def seconds(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> None:
    precision = sys.argv[1] if len(sys.argv) > 1 else "fp32"
    if precision not in ("fp32", "bf16"):
        raise SystemExit(f"precision must be fp32 or bf16, got {precision!r}")
    torch, evaluate, step = torch_eval_and_step(precision)
    calls = {"torch eval": evaluate, "torch eval GEMMs": torch_gemms(torch, precision, False),
             "gputrain eval GEMMs": gputrain_gemms(precision, False), "torch step": step,
             "torch step GEMMs": torch_gemms(torch, precision, True),
             "gputrain step GEMMs": gputrain_gemms(precision, True)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()  # warm-up
    for _ in range(ROUNDS):
        for name, call in calls.items():
            times[name].append(seconds(call))
    ms = {name: float(np.median(values)) * 1e3 for name, values in times.items()}
    print(f"{precision}, threads {gt.get_num_threads()}, {LAYERS} layers, batch {BATCH} x T {SEQ}, "
          f"torch {torch.__version__}, {gt.info()['blas_config']}, medians of {ROUNDS} rounds")
    for name, value in ms.items():
        print(f"  {name:<20} {value:8.0f} ms")
    for what in ("eval", "step"):
        total, theirs, ours = (ms[f"torch {what}"], ms[f"torch {what} GEMMs"],
                               ms[f"gputrain {what} GEMMs"])
        print(f"  {what}: GEMMs are {theirs / total:.0%} of PyTorch's time; speed-up over PyTorch "
              f"at most {total / min(theirs, ours):.2f}x (with gputrain's GEMMs: {total / ours:.2f}x)")


if __name__ == "__main__":
    main()
