"""A SimpleCNN training step: gputrain.models.SimpleCNN against the same architecture in PyTorch on the CPU.

Model: CIFAR-sized by default: 3x32x32 images, three stages of Conv3x3 (no bias) + BatchNorm2d +
ReLU + MaxPool2d(2) with 32, 64 and 128 channels (32 -> 16 -> 8 -> 4), global average pooling, a
Linear head to 10 classes; batch 64; one AdamW step (lr 1e-3, weight decay 0.01) per round. Both
models start from the same weights (PyTorch's loads gputrain's state_dict: the names match).
Reported per precision: images/s, the step's convolution and Linear FLOP/s (forward, weight
gradients, input gradients but the first convolution's) as a fraction of the sgemm peak measured
in the same run (_timing.sgemm_peak), and, with PyTorch importable, the ratio to PyTorch's step
(fp32; for bf16, PyTorch under CPU autocast to bf16), same threads. PyTorch's step runs before
every round of ours (pytest-benchmark's `setup`), so both see the same machine load; medians.

    python -m pytest benchmarks/bench_cnn.py --benchmark-only
    PYTHONPATH=<gputrain build> /work/venv-torch/bin/python -m pytest benchmarks/bench_cnn.py --benchmark-only
    # other sizes (and CNN_BENCH_THREADS, CNN_BENCH_ROUNDS), e.g. the digits example's:
    CNN_BENCH_IMAGE=8 CNN_BENCH_IN=1 CNN_BENCH_CHANNELS=32,64 CNN_BENCH_BATCH=32 ...
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain as gt
from _model_bench import benchmark_step, gputrain_adamw_step, torch_adamw_step
from gputrain.models import SimpleCNN


def _env(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


IMAGE, IN_CHANNELS, BATCH, CLASSES = _env("CNN_BENCH_IMAGE", 32), _env("CNN_BENCH_IN", 3), \
    _env("CNN_BENCH_BATCH", 64), 10
CHANNELS = tuple(int(c) for c in os.environ.get("CNN_BENCH_CHANNELS", "32,64,128").split(","))
ROUNDS = _env("CNN_BENCH_ROUNDS", 10)
if os.environ.get("CNN_BENCH_THREADS"):  # both libraries run with gputrain's thread count
    gt.set_num_threads(_env("CNN_BENCH_THREADS", 1))


def gputrain_model() -> SimpleCNN:
    gt.random.manual_seed(0)
    return SimpleCNN(in_channels=IN_CHANNELS, num_classes=CLASSES, channels=CHANNELS, image_size=IMAGE)


def step_flops() -> float:
    """Convolution and Linear FLOPs of one step: the forward, the weight gradients (as many), and
    the input gradients (as many) of every layer but the first convolution."""
    forward, first, size, previous = 0.0, 0.0, IMAGE, IN_CHANNELS
    for out in CHANNELS:
        flops = 2.0 * BATCH * size * size * out * previous * 9
        first = first or flops
        forward += flops
        size, previous = max(size // 2, 1), out
    forward += 2.0 * BATCH * CHANNELS[-1] * CLASSES
    return 3 * forward - first


def batch_data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((BATCH, IN_CHANNELS, IMAGE, IMAGE)).astype(np.float32),
            rng.integers(0, CLASSES, BATCH))


def gputrain_step(precision: str):
    return gputrain_adamw_step(gputrain_model(), *batch_data(), 1e-3, 0.01, precision)


def torch_cnn(torch):
    """The same SimpleCNN in PyTorch, holding gputrain_model()'s weights and buffers."""
    nn = torch.nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            layers, previous, size = [], IN_CHANNELS, IMAGE
            for out in CHANNELS:
                layers += [nn.Conv2d(previous, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU()]
                if size >= 2:
                    layers.append(nn.MaxPool2d(2))
                    size //= 2
                previous = out
            self.features = nn.Sequential(*layers)
            self.pool, self.flatten = nn.AdaptiveAvgPool2d(1), nn.Flatten()
            self.head = nn.Linear(CHANNELS[-1], CLASSES)

        def forward(self, x):
            return self.head(self.flatten(self.pool(self.features(x))))

    model = Model()
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v))
                           for k, v in gputrain_model().state_dict().items()})
    return model


def torch_step(autocast_bf16: bool = False):
    torch = pytest.importorskip("torch")
    x, y = (torch.from_numpy(a) for a in batch_data())
    return torch_adamw_step(torch, torch_cnn(torch), x, y, 1e-3, 0.01, autocast_bf16)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cnn_step(benchmark, gputrain_benchmark, precision):
    benchmark_step(benchmark, gputrain_benchmark, precision, gputrain_step(precision), torch_step, ROUNDS,
                   "images", BATCH, step_flops(),
                   sizes=f"{IN_CHANNELS}x{IMAGE}x{IMAGE}, channels {CHANNELS}, batch {BATCH}, classes {CLASSES}")
