"""A LoRA training step on a frozen base (issue 23 item 8) against the full fine-tune step of the
same model (gputrain both) and against PEFT + transformers + PyTorch, on the CPU.

One step = forward, cross-entropy over every position, backward, AdamW (lr 1e-4, weight decay 0.0)
over the trainable parameters, batch 1 x T tokens. The model: Llama-3.2-1B's config.json (hidden
2048, 32 heads, 8 KV heads, head_dim 64, intermediate 8192, rope llama3, tied head) cut to
LORA_BENCH_LAYERS layers and a LORA_BENCH_VOCAB vocabulary. The adapter: LoraConfig(r=16,
lora_alpha=32, lora_dropout=0.0, target_modules="all-linear") — the 7 projections of every layer,
not the (tied) head; everything else frozen.

    test_lora_vs_full  gputrain's LoRA step against gputrain's full fine-tune step (every parameter
                       trains, AdamW over all) of the same weights: what freezing saves (no
                       weight-gradient GEMMs and no optimizer on the base); no torch needed.
    test_lora_vs_peft  gputrain's LoRA step against PEFT's get_peft_model on transformers' model
                       (attn_implementation="sdpa", the same weights through save_pretrained /
                       gputrain.models.from_pretrained), torch.optim.AdamW(fused=True) over the
                       trainable parameters, torch.set_num_threads = gputrain's threads; bf16 is
                       torch.autocast("cpu", dtype=torch.bfloat16) against TrainStep(precision="bf16").

The baseline step runs before every round of ours (pytest-benchmark's `setup`), so each pair sees
the same machine load; one warm-up each; medians; the ratio is the baseline's median / ours.

    LORA_BENCH_THREADS=1 python -m pytest -p no:cacheprovider benchmarks/bench_lora_step.py \
        --benchmark-only -s
    # knobs: LORA_BENCH_LAYERS (2), LORA_BENCH_T (256), LORA_BENCH_VOCAB (32768), LORA_BENCH_ROUNDS (3)
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gputrain as gt
from _model_bench import benchmark_beside, env_int, logits_loss, torch_fused_adamw, torch_train_step
from bench_decoder_step import CONFIGS

LAYERS, SEQ = env_int("LORA_BENCH_LAYERS", 2), env_int("LORA_BENCH_T", 256)
VOCAB, ROUNDS = env_int("LORA_BENCH_VOCAB", 32768), env_int("LORA_BENCH_ROUNDS", 3)
if env_int("LORA_BENCH_THREADS", 0):  # both libraries run with gputrain's thread count
    gt.set_num_threads(env_int("LORA_BENCH_THREADS", 1))
LR, RANK, ALPHA = 1e-4, 16, 32
CONFIG = dict(CONFIGS["llama"], num_hidden_layers=LAYERS, vocab_size=VOCAB)


def batch_data() -> tuple[np.ndarray, np.ndarray]:
    tokens = np.random.default_rng(0).integers(0, VOCAB, (1, SEQ + 1))
    return tokens[:, :-1], tokens[:, 1:]


def lora_config() -> gt.peft.LoraConfig:
    return gt.peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules="all-linear")


def gputrain_step(model: gt.nn.Module, precision: str) -> Any:
    """A TrainStep with AdamW over `model`'s trainable parameters."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = gt.optim.AdamW(trainable, lr=LR, weight_decay=0.0)
    return gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=precision)


def gputrain_lora_call(precision: str) -> Callable[[], Any]:
    """gputrain's LoRA step on a fresh model and the batch, as one call (profile_lora_step.py and
    compare_builds.py time it)."""
    model = gt.peft.get_peft_model(gputrain_model(), lora_config())
    model.train()
    step, (x, y) = gputrain_step(model, precision), batch_data()
    return lambda: step(x, y)


def gputrain_model(seed: int = 0) -> gt.nn.Module:
    gt.random.manual_seed(seed)
    model = gt.models.LlamaForCausalLM(dict(CONFIG))
    model.train()
    return model


def step_flops(lora: bool) -> float:
    """GEMM FLOPs of one step: the forward's projections, MLP, attention (causal half) and tied head,
    times 3 for a full fine-tune (forward, input and weight gradients), times 2 for LoRA (no weight
    gradients of the frozen base; the adapters' r-wide GEMMs are left out)."""
    c = CONFIG
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    per_layer = c["hidden_size"] * (2 * q + 2 * kv) + 3 * c["hidden_size"] * c["intermediate_size"]
    forward = 2 * SEQ * (LAYERS * (per_layer + SEQ * q / 2) + VOCAB * c["hidden_size"])
    return forward * (2 if lora else 3)


def facts(model: gt.nn.Module, precision: str) -> dict[str, Any]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return dict(precision=precision, parameters=model.compiled.num_parameters, trainable_parameters=trainable,
                sizes=f"{LAYERS} layers, hidden {CONFIG['hidden_size']}, T {SEQ}, batch 1, vocab {VOCAB}",
                adapter=f"LoRA r={RANK} alpha={ALPHA} all-linear")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lora_vs_full(benchmark, gputrain_benchmark, precision):
    x, y = batch_data()
    full_model = gputrain_model()
    full = gputrain_step(full_model, precision)
    lora_model = gt.peft.get_peft_model(gputrain_model(), lora_config())
    lora = gputrain_step(lora_model, precision)
    benchmark_beside(benchmark, gputrain_benchmark, lambda: lora(x, y), ("gputrain_full_finetune", lambda: full(x, y)),
                     ROUNDS, "tokens", SEQ, step_flops(True), **facts(lora_model, precision))


def peft_models() -> tuple[Any, gt.nn.Module]:
    """PEFT's LoRA model on transformers' Llama (random init, seed 0) and gputrain's on the same weights."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    fields = dict(CONFIG)
    fields.pop("model_type")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**fields, attn_implementation="sdpa"))
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        ours = gt.models.from_pretrained(folder)
    hf_lora = peft.get_peft_model(hf, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                      target_modules="all-linear"))
    hf_lora.train()
    ours = gt.peft.get_peft_model(ours, lora_config())
    ours.train()
    return hf_lora, ours


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_lora_vs_peft(benchmark, gputrain_benchmark, precision):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(gt.get_num_threads())
    hf, ours = peft_models()
    x, y = batch_data()
    step = gputrain_step(ours, precision)
    trainable = [p for p in hf.parameters() if p.requires_grad]
    torch_optimizer, adamw_kind = torch_fused_adamw(torch, trainable, LR, 0.0)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    torch_step = torch_train_step(torch, torch_optimizer, lambda: hf(input_ids=tx).logits,
                                  lambda logits: logits_loss(torch, logits, ty), precision == "bf16")
    name = "peft_torch_autocast_bf16" if precision == "bf16" else "peft_torch_fp32"
    benchmark_beside(benchmark, gputrain_benchmark, lambda: step(x, y), (name, torch_step), ROUNDS, "tokens", SEQ,
                     step_flops(True), torch_adamw=adamw_kind, torch_version=torch.__version__,
                     **facts(ours, precision))
