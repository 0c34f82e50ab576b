"""BatchNorm2d, MaxPool2d, AvgPool2d and AdaptiveAvgPool2d as C layers: training steps whose loss and
gradients (the input gradient through a Linear before the layer) match the float64 NumPy reference
of tests/_cnn_reference.py (itself checked by finite differences) in fp32/bf16/fp16, plain and
checkpointed, in every position; running statistics over several steps and micro-batches against
NumPy, train/eval, buffers in state_dict/named_buffers/pickle/.to('sim'), the simulated device
bit-identical to the CPU, any thread count the same bits, and clear errors."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import _cnn_reference as cref
import gputrain as gt
from _mlp_reference import assert_gradients_match, cross_entropy, layer_backward, layer_forward, params_of
from gputrain import _C_testing
from gputrain.optim import SGD

nn = gt.nn

N, C, H, W = 3, 2, 7, 5  # odd sizes: vector tails, partial windows

LAYERS = {
    "bn": lambda: nn.BatchNorm2d(C),
    "bn_no_affine": lambda: nn.BatchNorm2d(C, affine=False),
    "bn_cumulative": lambda: nn.BatchNorm2d(C, momentum=None, eps=1e-3),
    "bn_untracked": lambda: nn.BatchNorm2d(C, track_running_stats=False),
    "max2": lambda: nn.MaxPool2d(2),
    "max3_s2_p1": lambda: nn.MaxPool2d(3, stride=2, padding=1),
    "max_dil_ceil": lambda: nn.MaxPool2d((2, 3), stride=(1, 2), padding=(1, 0), dilation=(2, 1), ceil_mode=True),
    "max3_ceil": lambda: nn.MaxPool2d(3, stride=2, ceil_mode=True),
    "avg2": lambda: nn.AvgPool2d(2),
    "avg3_s2_p1": lambda: nn.AvgPool2d(3, stride=2, padding=1),
    "avg_no_pad_count": lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
    "avg_ceil": lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True),
    "avg_rect_ceil": lambda: nn.AvgPool2d((3, 2), stride=(2, 1), ceil_mode=True, count_include_pad=False),
    "adaptive1": lambda: nn.AdaptiveAvgPool2d(1),
    "adaptive3x2": lambda: nn.AdaptiveAvgPool2d((3, 2)),
    "adaptive_overlap": lambda: nn.AdaptiveAvgPool2d((4, 4)),
}
#: layers that keep the (N, C, H, W) shape, for Residual blocks
SAME_SHAPE = {
    "bn": lambda: nn.BatchNorm2d(C),
    "max3_s1_p1": lambda: nn.MaxPool2d(3, stride=1, padding=1),
    "avg3_s1_p1": lambda: nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
    "adaptive_same": lambda: nn.AdaptiveAvgPool2d((H, W)),
}

GRAD_TOLERANCE = {"fp32": 2e-5, "fp16": 1e-2, "bf16": 6e-2}
#: Absolute allowance of a gradient that is zero in exact arithmetic (a BatchNorm2d's bias gradient
#: under softmax: its rows sum to zero), which rounding makes small but not zero.
ZERO_ALLOWANCE = {"fp32": 1e-6, "fp16": 2e-4, "bf16": 2e-3}
CLASSES = 4


def out_features(layer, shape=(N, C, H, W)) -> int:
    if isinstance(layer, nn.BatchNorm2d):
        return int(np.prod(shape[1:]))
    out, _ = cref.layer_forward(layer, np.zeros(shape), {})
    return int(np.prod(out.shape[1:]))


POSITIONS = {
    # the layer's input gradient reaches the first Linear's weight gradient
    "middle": lambda make: (lambda layer: nn.Sequential(nn.Linear(W, W), layer, nn.Flatten(),
                                                        nn.Linear(out_features(layer), CLASSES)))(make()),
    "first": lambda make: (lambda layer: nn.Sequential(layer, nn.Flatten(),
                                                       nn.Linear(out_features(layer), CLASSES)))(make()),
    "last": lambda make: nn.Sequential(nn.Linear(W, W), nn.Tanh(), make()),
}
RESIDUAL_POSITIONS = {
    "in_residual": lambda make: nn.Sequential(nn.Linear(W, W), nn.Residual(make(), nn.Tanh()), nn.Flatten(),
                                              nn.Linear(C * H * W, CLASSES)),
    "residual_first": lambda make: nn.Sequential(nn.Residual(nn.Tanh(), make()), nn.Flatten(),
                                                 nn.Linear(C * H * W, CLASSES)),
}


def batch(model, shape=(N, C, H, W), seed=1):
    """x, and class labels for every output row, shaped (N, rows per sample) as the step splits them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    out = _output_shape(model, shape)
    classes = min(CLASSES, out[-1])
    return x, rng.integers(0, classes, int(np.prod(out[:-1]))).reshape(shape[0], -1)


