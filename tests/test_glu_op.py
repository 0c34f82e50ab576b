"""Gated MLP activation (csrc/ops/cpu_glu.c; gputrain.functional.gated_activation and its
backward): SwiGLU / GeGLU on x's [gate | up] halves against the float64 reference and, bit for
bit, against Hugging Face's composition act_fn(gate) * up with PyTorch's roundings (the
activation op's own f32 functions, rounded with NumPy), finite differences, din aliasing x, the
sim backend (and CUDA where present), thread counts, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
from gputrain import _C
from gputrain import _C_testing
from gputrain import functional as F

DTYPES = ["f32", "f16", "bf16"]
KINDS = ["silu", "gelu_tanh", "gelu", "relu", "tanh"]
RAW = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}


def randn(shape, seed=0, scale=2.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def rounded(x, dt):
    """float32 x rounded to dt, back in float32 (one PyTorch op's result in dt)."""
    return ref.to_dtype(x, dt).astype(np.float32)


def hf_forward(x, kind, dt):
    """act_fn(gate) * up in dt: the activation (the activation op's f32 function) rounded, then the
    product rounded."""
    inter = x.shape[-1] // 2
    gate, up = x[..., :inter].astype(np.float32), x[..., inter:].astype(np.float32)
    a = rounded(F.activation(gate, kind), dt)
    return ref.to_dtype(a * up, dt)


def hf_backward(dout, x, kind, dt):
    """Autograd of act_fn(gate) * up in dt: dup = dout * act(gate), dgate = act'(gate) * (dout * up)."""
    inter = x.shape[-1] // 2
    gate, up = x[..., :inter].astype(np.float32), x[..., inter:].astype(np.float32)
    d = dout.astype(np.float32)
    dup = ref.to_dtype(d * rounded(F.activation(gate, kind), dt), dt)
    dgate = ref.to_dtype(F.activation_backward(rounded(d * up, dt), gate, kind), dt)
    return np.concatenate([dgate, dup], axis=-1)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_forward_and_backward_are_hf_bits(dt, kind):
    x = ref.to_dtype(randn((3, 5, 2 * 37), 1), dt)
    dout = ref.to_dtype(randn((3, 5, 37), 2, 1.0), dt)
    out = F.gated_activation(x, kind)
    assert out.dtype == x.dtype and out.shape == (3, 5, 37)
    assert ref.same_bits(out, hf_forward(x, kind, dt))
    din = F.gated_activation_backward(dout, x, kind)
    assert din.shape == x.shape and ref.same_bits(din, hf_backward(dout, x, kind, dt))


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_f32_matches_the_float64_reference_and_finite_differences(kind):
    x, dout = randn((4, 2 * 33), 3), randn((4, 33), 4, 1.0)
    gate, up = ref.f64(x[:, :33]), ref.f64(x[:, 33:])
    ref.assert_close(F.gated_activation(x, kind), ref.activation(gate, kind) * up, "f32", rtol=2e-6, atol=1e-7)
    din = F.gated_activation_backward(dout, x, kind)
    expected = np.concatenate([ref.f64(dout) * up * ref.activation_grad(gate, kind),
                               ref.f64(dout) * ref.activation(gate, kind)], axis=-1)
    ref.assert_close(din, expected, "f32", rtol=5e-6, atol=1e-6)
    small, small_dout = x[:2, :].copy(), dout[:2]
    def f(z):
        return ref.activation(z[:, :33], kind) * z[:, 33:]
    ref.assert_grad(F.gated_activation_backward(small_dout, small, kind), ref.numerical_grad(f, small, small_dout),
                    rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dt", DTYPES)
def test_din_may_alias_x(dt):
    x = ref.to_dtype(randn((6, 2 * 40), 5), dt).view(RAW[dt])
    dout = ref.to_dtype(randn((6, 40), 6, 1.0), dt).view(RAW[dt])
    expected = np.empty_like(x)
    _C.op_glu(expected, x, F.ACTIVATIONS["silu"], dt, dout=dout)
    in_place = x.copy()
    _C.op_glu(in_place, in_place, F.ACTIVATIONS["silu"], dt, dout=dout)
    assert ref.same_bits(in_place, expected)


def test_thread_counts_keep_the_bits_and_inputs_are_untouched():
    x = ref.to_dtype(randn((64, 2 * 700), 7), "bf16")
    dout = ref.to_dtype(randn((64, 700), 8, 1.0), "bf16")
    saved = x.copy(), dout.copy()
    results = []
    for threads in (1, 2):
        with ref.num_threads(threads):
            results.append((F.gated_activation(x, "silu"), F.gated_activation_backward(dout, x, "silu")))
    assert ref.same_bits(results[0][0], results[1][0]) and ref.same_bits(results[0][1], results[1][1])
    assert ref.same_bits(x, saved[0]) and ref.same_bits(dout, saved[1])


@pytest.mark.parametrize("backend", ["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_device_backends_give_the_cpu_bits(backend, dt, kind):
    rows, inter = 7, 45
    x = ref.to_dtype(randn((rows, 2 * inter), 9), dt).view(RAW[dt])
    dout = ref.to_dtype(randn((rows, inter), 10, 1.0), dt).view(RAW[dt])
    args = (rows, inter, F.ACTIVATIONS[kind], dt)
    outs = {}
    for name in ("cpu", backend):
        out, din = np.zeros((rows, inter), RAW[dt]), np.zeros_like(x)
        _C_testing.run_op(name, "glu_forward", [out, x.copy()], args)
        _C_testing.run_op(name, "glu_backward", [din, dout.copy(), x.copy()], args)
        _C_testing.run_op(name, "glu_backward", [None, dout.copy(), x.copy()], args)  # din not wanted
        outs[name] = out, din
    assert ref.same_bits(outs["cpu"][0], outs[backend][0]) and ref.same_bits(outs["cpu"][1], outs[backend][1])


def test_bad_arguments_are_named():
    x = randn((2, 6))
    with pytest.raises(ValueError, match="even"):
        F.gated_activation(randn((2, 5)))
    with pytest.raises(ValueError, match="dout"):
        F.gated_activation_backward(randn((2, 6)), x)
    with pytest.raises(ValueError, match="kind"):
        F.gated_activation(x, "swish")
    with pytest.raises(ValueError, match="act"):
        _C.op_glu(np.empty((2, 3), np.float32), x, 9, "f32")
    with pytest.raises(ValueError, match="out"):
        _C.op_glu(np.empty((2, 6), np.float32), x, 4, "f32")
    with pytest.raises(TypeError, match="dout"):
        F.gated_activation_backward(ref.to_dtype(randn((2, 3)), "f16"), x)
