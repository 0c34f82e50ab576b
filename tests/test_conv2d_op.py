"""gputrain.functional.conv2d / conv2d_backward (the CPU op table's conv2d: im2col tiles and the
GEMM library) against the float64 NumPy reference (tests/_conv_reference.py) over strides,
paddings, dilations, groups (depthwise included), 1x1 kernels, odd sizes and batch 1, in f32,
f16 and bf16; a finite-difference check; the same bits for any thread count; gradient
accumulation; clear errors; and PyTorch's conv2d when it is installed."""

from __future__ import annotations

import numpy as np
import pytest

import _conv_reference as cref
import _reference as ref
import gputrain.functional as F

DTYPES = ["f32", "f16", "bf16"]

# (N, C, H, W, O, kernel, stride, padding, dilation, groups)
CONFIGS = {
    "3x3_pad1": (2, 3, 7, 6, 4, 3, 1, 1, 1, 1),
    "batch1": (1, 5, 9, 9, 3, 3, 1, 0, 1, 1),
    "stride2": (3, 4, 11, 10, 5, 3, 2, 1, 1, 1),
    "rect_all": (3, 4, 9, 8, 6, (2, 3), (2, 1), (1, 2), (1, 2), 2),
    "dilation3": (2, 2, 13, 12, 3, 3, 1, 3, 3, 1),
    "depthwise": (2, 6, 8, 7, 6, 3, 1, 1, 1, 6),
    "depthwise_x2": (2, 4, 7, 7, 8, 5, 2, 2, 1, 4),
    "pointwise": (3, 6, 5, 7, 4, 1, 1, 0, 1, 1),
    "pointwise_groups": (2, 6, 4, 5, 9, 1, 1, 0, 1, 3),
    "1x1_stride2": (2, 3, 7, 7, 4, 1, 2, 0, 1, 1),
    "1x1_pad1": (2, 3, 4, 5, 2, 1, 1, 1, 1, 1),
    "kernel_is_input": (4, 3, 5, 4, 7, (5, 4), 1, 0, 1, 1),
    "big_stride": (2, 2, 9, 9, 3, 2, 4, 1, 1, 1),
    "tiled": (3, 16, 40, 37, 24, 3, 1, 1, 1, 2),  # several column tiles per sample
    "many_chunks": (37, 3, 5, 5, 4, 3, 1, 1, 1, 1),  # more samples than weight-gradient chunks
    "same_empty_span": (2, 3, 3, 2, 4, 5, 1, 2, 1, 1),  # a kernel column that sees only padding
    "same_dilated": (2, 3, 6, 5, 4, 3, 1, 2, 2, 1),  # output as wide as the input, dilated
}


