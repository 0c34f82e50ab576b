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

and prints each ceiling (_gemm_bound.py). Run it in the side venv that has torch, transformers
and gputrain:

    ENCODER_BENCH_THREADS=1 ENCODER_BENCH_LAYERS=12 python benchmarks/encoder_gemm_bound.py bf16
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gemm_bound import FORWARD, TRAINED, Linear, gputrain_gemms, medians, report, torch_gemms  # noqa: E402
from _model_bench import torch_fused_adamw, torch_train_step  # noqa: E402
from bench_encoder_step import BATCH, CONFIG, LAYERS, LR, SEQ, WEIGHT_DECAY, torch_model  # noqa: E402

ROUNDS = int(os.environ.get("ENCODER_BENCH_ROUNDS", "5"))


def linears(passes: tuple[str, ...]) -> list[Linear]:
    """Every layer's Q, K, V, output, up and down projections on all the batch's tokens."""
    hidden, inner, tokens = CONFIG["hidden_size"], CONFIG["intermediate_size"], BATCH * SEQ
    shapes = [(hidden, hidden)] * 4 + [(hidden, inner), (inner, hidden)]
    return [(tokens, n_in, n_out, passes) for n_in, n_out in shapes] * LAYERS


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


def main() -> None:
    precision = sys.argv[1] if len(sys.argv) > 1 else "fp32"
    if precision not in ("fp32", "bf16"):
        raise SystemExit(f"precision must be fp32 or bf16, got {precision!r}")
    torch, evaluate, step = torch_eval_and_step(precision)
    ms = medians({"torch eval": evaluate, "torch eval GEMMs": torch_gemms(torch, precision, linears(FORWARD)),
                  "gputrain eval GEMMs": gputrain_gemms(precision, linears(FORWARD)),
                  "torch step": step, "torch step GEMMs": torch_gemms(torch, precision, linears(TRAINED)),
                  "gputrain step GEMMs": gputrain_gemms(precision, linears(TRAINED))}, ROUNDS)
    report(f"BERT-base {precision}, {LAYERS} layers, batch {BATCH} x T {SEQ}, torch {torch.__version__}, "
           f"medians of {ROUNDS} rounds", ms, ("eval", "step"))


if __name__ == "__main__":
    main()
