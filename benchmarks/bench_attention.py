"""Fused attention forward + backward on the CPU: gputrain.functional.scaled_dot_product_attention
and its backward against torch.nn.functional.scaled_dot_product_attention (forward, then
backward through autograd) on the same float32 (batch, heads, seq, head_dim) arrays, same threads.

Shape: the issue's GPT step (n_head 6, n_embd 384 -> head_dim 64, T 256, batch 16), causal and
not. PyTorch's call runs before every round of ours (pytest-benchmark's `setup`), so both see the
same machine load; medians of ROUNDS. FLOP/s count the matrix products that are needed
(forward: QK^T and PV; backward: dV, dP, dQ and dK; causal: half of each), also as a fraction of the
sgemm peak of gputrain's BLAS measured in the same run (_timing.sgemm_peak, a 2048^3 GEMM).

    python -m pytest benchmarks/bench_attention.py --benchmark-only
    PYTHONPATH=<gputrain build> /work/venv-torch/bin/python -m pytest benchmarks/bench_attention.py --benchmark-only
    # as on a CPU without AVX-512: GPUTRAIN_BENCH_SIMD=avx2 ATEN_CPU_CAPABILITY=avx2
"""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _timing import Timed, benchmark_op
from gputrain import functional as F

SHAPE = (16, 6, 256, 64)  # batch, heads, seq, head_dim
ROUNDS = 10


def useful_flops(causal: bool) -> float:
    """2 * B * H * T^2 * D per (T, T, D) product: 2 forward and 4 backward (dV, dP, dQ, dK)."""
    batch, heads, seq, dim = SHAPE
    flops = 6 * 2 * batch * heads * seq * seq * dim
    return flops / 2 if causal else flops


def inputs():
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(SHAPE).astype(np.float32) for _ in range(4))


def gputrain_call(causal: bool):
    q, k, v, dout = inputs()

    def run():
        out, lse = F.scaled_dot_product_attention(q, k, v, causal=causal)
        F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, causal=causal)

    return run


def torch_call(causal: bool) -> Timed | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(gt.get_num_threads())
    q, k, v, dout = (torch.from_numpy(a) for a in inputs())
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))

    def run():
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(dout)
        q.grad = k.grad = v.grad = None

    run()  # warm-up
    return Timed(run)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_forward_backward(benchmark, gputrain_benchmark, causal):
    benchmark_op(benchmark, gputrain_benchmark, gputrain_call(causal), lambda: torch_call(causal), "torch_sdpa",
                 ROUNDS, useful_flops(causal), shape="x".join(map(str, SHAPE)), causal=causal)
