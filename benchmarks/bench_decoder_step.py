"""A decoder training step (issue 21 item 8): gputrain against transformers + PyTorch on the CPU.

One step = forward, cross-entropy over every position, backward, AdamW (lr 1e-5, weight decay
0.1), batch 1 x T tokens. Models, built with transformers' own config classes and copied into
gputrain through save_pretrained / gputrain.models.from_pretrained (same weights):

    llama: Llama-3.2-1B's config.json cut to DECODER_BENCH_LAYERS layers (hidden 2048, 32 heads,
           8 KV heads, head_dim 64, intermediate 8192, rope llama3 factor 32, theta 500000, tied)
    qwen3: Qwen3-0.6B's config.json cut the same way (hidden 1024, 16 heads, 8 KV heads,
           head_dim 128, intermediate 3072, QK-norm, theta 1e6, tied)

The vocabulary is the model's own unless DECODER_BENCH_VOCAB sets another (memory: both
libraries hold the model, gradients and AdamW state in one process). Baseline: transformers'
model (attn_implementation="sdpa") with torch.optim.AdamW(fused=True) where PyTorch has a fused
CPU AdamW (else foreach), torch.set_num_threads = gputrain's threads, fp32, and for bf16
torch.autocast("cpu", dtype=torch.bfloat16) against gputrain's TrainStep(precision="bf16").
PyTorch's step runs before every round of ours (pytest-benchmark's `setup`), so each pair sees
the same machine load; medians.

    # a venv whose site-packages hold gputrain, pytest and pytest-benchmark, and reach
    # transformers + torch through a .pth (benchmarks/README.md, "Decoder training step"):
    DECODER_BENCH_THREADS=1 python -m pytest -p no:cacheprovider benchmarks/bench_decoder_step.py \
        --benchmark-only -s -k qwen3
    # knobs: DECODER_BENCH_LAYERS (4), DECODER_BENCH_T (256), DECODER_BENCH_VOCAB (the model's),
    #        DECODER_BENCH_ROUNDS (3)
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import pytest

import gputrain as gt
from _model_bench import benchmark_beside, env_int, logits_loss, torch_fused_adamw, torch_train_step

LAYERS, SEQ = env_int("DECODER_BENCH_LAYERS", 4), env_int("DECODER_BENCH_T", 256)
ROUNDS = env_int("DECODER_BENCH_ROUNDS", 3)
VOCAB = os.environ.get("DECODER_BENCH_VOCAB")
if os.environ.get("DECODER_BENCH_THREADS"):  # both libraries run with gputrain's thread count
    gt.set_num_threads(env_int("DECODER_BENCH_THREADS", 1))
LR, WEIGHT_DECAY = 1e-5, 0.1

# The published config.json fields that change the arithmetic (Llama-3.2-1B, Qwen3-0.6B).
CONFIGS = {
    "llama": dict(model_type="llama", hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                  intermediate_size=8192, vocab_size=128256, rms_norm_eps=1e-5, max_position_embeddings=131072,
                  rope_theta=500000.0, rope_scaling={"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                                                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
                  attention_bias=False, mlp_bias=False, hidden_act="silu", tie_word_embeddings=True),
    "qwen3": dict(model_type="qwen3", hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                  intermediate_size=3072, vocab_size=151936, rms_norm_eps=1e-6, max_position_embeddings=40960,
                  rope_theta=1000000.0, attention_bias=False, hidden_act="silu", tie_word_embeddings=True,
                  use_sliding_window=False),
}


def hf_config(family: str) -> Any:
    transformers = pytest.importorskip("transformers")
    fields = dict(CONFIGS[family], num_hidden_layers=LAYERS)
    if VOCAB:
        fields["vocab_size"] = int(VOCAB)
    kind = fields.pop("model_type")
    cls = transformers.LlamaConfig if kind == "llama" else transformers.Qwen3Config
    return cls(**fields, attn_implementation="sdpa")


def step_flops(config: Any) -> float:
    """GEMM FLOPs of one step (3x the forward's): projections, MLP, tied head, and attention's
    QK^T and PV over the visible (causal) half."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = c.hidden_size * (2 * q + 2 * kv) + 3 * c.hidden_size * c.intermediate_size
    attention = 2 * SEQ * q / 2
    return 3 * 2 * SEQ * (LAYERS * (per_layer + attention) + c.vocab_size * c.hidden_size)


def batch_data(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = np.random.default_rng(0).integers(0, vocab, (1, SEQ + 1))
    return tokens[:, :-1], tokens[:, 1:]


def models(family: str) -> tuple[Any, Any, Any]:
    """transformers' model (random init, seed 0) and gputrain's copy of it, and the config."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = hf_config(family)
    torch.manual_seed(0)
    hf = getattr(transformers, "LlamaForCausalLM" if family == "llama" else "Qwen3ForCausalLM")(config)
    hf.train()
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        ours = gt.models.from_pretrained(folder)
    ours.train()
    return hf, ours, config


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_decoder_step(benchmark, gputrain_benchmark, family, precision):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(gt.get_num_threads())
    hf, ours, config = models(family)
    x, y = batch_data(config.vocab_size)
    optimizer = gt.optim.AdamW(ours.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    step = gt.TrainStep(ours, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)
    torch_optimizer, adamw_kind = torch_fused_adamw(torch, hf.parameters(), LR, WEIGHT_DECAY)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    torch_step = torch_train_step(torch, torch_optimizer, lambda: hf(input_ids=tx).logits,
                                  lambda logits: logits_loss(torch, logits, ty), precision == "bf16")

    name = "torch_autocast_bf16" if precision == "bf16" else "torch_fp32"
    benchmark_beside(benchmark, gputrain_benchmark, lambda: step(x, y), (name, torch_step), ROUNDS, "tokens", SEQ,
                     step_flops(config), precision=precision, family=family, torch_adamw=adamw_kind,
                     torch_version=torch.__version__,
                     sizes=f"{LAYERS} layers, hidden {config.hidden_size}, T {SEQ}, batch 1, vocab {config.vocab_size}",
                     parameters=ours.compiled.num_parameters)