def _output_shape(model, shape):
    params = params_of(model)
    training = model.training
    out, _ = layer_forward(model, np.zeros(shape), params)
    model.train(training)
    return out.shape


def reference_step(model, x, y):
    params = params_of(model)
    logits, cache = layer_forward(model, x.astype(np.float64), params)
    flat = logits.reshape(-1, logits.shape[-1])
    loss, dflat = cross_entropy(flat, np.asarray(y).reshape(-1))
    grads: dict = {}
    layer_backward(model, dflat.reshape(logits.shape), cache, params, grads)
    return loss, grads


def check_step(model, x, y, precision="fp32", checkpointing=False, micro=1):
    loss, expected = reference_step(model, x, y)
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision,
                       gradient_checkpointing=checkpointing)(x, y)
    tolerance = GRAD_TOLERANCE[precision]
    assert out.loss == pytest.approx(loss, rel=tolerance, abs=tolerance)
    checked = assert_gradients_match(model, lambda module, name: expected[id(module)][name], tolerance,
                                     ZERO_ALLOWANCE[precision])
    assert checked == len(list(model.parameters()))


def test_reference_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, 5, 4))
    for make in (LAYERS["bn"], LAYERS["max3_s2_p1"], LAYERS["avg_ceil"], LAYERS["avg_no_pad_count"],
                 LAYERS["adaptive_overlap"], LAYERS["max_dil_ceil"]):
        layer = make()
        params = {id(layer): {"weight": rng.standard_normal(2), "bias": rng.standard_normal(2)}} \
            if isinstance(layer, nn.BatchNorm2d) else {}
        out, _ = cref.layer_forward(layer, x, params)
        dy = rng.standard_normal(out.shape)
        _, cache = cref.layer_forward(layer, x, params)
        dx = cref.layer_backward(layer, dy, cache, params, {})
        numeric = cref.finite_difference(lambda v: float((cref.layer_forward(layer, v, params)[0] * dy).sum()), x.copy())
        np.testing.assert_allclose(dx, numeric, rtol=1e-5, atol=1e-6)


CASES = [(k, p) for k in LAYERS for p in POSITIONS] + [(k, p) for k in SAME_SHAPE for p in RESIDUAL_POSITIONS]


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("kind, position", CASES, ids=[f"{k}-{p}" for k, p in CASES])
def test_training_step_gradients_match_the_float64_reference(kind, position, precision, checkpointing):
    gt.random.manual_seed(0)
    make = LAYERS.get(kind) or SAME_SHAPE[kind]
    model = {**POSITIONS, **RESIDUAL_POSITIONS}[position](make)
    x, y = batch(model)
    if precision != "fp32" and "max" in kind:  # ties after rounding would move the argmax: spread the values
        x = (np.arange(x.size).reshape(x.shape) % 97 / 8.0 - 6.0).astype(np.float32)
        x = np.random.default_rng(2).permutation(x.reshape(-1)).reshape(x.shape)
    check_step(model, x, y, precision, checkpointing)


@pytest.mark.parametrize("shape", [(1, 1, 3, 3), (1, 3, 4, 6), (5, 1, 2, 3)], ids=["N1C1", "N1", "C1"])
@pytest.mark.parametrize("kind", ["bn", "max3_s2_p1", "avg_ceil", "adaptive1", "adaptive_overlap"])
def test_small_batches_and_single_channels(kind, shape):
    gt.random.manual_seed(0)
    n, c, h, w = shape
    layer = LAYERS[kind]() if kind != "bn" else nn.BatchNorm2d(c)
    if isinstance(layer, nn.BatchNorm2d):
        features = c * h * w
    else:
        out, _ = cref.layer_forward(layer, np.zeros(shape), {})
        features = int(np.prod(out.shape[1:]))
    model = nn.Sequential(nn.Linear(w, w), layer, nn.Flatten(), nn.Linear(features, CLASSES))
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    check_step(model, x, rng.integers(0, CLASSES, n))


