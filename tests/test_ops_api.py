"""The functional API as a whole: every public function leaves its inputs untouched, leaks no
references, and the raw `_C.op_*` bindings reject wrong objects with exceptions, never crashes."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import _reference as ref
import gputrain
from gputrain import _C
from gputrain import _C_testing
from gputrain import functional as F


def randn(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def calls():
    """(name, function, args, kwargs) for every public function of gputrain.functional."""
    x, d = randn((6, 8), 1), randn((6, 8), 2)
    w, b, v = randn((5, 8), 3), randn(5, 4), randn(8, 5)
    ids, table = np.array([0, 3, 1, 3, 2, 0]), randn((4, 8), 6)
    _, mean, rstd = F.layer_norm(x, v, v)
    q, k, a = randn((2, 2, 3, 4), 8), randn((2, 2, 3, 4), 9), randn((2, 2, 3, 4), 10)
    out, lse = F.scaled_dot_product_attention(q, k, a, causal=True)
    image, kernel = randn((2, 4, 5, 6), 11), randn((6, 2, 3, 2), 12)
    inv_freq, positions = F.rope_inv_freq(4, 10000.0), np.array([[0, 1, 2], [0, 1, 0]])
    return [
        ("gemm", F.gemm, (x, w), dict(trans_b=True)),
        ("linear", F.linear, (x, w, b), {}),
        ("linear_backward", F.linear_backward, (randn((6, 5), 7), x, w), {}),
        ("bias_add", F.bias_add, (x, v), {}),
        ("bias_backward", F.bias_backward, (d,), {}),
        ("activation", F.activation, (x, "silu"), {}),
        ("activation_backward", F.activation_backward, (d, x, "silu"), {}),
        ("relu", F.relu, (x,), {}),
        ("relu_backward", F.relu_backward, (d, x), {}),
        ("gelu", F.gelu, (x,), {}),
        ("gelu_backward", F.gelu_backward, (d, x), {}),
        ("tanh", F.tanh, (x,), {}),
        ("tanh_backward", F.tanh_backward, (d, x), {}),
        ("silu", F.silu, (x,), {}),
        ("silu_backward", F.silu_backward, (d, x), {}),
        ("dropout", F.dropout, (x, 0.5, 1), {}),
        ("dropout_backward", F.dropout_backward, (d, 0.5, 1), {}),
        ("add", F.add, (x, d), {}),
        ("layer_norm", F.layer_norm, (x, v, v), {}),
        ("layer_norm_backward", F.layer_norm_backward, (d, x, v, mean, rstd), {}),
        ("embedding", F.embedding, (ids, table), {}),
        ("embedding_backward", F.embedding_backward, (d, ids, 4), {}),
        ("cross_entropy", F.cross_entropy, (x, np.array([0, 1, 2, 3, 4, 7])), dict(label_smoothing=0.1)),
        ("mse_loss", F.mse_loss, (x, d), {}),
        ("sum_squares", F.sum_squares, (x,), {}),
        ("scaled_dot_product_attention", F.scaled_dot_product_attention, (q, k, a),
         dict(key_lengths=[3, 1], dropout_p=0.2)),
        ("scaled_dot_product_attention_backward", F.scaled_dot_product_attention_backward,
         (a, q, k, a, out, lse), dict(causal=True)),
        ("conv2d", F.conv2d, (image, kernel, randn(6, 13)), dict(stride=(2, 1), padding=1, groups=2)),
        ("conv2d_backward", F.conv2d_backward, (randn((2, 6, 3, 7), 14), image, kernel),
         dict(stride=(2, 1), padding=1, groups=2)),
        ("gated_activation", F.gated_activation, (x, "gelu_tanh"), {}),
        ("gated_activation_backward", F.gated_activation_backward, (randn((6, 4), 15), x), {}),
        ("rope_inv_freq", F.rope_inv_freq, (8, 10000.0), dict(partial_rotary_factor=0.5)),
        ("rotary_embedding", F.rotary_embedding, (q, positions, inv_freq), {}),
        ("rotary_embedding_backward", F.rotary_embedding_backward, (a, positions, inv_freq), {}),
    ]


def test_every_public_function_is_exercised():
    assert sorted(name for name, *_ in calls()) == sorted(F.__all__)
    assert gputrain.functional is F


@pytest.mark.parametrize("name,fn,args,kwargs", calls(), ids=[c[0] for c in calls()])
def test_inputs_are_not_modified(name, fn, args, kwargs):
    copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    fn(*args, **kwargs)
    for before, after in zip(copies, args):
        if isinstance(before, np.ndarray):
            assert ref.same_bits(before, after), name


@pytest.mark.parametrize("name,fn,args,kwargs", calls(), ids=[c[0] for c in calls()])
def test_no_reference_leaks(name, fn, args, kwargs):
    arrays = [a for a in args if isinstance(a, np.ndarray)]
    fn(*args, **kwargs)
    before = [sys.getrefcount(a) for a in arrays]
    for _ in range(50):
        fn(*args, **kwargs)
    assert [sys.getrefcount(a) for a in arrays] == before, name


def test_failed_calls_leak_no_references():
    x = randn((4, 5), 8)
    before = sys.getrefcount(x)
    for _ in range(50):
        with pytest.raises(IndexError):
            F.cross_entropy(x, np.array([0, 1, 2, 9]))
        with pytest.raises(ValueError):
            _C.op_activation(np.empty((4, 4), np.float32), x, 0, "f32")
    assert sys.getrefcount(x) == before


RAW_CALLS = [
    (_C.op_gemm, 10), (_C.op_bias, 3), (_C.op_activation, 4), (_C.op_dropout, 8), (_C.op_add, 4),
    (_C.op_layernorm_forward, 8), (_C.op_layernorm_backward, 9), (_C.op_embedding, 4),
    (_C.op_softmax_xent, 8), (_C.op_mse, 5), (_C.op_cast, 4), (_C_testing.op_copy, 2),
    (_C.op_attention, 14), (_C.op_conv2d, 9), (_C.op_conv2d_backward, 11), (_C.op_rope, 6),
    (_C.op_rope_inv_freq, 2), (_C.op_glu, 4),
]
JUNK = [None, 1.5, "f32", [1.0, 2.0], np.zeros((2, 2), np.float64), np.zeros((2, 2), np.float32)[:, ::2],
        np.zeros(3, np.int64)]


@pytest.mark.parametrize("fn,arity", RAW_CALLS, ids=[fn.__name__ for fn, _ in RAW_CALLS])
@pytest.mark.parametrize("junk", JUNK, ids=range(len(JUNK)))
def test_raw_bindings_reject_junk(fn, arity, junk):
    with pytest.raises((TypeError, ValueError, IndexError)):
        fn(*([junk] * arity))  # for op_copy: an array copied onto itself overlaps
    with pytest.raises(TypeError):
        fn()


def test_raw_copy_rejects_overlap():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="src: overlaps dst"):
        _C_testing.op_copy(x[2:], x[:8])


def test_raw_sum_squares_rejects_junk():
    for junk in (None, 3, np.zeros(3, np.float64), np.zeros((3, 2), np.float32)[:, ::2]):
        with pytest.raises((TypeError, ValueError)):
            _C.op_sum_squares(junk)
