"""The memory plan of a full bf16 fine-tune with AdamW (issue 21 item 8) of Llama-3.2-1B, Qwen3-0.6B
and Gemma-3-1B: micro-batch 1 x 1024 tokens (input shape (1, 3, 1024): ids, mask, position ids), cpu_offload_fraction 0 and 0.5, gradient
checkpointing off and on, against a 12 GB card.

Every number is gputrain.memory_plan.plan_training's, i.e. the C planner's for the model actually
built: the model is built (its f32 parameter and gradient arenas allocated: ~10 GB for a 1B
model; run one model per process on a machine with that much free memory) on the device given
(default "sim", the simulated accelerator, whose "sim:0" pool stands for the card; "cpu" plans the
same model for the host), with init_weights=False. The optimizer is planned from its spec
(OptimizerSpec("adamw", the parameters' numels, cpu_offload_fraction=...)), never built.

    python benchmarks/decoder_memory_plan.py llama [--device sim] [--layers N]
"""

from __future__ import annotations

import argparse
import json

import gputrain as gt
from gputrain.memory_plan import OptimizerSpec, plan_training

# The published config.json fields that change the arithmetic (and the memory).
CONFIGS = {
    "llama": dict(model_type="llama", num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=64, intermediate_size=8192, vocab_size=128256, rms_norm_eps=1e-5,
                  max_position_embeddings=131072, rope_theta=500000.0,
                  rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                  attention_bias=False, mlp_bias=False, hidden_act="silu", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", num_hidden_layers=28, hidden_size=1024, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936, rms_norm_eps=1e-6,
                  max_position_embeddings=40960, rope_theta=1000000.0, attention_bias=False, hidden_act="silu",
                  tie_word_embeddings=True, use_sliding_window=False, sliding_window=None, max_window_layers=28),
    "gemma3": dict(model_type="gemma3_text", num_hidden_layers=26, hidden_size=1152, num_attention_heads=4,
                   num_key_value_heads=1, head_dim=256, intermediate_size=6912, vocab_size=262144, rms_norm_eps=1e-6,
                   max_position_embeddings=32768, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                   sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256,
                   hidden_activation="gelu_pytorch_tanh", attention_bias=False, final_logit_softcapping=None,
                   attn_logit_softcapping=None, rope_scaling=None, tie_word_embeddings=True),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
CARD = 12 * 10**9  # "a 12 GB card": 12e9 bytes (a 12 GiB card, 12,884,901,888, is noted beside)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=sorted(CONFIGS))
    parser.add_argument("--device", default="sim")
    parser.add_argument("--layers", type=int, default=None, help="cut the model (a check of the script)")
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--layer-types", default=None,
                        help="comma-separated sliding_attention/full_attention per layer (with --layers)")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args()
    config = dict(CONFIGS[args.family])
    if args.layers:
        config["num_hidden_layers"] = args.layers
    if args.layer_types:
        config["layer_types"] = args.layer_types.split(",")
        config.pop("sliding_window_pattern", None)
    model = getattr(gt.models, CLASSES[args.family])(config, init_weights=False)
    model._compile(device=args.device)  # built on the device whose pool the plan is for
    numels = tuple(p.numel() for p in model.parameters())
    rows = []
    for offload in (0.0, 0.5):
        for checkpointing in (False, True):
            plan = plan_training(model, (1, 3, args.tokens), precision="bf16", checkpointing=checkpointing,
                                 optimizer=OptimizerSpec("adamw", numels, cpu_offload_fraction=offload))
            device = {k: v for k, v in plan[plan.device].items()}
            rows.append({"family": args.family, "layers": config["num_hidden_layers"], "device": plan.device,
                         "layer_types": config.get("layer_types"),
                         "parameters": model.compiled.num_parameters, "cpu_offload_fraction": offload,
                         "gradient_checkpointing": checkpointing, "device_regions": device,
                         "pinned_total": plan.total("pinned"), "device_total": plan.total(plan.device),
                         "fits_12e9": plan.total(plan.device) <= CARD,
                         "fits_12GiB": plan.total(plan.device) <= 12 * 2**30})
            if not args.json_only:
                print(plan)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
