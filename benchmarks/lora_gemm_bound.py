"""How much faster than PEFT + PyTorch a LoRA step on a frozen base can be on this CPU
(bench_lora_step.py's model, adapter and step): the share of PEFT's step that is the frozen base's
dense GEMMs, and the same GEMMs through gputrain's library (_gemm_bound.py).

The frozen base needs every projection's forward (Y = X W^T) and input gradient (dX = dY W), and
the tied head's too, but no weight gradient. The adapters' rank-16 GEMMs, the attention and
everything else count as the rest, so the ceiling printed is an upper bound on any library's
speed-up over PEFT's step. In the side venv with torch, transformers, peft and gputrain:

    LORA_BENCH_THREADS=1 python benchmarks/lora_gemm_bound.py bf16    # and fp32; and =2
    # knobs: bench_lora_step.py's (LORA_BENCH_LAYERS, _T, _VOCAB), LORA_BENCH_ROUNDS (5)
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gemm_bound import FROZEN, Linear, gputrain_gemms, medians, report, torch_gemms  # noqa: E402
from _model_bench import logits_loss, torch_fused_adamw, torch_train_step  # noqa: E402
from bench_lora_step import CONFIG, LAYERS, LR, SEQ, VOCAB, batch_data, peft_models  # noqa: E402

ROUNDS = int(os.environ.get("LORA_BENCH_ROUNDS", "5"))


def linears() -> list[Linear]:
    """Every layer's seven projections and the tied head, on the T tokens of the batch."""
    hidden, inner = CONFIG["hidden_size"], CONFIG["intermediate_size"]
    q = CONFIG["num_attention_heads"] * CONFIG["head_dim"]
    kv = CONFIG["num_key_value_heads"] * CONFIG["head_dim"]
    shapes = [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, inner), (hidden, inner),
              (inner, hidden)]
    return [(SEQ, n_in, n_out, FROZEN) for n_in, n_out in shapes] * LAYERS + [(SEQ, hidden, VOCAB, FROZEN)]


def main() -> None:
    precision = sys.argv[1] if len(sys.argv) > 1 else "fp32"
    if precision not in ("fp32", "bf16"):
        raise SystemExit(f"precision must be fp32 or bf16, got {precision!r}")
    import torch

    import gputrain as gt

    torch.set_num_threads(gt.get_num_threads())
    hf, _ = peft_models()
    x, y = (torch.from_numpy(a) for a in batch_data())
    trainable = [p for p in hf.parameters() if p.requires_grad]
    optimizer, _ = torch_fused_adamw(torch, trainable, LR, 0.0)
    step = torch_train_step(torch, optimizer, lambda: hf(input_ids=x).logits,
                            lambda logits: logits_loss(torch, logits, y), precision == "bf16")
    ms = medians({"torch step": step, "torch step GEMMs": torch_gemms(torch, precision, linears()),
                  "gputrain step GEMMs": gputrain_gemms(precision, linears())}, ROUNDS)
    report(f"LoRA on a frozen Llama-3.2-1B-shaped base {precision}, {LAYERS} layers, T {SEQ}, "
           f"vocab {VOCAB}, torch {torch.__version__}, medians of {ROUNDS} rounds", ms, ("step",))


if __name__ == "__main__":
    main()
