"""An encoder training step and evaluation forward (issue 22 item 5): BERT-base sequence
classification, gputrain against transformers + PyTorch on the CPU.

Model: BERT-base's config.json (hidden 768, 12 heads, intermediate 3072, GELU, vocabulary 30,522,
512 positions, 2 token types, LayerNorm eps 1e-12, dropout 0.1 in attention and hidden states),
2 labels, cut to ENCODER_BENCH_LAYERS layers (the full model has 12), random weights
(transformers' init on both sides: N(0, 0.02), zero biases). gputrain's
``gputrain.models.hf.encoders.BertForSequenceClassification(config)``; transformers'
``BertForSequenceClassification`` with ``attn_implementation="sdpa"``. Inputs: batch ENCODER_BENCH_BATCH (32) x ENCODER_BENCH_T (128)
random token ids, attention mask all ones, token types 0, labels 0/1.

Training step (test_encoder_step): forward in training mode (dropout on), the head's
cross-entropy, backward, AdamW (lr 2e-5, weight decay 0.01). gputrain: ``TrainStep(model,
model.loss_fn(), AdamW, precision=...)``. PyTorch: ``torch.optim.AdamW(fused=True)`` (foreach
where PyTorch has no fused CPU AdamW; the metrics say which), ``zero_grad(set_to_none=True)``,
the model's own loss (``labels=``), and for bf16 the forward and loss under
``torch.autocast("cpu", dtype=torch.bfloat16)``, as transformers' Trainer does with bf16=True.

Evaluation (test_encoder_eval): the logits in eval mode. gputrain: ``model.eval(); model(x)`` in
the precision (bf16: the compiled model's compute precision, as ``from_pretrained(dtype="bf16")``
or the Trainer's bf16 evaluation sets it). PyTorch: ``model.eval()`` under ``torch.inference_mode()``
(and autocast for bf16).

PyTorch's call runs before every round of ours (pytest-benchmark's ``setup``), so each pair sees
the same machine load; one warm-up each; medians; both at gputrain's thread count.

    # a venv with gputrain, pytest and pytest-benchmark that reaches transformers + torch
    # through a .pth (benchmarks/README.md, "Decoder training step"):
    ENCODER_BENCH_THREADS=1 .venv-bench/bin/python -m pytest -p no:cacheprovider \\
        benchmarks/bench_encoder_step.py --benchmark-only -s       # and =2
    # knobs: ENCODER_BENCH_LAYERS (1), ENCODER_BENCH_T (128), ENCODER_BENCH_BATCH (32),
    #        ENCODER_BENCH_VOCAB (30522), ENCODER_BENCH_ROUNDS (3)

Without torch the benchmarks time gputrain alone (the metrics say "torch": "not installed").
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import gputrain as gt
from _model_bench import env_int, gputrain_adamw_step, report, torch_baseline, torch_fused_adamw, torch_train_step
from _timing import Timed, benchmark_op, pedantic, sgemm_peak
from gputrain._vocab import c_dtype
from gputrain.models.hf.encoders import BertForSequenceClassification

LAYERS, SEQ = env_int("ENCODER_BENCH_LAYERS", 1), env_int("ENCODER_BENCH_T", 128)
BATCH, ROUNDS = env_int("ENCODER_BENCH_BATCH", 32), env_int("ENCODER_BENCH_ROUNDS", 3)
if os.environ.get("ENCODER_BENCH_THREADS"):  # both libraries run with gputrain's thread count
    gt.set_num_threads(env_int("ENCODER_BENCH_THREADS", 1))
LR, WEIGHT_DECAY = 2e-5, 0.01

# bert-base-uncased's config.json fields that change the arithmetic, and the head's labels
CONFIG = dict(model_type="bert", vocab_size=env_int("ENCODER_BENCH_VOCAB", 30522), hidden_size=768,
              num_attention_heads=12, intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
              attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
              layer_norm_eps=1e-12, pad_token_id=0, num_labels=2, num_hidden_layers=LAYERS)


def forward_flops() -> float:
    """GEMM FLOPs of one forward: per layer the Q, K, V and output projections and the two MLP
    matrices on every token, attention's QK^T and PV, then the pooler and classifier."""
    h, i, tokens = CONFIG["hidden_size"], CONFIG["intermediate_size"], BATCH * SEQ
    per_layer = 2 * tokens * (4 * h * h + 2 * h * i) + 2 * 2 * tokens * SEQ * h
    return LAYERS * per_layer + 2 * BATCH * (h * h + h * CONFIG["num_labels"])


