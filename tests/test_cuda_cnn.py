"""A CUDA training step of models with BatchNorm2d, 2-D pooling and the sequence ops
(cuda/ops_batchnorm.cu, ops_pool2d.cu, ops_sequence.cu) against the same step on the CPU. The
kernels give the CPU ops' bits (their math is checked on the host in tests/test_cnn_cuda_math.py);
the models' GEMMs do not (cuBLAS), so losses, gradients and running statistics agree within a
tolerance. Marked `cuda`: they skip without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain.models import SimpleCNN, TransformerClassifier

nn = gt.nn
cuda = pytest.mark.cuda
TOLERANCE = {"fp32": 1e-4, "bf16": 6e-2}


def images(n=12, channels=3, size=9, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, channels, size, size)).astype(np.float32),
            rng.integers(0, classes, n).astype(np.int64))


def pooling_stack():
    """Every CNN layer but Conv2d, at odd sizes: (N, 3, 9, 9) -> 4 classes."""
    return nn.Sequential(nn.BatchNorm2d(3), nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
                         nn.BatchNorm2d(3, momentum=None),
                         nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
                         nn.AdaptiveAvgPool2d((2, 3)), nn.Flatten(), nn.Linear(18, 4))


def steps(make, device, precision, inputs, count=2, accumulation=1, **columns):
    """Losses, gradients and state after `count` steps of a fresh model on `device` (columns: the
    step's attention_mask and token_type_ids)."""
    gt.backends.set_tf32(False)
    gt.random.manual_seed(7)
    model = make().to(device)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.SGD(model.parameters(), lr=0.05),
                        precision=precision, micro_batches=accumulation)
    losses = [step(*inputs, **columns).loss for _ in range(count)]
    return losses, model.compiled.read_gradients(), model.state_dict()


def assert_close(cpu, gpu, tol):
    (cpu_losses, cpu_grads, cpu_state), (gpu_losses, gpu_grads, gpu_state) = cpu, gpu
    assert gpu_losses == pytest.approx(cpu_losses, rel=tol)
    assert np.max(np.abs(gpu_grads - cpu_grads)) <= tol * np.max(np.abs(cpu_grads))
    assert list(gpu_state) == list(cpu_state)
    for key, value in cpu_state.items():
        np.testing.assert_allclose(np.asarray(gpu_state[key], np.float64), np.asarray(value, np.float64),
                                   rtol=tol, atol=tol, err_msg=key)


@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_batchnorm_and_pooling_layers_step_on_cuda_as_on_the_cpu(precision):
    x, y = images()
    run = lambda device: steps(pooling_stack, device, precision, (x, y), accumulation=2)
    assert_close(run("cpu"), run("cuda"), TOLERANCE[precision])


@cuda
def test_eval_mode_normalises_with_the_running_statistics_on_cuda():
    x, _ = images()
    outputs = []
    for device in ("cpu", "cuda"):
        gt.random.manual_seed(7)
        model = pooling_stack().to(device)
        model(x)  # train mode: folds one batch into the running statistics
        outputs.append(model.eval()(x))
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)


@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_simple_cnn_steps_on_cuda_as_on_the_cpu(precision):
    x, y = images(channels=1, size=8)
    make = lambda: SimpleCNN(in_channels=1, num_classes=4, channels=(4, 8), image_size=8)
    gpu = steps(make, "cuda", precision, (x, y))
    assert_close(steps(make, "cpu", precision, (x, y)), gpu, TOLERANCE[precision])


@cuda
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_transformer_classifier_with_a_mask_steps_on_cuda_as_on_the_cpu(pooling, precision):
    rng = np.random.default_rng(1)
    ids = rng.integers(3, 30, (6, 11)).astype(np.int64)
    mask = (np.arange(11) < np.array([11, 1, 5, 8, 11, 3])[:, None]).astype(np.int64)
    types = (np.arange(11) >= 4).astype(np.int64) * mask
    labels = rng.integers(0, 3, 6).astype(np.int64)
    make = lambda: TransformerClassifier(30, 3, max_len=11, d_model=32, num_layers=2, num_heads=2, dropout=0.1,
                                         pooling=pooling)
    run = lambda device: steps(make, device, precision, (ids, labels), attention_mask=mask, token_type_ids=types)
    assert_close(run("cpu"), run("cuda"), TOLERANCE[precision])
