"""The decoder-family layer kinds (issue 21): Parallel (csrc/nn/parallel.c), GatedActivation
("glu", csrc/nn/glu.c), Scale (csrc/nn/scale.c) and RMSNorm's plus_one and groups
(csrc/nn/rmsnorm.c, the op's plus_one in ops/rmsnorm_hd.h), with the ops they brought: scale and
copy_2d.

Each kind in every position of tests/test_layer_positions.py (first layer: no input gradient; in a
Residual, checkpointed or not; nested) is a training step in fp32, bf16 and fp16 whose loss and
parameter gradients match the float64 NumPy reference of tests/_mlp_reference.py; a Parallel
inside a Parallel and a Llama-like decoder block train on sim with the CPU's bits; the ops against
NumPy (the scale op to the bit: one f32 product rounded once), sim against the CPU, the RMSNorm
kernels' host harness against the CPU with plus_one; Gemma's (1 + w) arithmetic against an f32
emulation of Hugging Face's Gemma3RMSNorm; state_dict names, spec and class errors naming the
argument, and the memory plan of a step with these kinds against the allocator's peak."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import _c_harness
import _reference as ref
import gputrain as gt
from _mlp_reference import assert_gradients_match
from gputrain import _C
from gputrain import _C_testing
from gputrain import memory_plan as mp
from test_layer_positions import GRAD_TOLERANCE, POSITIONS, ROWS, WIDTH, reference_step

nn = gt.nn
DTYPES = ["f32", "f16", "bf16"]
DT_CODES = {"f32": 0, "f16": 1, "bf16": 2}


def raw(array):
    """What the op bindings take: bf16 as its uint16 bits."""
    return None if array is None else array.view(np.uint16) if array.dtype.name == "bfloat16" else array


# Every kind as a module of WIDTH -> WIDTH features, for the positions of test_layer_positions.
KINDS = {
    "parallel": lambda: nn.Parallel(nn.Linear(WIDTH, 2), nn.Sequential(nn.Linear(WIDTH, 4), nn.Tanh())),
    "parallel_one": lambda: nn.Parallel(nn.Linear(WIDTH, WIDTH)),
    "parallel_nested": lambda: nn.Parallel(nn.Parallel(nn.Linear(WIDTH, 1), nn.Linear(WIDTH, 2, bias=False)),
                                           nn.Linear(WIDTH, 3)),
    "parallel_of_residuals": lambda: nn.Sequential(
        nn.Parallel(nn.Residual(nn.Linear(WIDTH, WIDTH), nn.SiLU()), nn.Sequential(nn.Tanh(), nn.Dropout(0.3))),
        nn.Linear(2 * WIDTH, WIDTH)),
    "glu_silu": lambda: nn.Sequential(nn.Parallel(nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)),
                                      nn.GatedActivation("silu")),
    "glu_gelu_tanh": lambda: nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GatedActivation("gelu_tanh")),
    "glu_gelu": lambda: nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GatedActivation("gelu")),
    "glu_relu": lambda: nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GatedActivation("relu")),
    "scale": lambda: nn.Scale(2.449489742783178),
    "scale_negative": lambda: nn.Scale(-0.3),
    "rmsnorm_plus_one": lambda: nn.RMSNorm(WIDTH, plus_one=True),
    "rmsnorm_groups": lambda: nn.RMSNorm(3, groups=2),
    "rmsnorm_groups_plus_one": lambda: nn.RMSNorm(2, 1e-5, plus_one=True, groups=3),
    "rmsnorm_groups_no_weight": lambda: nn.RMSNorm(2, elementwise_affine=False, groups=3),
}
POSITION_NAMES = [p for p in POSITIONS if not p.endswith("_3d")]
CASES = [(k, p) for k in KINDS for p in POSITION_NAMES]


def perturbed(model: nn.Module, seed: int) -> nn.Module:
    """Weights that are not their init (an RMSNorm's 1, or plus_one's 0, would hide a weight)."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        if p.data.ndim == 1:
            p.data[:] += (0.3 * rng.standard_normal(p.data.shape)).astype(np.float32)
    return model


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind, position", CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_training_step_gradients_in_every_position(kind, position, precision, checkpointing):
    gt.random.manual_seed(0)
    model = perturbed(POSITIONS[position](KINDS[kind]()), 2)
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((ROWS, WIDTH)).astype(np.float32), rng.integers(0, WIDTH, ROWS)
    loss, expected = reference_step(model, x, y)
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision, gradient_checkpointing=checkpointing)(x, y)
    tolerance = GRAD_TOLERANCE[precision]
    assert out.loss == pytest.approx(loss, rel=tolerance, abs=tolerance)
    # A gradient that is a sum with cancellation (the bias of a one-column child: 0.004 from terms
    # of 0.03) is judged by the absolute error of its half-precision terms, not relative to itself.
    allowance = 1e-6 if precision == "fp32" else 1e-2 * tolerance
    checked = assert_gradients_match(model, lambda module, name: expected[(id(module), name)], tolerance, allowance)
    assert checked == len(expected) and checked == len(list(model.parameters()))


