"""gputrain.nn.Conv2d as a C layer inside the one-call training step: first, middle and last, in a
Residual, nested, before a Flatten, with gradient checkpointing, in fp32/bf16/fp16 and train/eval,
against the float64 NumPy reference (tests/_mlp_reference.py with tests/_conv_reference.py);
PyTorch's parameter names, shapes and init; clear errors; the same bits on the simulated device
and for any thread count; gradient accumulation; a shared (tied) Conv2d."""

from __future__ import annotations

import numpy as np
import pytest

import _reference as ref
import gputrain as gt
from _mlp_reference import assert_gradients_match, cross_entropy, layer_backward, layer_forward, params_of
from gputrain.optim import AdamW

nn = gt.nn

N, C, H, W, CLASSES = 3, 4, 6, 5, 5


def conv(**kwargs):
    """A shape-keeping Conv2d (C -> C, 'same' padding)."""
    options = dict(kernel_size=3, padding=1)
    options.update(kwargs)
    return nn.Conv2d(C, C, **options)


def head(channels=C, h=H, w=W):
    return nn.Sequential(nn.Flatten(), nn.Linear(channels * h * w, CLASSES))


POSITIONS = {
    "first": lambda: nn.Sequential(conv(), nn.ReLU(), head()),
    "first_strided": lambda: nn.Sequential(nn.Conv2d(C, 6, (3, 2), stride=2, padding=(1, 0), dilation=(1, 2)),
                                           head(6, 3, 2)),
    "middle": lambda: nn.Sequential(nn.Tanh(), conv(groups=2), nn.GELU(), head()),
    "depthwise_pointwise": lambda: nn.Sequential(nn.SiLU(), conv(groups=C), nn.Conv2d(C, 2 * C, 1), nn.ReLU(),
                                                 head(2 * C)),
    # (N, 2, H - 1, W = CLASSES); no bias: softmax over W makes a channel's bias gradient exactly 0
    "last": lambda: nn.Sequential(nn.Tanh(), nn.Conv2d(C, 2, (2, 1), bias=False)),
    "last_no_bias_strided": lambda: nn.Sequential(nn.Linear(W, W), nn.Conv2d(C, 3, (2, 3), stride=(2, 1),
                                                                             padding=(0, 1), bias=False)),
    "in_residual": lambda: nn.Sequential(nn.Tanh(), nn.Residual(conv(), nn.ReLU(), conv()), head()),
    "residual_first": lambda: nn.Sequential(nn.Residual(conv(dilation=2, padding=2)), head()),
    "nested_first": lambda: nn.Sequential(nn.Sequential(conv(bias=False), nn.Tanh()), head()),
    "two_blocks": lambda: nn.Sequential(nn.Residual(conv(), nn.ReLU()), nn.Residual(conv(), nn.Dropout(0.0)),
                                        nn.Conv2d(C, 2, 3, stride=2), head(2, 2, 2)),
}

GRAD_TOLERANCE = {"fp32": 2e-5, "fp16": 1e-2, "bf16": 6e-2}