def batch_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids (batch, T), an all-ones attention mask, and labels (batch,)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, CONFIG["vocab_size"], (BATCH, SEQ))
    return ids, np.ones_like(ids), rng.integers(0, CONFIG["num_labels"], BATCH)


def gputrain_model(training: bool) -> tuple[Any, np.ndarray, np.ndarray]:
    """gputrain's BertForSequenceClassification (seed 0), its packed input rows and the labels."""
    gt.random.manual_seed(0)
    model = BertForSequenceClassification(CONFIG)
    model.train(training)
    ids, mask, labels = batch_data()
    return model, model.pack(ids, mask, np.zeros_like(ids)), labels


def torch_model(training: bool) -> tuple[Any, Any, dict[str, Any], Any]:
    """torch, transformers' BertForSequenceClassification (sdpa, seed 0, gputrain's threads), its
    inputs and labels; skips without torch + transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.set_num_threads(gt.get_num_threads())
    fields = dict(CONFIG)
    fields.pop("model_type")
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(**fields, attn_implementation="sdpa"))
    model.train(training)
    ids, mask, labels = batch_data()
    inputs = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                  token_type_ids=torch.zeros(ids.shape, dtype=torch.int64))
    return torch, model, inputs, torch.from_numpy(labels)


def sizes(model: Any) -> dict[str, Any]:
    """The facts every result carries: the model's shape and parameter count."""
    return dict(sizes=f"{LAYERS} of 12 layers, hidden 768, T {SEQ}, batch {BATCH}, vocab {CONFIG['vocab_size']}",
                parameters=model.compiled.num_parameters)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_encoder_step(benchmark, gputrain_benchmark, precision):
    model, x, y = gputrain_model(training=True)
    step = gputrain_adamw_step(model, x, y, LR, WEIGHT_DECAY, precision)
    adamw_kind = {}

    def torch_step(autocast_bf16: bool) -> Any:
        torch, hf, inputs, labels = torch_model(training=True)
        optimizer, adamw_kind["torch_adamw"] = torch_fused_adamw(torch, hf.parameters(), LR, WEIGHT_DECAY)
        adamw_kind["torch_version"] = torch.__version__
        return torch_train_step(torch, optimizer, lambda: hf(**inputs, labels=labels).loss, lambda loss: loss,
                                autocast_bf16)

    peak = sgemm_peak()
    baseline = torch_baseline(precision, torch_step)
    timed = pedantic(benchmark, step, setup=baseline[1] if baseline else None, rounds=ROUNDS, warmup_rounds=1)
    report(timed, gputrain_benchmark, baseline, "sequences", BATCH, 3 * forward_flops(), peak,
           precision=precision, **adamw_kind, **sizes(model))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_encoder_eval(benchmark, gputrain_benchmark, precision):
    model, x, _ = gputrain_model(training=False)
    model.compiled.precision = c_dtype(precision)
    model.compiled.refresh_half_parameters()

    def torch_eval() -> Timed | None:
        try:
            torch, hf, inputs, _ = torch_model(training=False)
        except pytest.skip.Exception:
            return None

        def logits() -> Any:
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                return hf(**inputs).logits

        logits()  # warm-up
        return Timed(logits)

    name = "torch_inference_mode_autocast_bf16" if precision == "bf16" else "torch_inference_mode_fp32"
    benchmark_op(benchmark, gputrain_benchmark, lambda: model(x), torch_eval, name, ROUNDS, forward_flops(),
                 precision=precision, **sizes(model))