def decoder_block(gemma: bool) -> nn.Module:
    """A Llama (or Gemma-like) block without attention: the specs of DECODER_CONTRACT.md's MLP
    half and a q | k | v Parallel with QK-norm, in 3-D (B, T, E)."""
    e, heads, kv, d, inter = 8, 2, 1, 4, 12
    act = "gelu_tanh" if gemma else "silu"
    return nn.Sequential(
        nn.Scale(8 ** 0.5) if gemma else nn.Tanh(),
        nn.Residual(
            nn.RMSNorm(e, plus_one=gemma),
            nn.Parallel(nn.Sequential(nn.Linear(e, heads * d, bias=False), nn.RMSNorm(d, plus_one=gemma, groups=heads)),
                        nn.Sequential(nn.Linear(e, kv * d, bias=False), nn.RMSNorm(d, plus_one=gemma, groups=kv)),
                        nn.Linear(e, kv * d, bias=False)),
            nn.Linear((heads + 2 * kv) * d, e, bias=False)),
        nn.Residual(
            nn.RMSNorm(e, plus_one=gemma),
            nn.Parallel(nn.Linear(e, inter, bias=False), nn.Linear(e, inter, bias=False)),
            nn.GatedActivation(act),
            nn.Linear(inter, e, bias=False)),
        nn.RMSNorm(e, plus_one=gemma),
        nn.Scale(1 / 30.0), nn.Tanh(), nn.Scale(30.0),
        nn.Linear(e, 5))


def block_batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2, 3, 8)).astype(np.float32), rng.integers(0, 5, (2, 3))


@pytest.mark.sim
@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("gemma", [False, True], ids=["llama", "gemma"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_decoder_block_trains_on_sim_with_the_cpu_bits(precision, gemma, checkpointing):
    def trained(device):
        gt.random.manual_seed(0)
        model = perturbed(decoder_block(gemma), 3)
        if device != "cpu":
            model = model.to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision=precision, gradient_checkpointing=checkpointing)
        losses = []
        for s in range(3):
            x, y = block_batch(s)
            losses.append(step(x.reshape(6, 8), y.reshape(6)).loss)
        return losses, model.state_dict()

    (cpu_losses, cpu_state), (sim_losses, sim_state) = trained("cpu"), trained("sim")
    assert cpu_losses == sim_losses and np.isfinite(cpu_losses).all()
    assert all(ref.same_bits(cpu_state[k], sim_state[k]) for k in cpu_state)


def test_a_decoder_block_in_3d_matches_the_reference():
    gt.random.manual_seed(0)
    model = perturbed(decoder_block(True), 3)
    x, _ = block_batch(0)
    from _mlp_reference import layer_forward, params_of
    want, _ = layer_forward(model, x.astype(np.float64), params_of(model))
    got = model(x)
    assert got.shape == (2, 3, 5)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_parallel_children_are_named_as_a_sequentials():
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Parallel(nn.Linear(4, 1), nn.Sequential(nn.Linear(4, 3, bias=False), nn.RMSNorm(3)),
                                      nn.Tanh()),
                          nn.RMSNorm(4, plus_one=True, groups=2), nn.GatedActivation(), nn.Scale(3.0))
    assert list(model.state_dict()) == ["0.0.weight", "0.0.bias", "0.1.0.weight", "0.1.1.weight", "1.weight"]
    assert [name for name, _ in model[0].named_children()] == ["0", "1", "2"]
    assert len(model[0]) == 3 and isinstance(model[0][1], nn.Sequential)
    assert np.array_equal(model.state_dict()["1.weight"], np.zeros(4, np.float32))  # Gemma's init
    assert np.array_equal(model.state_dict()["0.1.1.weight"], np.ones(3, np.float32))
    x = np.ones((2, 4), np.float32)
    assert model(x).shape == (2, 4)
    assert "Parallel(" in repr(model) and "GatedActivation('silu')" in repr(model) and "Scale(3.0)" in repr(model)
    assert "plus_one=True, groups=2" in repr(model)


