"""Conv2d forward + backward on the CPU: gputrain.functional.conv2d and conv2d_backward (im2col
tiles + the GEMM library) against torch.nn.functional.conv2d (forward, then backward through
autograd, input gradient included) on the same float32 arrays, same threads.

Shape: a CNN's middle layer, (N, C, H, W) = (32, 32, 32, 32), 3x3, padding 1, 64 out channels.
PyTorch's call runs before every round of ours (pytest-benchmark's `setup`), so both see the same
machine load; medians of ROUNDS. FLOP/s count the three products (forward, input and weight
gradients: 3 x 2 N O OH OW C KH KW), also as a fraction of the sgemm peak of gputrain's BLAS
measured in the same run (_timing.sgemm_peak, a 2048^3 GEMM).

    python -m pytest benchmarks/bench_conv2d.py --benchmark-only
    PYTHONPATH=<gputrain build> /work/venv-torch/bin/python -m pytest benchmarks/bench_conv2d.py --benchmark-only
"""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from _timing import Timed, benchmark_op
from gputrain import functional as F

X_SHAPE = (32, 32, 32, 32)  # N, C, H, W
W_SHAPE = (64, 32, 3, 3)    # O, C, KH, KW
PADDING = 1
ROUNDS = 10


def useful_flops() -> float:
    n, c, h, w = X_SHAPE
    o, _, kh, kw = W_SHAPE
    return 3 * 2 * n * o * h * w * c * kh * kw  # same-size output (stride 1, padding 1)


def inputs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(X_SHAPE).astype(np.float32)
    weight = (rng.standard_normal(W_SHAPE) * 0.05).astype(np.float32)
    bias = rng.standard_normal(W_SHAPE[0]).astype(np.float32)
    dout = rng.standard_normal((X_SHAPE[0], W_SHAPE[0], X_SHAPE[2], X_SHAPE[3])).astype(np.float32)
    return x, weight, bias, dout


def gputrain_call():
    x, weight, bias, dout = inputs()

    def run():
        F.conv2d(x, weight, bias, padding=PADDING)
        F.conv2d_backward(dout, x, weight, padding=PADDING)

    return run


def torch_call() -> Timed | None:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(gt.get_num_threads())
    x, weight, bias, dout = (torch.from_numpy(a) for a in inputs())
    x, weight, bias = (t.clone().requires_grad_(True) for t in (x, weight, bias))

    def run():
        out = torch.nn.functional.conv2d(x, weight, bias, padding=PADDING)
        out.backward(dout)
        x.grad = weight.grad = bias.grad = None

    run()  # warm-up
    return Timed(run)


def test_conv2d_forward_backward(benchmark, gputrain_benchmark):
    benchmark_op(benchmark, gputrain_benchmark, gputrain_call(), torch_call, "torch_conv2d", ROUNDS, useful_flops(),
                 x_shape="x".join(map(str, X_SHAPE)), weight_shape="x".join(map(str, W_SHAPE)))


if __name__ == "__main__":
    pytest.main([__file__, "--benchmark-only", "-s"])