def setup(config, dt, seed=0):
    n, c, h, w, o, kernel, stride, padding, dilation, groups = config
    kh, kw = cref._pair(kernel)
    rng = np.random.default_rng(seed)
    x = ref.to_dtype(rng.standard_normal((n, c, h, w)), dt)
    weight = (rng.standard_normal((o, c // groups, kh, kw)) / np.sqrt(c // groups * kh * kw)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    options = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    return x, weight, bias, options


def rounded_weight(weight, dt):
    return ref.f64(ref.to_dtype(weight, dt))


def check(actual, reference, dt, what):
    scale = np.abs(reference).max() + 1e-30
    if dt == "f32":
        np.testing.assert_allclose(ref.f64(actual), reference, rtol=1e-5, atol=1e-6 * scale, err_msg=what)
    else:  # rounded once from an f32 sum: one ulp of dt, plus the f32 sum's error near zero
        ref.assert_close(actual, reference, dt, atol=1e-4 * scale, err_msg=what)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward_and_backward_match_the_float64_reference(name, dt):
    x, weight, bias, options = setup(CONFIGS[name], dt)
    out = F.conv2d(x, weight, bias, **options)
    w64 = rounded_weight(weight, dt)
    expected = cref.conv2d(ref.f64(x), w64, bias, **options)
    assert out.shape == expected.shape and out.dtype == x.dtype
    check(out, expected, dt, "out")
    dout = ref.to_dtype(np.random.default_rng(1).standard_normal(expected.shape), dt)
    dx, dweight, dbias = F.conv2d_backward(dout, x, weight, **options)
    rdx, rdweight, rdbias = cref.conv2d_backward(ref.f64(dout), ref.f64(x), w64, **options)
    check(dx, rdx, dt, "dx")
    np.testing.assert_allclose(dweight, rdweight, rtol=1e-5, atol=1e-5 * np.abs(rdweight).max(), err_msg="dweight")
    np.testing.assert_allclose(dbias, rdbias, rtol=1e-5, atol=1e-5 * np.abs(rdbias).max(), err_msg="dbias")


def test_without_bias_and_the_bias_gradient_left_out():
    x, weight, bias, options = setup(CONFIGS["stride2"], "f32")
    with_bias = F.conv2d(x, weight, bias, **options)
    np.testing.assert_allclose(F.conv2d(x, weight, None, **options), with_bias - bias[None, :, None, None],
                               rtol=1e-5, atol=1e-5)
    dout = np.ones(F.conv2d(x, weight, **options).shape, np.float32)
    with_bias = F.conv2d_backward(dout, x, weight, **options)
    without = F.conv2d_backward(dout, x, weight, **options, with_bias=False)
    assert without[2] is None
    assert ref.same_bits(with_bias[0], without[0]) and ref.same_bits(with_bias[1], without[1])


@pytest.mark.parametrize("name", ["rect_all", "depthwise", "pointwise"])
def test_finite_differences(name):
    """d(sum(r * conv(x, w)))/dx . v and /dw . u from the backward against central differences
    of the forward (float32, step 1e-2: quadratic terms vanish, conv is linear)."""
    x, weight, bias, options = setup(CONFIGS[name], "f32", seed=3)
    rng = np.random.default_rng(4)
    r = rng.standard_normal(F.conv2d(x, weight, bias, **options).shape)
    v, u = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(weight.shape).astype(np.float32)

    def loss(xx, ww):
        return float((F.conv2d(xx, ww, bias, **options).astype(np.float64) * r).sum())

    dx, dweight, dbias = F.conv2d_backward(r.astype(np.float32), x, weight, **options)
    eps = 1e-2
    fd_x = (loss(x + eps * v, weight) - loss(x - eps * v, weight)) / (2 * eps)
    fd_w = (loss(x, weight + eps * u) - loss(x, weight - eps * u)) / (2 * eps)
    assert (dx.astype(np.float64) * v).sum() == pytest.approx(fd_x, rel=2e-3, abs=1e-3)
    assert (dweight.astype(np.float64) * u).sum() == pytest.approx(fd_w, rel=2e-3, abs=1e-3)
    assert dbias.astype(np.float64).sum() == pytest.approx(r.sum(), rel=1e-5)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", ["tiled", "many_chunks", "depthwise_x2", "pointwise_groups"])
def test_any_thread_count_gives_the_same_bits(name, dt):
    x, weight, bias, options = setup(CONFIGS[name], dt)
    results = []
    for threads in (1, 2, 3):
        with ref.num_threads(threads):
            out = F.conv2d(x, weight, bias, **options)
            dout = ref.to_dtype(np.cos(np.arange(out.size)).reshape(out.shape), dt)
            results.append((out, *F.conv2d_backward(dout, x, weight, **options)))
    for other in results[1:]:
        assert all(ref.same_bits(a, b) for a, b in zip(other, results[0]))


def test_accumulate_adds_to_the_gradients_and_leaves_dx_written():
    from gputrain import _C

    x, weight, bias, options = setup(CONFIGS["many_chunks"], "f32")
    dout = np.random.default_rng(5).standard_normal(F.conv2d(x, weight, **options).shape).astype(np.float32)
    _, dweight, dbias = F.conv2d_backward(dout, x, weight, **options)
    start_w, start_b = np.full_like(weight, 0.5), np.full_like(bias, -2.0)
    dx = np.full_like(x, 7.0)
    args = (options["stride"],) * 2, (options["padding"],) * 2, (options["dilation"],) * 2, options["groups"]
    _C.op_conv2d_backward(dx, start_w, start_b, dout, x, weight, "f32", *args, accumulate=True)
    np.testing.assert_allclose(start_w, dweight + 0.5, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(start_b, dbias - 2.0, rtol=1e-6, atol=1e-6)
    assert ref.same_bits(dx, F.conv2d_backward(dout, x, weight, **options)[0])
    only_dx = np.empty_like(x)  # no weight gradient wanted: the input gradient alone, same bits
    _C.op_conv2d_backward(only_dx, None, None, dout, x, weight, "f32", *args)
    assert ref.same_bits(only_dx, dx)


def test_inputs_are_not_modified():
    x, weight, bias, options = setup(CONFIGS["rect_all"], "bf16")
    copies = [a.copy() for a in (x, weight, bias)]
    out = F.conv2d(x, weight, bias, **options)
    dout = out.copy()
    F.conv2d_backward(dout, x, weight, **options)
    assert all(ref.same_bits(a, b) for a, b in zip((x, weight, bias), copies))
    assert ref.same_bits(dout, out)


@pytest.mark.parametrize("call, error, match", [
    (lambda x, w: F.conv2d(x[0], w), ValueError, "x must be 4-D"),
    (lambda x, w: F.conv2d(x, w[0]), ValueError, "weight must be 4-D"),
    (lambda x, w: F.conv2d(x, w, groups=2), ValueError, "must be divisible by groups"),
    (lambda x, w: F.conv2d(x[:, :2], w), ValueError, "weight: dimension 1 must be in_channels / groups = 2"),
    (lambda x, w: F.conv2d(x, np.zeros((5, 1, 3, 3), np.float32), groups=3), ValueError, "groups"),
    (lambda x, w: F.conv2d(x, np.zeros((2, 3, 9, 3), np.float32)), ValueError, "kernel_h: the dilated kernel"),
    (lambda x, w: F.conv2d(x, w, dilation=(1, 4)), ValueError, "kernel_w: the dilated kernel"),
    (lambda x, w: F.conv2d(x, w, stride=0), ValueError, "stride"),
    (lambda x, w: F.conv2d(x, w, groups=2**100), ValueError, "groups must be in"),  # fuzz: was OverflowError
    (lambda x, w: F.conv2d(x, w, groups=1.0), TypeError, "groups must be an int"),
    (lambda x, w: F.conv2d(x, w, padding=-1), ValueError, "padding"),
    (lambda x, w: F.conv2d(x, w, stride=(1, 2, 3)), TypeError, "stride"),
    (lambda x, w: F.conv2d(x, w, np.zeros(3, np.float32)), ValueError, "bias"),
    (lambda x, w: F.conv2d(x.astype(np.float64), w), TypeError, "x must be float32"),
    (lambda x, w: F.conv2d_backward(np.zeros((2, 2, 5, 5), np.float32), x, w), ValueError, "dout"),
])
def test_bad_arguments_raise_naming_them(call, error, match):
    x = np.zeros((2, 3, 6, 6), np.float32)
    w = np.zeros((2, 3, 3, 3), np.float32)
    with pytest.raises(error, match=match):
        call(x, w)


def test_empty_batch():
    x, weight, bias, options = setup(CONFIGS["3x3_pad1"], "f32")
    out = F.conv2d(x[:0], weight, bias, **options)
    assert out.shape == (0, 4, 7, 6)
    dx, dweight, dbias = F.conv2d_backward(out, x[:0], weight, **options)
    assert dx.shape == (0, 3, 7, 6) and not dweight.any() and not dbias.any()


def test_matches_torch_conv2d():
    torch = pytest.importorskip("torch")
    for name in ("rect_all", "depthwise_x2", "tiled", "pointwise"):
        x, weight, bias, options = setup(CONFIGS[name], "f32")
        tx = torch.from_numpy(x.copy()).requires_grad_()
        tw = torch.from_numpy(weight.copy()).requires_grad_()
        tb = torch.from_numpy(bias.copy()).requires_grad_()
        tout = torch.nn.functional.conv2d(tx, tw, tb, **options)
        out = F.conv2d(x, weight, bias, **options)
        np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-4, atol=1e-5)
        dout = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
        tout.backward(torch.from_numpy(dout))
        dx, dweight, dbias = F.conv2d_backward(dout, x, weight, **options)
        for ours, theirs in ((dx, tx), (dweight, tw), (dbias, tb)):
            np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-4, atol=1e-4)
