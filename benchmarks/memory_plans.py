"""Memory plans of LoRA/QLoRA-style fine-tunes (issue 23 item 7), before training: Llama-3.2-1B,
Qwen3-0.6B, Gemma-3-1B and an 8B Llama-3.1-shaped model, micro-batch 1 x 2048 tokens (input shape
(1, 3, 2048): ids, mask, position ids), bf16, gradient checkpointing on, with the LM head + loss whole
and chunked (loss_chunk_rows).

Rows (every one a plan of gputrain.memory_plan.plan_training, i.e. the C planner's, of the device
pool "sim:0" that stands for the card; nothing here is estimated):
  full       every parameter trains, AdamW (fp32 moments)
  full8      the same with 8-bit AdamW (kind "adamw8bit": 2 bytes of state per element)
  full8-paged  the same with the 8-bit state in pinned host memory (optim="paged_adamw_8bit":
             cpu_offload_fraction 1, updated by CPU threads; the pinned pool's optimizer_offload)
  lora       bf16 base frozen, LoRA r=16 (alpha 32) on all linear layers (PEFT's "all-linear": not the
             LM head), AdamW on the adapters; the model is built in bf16 (as from_pretrained(folder,
             dtype="bf16")), so the adapted layers' bases, an untied LM head and the token table (tied
             or not) hold their weights in bf16 alone (QLinear "bf16", HalfTokenEmbedding: no float32
             master, no half copy); the norms keep theirs
  lora8      the same with 8-bit AdamW
  nf4-lora   the decoder blocks' Linear layers NF4 (QLinear, block 64; norms float, an untied head
             and table in bf16 alone as in lora), LoRA r=16 on them (QLoRA: the adapters as on the
             bf16 base), AdamW on the adapters
  nf4-lora8  the same with 8-bit AdamW
  nf4e-lora8 the same with the token table and the untied LM head NF4 too (quantize_embeddings_:
             QTokenEmbedding, QLinear; models with a tied head have no such row)
  nf4e-dq-lora8  the same with the QLinear layers' absmax double-quantized (double_quant=True: 8-bit
             codes, as bitsandbytes' bnb_4bit_use_double_quant keeps it; the table's stays float32)
  nf4e-dq-lora8-off  the same with the checkpointed decoder layers' inputs offloaded to pinned
             host memory (gradient_checkpointing="offload": the device keeps two of them and the last
             layer's output; the pinned pool's checkpoint_offload holds the others)
  nf4        the NF4 base alone, every parameter frozen, no optimizer
  int8-lora  the decoder blocks' Linear layers int8 (QLinear, LLM.int8's row-wise format), LoRA r=16
             on them, AdamW on the adapters
  frozen     the base alone, every parameter frozen, no optimizer: float32 masters and their bf16 copy
             (a model not adapted keeps its masters)

The models are built inside gputrain.memory_plan.planning(): laid out, never allocated, so the 8B
model plans on a small machine (tests/test_memory_plan_planning.py checks that such plans equal
those of allocated models, to the byte).

    python benchmarks/memory_plans.py [--models llama-3.2-1b,...] [--rows full,lora,...] [--chunks 0,512]
                                      [--batch 1] [--tokens 2048] [--json | --markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import gputrain as gt
from gputrain import memory_plan as mp
from gputrain.nn.qlinear import quantized_linears

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoder_memory_plan import CONFIGS  # noqa: E402  (the published 1B config.json fields)

# meta-llama/Llama-3.1-8B config.json's fields that change the arithmetic (head_dim: hidden / heads)
LLAMA_31_8B = dict(model_type="llama", num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                   num_key_value_heads=8, head_dim=128, intermediate_size=14336, vocab_size=128256,
                   rms_norm_eps=1e-5, max_position_embeddings=131072, rope_theta=500000.0,
                   rope_scaling={"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                   attention_bias=False, mlp_bias=False, hidden_act="silu", tie_word_embeddings=False)
MODELS = {
    "llama-3.2-1b": (gt.models.LlamaForCausalLM, CONFIGS["llama"]),
    "qwen3-0.6b": (gt.models.Qwen3ForCausalLM, CONFIGS["qwen3"]),
    "gemma-3-1b": (gt.models.Gemma3ForCausalLM, CONFIGS["gemma3"]),
    "llama-3.1-8b": (gt.models.LlamaForCausalLM, LLAMA_31_8B),
}
ROWS = ("full", "full8", "full8-paged", "lora", "lora8", "nf4-lora", "nf4-lora8", "nf4e-lora8", "nf4e-dq-lora8", "nf4e-dq-lora8-off",
        "nf4", "int8-lora", "frozen")
OFFLOADED = "-off"  # a row's suffix: its checkpoints offloaded to pinned host memory
PAGED = "-paged"  # a row's suffix: its optimizer state in pinned host memory
LORA = dict(r=16, lora_alpha=32, target_modules="all-linear")


def build(name: str, row: str, device: str = "sim") -> gt.nn.Module:
    """The model of `row`, built for planning only on `device`."""
    cls, config = MODELS[name]
    with mp.planning():
        quant = row.split("-")[0].rstrip("e") if row.startswith(("nf4", "int8")) else None
        double_quant = "-dq-" in row
        linear = quantized_linears(quant, double_quant=double_quant) if quant else gt.nn.Linear
        model = cls(dict(config), init_weights=False, linear=linear)
        model.compiled.precision = "bf16"  # from_pretrained(folder, dtype="bf16")
        if row.startswith("nf4e"):  # from_pretrained(folder, quantization="nf4", quantize_embeddings=True, ...)
            model.quantize_embeddings_("nf4", double_quant=double_quant)
        if "lora" in row:  # adapted, then moved
            model = gt.peft.get_peft_model(model, gt.peft.LoraConfig(**LORA))
        model = model.to(device)
    if row in ("frozen", "nf4"):
        for p in model.parameters():
            p.requires_grad = False
    return model


def optimizer_of(model: gt.nn.Module, row: str) -> mp.OptimizerSpec | None:
    numels = tuple(p.numel() for p in model.parameters() if p.requires_grad)
    if not numels:
        return None
    base = row.removesuffix(OFFLOADED).removesuffix(PAGED)
    return mp.OptimizerSpec("adamw8bit" if base.endswith("8") else "adamw", numels,
                            cpu_offload_fraction=1.0 if row.endswith(PAGED) else 0.0)


def plan_row(model: gt.nn.Module, row: str, tokens: int, chunk: int, batch: int = 1) -> mp.MemoryPlan:
    checkpointing = "offload" if row.endswith(OFFLOADED) else True
    return mp.plan_training(model, (batch, 3, tokens), precision="bf16", checkpointing=checkpointing,
                            optimizer=optimizer_of(model, row), loss_chunk_rows=chunk)


HEADER = ("model", "row", "chunk", "params", "trainable", "device GiB", "parameters+half", "gradients",
          "optimizer", "buffers", "activation arena", "other")
WIDTHS = (-14, -13, 5, 14, 12, 10, 15, 9, 9, 7, 16, 5)  # text columns (negative: left-aligned)


def cells(name: str, row: str, chunk: int, model: gt.nn.Module, plan: mp.MemoryPlan) -> tuple:
    """One table row: the counts, and the device pool's regions in GiB (other: what the named
    columns leave of the total, i.e. the step scratch)."""
    gib = 2**30
    regions = plan[plan.device]
    weights = regions.get("parameters", 0) + regions.get("half_parameters", 0)
    named = (weights, regions.get("gradients", 0), regions.get("optimizer_state", 0), regions.get("buffers", 0),
             plan.activation_arena)
    total = plan.total(plan.device)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (name, row, str(chunk), f"{model.compiled.num_parameters:,}", f"{trainable:,}",
            *(f"{v / gib:.2f}" for v in (total, *named, total - sum(named))))


def line(values: tuple, markdown: bool) -> str:
    if markdown:
        return "| " + " | ".join(values) + " |"
    return " ".join(f"{v:<{-w}}" if w < 0 else f"{v:>{w}}" for v, w in zip(values, WIDTHS)).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--chunks", default="0,512", help="loss_chunk_rows values (0: whole logits)")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1, help="sequences per micro-batch")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="one JSON line per plan, with every region")
    output.add_argument("--markdown", action="store_true", help="the table in Markdown")
    args = parser.parse_args()
    if not args.json:
        print(line(HEADER, args.markdown))
        if args.markdown:
            print("|" + "|".join("---" if w < 0 else "---:" for w in WIDTHS) + "|")
    for name in args.models.split(","):
        for row in args.rows.split(","):
            if row.startswith("nf4e") and MODELS[name][1].get("tie_word_embeddings", True):
                continue  # a tied head's GEMMs read a float32 or half table: not quantized
            model = build(name, row)
            for chunk in (int(c) for c in args.chunks.split(",")):
                plan = plan_row(model, row, args.tokens, chunk, args.batch)
                if args.json:
                    print(json.dumps({"model": name, "row": row, "loss_chunk_rows": chunk, "batch": args.batch,
                                      "tokens": args.tokens, "parameters": model.compiled.num_parameters,
                                      "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
                                      "device_total": plan.total(plan.device),
                                      "device_regions": {k: v for k, v in plan[plan.device].items() if k != "total"},
                                      "pinned_total": plan.total("pinned")}),
                          flush=True)
                else:
                    print(line(cells(name, row, chunk, model, plan), args.markdown), flush=True)


if __name__ == "__main__":
    main()