def bn_model(momentum=0.1, seed=0):
    gt.random.manual_seed(seed)
    return nn.Sequential(nn.BatchNorm2d(C, momentum=momentum), nn.Flatten(), nn.Linear(C * H * W, CLASSES))


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("momentum", [0.1, None, 0.0, 1.0])
def test_running_statistics_follow_numpy_over_steps_and_micro_batches(momentum, checkpointing):
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Residual(nn.BatchNorm2d(C, momentum=momentum), nn.Tanh()), nn.Flatten(),
                          nn.Linear(C * H * W, CLASSES))
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), SGD(model.parameters(), lr=0.1),
                        micro_batches=2, gradient_checkpointing=checkpointing)
    mean, var, count = np.zeros(C), np.ones(C), 0
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = (rng.standard_normal((4, C, H, W)) * 3 + 1).astype(np.float32)
        step(x, rng.integers(0, CLASSES, 4))
        for micro in (x[:2], x[2:]):  # one update per micro-batch, none in the recompute
            mean, var, count = cref.running_update(micro.astype(np.float64), mean, var, count, momentum)
    bn = model[0].block[0]
    np.testing.assert_allclose(bn.running_mean, mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var, var, rtol=1e-5, atol=1e-6)
    assert int(bn.num_batches_tracked) == count == 6


def test_eval_normalises_with_the_running_statistics_and_changes_nothing():
    model = bn_model()
    rng = np.random.default_rng(1)
    for _ in range(2):
        model(rng.standard_normal((N, C, H, W)).astype(np.float32) * 2)  # a train-mode forward updates them
    assert int(model[0].num_batches_tracked) == 2
    model.eval()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    out = model(x)
    params = params_of(model)
    expected, _ = layer_forward(model, x.astype(np.float64), params)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    for key, value in model.state_dict().items():
        assert np.array_equal(value, before[key]), key
    model.train()
    train_out = model(x)
    assert not np.allclose(train_out, out)  # batch statistics differ from the running ones


def test_a_training_step_in_eval_mode_uses_running_statistics():
    model = bn_model()
    model(np.random.default_rng(2).standard_normal((N, C, H, W)).astype(np.float32) + 3)
    model.eval()
    x, y = np.random.default_rng(4).standard_normal((N, C, H, W)).astype(np.float32), np.array([0, 1, 2])
    check_step(model, x, y)
    assert int(model[0].num_batches_tracked) == 1


def test_state_dict_names_order_and_round_trip():
    model = nn.Sequential(nn.Linear(W, W), nn.BatchNorm2d(C), nn.MaxPool2d(2), nn.BatchNorm2d(C, affine=False),
                          nn.BatchNorm2d(C, track_running_stats=False), nn.Flatten(), nn.Linear(C * 3 * 2, CLASSES))
    rng = np.random.default_rng(0)
    for _ in range(3):
        model(rng.standard_normal((N, C, H, W)).astype(np.float32))
    state = model.state_dict()
    assert list(state) == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                           "1.num_batches_tracked", "3.running_mean", "3.running_var", "3.num_batches_tracked",
                           "4.weight", "4.bias", "6.weight", "6.bias"]
    assert state["1.num_batches_tracked"].dtype == np.int64 and state["1.num_batches_tracked"].shape == ()
    assert int(state["1.num_batches_tracked"]) == 3
    assert [name for name, _ in model.named_buffers()] == ["1.running_mean", "1.running_var", "1.num_batches_tracked",
                                                           "3.running_mean", "3.running_var", "3.num_batches_tracked"]
    other = nn.Sequential(nn.Linear(W, W), nn.BatchNorm2d(C), nn.MaxPool2d(2), nn.BatchNorm2d(C, affine=False),
                          nn.BatchNorm2d(C, track_running_stats=False), nn.Flatten(), nn.Linear(C * 3 * 2, CLASSES))
    other.load_state_dict(state)
    for key, value in other.state_dict().items():
        assert np.array_equal(value, state[key]) and value.dtype == state[key].dtype, key
    model.eval(), other.eval()
    x = rng.standard_normal((N, C, H, W)).astype(np.float32)
    assert np.array_equal(model(x), other(x))