def test_a_parallel_of_embeddings_reads_the_models_ids():
    gt.random.manual_seed(0)
    first, second = nn.Embedding(7, 3), nn.Embedding(7, 2)
    model = nn.Sequential(nn.Parallel(first, second), nn.Linear(5, 4))
    ids = np.array([1, 2, 6, 0])
    gt.TrainStep(model, nn.CrossEntropyLoss())(ids, np.array([0, 1, 2, 3]))
    assert np.abs(first.weight.grad).sum() > 0 and np.abs(second.weight.grad).sum() > 0
    want = np.concatenate([first.weight.data[ids], second.weight.data[ids]], -1) @ model[1].weight.data.T
    np.testing.assert_allclose(model(ids), want + model[1].bias.data, rtol=1e-6, atol=1e-6)


def test_parallel_input_gradient_is_the_sum_in_child_order():
    """din = (g0 + g1) + g2, each add rounded to the activation dtype. Children Scale(1024),
    Scale(-1024), Scale(1 / 64) under equal column blocks of the next Linear get the same dout
    slice d, so g0 + g1 = 0 exactly and din = d / 64; summed the other way, d / 64 would vanish
    next to -1024 d in bf16 and f16 (2^16 apart) and din would be 0."""
    factors = [1024.0, -1024.0, 1 / 64]
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    targets = np.array([0, 1, 1, 0])
    for precision in ("fp32", "fp16", "bf16"):
        gt.random.manual_seed(0)
        first = nn.Linear(3, 3)
        model = nn.Sequential(first, nn.Parallel(*(nn.Scale(f) for f in factors)), nn.Linear(9, 2))
        list(model.parameters())
        w = model[2].weight.data
        w[:, 3:6] = w[:, 0:3]
        w[:, 6:9] = w[:, 0:3]
        gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision)(x, targets)
        h = x @ first.weight.data.T.astype(np.float64) + first.bias.data
        wb = w[:, 0:3].astype(np.float64)
        logits = (h * sum(factors)) @ wb.T + model[2].bias.data
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        din = ((p - np.eye(2)[targets]) / 4) @ wb * sum(factors)
        # fp32: below AVX-512 the GEMM computes the three equal column blocks' d through
        # different edge kernels, so g0 + g1 keeps ~ulp(1024 d) (6.5e-5 relative under qemu
        # Haswell); the half precisions are the order's real check (reversed, din is 0 there)
        tol = max(GRAD_TOLERANCE[precision], 1e-3)
        assert np.abs(first.bias.grad).min() > 0
        np.testing.assert_allclose(first.bias.grad, din.sum(0), rtol=tol, atol=tol * np.abs(din).max())


# ---- the ops --------------------------------------------------------------------------------

def scale_want(x, factor, dt):
    """dt(f32(x) * f32(dt(f32(factor)))): one f32 product, rounded once."""
    f = np.float32(ref.to_dtype(np.array([np.float32(factor)]), dt).astype(np.float32)[0])
    return ref.to_dtype(x.astype(np.float32) * f, dt)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=pytest.mark.sim)])
