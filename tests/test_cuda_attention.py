"""The attention op of the CUDA table (cuda/ops_attention.cu) against the CPU op, through
_C_testing.run_op on the same inputs. The kernels' per-row math is the CPU op's arithmetic in its
order (checked on the host in tests/test_attention_cuda_math.py), so the comparisons are bit for
bit. Tests marked `cuda` need a GPU (they skip without one); the others run the same calls on the
CPU table and the simulated device, the plumbing the GPU tests rely on."""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
from gputrain import _C_testing
from gputrain import functional as F

cuda = pytest.mark.cuda
KEY = dict(seed=41, layer=3, step=2, offset=7)
CASES = [  # (shape, dt, causal, masked, dropout_p)
    ((1, 1, 1, 32), "f32", False, False, 0.0),
    ((2, 3, 17, 32), "f32", True, True, 0.0),
    ((1, 2, 64, 64), "f32", False, True, 0.2),
    ((2, 2, 65, 80), "f32", True, True, 0.1),
    ((1, 1, 130, 64), "f32", True, False, 0.0),
    ((2, 2, 70, 64), "bf16", True, True, 0.1),
    ((2, 2, 70, 80), "f16", False, True, 0.1),
    ((1, 2, 40, 256), "f32", True, False, 0.0),
]


def inputs(shape, dt, masked, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (ref.to_dtype(rng.standard_normal(shape), dt) for _ in range(4))
    lengths = rng.integers(1, shape[2] + 1, size=shape[0]).astype(np.int64) if masked else None
    return q, k, v, dout, lengths


def scalars(shape, dt, causal, dropout_p):
    return (*shape, causal, 1.0 / np.sqrt(shape[3]), dropout_p, *KEY.values(), dt)


def run(backend, shape, dt, causal, masked, dropout_p, kv_heads=0, window=0, starts=None):
    """(out, lse, dq, dk, dv) of the op on `backend`, forward then backward; kv_heads > 0: k and v
    (and dk, dv) have that many heads (grouped-query attention)."""
    q, k, v, dout, lengths = inputs(shape, dt, masked)
    if kv_heads:
        k, v = np.ascontiguousarray(k[:, :kv_heads]), np.ascontiguousarray(v[:, :kv_heads])
    out, lse = np.zeros_like(q), np.zeros(shape[:3], np.float32)
    args = (*scalars(shape, dt, causal, dropout_p), kv_heads, window)
    _C_testing.run_op(backend, "attention_forward", [q, k, v, out, lse, lengths, starts], args)
    grads = [np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)]
    _C_testing.run_op(backend, "attention_backward", [q, k, v, out, lse, dout, *grads, lengths, starts], args)
    return out, lse, *grads


def assert_same(got, want):
    for name, a, b in zip(["out", "lse", "dq", "dk", "dv"], got, want):
        assert ref.same_bits(a, b), name


@pytest.mark.parametrize("case", CASES[:4])
def test_run_op_on_the_cpu_is_the_functional_op(case):
    shape, dt, causal, masked, dropout_p = case
    q, k, v, dout, lengths = inputs(shape, dt, masked)
    options = dict(causal=causal, key_lengths=lengths, dropout_p=dropout_p, **KEY)
    out, lse = F.scaled_dot_product_attention(q, k, v, **options)
    grads = F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, **options)
    assert_same(run("cpu", *case), (out, lse, *grads))


@pytest.mark.sim
@pytest.mark.parametrize("case", CASES[1:4])
def test_the_simulated_device_gives_the_cpu_ops_bits(case):
    assert_same(run("sim", *case), run("cpu", *case))


@cuda
@pytest.mark.parametrize("case", CASES)
def test_cuda_attention_gives_the_cpu_ops_bits(case):
    assert_same(run("cuda", *case), run("cpu", *case))


@cuda
def test_cuda_attention_query_without_keys_and_bad_arguments():
    shape = (2, 1, 9, 32)
    q, k, v, dout, _ = inputs(shape, "f32", False)
    lengths = np.array([0, 9], np.int64)
    out, lse = np.zeros_like(q), np.zeros(shape[:3], np.float32)
    _C_testing.run_op("cuda", "attention_forward", [q, k, v, out, lse, lengths, None], scalars(shape, "f32", True, 0.0))
    assert np.all(out[0] == 0) and np.all(lse[0] == -np.inf) and np.all(np.isfinite(out[1]))
    with pytest.raises(ValueError, match=r"key_lengths\[1\]: must be in \[0, 9\], got 10"):
        _C_testing.run_op("cuda", "attention_forward", [q, k, v, out, lse, np.array([3, 10], np.int64), None],
                  scalars(shape, "f32", True, 0.0))
    wide = (1, 1, 4, 300)
    q, k, v, _, _ = inputs(wide, "f32", False)
    with pytest.raises(ValueError, match=r"head_dim: must be in \[1, 256\] on this backend, got 300"):
        _C_testing.run_op("cuda", "attention_forward", [q, k, v, np.zeros_like(q), np.zeros(wide[:3], np.float32),
                                                None, None], scalars(wide, "f32", False, 0.0))
