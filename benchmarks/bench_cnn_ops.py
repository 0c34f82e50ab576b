"""BatchNorm2d and 2-D pooling ops alone on the CPU, one thread, against PyTorch's ATen kernels
(the ones its training forward and backward call) on the same float32 (32, 64, 32, 32) input:
median milliseconds of ROUNDS calls each, PyTorch's call timed right before ours every round.

    PYTHONPATH=python /work/venv-torch/bin/python benchmarks/bench_cnn_ops.py
"""

from __future__ import annotations

import numpy as np

import gputrain as gt
from _timing import Timed
from gputrain import _C_testing

SHAPE = (32, 64, 32, 32)
ROUNDS = 15


def cases(torch):
    """(name, ours, theirs) callables over shared inputs."""
    aten = torch.ops.aten
    n, c, h, w = SHAPE
    rng = np.random.default_rng(0)
    x = rng.standard_normal(SHAPE).astype(np.float32)
    tx = torch.from_numpy(x)
    weight, bias = np.ones(c, np.float32), np.zeros(c, np.float32)
    rm, rv, count = np.zeros(c, np.float32), np.ones(c, np.float32), np.zeros(1, np.int64)
    mean, rstd, out = np.empty(c, np.float32), np.empty(c, np.float32), np.empty_like(x)
    tw, tb, trm, trv = (torch.from_numpy(a.copy()) for a in (weight, bias, rm, rv))
    dout = rng.standard_normal(SHAPE).astype(np.float32)
    tdout = torch.from_numpy(dout)
    din, dw, db = np.empty_like(x), np.empty(c, np.float32), np.empty(c, np.float32)
    _, tmean, tinvstd = aten.native_batch_norm(tx, tw, tb, trm, trv, True, 0.1, 1e-5)
    _C_testing.op_batchnorm2d(out, mean, rstd, x, weight, bias, rm, rv, count, 1e-5, 0.1, True, True, "f32")
    yield ("BatchNorm2d forward (train)",
           lambda: _C_testing.op_batchnorm2d(out, mean, rstd, x, weight, bias, rm, rv, count, 1e-5, 0.1, True, True,
                                              "f32"),
           lambda: aten.native_batch_norm(tx, tw, tb, trm, trv, True, 0.1, 1e-5))
    yield ("BatchNorm2d backward",
           lambda: _C_testing.op_batchnorm2d_backward(din, dw, db, dout, x, weight, mean, rstd, True, "f32"),
           lambda: aten.native_batch_norm_backward(tdout, tx, tw, trm, trv, tmean, tinvstd, True, 1e-5,
                                                   [True, True, True]))
    pooled = np.empty((n, c, h // 2, w // 2), np.float32)
    pdout = rng.standard_normal(pooled.shape).astype(np.float32)
    tpdout = torch.from_numpy(pdout)
    _, indices = aten.max_pool2d_with_indices(tx, [2, 2], [2, 2])
    argmax = np.empty(pooled.shape, np.int32)  # the maxima the layer saves, as PyTorch its indices
    yield ("MaxPool2d(2) forward",
           lambda: _C_testing.op_pool2d(pooled, x, "max", (2, 2), (2, 2), (0, 0), (1, 1), True, "f32", argmax=argmax),
           lambda: aten.max_pool2d_with_indices(tx, [2, 2], [2, 2]))
    yield ("MaxPool2d(2) backward",
           lambda: _C_testing.op_pool2d(din, x, "max", (2, 2), (2, 2), (0, 0), (1, 1), True, "f32", dout=pdout,
                                argmax=argmax),
           lambda: aten.max_pool2d_with_indices_backward(tpdout, tx, [2, 2], [2, 2], [0, 0], [1, 1], False, indices))
    yield ("AvgPool2d(2) forward",
           lambda: _C_testing.op_pool2d(pooled, x, "avg", (2, 2), (2, 2), (0, 0), (1, 1), True, "f32"),
           lambda: aten.avg_pool2d(tx, [2, 2], [2, 2]))
    yield ("AvgPool2d(2) backward",
           lambda: _C_testing.op_pool2d(din, x, "avg", (2, 2), (2, 2), (0, 0), (1, 1), True, "f32", dout=pdout),
           lambda: aten.avg_pool2d_backward(tpdout, tx, [2, 2], [2, 2], [0, 0], False, True, None))
    gap = np.empty((n, c, 1, 1), np.float32)
    gdout = rng.standard_normal(gap.shape).astype(np.float32)
    tgdout = torch.from_numpy(gdout)
    yield ("AdaptiveAvgPool2d(1) forward",
           lambda: _C_testing.op_pool2d(gap, x, "adaptive_avg", (1, 1), (1, 1), (0, 0), (1, 1), True, "f32"),
           lambda: aten._adaptive_avg_pool2d(tx, [1, 1]))
    yield ("AdaptiveAvgPool2d(1) backward",
           lambda: _C_testing.op_pool2d(din, x, "adaptive_avg", (1, 1), (1, 1), (0, 0), (1, 1), True, "f32",
                                         dout=gdout),
           lambda: aten._adaptive_avg_pool2d_backward(tgdout, tx))


def main() -> None:
    import torch

    gt.set_num_threads(1)
    torch.set_num_threads(1)
    print(f"{SHAPE} float32, 1 thread, median of {ROUNDS} (torch {torch.__version__})")
    print(f"{'op':<32} {'gputrain ms':>12} {'torch ms':>10} {'speed-up':>9}")
    for name, ours_fn, theirs_fn in cases(torch):
        ours, theirs = Timed(ours_fn), Timed(theirs_fn)
        ours_fn(), theirs_fn()
        for _ in range(ROUNDS):
            theirs()
            ours()
        t_ours, t_theirs = ours.median() * 1e3, theirs.median() * 1e3
        print(f"{name:<32} {t_ours:>12.3f} {t_theirs:>10.3f} {t_theirs / t_ours:>8.2f}x")


if __name__ == "__main__":
    main()
