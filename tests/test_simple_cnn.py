"""gputrain.models.SimpleCNN: its layers, output shapes and PyTorch-style names, argument errors
naming the argument, learning a small image task in fp32 and bf16, BatchNorm's running
statistics in train and eval, the simulated device's bits, the Trainer's memory plan equal to the
allocator's peak, three steps against torch.nn (when installed), and examples/digits_cnn.py."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain.models import SimpleCNN
from gputrain.optim import AdamW

nn = gt.nn


def quadrants(n=64, seed=0, channels=1, size=8):
    """Images (n, channels, size, size) with a bright blob in one of four quadrants: the label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    x = rng.standard_normal((n, channels, size, size)).astype(np.float32) * 0.5
    half = size // 2
    for i, k in enumerate(labels):
        x[i, :, half * (k // 2):half * (k // 2) + half, half * (k % 2):half * (k % 2) + half] += 1.0
    return x, labels


def small(seed=0, **kwargs):
    gt.random.manual_seed(seed)
    options = dict(in_channels=1, num_classes=4, channels=(4, 8), image_size=8)
    options.update(kwargs)
    return SimpleCNN(**options)


def test_layers_names_and_shapes():
    model = SimpleCNN(in_channels=3, num_classes=5, channels=(8, 16), image_size=(12, 6))
    assert [type(m).__name__ for m in model.features] == ["Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d"] * 2
    assert model.feature_size == (3, 1)  # 12x6 -> 6x3 -> 3x1
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert list(shapes) == [
        "features.0.weight", "features.1.weight", "features.1.bias", "features.1.running_mean",
        "features.1.running_var", "features.1.num_batches_tracked",
        "features.4.weight", "features.5.weight", "features.5.bias", "features.5.running_mean",
        "features.5.running_var", "features.5.num_batches_tracked", "head.weight", "head.bias"]
    assert shapes["features.0.weight"] == (8, 3, 3, 3) and shapes["features.4.weight"] == (16, 8, 3, 3)
    assert shapes["head.weight"] == (5, 16)
    assert model(np.zeros((2, 3, 12, 6), np.float32)).shape == (2, 5)
    assert model.num_parameters() == 8 * 27 + 2 * 8 + 16 * 72 + 2 * 16 + 5 * 16 + 5


def test_flatten_head_no_batch_norm_and_dropout():
    model = SimpleCNN(in_channels=2, num_classes=3, channels=(4,), image_size=5, batch_norm=False,
                      dropout=0.25, global_pool=False)
    assert list(model.state_dict()) == ["features.0.weight", "features.0.bias", "head.weight", "head.bias"]
    assert model.head.weight.shape == (3, 4 * 2 * 2)  # 5x5 -> 2x2, flattened
    assert [name for name, _ in model.named_children()] == ["features", "flatten", "head_dropout", "head"]
    assert model(np.ones((4, 2, 5, 5), np.float32)).shape == (4, 3)


def test_pools_stop_at_one_pixel():
    """Five stages on 8x8: 8 -> 4 -> 2 -> 1, then no pool (a 1x1 map would become 0x0)."""
    model = SimpleCNN(channels=(2, 2, 2, 2, 2), image_size=(8, 2), batch_norm=False)
    pools = [m.kernel_size for m in model.features if isinstance(m, nn.MaxPool2d)]
    assert pools == [(2, 2), (2, 1), (2, 1)]  # the width stops halving at 1
    assert model.feature_size == (1, 1)
    assert model(np.zeros((1, 1, 8, 2), np.float32)).shape == (1, 10)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"in_channels": 0}, ValueError, "in_channels"),
    ({"num_classes": 2.0}, TypeError, "num_classes"),
    ({"channels": ()}, ValueError, "channels"),
    ({"channels": (8, -1)}, ValueError, "channels"),
    ({"channels": 8}, ValueError, "channels"),
    ({"image_size": (8, 8, 8)}, ValueError, "image_size"),
    ({"image_size": 0}, ValueError, "image_size"),
    ({"dropout": 1.0}, ValueError, "dropout"),
    ({"dropout": True}, ValueError, "dropout"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        SimpleCNN(**kwargs)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_learns_which_quadrant_is_bright(precision):
    x, y = quadrants()
    model = small(dropout=0.1)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), AdamW(model.parameters(), lr=1e-2), precision=precision)
    model.eval()
    before = (model(x).argmax(-1) == y).mean()
    model.train()
    losses = [step(x, y).loss for _ in range(40)]
    model.eval()
    accuracy = (model(x).argmax(-1) == y).mean()
    assert losses[-1] < 0.5 * losses[0]
    assert accuracy > 0.9 and accuracy > before + 0.3


