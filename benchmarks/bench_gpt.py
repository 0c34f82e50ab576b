"""A GPT training step: gputrain.models.GPT against the same architecture in PyTorch on the CPU.

Model: GPT-2's architecture (pre-LN blocks, causal attention, GELU tanh, tied LM head) with
nanoGPT's character-level sizes by default: n_layer 6, n_head 6, n_embd 384, T 256, batch 16,
vocab 65, no dropout; one AdamW step (lr 3e-4, weight decay 0.1) per round. Both models start
from the same weights (PyTorch's loads gputrain's). Reported per precision: tokens/s, the step's
GEMM FLOP/s (attention counted for the visible half) as a fraction of the sgemm peak measured in
the same run (_timing.sgemm_peak), and, with PyTorch importable, the ratio to PyTorch's step
(fp32; for bf16, PyTorch under CPU autocast to bf16), same threads. PyTorch's step runs before
every round of ours (pytest-benchmark's `setup`), so both see the same machine load; medians.

    python -m pytest benchmarks/bench_gpt.py --benchmark-only
    PYTHONPATH=<gputrain build> /work/venv-torch/bin/python -m pytest benchmarks/bench_gpt.py --benchmark-only
    # a quick run on smaller sizes (and GPT_BENCH_THREADS, GPT_BENCH_VOCAB, GPT_BENCH_ROUNDS):
    GPT_BENCH_LAYERS=2 GPT_BENCH_EMBD=128 GPT_BENCH_HEADS=4 GPT_BENCH_T=64 GPT_BENCH_BATCH=8 ...
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain as gt
from _model_bench import benchmark_step, gputrain_adamw_step, torch_adamw_step
from gputrain.models import GPT


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


LAYERS, HEADS, EMBD = _env("GPT_BENCH_LAYERS", 6), _env("GPT_BENCH_HEADS", 6), _env("GPT_BENCH_EMBD", 384)
SEQ, BATCH, VOCAB = _env("GPT_BENCH_T", 256), _env("GPT_BENCH_BATCH", 16), _env("GPT_BENCH_VOCAB", 65)
ROUNDS = _env("GPT_BENCH_ROUNDS", 5)
if os.environ.get("GPT_BENCH_THREADS"):  # both libraries run with gputrain's thread count
    gt.set_num_threads(_env("GPT_BENCH_THREADS", 1))


def step_flops() -> float:
    """GEMM FLOPs of one training step: forward, weight gradients and input gradients (3x the
    forward's), the attention's QK^T and PV over the visible (causal) half."""
    tokens = BATCH * SEQ
    linear = LAYERS * (3 * EMBD * EMBD + EMBD * EMBD + 8 * EMBD * EMBD) + VOCAB * EMBD
    attention = LAYERS * 2 * SEQ * EMBD / 2
    return 3 * 2 * tokens * (linear + attention)


def batch_data():
    tokens = np.random.default_rng(0).integers(0, VOCAB, (BATCH, SEQ + 1))
    return tokens[:, :-1], tokens[:, 1:]


def gputrain_model() -> GPT:
    gt.random.manual_seed(0)
    return GPT(vocab_size=VOCAB, block_size=SEQ, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD)


def gputrain_step(precision: str):
    return gputrain_adamw_step(gputrain_model(), *batch_data(), 3e-4, 0.1, precision)


def torch_gpt(torch):
    """The same GPT in PyTorch (nanoGPT's layout), holding gputrain_model()'s weights."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
            self.in_proj, self.out_proj = nn.Linear(EMBD, 3 * EMBD), nn.Linear(EMBD, EMBD)
            self.c_fc, self.c_proj = nn.Linear(EMBD, 4 * EMBD), nn.Linear(4 * EMBD, EMBD)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.in_proj(self.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
            x = x + self.out_proj(y)
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(SEQ, EMBD)
            self.h = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(EMBD)

        def forward(self, ids):
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.T  # the tied LM head

    model = Model()
    state = {k.replace(".attn.", ".").replace(".mlp.", "."): torch.from_numpy(v)
             for k, v in gputrain_model().state_dict().items()}
    model.load_state_dict(state)
    return model


def torch_step(autocast_bf16: bool = False):
    torch = pytest.importorskip("torch")
    x, y = (torch.from_numpy(a) for a in batch_data())
    return torch_adamw_step(torch, torch_gpt(torch), x, y, 3e-4, 0.1, autocast_bf16)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_gpt_step(benchmark, gputrain_benchmark, precision):
    benchmark_step(benchmark, gputrain_benchmark, precision, gputrain_step(precision), torch_step, ROUNDS,
                   "tokens", BATCH * SEQ, step_flops(),
                   sizes=f"n_layer {LAYERS}, n_head {HEADS}, n_embd {EMBD}, T {SEQ}, batch {BATCH}, vocab {VOCAB}")