def test_the_scale_op_is_one_rounded_product(backend, dt):
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 5000):
        x = ref.to_dtype(rng.standard_normal(n) * 3, dt)
        for factor in (8 ** 0.5, -1 / 30.0, 30.0):
            f = float(ref.to_dtype(np.array([np.float32(factor)]), dt).astype(np.float32)[0])
            out = np.full_like(x, np.nan)
            _C_testing.run_op(backend, "scale", [raw(out), raw(x)], (n, f, dt))
            assert ref.same_bits(raw(out), raw(scale_want(x, factor, dt)))
            if backend == "cpu":  # out may alias in (run_op gives sim a device copy of each array)
                aliased = x.copy()
                _C_testing.run_op(backend, "scale", [raw(aliased), raw(aliased)], (n, f, dt))
                assert ref.same_bits(raw(aliased), raw(out))
    with pytest.raises(ValueError, match="factor: must be finite" if backend == "cpu" else None):
        # (sim reports an op's failure on its stream's thread: the message stays there)
        _C_testing.run_op(backend, "scale", [np.zeros(2, np.float32), np.zeros(2, np.float32)],
                          (2, float("inf"), "f32"))


@pytest.mark.parametrize("precision, dt", [("fp32", "f32"), ("bf16", "bf16"), ("fp16", "f16")])
def test_the_scale_layer_rounds_its_factor_to_the_activation_dtype(precision, dt):
    """Hugging Face's Gemma: hidden * torch.tensor(sqrt(E), dtype=x.dtype) (sqrt(8) is 2.828125 in
    bf16): the model's output is dt(dt(x) * dt(factor)), not the product with the exact factor."""
    x = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    model = nn.Sequential(nn.Scale(8 ** 0.5))
    gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision)(x, np.arange(64) % 8)  # compiles in dt
    got = model(x)
    want = scale_want(ref.to_dtype(x, dt), 8 ** 0.5, dt).astype(np.float32)
    assert ref.same_bits(got, want)
    if dt == "bf16":
        assert float(ref.to_dtype(np.array([8 ** 0.5]), "bf16").astype(np.float32)[0]) == 2.828125
        exact = ref.to_dtype(ref.to_dtype(x, dt).astype(np.float32) * np.float32(8 ** 0.5), dt).astype(np.float32)
        assert not ref.same_bits(got, exact)


@pytest.mark.sim
@pytest.mark.parametrize("dt", DTYPES)
def test_copy_2d_and_the_parallel_layer_on_sim_give_the_cpu_bits(dt):
    precision = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[dt]
    x = np.random.default_rng(3).standard_normal((5, 6)).astype(np.float32)

    def out(device):
        gt.random.manual_seed(0)
        model = nn.Sequential(nn.Parallel(nn.Linear(6, 3), nn.Parallel(nn.Linear(6, 1), nn.Tanh()), nn.Scale(0.5)),
                              nn.Linear(16, 2))
        if device != "cpu":
            model = model.to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision)
        loss = step(x, np.array([0, 1, 1, 0, 1])).loss
        return loss, {k: np.asarray(v) for k, v in model.state_dict().items()}, \
            {n: p.grad.copy() for n, p in model.named_parameters()}

    cpu, sim = out("cpu"), out("sim:0")
    assert cpu[0] == sim[0]
    assert all(ref.same_bits(cpu[2][k], sim[2][k]) for k in cpu[2])


# ---- RMSNorm's plus_one in the op --------------------------------------------------------------

def rms_inputs(rows, cols, dt, seed=0):
    rng = np.random.default_rng(seed)
    x = ref.to_dtype(rng.standard_normal((rows, cols)) * 3 + 0.5, dt)
    dout = ref.to_dtype(rng.standard_normal((rows, cols)), dt)
    weight = (0.3 * rng.standard_normal(cols)).astype(np.float32)
    return x, dout, weight


def rms_run(backend, x, dout, weight, plus_one, dt, eps=1e-6):
    rows, cols = x.shape
    out, rstd = np.empty_like(x), np.zeros(rows, np.float32)
    _C_testing.run_op(backend, "rmsnorm_forward", [raw(out), rstd, raw(x), weight], (rows, cols, eps, dt, plus_one))
    din, dweight = np.full_like(x, np.nan), np.full(cols, np.nan, np.float32)
    _C_testing.run_op(backend, "rmsnorm_backward", [raw(din), dweight, raw(dout), raw(x), weight, rstd],
              (rows, cols, dt, False, plus_one))
    return out, rstd, din, dweight