def test_load_state_dict_checks_buffers_and_changes_nothing_on_error():
    model = bn_model()
    model((np.ones((N, C, H, W)) * np.arange(H * W).reshape(H, W)).astype(np.float32))
    before = model.state_dict()
    bad = dict(before)
    bad["0.running_var"] = -np.ones(C, np.float32)
    bad["2.weight"] = np.zeros_like(before["2.weight"])
    with pytest.raises(ValueError, match="running_var"):
        model.load_state_dict(bad)
    bad = dict(before, **{"0.num_batches_tracked": np.array(1.5)})
    with pytest.raises(TypeError, match="num_batches_tracked"):
        model.load_state_dict(bad)
    bad = dict(before, **{"0.running_mean": np.zeros(C + 1)})
    with pytest.raises(ValueError, match="running_mean"):
        model.load_state_dict(bad)
    missing = {k: v for k, v in before.items() if k != "0.running_mean"}
    with pytest.raises(KeyError, match="running_mean"):
        model.load_state_dict(missing)
    for key, value in model.state_dict().items():
        assert np.array_equal(value, before[key]), key


def test_buffers_are_views_on_the_cpu_and_survive_compiles_copies_and_moves():
    bn = nn.BatchNorm2d(C)
    bn(np.random.default_rng(0).standard_normal((N, C, H, W)).astype(np.float32))
    bn.running_mean[...] = [1.5, -2.0]  # a view: writes go into the model
    assert np.array_equal(bn.state_dict()["running_mean"], [1.5, -2.0])
    model = nn.Sequential(bn, nn.Flatten(), nn.Linear(C * H * W, CLASSES))  # recompiled: values kept
    assert np.array_equal(model.state_dict()["0.running_mean"], [1.5, -2.0])
    assert int(model.state_dict()["0.num_batches_tracked"]) == 1
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        for key, value in model.state_dict().items():
            assert np.array_equal(clone.state_dict()[key], value), key
    moved = copy.deepcopy(model).to("sim")
    for key, value in model.state_dict().items():
        assert np.array_equal(moved.state_dict()[key], value), key
    assert [n for n, _ in moved.named_buffers()] == [n for n, _ in model.named_buffers()]
    moved.to("cpu")
    assert np.array_equal(moved[0].running_mean, [1.5, -2.0])


def cnn(seed=0):
    gt.random.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(W, W), nn.BatchNorm2d(C), nn.ReLU(),
        nn.Residual(nn.BatchNorm2d(C, momentum=None), nn.MaxPool2d(3, stride=1, padding=1)),
        nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), nn.BatchNorm2d(C), nn.AdaptiveAvgPool2d((2, 2)),
        nn.Flatten(), nn.Linear(C * 4, CLASSES))


def train(model, precision, checkpointing=False, steps=3):
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), SGD.for_model(model, lr=0.1),
                        micro_batches=2, precision=precision, gradient_checkpointing=checkpointing)
    rng = np.random.default_rng(9)
    losses = []
    for _ in range(steps):
        losses.append(step(rng.standard_normal((4, C, H, W)).astype(np.float32), rng.integers(0, CLASSES, 4)).loss)
    return losses


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_sim_device_is_bit_identical_to_the_cpu(precision):
    cpu, sim = cnn(), cnn().to("sim")
    assert train(cpu, precision) == train(sim, precision, checkpointing=True) == train(cnn(), precision, True)
    for key, value in cpu.state_dict().items():
        assert np.array_equal(value.tobytes(), sim.state_dict()[key].tobytes()), key


def test_any_thread_count_gives_the_same_bits():
    results = []
    for threads in (1, 2, 3):
        gt.set_num_threads(threads)
        try:
            model = cnn()
            train(model, "bf16")
            results.append(model.state_dict())
        finally:
            gt.set_num_threads(2)
    for state in results[1:]:
        for key, value in state.items():
            assert np.array_equal(value.tobytes(), results[0][key].tobytes()), key


def test_checkpointed_recompute_does_not_update_running_statistics_twice():
    plain, checkpointed = cnn(), cnn()
    train(plain, "fp32")
    train(checkpointed, "fp32", checkpointing=True)
    for key, value in plain.state_dict().items():
        assert np.array_equal(value, checkpointed.state_dict()[key]), key
    assert int(plain.state_dict()["3.block.0.num_batches_tracked"]) == 6


def test_memory_plan_counts_the_buffers_and_matches_the_arenas():
    model = cnn()
    plan = model.compiled.plan((4, C, H, W))
    # per BatchNorm2d 2 x 2 floats and an int64 (24 bytes), 64-byte aligned in all, and the copy a failed
    # training step restores them from
    assert plan["buffers"] == 2 * 128
    arenas = model.compiled.arena_plan((4, C, H, W))
    model(np.zeros((4, C, H, W), np.float32))
    assert model.compiled.live_arenas()["buffers"] == arenas["buffers"] > 0


