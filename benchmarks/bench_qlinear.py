"""The dequantizing GEMM of a QLinear (NF4, int8) against the bf16 GEMM of a Linear of the same shape
(issue 23 item 8: "state the NF4 GEMM's speed against the bf16 GEMM of the same shape"), on the CPU.

One call = a forward of the layer alone in bf16 (`model.compiled.precision = "bf16"`), M tokens
of the given width: the QLinear dequantizes its weight tile by tile into bf16 and runs the bf16
GEMM on each tile (csrc/nn/qlinear.c); the Linear runs the bf16 GEMM on its bf16 copy of the
weight. Shapes: the projections of Llama-3.1-8B (4096 -> 4096: q/o; 4096 -> 14336: gate/up;
14336 -> 4096: down). The Linear's call runs before every round of the QLinear's
(pytest-benchmark's `setup`), so both see the same machine load; one warm-up each; medians;
ratio = the Linear's median / the QLinear's (below 1: the QLinear is slower).

    python -m pytest -p no:cacheprovider benchmarks/bench_qlinear.py --benchmark-only -s
    # knobs: QLINEAR_BENCH_M (512 tokens), QLINEAR_BENCH_ROUNDS (5), QLINEAR_BENCH_SCALE (1: full
    # widths; 8: every width divided by 8)
"""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _model_bench import env_int
from _timing import Timed, machine, pedantic, show

M, ROUNDS = env_int("QLINEAR_BENCH_M", 512), env_int("QLINEAR_BENCH_ROUNDS", 5)
SCALE = env_int("QLINEAR_BENCH_SCALE", 1)
SHAPES = {"q_proj": (4096, 4096), "up_proj": (4096, 14336), "down_proj": (14336, 4096)}


def layers(inp: int, out: int, quant_type: str) -> tuple[gt.nn.Module, gt.nn.Module]:
    """(the QLinear, the Linear) of the same random weight, both computing in bf16."""
    w = (np.random.default_rng(0).standard_normal((out, inp)) * 0.02).astype(np.float32)
    q = gt.nn.QLinear(inp, out, bias=False, quant_type=quant_type).quantize_(w).eval()
    linear = gt.nn.Linear(inp, out, bias=False).eval()
    linear.load_state_dict({"weight": w})
    for layer in (q, linear):
        layer.compiled.precision = "bf16"
    return q, linear


@pytest.mark.parametrize("quant_type", ["nf4", "int8"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_dequantizing_gemm_vs_bf16_gemm(benchmark, gputrain_benchmark, shape, quant_type):
    inp, out = (n // SCALE for n in SHAPES[shape])
    q, linear = layers(inp, out, quant_type)
    x = np.random.default_rng(1).standard_normal((M, inp)).astype(np.float32)
    q(x)
    baseline = Timed(lambda: linear(x))
    baseline()
    seconds = pedantic(benchmark, lambda: q(x), setup=baseline, rounds=ROUNDS, warmup_rounds=1)
    flops = 2 * M * inp * out
    metrics = {"shape": f"{M}x{inp}->{out}", "quant_type": quant_type, "qlinear_ms": seconds.median * 1e3,
               "bf16_linear_ms": baseline.median() * 1e3, "qlinear_gflops": flops / seconds.median / 1e9,
               "bf16_gflops": flops / baseline.median() / 1e9, "ratio": baseline.median() / seconds.median,
               **machine()}
    gputrain_benchmark.record(**metrics)
    show(metrics)