@pytest.mark.parametrize("dt", DTYPES)
def test_plus_one_is_the_op_with_weight_one_plus_w(dt):
    """The op with plus_one and w gives the bits of the op with the f32 weight 1 + w (Gemma's
    (1.0 + weight.float())), its dweight included (d(1 + w)/dw = 1)."""
    x, dout, weight = rms_inputs(9, 20, dt)
    with_flag = rms_run("cpu", x, dout, weight, True, dt)
    shifted = rms_run("cpu", x, dout, (np.float32(1) + weight).astype(np.float32), False, dt)
    for a, b in zip(with_flag, shifted):
        assert ref.same_bits(raw(a), raw(b))
    plain = rms_run("cpu", x, dout, weight, False, dt)
    assert not ref.same_bits(raw(plain[0]), raw(with_flag[0]))


@pytest.mark.parametrize("dt", ["bf16", "f16"])
def test_plus_one_matches_hugging_faces_gemma_rmsnorm_arithmetic(dt):
    """Gemma3RMSNorm: out = (x.float() * rsqrt(mean(x^2) + eps) * (1 + w.float())).type_as(x), in
    f32 (NumPy float32 here; the op's rstd comes from a double sum, so a last-bit difference of
    rstd may move an output by one unit of the half format)."""
    x, _, weight = rms_inputs(16, 64, dt, seed=7)
    out = rms_run("cpu", x, x, weight, True, dt)[0]
    x32 = x.astype(np.float32)
    rstd = np.float32(1) / np.sqrt((x32 * x32).mean(-1, keepdims=True, dtype=np.float32) + np.float32(1e-6))
    want = ref.to_dtype((x32 * rstd) * (np.float32(1) + weight), dt)
    units = np.abs(out.astype(np.float32) - want.astype(np.float32)) / np.maximum(
        np.abs(want.astype(np.float32)), 1e-3) / (2.0 ** -7 if dt == "bf16" else 2.0 ** -10)
    assert (out.astype(np.float32) == want.astype(np.float32)).mean() > 0.95
    assert units.max() <= 1.0


@pytest.mark.sim
@pytest.mark.parametrize("dt", DTYPES)
def test_plus_one_on_sim_gives_the_cpu_bits(dt):
    x, dout, weight = rms_inputs(37, 70, dt, seed=4)
    for a, b in zip(rms_run("cpu", x, dout, weight, True, dt), rms_run("sim", x, dout, weight, True, dt)):
        assert ref.same_bits(raw(a), raw(b))


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    so = _c_harness.build("_rmsnorm_harness.c", tmp_path_factory.mktemp("rmsnorm_harness_plus_one"))
    i64, p, i32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    so.gt_harness_rmsnorm_forward.argtypes = [p, p, p, p, i32, i64, i64, ctypes.c_float, i32]
    so.gt_harness_rmsnorm_backward.argtypes = [p, p, p, p, p, i32, p, i64, i64, i32, i32]
    return so


def ptr(array):
    return ctypes.c_void_p(0 if array is None else array.ctypes.data)


@pytest.mark.parametrize("dt", DTYPES)
def test_the_cuda_kernels_arithmetic_with_plus_one_gives_the_cpu_bits(harness, dt):
    rows, cols = 45, 300
    x, dout, weight = rms_inputs(rows, cols, dt, seed=5)
    cpu = rms_run("cpu", x, dout, weight, True, dt)
    out, rstd = np.empty_like(x), np.zeros(rows, np.float32)
    harness.gt_harness_rmsnorm_forward(ptr(out), ptr(rstd), ptr(x), ptr(weight), 1, rows, cols, 1e-6, DT_CODES[dt])
    din, dweight = np.full_like(x, np.nan), np.full(cols, np.nan, np.float32)
    harness.gt_harness_rmsnorm_backward(ptr(din), ptr(dweight), ptr(dout), ptr(x), ptr(weight), 1, ptr(rstd), rows,
                                        cols, DT_CODES[dt], 0)
    for a, b in zip(cpu, (out, rstd, din, dweight)):
        assert ref.same_bits(raw(a), raw(b))


# ---- errors --------------------------------------------------------------------------------

