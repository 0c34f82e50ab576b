"""The memory plan with and without the chunked LM head + cross-entropy (TrainStep's
loss_chunk_rows): the guides' GPT-2 Medium recipe (docs/guides/small-card.md at micro-batches of
3 x 1024 tokens: fp16 with a loss scaler, 4 micro-batches per step, gradient checkpointing, AdamW
with cpu_offload_fraction 0.5, clipping) and a Llama-3.2-1B-shaped fine-tune (bf16, one sequence of
--tokens tokens, checkpointing, AdamW with cpu_offload_fraction 0.5).

Every number is the C planner's (gputrain.memory_plan.plan_step) for the model actually built on
`sim` (the simulated accelerator, whose sim:0 pool stands for the card). A build holds ~20 bytes of
host memory per parameter, so Llama can be cut to --layers N (full vocabulary and width): the
regions the head changes (activations, backward scratch, loss buffers, workspace) do not depend on
the layer count, and every region is affine in it (benchmarks/decoder_memory_extrapolate.py).

    python benchmarks/chunked_loss_plan.py gpt2-medium [--chunks 0,1024,256]
    python benchmarks/chunked_loss_plan.py llama --layers 1 --tokens 2048
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import gputrain as gt
from gputrain import memory_plan as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoder_memory_plan import CONFIGS  # noqa: E402  (the published Llama-3.2-1B config fields)


def gpt2_medium_step() -> tuple[gt.TrainStep, tuple[int, ...]]:
    """The guides' recipe at 3 sequences per micro-batch (12 per optimizer step)."""
    gt.random.manual_seed(0)
    model = gt.models.GPT(vocab_size=50257, block_size=1024, n_layer=24, n_head=16, n_embd=1024).to("sim")
    optimizer = gt.optim.AdamW(gt.optim.param_groups_weight_decay(model, 0.01), lr=3e-4, cpu_offload_fraction=0.5)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, scaler=gt.amp.GradScaler(), micro_batches=4,
                        precision="fp16", gradient_checkpointing=True, max_grad_norm=1.0)
    return step, (12, 1024)


def llama_step(layers: int, tokens: int) -> tuple[gt.TrainStep, tuple[int, ...]]:
    config = dict(CONFIGS["llama"], num_hidden_layers=layers)
    model = gt.models.LlamaForCausalLM(config, init_weights=False)
    model._compile(device="sim")
    optimizer = gt.optim.AdamW(model.parameters(), lr=1e-5, cpu_offload_fraction=0.5)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision="bf16", gradient_checkpointing=True)
    return step, (1, 3, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=["gpt2-medium", "llama"])
    parser.add_argument("--layers", type=int, default=16, help="llama: layers built (16: the full model)")
    parser.add_argument("--tokens", type=int, default=2048, help="llama: tokens per micro-batch")
    parser.add_argument("--chunks", default="0,1024,256", help="loss_chunk_rows values (0: whole logits)")
    args = parser.parse_args()
    step, shape = gpt2_medium_step() if args.model == "gpt2-medium" else llama_step(args.layers, args.tokens)
    compiled = step.model.compiled
    rows = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        compiled.loss_chunk_rows = chunk
        plan = mp.plan_step(step, shape)
        print(plan, flush=True)
        rows.append({"model": args.model, "layers": args.layers if args.model == "llama" else 24,
                     "batch_shape": shape, "loss_chunk_rows": chunk, "parameters": compiled.num_parameters,
                     "device_regions": dict(plan[plan.device]), "device_total": plan.total(plan.device)})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