def test_running_statistics_change_in_train_only():
    x, y = quadrants(16)
    model = small()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), AdamW(model.parameters(), lr=1e-2))
    start = {k: v.copy() for k, v in model.named_buffers()}
    step(x, y)
    trained = {k: v.copy() for k, v in model.named_buffers()}
    assert all(not np.array_equal(trained[k], start[k]) for k in start), "every buffer moves in train mode"
    assert int(trained["features.1.num_batches_tracked"]) == 1
    model.eval()
    eval_out = model(x)
    step(x, y)  # an eval-mode step normalises with the running statistics and leaves them
    for k, v in model.named_buffers():
        assert np.array_equal(v, trained[k]), k
    assert not np.array_equal(model(x), eval_out)  # the step did update the weights
    model.train()
    assert not np.allclose(model(x), model.eval()(x))  # batch statistics differ from the running ones


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_simulated_device_is_bit_identical_to_the_cpu(precision):
    x, y = quadrants(16)

    def train(device):
        model = small(seed=3, dropout=0.2).to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), AdamW.for_model(model, lr=1e-2), precision=precision)
        losses = [step(x, y).loss for _ in range(2)]
        return losses, model.state_dict()

    (cpu_losses, cpu_state), (sim_losses, sim_state) = train("cpu"), train("sim")
    assert sim_losses == cpu_losses
    assert list(sim_state) == list(cpu_state)
    for key, value in cpu_state.items():
        assert value.tobytes() == sim_state[key].tobytes(), key


@pytest.mark.parametrize("config", [{}, {"bf16": True, "gradient_checkpointing": True}], ids=["fp32", "bf16"])
def test_a_trainer_peaks_at_its_memory_plan(tmp_path, config):
    from test_memory_plan import args, measured, reset_peaks

    x, y = quadrants(40)
    with measured(("cpu",)) as growth:
        model = small(dropout=0.1)
        reset_peaks(("cpu",))
        trainer = gt.Trainer(model, args(tmp_path, **config), train_dataset=(x, y))
        plan = trainer.memory_plan()
        trainer.train()
    assert growth["cpu"] == plan.total("cpu"), str(plan)


def test_the_digits_example_runs_and_learns(tmp_path, monkeypatch, capsys):
    """examples/digits_cnn.py, shortened to 3 epochs of a narrower model: one line per epoch, and a
test accuracy far above chance (10%)."""
    pytest.importorskip("sklearn")
    import pathlib
    import re
    import runpy

    script = pathlib.Path(__file__).parent.parent / "examples" / "digits_cnn.py"
    monkeypatch.setattr("sys.argv", [str(script), "--epochs", "3", "--channels", "16", "32",
                                     "--output-dir", str(tmp_path)])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert len(re.findall(r"^epoch .* val accuracy .* images/s$", out, re.M)) == 3, out
    accuracy = float(re.search(r"^test accuracy ([\d.]+)%", out, re.M).group(1))
    assert accuracy > 90, out


def test_three_steps_match_pytorch():
    """The same SimpleCNN in torch.nn from the same state_dict (skipped without PyTorch): after
    three SGD steps the losses, parameters and running statistics agree."""
    torch = pytest.importorskip("torch")
    model = small(channels=(4, 8, 8), dropout=0.0)  # 8x8 -> 4x4 -> 2x2 -> 1x1
    tnn = torch.nn
    reference = tnn.Sequential()
    reference.features = tnn.Sequential(
        tnn.Conv2d(1, 4, 3, padding=1, bias=False), tnn.BatchNorm2d(4), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Conv2d(4, 8, 3, padding=1, bias=False), tnn.BatchNorm2d(8), tnn.ReLU(), tnn.MaxPool2d(2),
        tnn.Conv2d(8, 8, 3, padding=1, bias=False), tnn.BatchNorm2d(8), tnn.ReLU(), tnn.MaxPool2d(2))
    reference.pool, reference.flatten, reference.head = tnn.AdaptiveAvgPool2d(1), tnn.Flatten(), tnn.Linear(8, 4)
    reference.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model.state_dict().items()})
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for seed in range(3):
        x, y = quadrants(16, seed=seed)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        assert step(x, y).loss == pytest.approx(loss.item(), rel=1e-5)
    for key, value in reference.state_dict().items():
        np.testing.assert_allclose(model.state_dict()[key], value.numpy(), rtol=1e-4, atol=1e-5, err_msg=key)