@pytest.mark.parametrize("spec, error, match", [
    (("rmsnorm", 4, 1e-6, True, False, 0), ValueError, r"model spec: RMSNorm groups must be at least 1, got 0"),
    (("rmsnorm", 4, 1e-6, True, False, 2.0), TypeError, r"RMSNorm groups must be an int, not float"),
    (("rmsnorm", 2**40, 1e-6, True, False, 2**40), ValueError,
     r"RMSNorm groups \* normalized_shape must fit an int64"),
    (("parallel", []), ValueError, r"model spec: Parallel needs at least one module"),
    (("parallel", [("linear", 2, 2, True)], 1), TypeError, r"Parallel takes 1 argument \(modules\) after its kind"),
    (("glu", "swish"), ValueError,
     r"GatedActivation activation must be one of 'relu', 'gelu', 'gelu_tanh', 'tanh', 'silu'"),
    (("glu", 1), TypeError, r"GatedActivation activation must be a str"),
    (("scale", 0.0), ValueError, r"model spec: Scale factor must be nonzero"),
    (("scale", float("inf")), ValueError, r"Scale factor must be in"),
    (("scale", float("nan")), ValueError, r"Scale factor must be in"),
    (("scale", "2"), TypeError, r"Scale factor must be a real number, not str"),
])
def test_spec_errors_name_the_argument(spec, error, match):
    with pytest.raises(error, match=match):
        _C.Model([spec], 0)


def test_the_classes_check_their_arguments():
    with pytest.raises(ValueError, match="modules: Parallel needs at least one module"):
        nn.Parallel()
    with pytest.raises(TypeError, match="module 1 must be a gputrain.nn.Module"):
        nn.Parallel(nn.Tanh(), "linear")
    with pytest.raises(ValueError, match="activation must be one of 'silu', 'gelu_tanh'"):
        nn.GatedActivation("swish")
    with pytest.raises(TypeError, match="activation must be a str"):
        nn.GatedActivation(None)
    for bad, error in ((0.0, ValueError), (float("nan"), ValueError), (float("-inf"), ValueError),
                       ("2", TypeError), (True, TypeError)):
        with pytest.raises(error, match="factor must be"):
            nn.Scale(bad)
    with pytest.raises(ValueError, match="groups must be positive"):
        nn.RMSNorm(4, groups=0)
    with pytest.raises(TypeError, match="groups must be an int"):
        nn.RMSNorm(4, groups=2.0)
    with pytest.raises(TypeError):
        nn.RMSNorm(4, 1e-6, True, True)  # plus_one and groups are keyword-only


@pytest.mark.parametrize("model, x, match", [
    (lambda: nn.Sequential(nn.Parallel(nn.Linear(4, 2), nn.Flatten())), np.ones((2, 3, 4), np.float32),
     r"child 1 of the Parallel '0' gives outputs of leading dimensions \(2\), child 0 \(2 x 3\)"),
    (lambda: nn.Sequential(nn.Linear(4, 5), nn.GatedActivation()), np.ones((2, 4), np.float32),
     r"layer '1' \(GatedActivation\('silu'\)\) takes \(\.\.\., 2 \* intermediate\) inputs .* last dimension of 5"),
    (lambda: nn.Sequential(nn.Linear(4, 6), nn.RMSNorm(4, groups=2)), np.ones((2, 4), np.float32),
     r"layer '1' \(RMSNorm\(4, groups=2\)\) expects 8 input features, but the layer before it gives 6"),
])
def test_shapes_a_kind_cannot_take_are_refused_naming_it(model, x, match):
    with pytest.raises(ValueError, match=match):
        model()(x)


def test_a_module_used_twice_in_one_parallel_is_refused():
    shared = nn.Linear(4, 2)
    model = nn.Sequential(nn.Parallel(shared, nn.Sequential(nn.Tanh(), shared)))
    with pytest.raises(ValueError, match=r"children 0 and 1 of the Parallel '0' use the same parameters"):
        model(np.ones((2, 4), np.float32))
    outside = nn.Linear(4, 4)  # a module used in a child and outside the Parallel is fine
    ok = nn.Sequential(outside, nn.Parallel(outside, nn.Linear(4, 4)), nn.Linear(8, 4))
    assert ok(np.ones((2, 4), np.float32)).shape == (2, 4)