def test_errors_name_the_argument_and_leave_the_model_unchanged():
    with pytest.raises(TypeError, match="num_features"):
        nn.BatchNorm2d(2.0)
    with pytest.raises(ValueError, match="momentum"):
        nn.BatchNorm2d(2, momentum=1.5)
    with pytest.raises(ValueError, match="eps"):
        nn.BatchNorm2d(2, eps=0)
    with pytest.raises(ValueError, match="kernel_size"):
        nn.MaxPool2d(0)
    with pytest.raises(ValueError, match="padding"):
        nn.MaxPool2d(2, padding=2)
    with pytest.raises(ValueError, match="pad"):
        nn.AvgPool2d(3, padding=2)
    with pytest.raises(TypeError, match="stride"):
        nn.AvgPool2d(2, stride=1.5)
    with pytest.raises(ValueError, match="output_size"):
        nn.AdaptiveAvgPool2d((1, 2, 3))
    with pytest.raises(ValueError, match="return_indices"):
        nn.MaxPool2d(2, return_indices=True)
    with pytest.raises(ValueError, match="divisor_override"):
        nn.AvgPool2d(2, divisor_override=3)
    model = bn_model()
    before = model.state_dict()
    with pytest.raises(ValueError, match="expects 2 channels"):
        model(np.zeros((N, 3, H, W), np.float32))
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        model(np.zeros((N, C, H), np.float32))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.Sequential(nn.BatchNorm2d(C), nn.Flatten())(np.zeros((1, C, 1, 1), np.float32))
    with pytest.raises(ValueError, match="too small"):
        nn.Sequential(nn.MaxPool2d(3))(np.zeros((1, 1, 2, 2), np.float32))
    one = nn.Sequential(nn.BatchNorm2d(C), nn.Flatten())
    one.eval()
    assert one(np.ones((1, C, 1, 1), np.float32)).shape == (1, C)  # eval: running statistics, allowed
    for key, value in model.state_dict().items():
        assert np.array_equal(value, before[key]), key


@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_max_pool_backward_from_saved_maxima_equals_the_recomputed_one(dt):
    """The layer saves the maxima in forward (argmax); without them the op recomputes them: same bits."""
    import _reference as ref

    rng = np.random.default_rng(0)
    x = ref.to_dtype(rng.integers(0, 4, (2, 3, 9, 8)).astype(np.float64), dt)  # ties
    raw = (lambda a: a.view(np.uint16)) if dt == "bf16" else (lambda a: a)
    out, dout = np.empty((2, 3, 5, 4), x.dtype), ref.to_dtype(rng.standard_normal((2, 3, 5, 4)), dt)
    argmax = np.full(out.shape, -1, np.int32)
    args = ("max", (3, 3), (2, 2), (1, 1), (1, 1), True, dt)
    _C_testing.op_pool2d(raw(out), raw(x), *args, argmax=argmax)
    grads = []
    for saved in (argmax, None):
        din = np.empty_like(x)
        _C_testing.op_pool2d(raw(din), raw(x), *args, dout=raw(dout), argmax=saved)
        grads.append(din)
    assert ref.same_bits(grads[0], grads[1]) and np.abs(grads[0].astype(np.float32)).sum() > 0
    with pytest.raises(ValueError, match="argmax"):
        _C_testing.op_pool2d(raw(np.empty_like(x)), raw(x), *args, dout=raw(dout), argmax=argmax * 0 + 72)


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_a_failed_step_leaves_the_running_statistics_as_they_were(device):
    """The second micro-batch's labels are out of range: its loss fails after both forwards updated
    the running statistics; the step restores them (and changes nothing else)."""
    model = cnn().to(device)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), SGD.for_model(model, lr=0.1), micro_batches=2)
    x = np.random.default_rng(0).standard_normal((4, C, H, W)).astype(np.float32)
    step(x, np.array([0, 1, 2, 3]))
    before = model.state_dict()
    with pytest.raises(IndexError):
        step(x, np.array([0, 1, 2, CLASSES]))
    for key, value in model.state_dict().items():
        assert value.tobytes() == before[key].tobytes(), key
    assert int(before["1.num_batches_tracked"]) == 2
