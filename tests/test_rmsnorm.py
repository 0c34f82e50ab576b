"""RMSNorm (csrc/nn/rmsnorm.c, the op of csrc/ops/rmsnorm_hd.h): PyTorch's nn.RMSNorm,
y = x / sqrt(mean(x^2) + eps) * weight. The op against a float64 NumPy reference (f32, f16, bf16,
with and without weight, din aliasing dout and NULL), its gradients against central differences
of the reference, the sim backend against the CPU bit for bit, the CUDA kernels' decomposition run
on the host (tests/_rmsnorm_harness.c) against the CPU bit for bit, and the layer: parameters,
forward, a training step on cpu and sim, and spec errors that name the argument. Every position
of the layer in a model is covered by tests/test_layer_positions.py."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import _c_harness
import _reference as ref
import gputrain as gt
from gputrain import _C
from gputrain import _C_testing

nn = gt.nn
DTYPES = ["f32", "f16", "bf16"]
DT_CODES = {"f32": 0, "f16": 1, "bf16": 2}
#: Relative error against the float64 reference: one f32 rounding, or one rounding of the half format.
TOLERANCE = {"f32": 1e-5, "f16": 2e-3, "bf16": 1.6e-2}


def raw(array):
    """What the op bindings take: bf16 as its uint16 bits."""
    return None if array is None else array.view(np.uint16) if array.dtype.name == "bfloat16" else array


def reference(x, weight, eps, dout):
    """(out, rstd, din, dweight) in float64."""
    x, dout = ref.f64(x), ref.f64(dout)
    rstd = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    xhat = x * rstd
    w = 1.0 if weight is None else weight.astype(np.float64)
    g = dout * w
    din = rstd * (g - xhat * (g * xhat).mean(-1, keepdims=True))
    dweight = None if weight is None else (dout * xhat).sum(0)
    return xhat * w, rstd[:, 0], din, dweight


def inputs(rows, cols, dt, affine, seed=0):
    rng = np.random.default_rng(seed)
    x = ref.to_dtype(rng.standard_normal((rows, cols)) * 3 + 0.5, dt)
    dout = ref.to_dtype(rng.standard_normal((rows, cols)), dt)
    weight = (1 + 0.5 * rng.standard_normal(cols)).astype(np.float32) if affine else None
    return x, dout, weight


def run(backend, x, dout, weight, eps, dt, want_din=True, alias=False):
    """(out, rstd, din, dweight) of the op on `backend`."""
    rows, cols = x.shape
    out, rstd = np.empty_like(x), np.zeros(rows, np.float32)
    _C_testing.run_op(backend, "rmsnorm_forward", [raw(out), rstd, raw(x), weight], (rows, cols, eps, dt))
    dweight = None if weight is None else np.full(cols, np.nan, np.float32)
    din = dout.copy() if alias else np.full_like(x, np.nan) if want_din else None
    source = din if alias else dout
    _C_testing.run_op(backend, "rmsnorm_backward", [raw(din), dweight, raw(source), raw(x), weight, rstd],
              (rows, cols, dt, False))
    return out, rstd, din, dweight


@pytest.mark.parametrize("affine", [True, False], ids=["weight", "no_weight"])
@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 13), (33, 130)])
def test_op_matches_the_numpy_reference(rows, cols, dt, affine):
    x, dout, weight = inputs(rows, cols, dt, affine)
    out, rstd, din, dweight = run("cpu", x, dout, weight, 1e-6, dt)
    want = reference(x, weight, 1e-6, dout)
    tol = TOLERANCE[dt]
    np.testing.assert_allclose(ref.f64(rstd), want[1], rtol=1e-6)
    np.testing.assert_allclose(ref.f64(out), want[0], rtol=tol, atol=tol)
    # din is a difference of terms of size rstd * |dout * weight| (0 for one column): errors scale with them
    scale = np.abs(want[1][:, None] * ref.f64(dout) * (1.0 if weight is None else weight)).max()
    np.testing.assert_allclose(ref.f64(din), want[2], rtol=tol, atol=4 * tol * scale)
    if affine:
        np.testing.assert_allclose(dweight, want[3], rtol=tol, atol=tol * np.abs(want[3]).max())


@pytest.mark.parametrize("affine", [True, False], ids=["weight", "no_weight"])
def test_op_gradients_match_central_differences(affine):
    """din and dweight of the op against central differences of the float64 forward."""
    x, dout, weight = inputs(4, 9, "f32", affine, seed=2)
    _, _, din, dweight = run("cpu", x, dout, weight, 1e-3, "f32")
    numeric_din = ref.numerical_grad(lambda v: reference(v, weight, 1e-3, dout)[0], x, ref.f64(dout))
    ref.assert_grad(din, numeric_din, rtol=1e-4, atol=1e-5)
    if affine:
        forward = lambda w: reference(x, w, 1e-3, dout)[0]  # noqa: E731
        ref.assert_grad(dweight, ref.numerical_grad(forward, weight, ref.f64(dout)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dt", DTYPES)
def test_din_may_alias_dout_or_be_left_out(dt):
    x, dout, weight = inputs(6, 20, dt, True, seed=3)
    plain = run("cpu", x, dout, weight, 1e-6, dt)
    aliased = run("cpu", x, dout, weight, 1e-6, dt, alias=True)
    without = run("cpu", x, dout, weight, 1e-6, dt, want_din=False)
    assert ref.same_bits(raw(plain[2]), raw(aliased[2]))
    assert ref.same_bits(plain[3], aliased[3]) and ref.same_bits(plain[3], without[3])


@pytest.mark.sim
@pytest.mark.parametrize("affine", [True, False], ids=["weight", "no_weight"])
@pytest.mark.parametrize("dt", DTYPES)
def test_sim_gives_the_cpu_bits(dt, affine):
    x, dout, weight = inputs(37, 70, dt, affine, seed=4)
    cpu, sim = run("cpu", x, dout, weight, 1e-5, dt), run("sim", x, dout, weight, 1e-5, dt)
    for a, b in zip(cpu, sim):
        assert (a is None and b is None) or ref.same_bits(raw(a), raw(b))


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    so = _c_harness.build("_rmsnorm_harness.c", tmp_path_factory.mktemp("rmsnorm_harness"))
    i64, p = ctypes.c_int64, ctypes.c_void_p
    so.gt_harness_rmsnorm_forward.argtypes = [p, p, p, p, ctypes.c_int, i64, i64, ctypes.c_float, ctypes.c_int]
    so.gt_harness_rmsnorm_backward.argtypes = [p, p, p, p, p, ctypes.c_int, p, i64, i64, ctypes.c_int, ctypes.c_int]
    return so


def ptr(array):
    return ctypes.c_void_p(0 if array is None else array.ctypes.data)


@pytest.mark.parametrize("affine", [True, False], ids=["weight", "no_weight"])
@pytest.mark.parametrize("dt", DTYPES)
def test_the_cuda_kernels_arithmetic_gives_the_cpu_bits(harness, dt, affine):
    """cuda/ops_rmsnorm.cu's per-row and per-column work, run on the host, against the CPU op
    (which sums dweight over blocks of columns, and accumulates into an existing gradient)."""
    rows, cols = 45, 300
    x, dout, weight = inputs(rows, cols, dt, affine, seed=5)
    cpu = run("cpu", x, dout, weight, 1e-6, dt)
    out, rstd = np.empty_like(x), np.zeros(rows, np.float32)
    harness.gt_harness_rmsnorm_forward(ptr(out), ptr(rstd), ptr(x), ptr(weight), 0, rows, cols, 1e-6, DT_CODES[dt])
    din, dweight = np.full_like(x, np.nan), None if weight is None else np.full(cols, np.nan, np.float32)
    harness.gt_harness_rmsnorm_backward(ptr(din), ptr(dweight), ptr(dout), ptr(x), ptr(weight), 0, ptr(rstd), rows,
                                        cols, DT_CODES[dt], 0)
    for a, b in zip(cpu, (out, rstd, din, dweight)):
        assert (a is None and b is None) or ref.same_bits(raw(a), raw(b))
    if affine:
        start = np.linspace(-1, 1, cols).astype(np.float32)
        grads = [start.copy(), start.copy()]
        _C_testing.run_op("cpu", "rmsnorm_backward", [None, grads[0], raw(dout), raw(x), weight, rstd],
                          (rows, cols, dt, True))
        harness.gt_harness_rmsnorm_backward(None, ptr(grads[1]), ptr(dout), ptr(x), ptr(weight), 0, ptr(rstd), rows,
                                            cols, DT_CODES[dt], 1)
        assert ref.same_bits(grads[0], grads[1])


def test_the_layer_has_pytorchs_parameters_and_forward():
    gt.random.manual_seed(0)
    layer = nn.RMSNorm(8)
    assert list(layer.state_dict()) == ["weight"] and np.array_equal(layer.weight.data, np.ones(8, np.float32))
    assert repr(layer) == "RMSNorm((8,), eps=1e-06, elementwise_affine=True)"
    assert list(nn.RMSNorm((8,), elementwise_affine=False).state_dict()) == []
    x = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    layer.weight.data[:] = np.arange(1, 9, dtype=np.float32) / 4
    out = layer(x)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * layer.weight.data
    assert out.shape == (2, 3, 8)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_training_step_on_sim_gives_the_cpu_bits(precision):
    def trained(device):
        gt.random.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.RMSNorm(8), nn.SiLU(), nn.RMSNorm(8, elementwise_affine=False),
                              nn.Linear(8, 3))
        if device != "cpu":
            model = model.to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision=precision, gradient_checkpointing=True)
        rng = np.random.default_rng(1)
        losses = [step(rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)).loss for _ in range(3)]
        return losses, model.state_dict()

    (cpu_losses, cpu_state), (sim_losses, sim_state) = trained("cpu"), trained("sim")
    assert cpu_losses == sim_losses and cpu_losses[-1] < cpu_losses[0]
    assert all(ref.same_bits(cpu_state[k], sim_state[k]) for k in cpu_state)


@pytest.mark.parametrize("spec, error, match", [
    (("rmsnorm", 0, 1e-6, True, False, 1), ValueError, r"model spec: RMSNorm normalized_shape must be at least 1, got 0"),
    (("rmsnorm", 4, 0.0, True, False, 1), ValueError, r"model spec: RMSNorm eps must be in \(0, inf\], got 0"),
    (("rmsnorm", 4, float("nan"), True, False, 1), ValueError, r"RMSNorm eps must be in"),
    (("rmsnorm", 4.0, 1e-6, True, False, 1), TypeError, r"RMSNorm normalized_shape must be an int, not float"),
    (("rmsnorm", 4, "x", True, False, 1), TypeError, r"RMSNorm eps must be a real number, not str"),
    (("rmsnorm", 4, 1e-6), TypeError, r"RMSNorm takes 5 arguments \(normalized_shape, eps, elementwise_affine, "
                                      r"plus_one, groups\) after its kind, got 2"),
    (("activation", "swish"), ValueError,
     r"Activation function must be one of 'relu', 'gelu', 'gelu_tanh', 'tanh', 'silu'"),
    (("conv2d", 4, 6, (3, 3), (1, 1), (0, 0), (1, 1), 4, True), ValueError,
     r"Conv2d needs in_channels and out_channels divisible by groups"),
    (("pool2d", "max", (2, 2), (0, 2), (0, 0), (1, 1), False, False), ValueError, r"Pool2d stride must be at least 1"),
    (("rmsnorm2", 4), ValueError, r"unknown layer kind 'rmsnorm2'"),
])
def test_spec_errors_name_the_argument(spec, error, match):
    with pytest.raises(error, match=match):
        _C.Model([spec], 0)


def test_the_python_class_checks_its_arguments():
    with pytest.raises(ValueError, match="normalized_shape must be positive"):
        nn.RMSNorm(0)
    with pytest.raises(ValueError, match="eps: None"):
        nn.RMSNorm(4, eps=None)
    with pytest.raises(ValueError, match="eps must be positive"):
        nn.RMSNorm(4, eps=0.0)
    with pytest.raises(TypeError, match="eps must be a float"):
        nn.RMSNorm(4, eps="1e-6")


def test_a_reused_rmsnorm_shares_its_weight_and_sums_its_gradients():
    gt.random.manual_seed(0)
    norm = nn.RMSNorm(4)
    model = nn.Sequential(nn.Linear(4, 4), norm, nn.Linear(4, 4), norm, nn.Linear(4, 2))
    assert [name for name, _ in model.named_parameters()].count("1.weight") == 1
    x, y = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), np.array([0, 1, 1])
    gt.TrainStep(model, nn.CrossEntropyLoss())(x, y)
    assert np.abs(norm.weight.grad).sum() > 0