def test_a_scale_factor_that_the_half_format_cannot_hold_is_refused():
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 2), nn.Scale(1e6), nn.Linear(2, 2))
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), precision="fp16")
    with pytest.raises(ValueError, match=r"Scale\(1e\+06\).*factor 1e\+06 becomes inf in f16"):
        step(np.ones((2, 2), np.float32), np.array([0, 1]))


# ---- memory ----------------------------------------------------------------------------------

@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_a_steps_plan_with_these_kinds_is_its_peak(checkpointing):
    """tests/test_memory_plan.py's check: the plan of the step is the growth of each pool's peak,
    to the byte, for a model of Parallels (nested, in a Residual), gates, scales and group norms."""
    import gc
    x, y = block_batch(0)
    x, y = x.reshape(6, 8), y.reshape(6)
    kinds = ("cpu", "pinned")
    gc.collect()
    gc.disable()
    try:
        base = {k: gt.memory_stats(k)["reserved_bytes"] for k in kinds}
        gt.random.manual_seed(0)
        m = nn.Sequential(decoder_block(True), nn.Parallel(nn.Parallel(nn.Linear(5, 3), nn.Tanh()), nn.Linear(5, 2)),
                          nn.Linear(10, 5))
        for k in kinds:
            gt.reset_peak_memory_stats(k)
        step = gt.TrainStep(m, nn.CrossEntropyLoss(), gt.optim.AdamW(m.parameters()), precision="bf16",
                            micro_batches=2, gradient_checkpointing=checkpointing)
        plan = mp.plan_step(step, x)
        step(x, y)
        growth = {k: gt.memory_stats(k)["peak_reserved_bytes"] - base[k] for k in kinds}
    finally:
        gc.enable()
    assert growth == {k: plan.total(k) for k in kinds}, str(plan)


@pytest.mark.sim
@pytest.mark.parametrize("config", [{"bf16": True}, {"fp16": True, "gradient_checkpointing": True}],
                         ids=["bf16", "fp16 checkpointed"])
def test_a_sim_device_run_with_these_kinds_peaks_at_the_plan(tmp_path, config):
    """tests/test_memory_plan.py's sim check: the device pool's peak is the Trainer's plan."""
    import gc
    x, y = block_batch(0)
    x, y = np.repeat(x.reshape(6, 8), 3, 0), np.repeat(y.reshape(6), 3, 0)
    gt.random.manual_seed(0)
    m = nn.Sequential(decoder_block(True), nn.Parallel(nn.Parallel(nn.Linear(5, 3), nn.Tanh()), nn.Linear(5, 2)),
                      nn.Linear(10, 5)).to("sim")
    gc.collect()
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=6, learning_rate=1e-2,
                                save_strategy="no", logging_steps=50, disable_tqdm=True, seed=3, device="sim",
                                max_steps=1, **config)
    gt.reset_peak_memory_stats("sim:0")
    trainer = gt.Trainer(m, args, train_dataset=(x, y))
    plan = trainer.memory_plan()
    trainer.train()
    assert trainer.state.global_step == 1
    assert gt.memory_stats("sim:0")["peak_reserved_bytes"] == plan.total("sim:0"), str(plan)


def test_the_scratch_holds_the_gradient_of_a_flattened_model_input():
    """Flatten(model input) -> Linear: the Linear's input gradient has the input's size and goes
    to a scratch buffer, which was sized by the activations alone (64 B here, for 48 KiB: the
    step wrote past the arena and the process crashed at exit). Also a Parallel reading it."""
    code = """if True:
        import numpy as np, gputrain as gt
        nn = gt.nn
        x = np.random.default_rng(0).standard_normal((4, 3, 1024)).astype(np.float32)
        for second in (lambda: nn.Linear(3072, 2), lambda: nn.Parallel(nn.Linear(3072, 1), nn.Linear(3072, 1))):
            m = nn.Sequential(nn.Flatten(), second())
            plan = m.compiled.plan((4, 3, 1024))
            assert plan["backward_scratch"] >= 2 * 4 * 3072 * 4, plan
            assert np.isfinite(gt.TrainStep(m, nn.CrossEntropyLoss())(x, np.array([0, 1, 0, 1])).loss)
        print("ok")
    """
    import os
    import subprocess
    import sys
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(gt.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([package_dir, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", f"exit {result.returncode}: {result.stderr[-2000:]}"
