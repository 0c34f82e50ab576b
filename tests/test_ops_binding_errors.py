"""The raw `_C.op_*` bindings' argument errors, one wrong argument at a time: the exception type,
the message (naming the argument, with the shapes), and every array passed left as it was. The
bindings share their checks (csrc/py/ops_args.c); these pin what each binding says."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from gputrain import _C
from gputrain import _C_testing


def randn(*shape: int) -> np.ndarray:
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


def f32(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def valid() -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """A call of each binding that succeeds, as (function, keyword arguments)."""
    x, q = randn(4, 6), randn(2, 2, 3, 4)
    image, kernel = randn(2, 4, 5, 5), randn(6, 4, 3, 3)
    conv = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    key = dict(seed=1, layer=0, step=0, offset=0)
    return {
        "activation": (_C.op_activation, dict(out=f32(4, 6), x=x, act=1, dt="f32", dout=randn(4, 6))),
        "dropout": (_C.op_dropout, dict(out=f32(4, 6), x=x, p=0.5, dt="f32", **key)),
        "add": (_C.op_add, dict(out=f32(4, 6), a=x, b=randn(4, 6), dt="f32")),
        "bias": (_C.op_bias, dict(x=randn(4, 6), bias=randn(6), dt="f32")),
        "layernorm_forward": (_C.op_layernorm_forward, dict(out=f32(4, 6), mean=f32(4), rstd=f32(4), x=x,
                                                            weight=randn(6), bias=randn(6), eps=1e-5,
                                                            dt="f32")),
        "layernorm_backward": (_C.op_layernorm_backward, dict(din=f32(4, 6), dweight=f32(6), dbias=f32(6),
                                                              dout=randn(4, 6), x=x, weight=randn(6),
                                                              mean=f32(4), rstd=np.ones(4, np.float32),
                                                              dt="f32")),
        "embedding": (_C.op_embedding, dict(x=f32(3, 6), ids=np.array([0, 2, 1]), table=randn(3, 6), dt="f32")),
        "softmax_xent": (_C.op_softmax_xent, dict(losses=f32(4), dlogits=f32(4, 6), logits=x,
                                                  targets=np.array([0, 1, 2, 3]), label_smoothing=0.0,
                                                  ignore_index=-100, dloss_scale=1.0, dt="f32")),
        "mse": (_C.op_mse, dict(dpred=f32(4, 6), pred=x, target=randn(4, 6), dloss_scale=1.0, dt="f32")),
        "cast": (_C.op_cast, dict(dst=np.zeros((4, 6), np.float16), dst_dt="f16", src=x, src_dt="f32")),
        "attention": (_C.op_attention, dict(out=f32(2, 2, 3, 4), lse=f32(12), q=q, k=randn(2, 2, 3, 4),
                                            v=randn(2, 2, 3, 4), dt="f32", causal=True, scale=0.5,
                                            key_lengths=None, dropout_p=0.0, **key)),
        "conv2d": (_C.op_conv2d, dict(out=f32(2, 6, 5, 5), x=image, weight=kernel, bias=randn(6), dt="f32",
                                      **conv)),
        "conv2d_backward": (_C.op_conv2d_backward, dict(dx=f32(2, 4, 5, 5), dweight=f32(6, 4, 3, 3),
                                                        dbias=f32(6), dout=randn(2, 6, 5, 5), x=image,
                                                        weight=kernel, dt="f32", **conv)),
        "batchnorm2d": (_C_testing.op_batchnorm2d, dict(out=f32(2, 4, 5, 5), mean=f32(4), rstd=f32(4), x=image,
                                                weight=randn(4), bias=randn(4), running_mean=f32(4),
                                                running_var=np.ones(4, np.float32),
                                                num_batches_tracked=np.zeros(1, np.int64), eps=1e-5,
                                                momentum=0.1, batch_stats=True, update_running=True,
                                                dt="f32")),
        "batchnorm2d_backward": (_C_testing.op_batchnorm2d_backward, dict(din=f32(2, 4, 5, 5), dweight=f32(4),
                                                                  dbias=f32(4), dout=randn(2, 4, 5, 5), x=image,
                                                                  weight=randn(4), mean=f32(4),
                                                                  rstd=np.ones(4, np.float32),
                                                                  batch_stats=True, dt="f32")),
        "pool2d": (_C_testing.op_pool2d, dict(out=f32(2, 4, 2, 2), x=image, kind="max", kernel=(2, 2), stride=(2, 2),
                                      padding=(0, 0), dilation=(1, 1), count_include_pad=False, dt="f32",
                                      argmax=np.zeros((2, 4, 2, 2), np.int32))),
    }


# (binding, the arguments changed, exception, the whole message)
CASES = [
    ("activation", dict(out=f32(4, 5)), ValueError, "out: shape (4, 5) does not match x's shape (4, 6)"),
    ("activation", dict(dout=f32(6, 4)), ValueError, "dout: shape (6, 4) does not match x's shape (4, 6)"),
    ("activation", dict(x=np.zeros((4, 6))), TypeError, "x must have native dtype float32, got dtype('float64')"),
    ("dropout", dict(out=f32(4)), ValueError, "out: shape (4,) does not match x's shape (4, 6)"),
    ("dropout", dict(out=f32(4), backward=True), ValueError, "din: shape (4,) does not match dout's shape (4, 6)"),
    ("dropout", dict(offset=-1), ValueError, "offset must be in [0, 9223372036854775807], got -1"),
    ("dropout", dict(step=2**32), ValueError, "step must be in [0, 4294967295], got 4294967296"),
    ("add", dict(a=f32(4, 5)), ValueError, "a: shape (4, 5) does not match out's shape (4, 6)"),
    ("add", dict(b=f32(6, 4)), ValueError, "b: shape (6, 4) does not match out's shape (4, 6)"),
    ("bias", dict(bias=f32(5)), ValueError, "bias: must have shape (6,), got shape (5,)"),
    ("bias", dict(x=randn(4, 6)[:, :3]), ValueError, "out must be C-contiguous and aligned"),
    ("layernorm_forward", dict(out=f32(6, 4)), ValueError, "out: shape (6, 4) does not match x's shape (4, 6)"),
    ("layernorm_forward", dict(mean=f32(6)), ValueError, "mean: must have shape (4,), got shape (6,)"),
    ("layernorm_backward", dict(din=f32(4, 5)), ValueError, "din: shape (4, 5) does not match x's shape (4, 6)"),
    ("layernorm_backward", dict(dout=f32(4)), ValueError, "dout: shape (4,) does not match x's shape (4, 6)"),
    ("embedding", dict(table=f32(18)), ValueError, "table: must be 2-D (num, dim), got shape (18,)"),
    ("embedding", dict(x=f32(3, 5)), ValueError, "out: must have the shape of ids plus (dim,), got shape (3, 5)"),
    ("softmax_xent", dict(logits=f32(24)), ValueError, "logits: must be 2-D (rows, classes), got shape (24,)"),
    ("softmax_xent", dict(dlogits=f32(4, 5)), ValueError,
     "dlogits: shape (4, 5) does not match logits's shape (4, 6)"),
    ("mse", dict(target=f32(4, 5)), ValueError, "target: shape (4, 5) does not match pred's shape (4, 6)"),
    ("mse", dict(dpred=f32(6, 4)), ValueError, "dpred: shape (6, 4) does not match pred's shape (4, 6)"),
    ("cast", dict(dst=np.zeros(24, np.float16)), ValueError, "dst: shape (24,) does not match src's shape (4, 6)"),
    ("cast", dict(src_dt="i8"), ValueError, "src_dt must be 'f32', 'f16' or 'bf16', got 'i8'"),
    ("attention", dict(q=f32(2, 2, 12)), ValueError,
     "q: must be 4-D (batch, heads, seq, head_dim), got shape (2, 2, 12)"),
    ("attention", dict(v=f32(2, 2, 3, 5)), ValueError,
     "v: shape (2, 2, 3, 5) does not match k's shape (2, 2, 3, 4)"),
    ("attention", dict(lse=f32(11)), ValueError, "lse: must have shape (12,), got shape (11,)"),
    ("attention", dict(key_lengths=np.array([3])), ValueError, "key_lengths: must have shape (2,), got shape (1,)"),
    ("attention", dict(layer=-1), ValueError, "layer must be in [0, 4294967295], got -1"),
    ("conv2d", dict(x=f32(2, 4, 25)), ValueError,
     "x: must be 4-D (batch, channels, height, width), got shape (2, 4, 25)"),
    ("conv2d", dict(weight=f32(6, 36)), ValueError,
     "weight: must be 4-D (out_channels, in_channels / groups, kh, kw), got shape (6, 36)"),
    ("conv2d", dict(weight=f32(6, 3, 3, 3)), ValueError, "weight: dimension 1 must be in_channels / groups = 4, got 3"),
    ("conv2d", dict(out=f32(2, 6, 4, 4)), ValueError, "out: must be (N, O, OH, OW), got shape (2, 6, 4, 4)"),
    ("conv2d", dict(bias=f32(5)), ValueError, "bias: must have shape (6,), got shape (5,)"),
    ("conv2d_backward", dict(dout=f32(2, 6, 5, 4)), ValueError, "dout: must be (N, O, OH, OW), got shape (2, 6, 5, 4)"),
    ("conv2d_backward", dict(dx=f32(2, 4, 5, 4)), ValueError, "dx: must have x's shape, got shape (2, 4, 5, 4)"),
    ("conv2d_backward", dict(dweight=f32(6, 4, 3, 2)), ValueError,
     "dweight: must have the weight's shape, got shape (6, 4, 3, 2)"),
    ("conv2d_backward", dict(dbias=f32(5)), ValueError, "dbias: must have shape (6,), got shape (5,)"),
    ("batchnorm2d", dict(x=f32(2, 4, 25)), ValueError, "x: must be (N, C, H, W), got shape, got shape (2, 4, 25)"),
    ("batchnorm2d", dict(out=f32(2, 4, 5, 4)), ValueError,
     "out: shape (2, 4, 5, 4) does not match x's shape (2, 4, 5, 5)"),
    ("batchnorm2d", dict(mean=None), TypeError, "mean and rstd must be float32 arrays, not None"),
    ("batchnorm2d", dict(rstd=None), TypeError, "mean and rstd must be float32 arrays, not None"),
    ("batchnorm2d", dict(running_var=f32(3)), ValueError, "running_var: must have shape (4,), got shape (3,)"),
    ("batchnorm2d", dict(num_batches_tracked=np.zeros(2, np.int64)), ValueError,
     "num_batches_tracked: must hold one count, got shape, got shape (2,)"),
    ("batchnorm2d_backward", dict(din=f32(2, 4, 5, 4)), ValueError,
     "din: shape (2, 4, 5, 4) does not match x's shape (2, 4, 5, 5)"),
    ("batchnorm2d_backward", dict(rstd=None), TypeError, "mean and rstd must be float32 arrays, not None"),
    ("batchnorm2d_backward", dict(dweight=f32(5)), ValueError, "dweight: must have shape (4,), got shape (5,)"),
    ("pool2d", dict(out=f32(2, 3, 2, 2), argmax=None), ValueError,
     "out: must have x's N and C, got shape, got shape (2, 3, 2, 2)"),
    ("pool2d", dict(kind="avg"), ValueError, "argmax: only max pooling saves its maxima"),
    ("pool2d", dict(kind="min"), ValueError, "kind must be 'max', 'avg' or 'adaptive_avg', got 'min'"),
    ("pool2d", dict(stride=2), TypeError, "stride must be a pair of ints"),
    ("pool2d", dict(out=f32(2, 4, 5, 5), dout=f32(2, 4, 2, 2), argmax=np.full((2, 4, 2, 2), 25, np.int32)),
     ValueError, "argmax[0]: 25 is outside a 5 x 5 plane"),
]


@pytest.mark.parametrize("name", sorted(valid()))
def test_valid_call_succeeds(name):
    fn, kwargs = valid()[name]
    fn(**kwargs)


@pytest.mark.parametrize("name, change, error, message", CASES,
                         ids=[f"{c[0]}-{'-'.join(c[1])}" for c in CASES])
def test_one_wrong_argument(name, change, error, message):
    fn, kwargs = valid()[name]
    kwargs.update(change)
    before = {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    with pytest.raises(error) as raised:
        fn(**kwargs)
    if message is not None:
        assert str(raised.value) == message
    for key, value in before.items():
        np.testing.assert_array_equal(kwargs[key], value, err_msg=key)


def test_every_binding_has_a_case():
    assert {c[0] for c in CASES} == set(valid()), "each binding in valid() needs a wrong-argument case"