def batch(model, seed=1, n=N):
    """x (n, C, H, W) and one label per output row (the output's last dim is CLASSES)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, C, H, W)).astype(np.float32)
    out_shape = model(x).shape
    assert out_shape[-1] == CLASSES
    return x, rng.integers(0, CLASSES, out_shape[:-1])


def reference_step(model, x, y):
    params = params_of(model)
    logits, cache = layer_forward(model, x.astype(np.float64), params)
    loss, dflat = cross_entropy(logits.reshape(-1, CLASSES), y.reshape(-1))
    grads: dict = {}
    layer_backward(model, dflat.reshape(logits.shape), cache, params, grads)
    return loss, {(layer, name): g for layer, named in grads.items() for name, g in named.items()}


def check_step(model, precision="fp32", checkpointing=False):
    x, y = batch(model)
    loss, expected = reference_step(model, x, y)
    out = gt.TrainStep(model, nn.CrossEntropyLoss(), precision=precision,
                       gradient_checkpointing=checkpointing)(x, y)
    tolerance = GRAD_TOLERANCE[precision]
    assert out.loss == pytest.approx(loss, rel=tolerance, abs=tolerance)
    checked = assert_gradients_match(model, lambda module, name: expected[(id(module), name)], tolerance)
    assert checked == len(expected) == len(list(model.parameters()))


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("position", list(POSITIONS))
def test_step_gradients_match_reference(position, precision, checkpointing):
    gt.random.manual_seed(0)
    check_step(POSITIONS[position](), precision, checkpointing)


def test_parameters_have_pytorchs_names_shapes_and_init():
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(6, 12, (3, 5), groups=3), nn.Conv2d(12, 4, 1, bias=False))
    shapes = {name: value.shape for name, value in model.state_dict().items()}
    assert shapes == {"0.weight": (12, 2, 3, 5), "0.bias": (12,), "1.weight": (4, 12, 1, 1)}
    bound = 1 / np.sqrt(2 * 3 * 5)  # fan_in = in_channels / groups * kh * kw
    weight, bias = model.state_dict()["0.weight"], model.state_dict()["0.bias"]
    assert 0.95 * bound < np.abs(weight).max() <= bound and np.abs(bias).max() <= bound
    assert abs(weight.std() - bound / np.sqrt(3)) < 0.1 * bound  # uniform
    assert np.abs(model.state_dict()["1.weight"]).max() <= 1 / np.sqrt(12)
    assert repr(model[0]) == "Conv2d(6, 12, kernel_size=(3, 5), stride=(1, 1), groups=3)"


def test_eval_and_train_give_the_same_forward():
    gt.random.manual_seed(0)
    model = POSITIONS["two_blocks"]()
    x, _ = batch(model)
    train = model(x)
    model.eval()
    np.testing.assert_array_equal(model(x), train)


def test_a_shared_conv_sums_its_gradients():
    gt.random.manual_seed(0)
    shared = conv()
    check_step(nn.Sequential(shared, nn.Tanh(), shared, head()))


SHAPE_ERRORS = [
    (lambda: nn.Sequential(conv(), head()), (N, C + 1, H, W),
     r"x: layer '0' \(Conv2d\(4, 4.*expects 4 input channels \(dimension 1\), but the input has 5"),
    (lambda: nn.Sequential(conv(), head()), (N, C, H * W),
     r"x: layer '0'.*takes \(batch, channels, height, width\) inputs, but gets 3 dimensions"),
    (lambda: nn.Sequential(nn.Conv2d(C, C, 7), head()), (N, C, H, W),
     r"x: layer '0'.*the input's height 6 \(6 with padding\) is smaller than the kernel's 7"),
    (lambda: nn.Sequential(nn.Conv2d(C, C, 3, dilation=(1, 3)), head()), (N, C, H, W),
     r"input's width 5 \(5 with padding\) is smaller than the kernel's 7 \(kernel_size 3, dilation 3\)"),
    (lambda: nn.Sequential(nn.Conv2d(C, 2, 3, padding=1), nn.Conv2d(C, 2, 3)), (N, C, H, W),
     r"model: layer '1'.*expects 4 input channels \(dimension 1\), but the layer before it gives 2"),
    (lambda: nn.Sequential(nn.Flatten(), conv()), (N, C, H, W),
     r"model: layer '1'.*takes \(batch, channels, height, width\) inputs, but gets 2 dimensions"),
    (lambda: nn.Sequential(nn.Embedding(5, 4), conv()), (N, C),
     r"model: layer '1'.*takes \(batch, channels, height, width\) inputs, but gets 3 dimensions"),
]


@pytest.mark.parametrize("build, shape, match", SHAPE_ERRORS)
def test_bad_input_shapes_raise_naming_the_layer_and_leave_the_model_usable(build, shape, match):
    gt.random.manual_seed(0)
    model = build()
    data = np.zeros(shape, np.int64 if isinstance(model[0], nn.Embedding) else np.float32)
    with pytest.raises(ValueError, match=match):
        model(data)
    if not isinstance(model[0], nn.Embedding) and shape != (N, C, H, W):
        assert model(np.zeros((N, C, H, W), np.float32)).shape[0] == N


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(in_channels=0), ValueError, "in_channels must be positive"),
    (dict(kernel_size=(3, 0)), ValueError, "kernel_size must be in"),
    (dict(kernel_size=(1, 2, 3)), ValueError, "kernel_size must be an int or a pair"),
    (dict(stride=1.5), TypeError, "stride must be an int or a pair"),
    (dict(padding=-1), ValueError, "padding must be in"),
    (dict(padding="full"), ValueError, "padding must be an int, a pair of ints, 'valid' or 'same'"),
    (dict(padding="same", stride=2), ValueError, "padding='same' needs stride 1"),
    (dict(padding="same", kernel_size=2), ValueError, "needs uneven padding"),
    (dict(groups=3), ValueError, "must be divisible by groups"),
    (dict(dilation=2**31), ValueError, "dilation must be in"),
])
def test_bad_configuration_raises(kwargs, error, match):
    options = dict(in_channels=4, out_channels=6, kernel_size=3)
    options.update(kwargs)
    with pytest.raises(error, match=match):
        nn.Conv2d(**options)


def test_same_and_valid_padding():
    assert nn.Conv2d(2, 2, (3, 5), padding="same", dilation=2).padding == (2, 4)
    assert nn.Conv2d(2, 2, 3, padding="valid").padding == (0, 0)


def test_thread_count_changed_after_planning_keeps_the_bits():
    """The workspace has one slot per thread of the plan; more threads later use only those slots,
    fewer use fewer, and the weight-gradient chunks depend on the batch only: the same bits."""
    def make():
        model = POSITIONS["two_blocks"]()
        return (model, *batch(model, n=19))

    ref.assert_thread_counts_keep_the_bits(make, [(1, 1), (1, 3), (3, 1), (2, 2)])


def test_micro_batches_accumulate_the_whole_batchs_gradients():
    grads = []
    for steps in (1, 3):
        gt.random.manual_seed(0)
        model = POSITIONS["in_residual"]()
        x, y = batch(model, n=6)
        gt.TrainStep(model, nn.CrossEntropyLoss(), micro_batches=steps)(x, y)
        grads.append([p.grad.copy() for p in model.parameters()])
    for whole, split in zip(*grads):
        np.testing.assert_allclose(split, whole, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("config", [{}, {"bf16": True, "gradient_checkpointing": True}], ids=["fp32", "bf16"])
def test_a_cnn_trainer_peaks_at_its_memory_plan(tmp_path, config):
    """The convolutions' column tiles and weight-gradient partials are planned workspace: the
    allocator's peak is the plan to the byte, and the plan has room for them."""
    from test_memory_plan import args, measured, reset_peaks

    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, C, H, W)).astype(np.float32)
    y = rng.integers(0, CLASSES, 40)
    with measured(("cpu",)) as growth:
        gt.random.manual_seed(0)
        model = POSITIONS["two_blocks"]()
        reset_peaks(("cpu",))
        trainer = gt.Trainer(model, args(tmp_path, **config), train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
    assert growth["cpu"] == plan.total("cpu"), str(plan)
    one = model.compiled.plan((8, C, H, W))["workspace"]
    with ref.num_threads(3):
        assert model.compiled.plan((8, C, H, W))["workspace"] > one  # a slot per thread


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_a_cnn_on_the_simulated_device_trains_as_on_the_cpu(precision):
    def train(device):
        gt.random.manual_seed(5)
        model = POSITIONS["two_blocks"]().to(device)
        optimizer = AdamW.for_model(model, lr=1e-2)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, precision=precision,
                            micro_batches=2, gradient_checkpointing=True)
        x, y = batch(POSITIONS["two_blocks"](), n=8)
        losses = [step(x * (seed + 1), y).loss for seed in range(3)]
        return losses, model.compiled.read_parameters()

    (cpu_losses, cpu_params), (sim_losses, sim_params) = train("cpu"), train("sim")
    assert sim_losses == cpu_losses
    np.testing.assert_array_equal(sim_params, cpu_params)


def test_a_small_cnn_learns():
    """Which quadrant holds the bright blob: a two-conv network gets it right after training."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 64)
    x = rng.standard_normal((64, 1, 8, 8)).astype(np.float32) * 0.3
    for i, k in enumerate(labels):
        x[i, 0, 4 * (k // 2):4 * (k // 2) + 4, 4 * (k % 2):4 * (k % 2) + 4] += 1.5
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2, padding=1),
                          nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 4))
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), AdamW(model.parameters(), lr=3e-2))
    for _ in range(60):
        step(x, labels)
    assert (model(x).argmax(-1) == labels).mean() > 0.95
