"""Conv2d on CUDA through cuDNN (cuda/ops_conv.cu) and torch.backends.cudnn's knobs as
`gputrain.backends.cudnn` (benchmark, deterministic, is_available(), version()).

Unmarked tests run everywhere: the knobs' Python API and argument errors, the C setter's, and on a
CUDA build (CI's) that the extension does not link cuDNN but opens it on first use and reports its
version without a GPU (tests/test_cuda_lazy_libraries.py checks when it is opened). Tests marked
`cuda` need a GPU: a model of strided, dilated, grouped and bias-free convolutions trained one step
(with gradient accumulation, so dweight/dbias accumulate) on CUDA against the same model on the CPU,
within 1e-3 of the largest gradient in fp32 (TF32 off; cuDNN's Winograd/FFT algorithms round
differently from im2col + GEMM), 3e-2 in fp16 and 6e-2 in bf16; with `deterministic` the same bits
on every run; with `benchmark` one cached algorithm choice per shape.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import gputrain as gt
from gputrain import _C

nn = gt.nn
cudnn = gt.backends.cudnn
CUDA_COMPILED = bool(_C.build_info()["cuda_compiled"])
needs_cuda_build = pytest.mark.skipif(not CUDA_COMPILED, reason="a CPU-only build has no cuDNN")


@pytest.fixture(autouse=True)
def default_knobs():
    yield
    cudnn.benchmark = False
    cudnn.deterministic = False


def test_knobs_have_torchs_names_and_defaults():
    assert cudnn.benchmark is False and cudnn.deterministic is False
    cudnn.benchmark = True
    assert cudnn.benchmark is True and cudnn.deterministic is False
    cudnn.deterministic = True
    assert gt.backends.cudnn.deterministic is True and cudnn.benchmark is True


def test_cudnn_is_an_importable_submodule():
    import gputrain.backends.cudnn as module

    assert module is cudnn and module.__name__ == "gputrain.backends.cudnn"
    assert "cudnn" in gt.backends.__all__


@pytest.mark.parametrize("name", ["benchmark", "deterministic"])
@pytest.mark.parametrize("value", [1, 0, None, "True", np.bool_(True)])
def test_knobs_take_bools_only_and_keep_their_value(name, value):
    setattr(cudnn, name, True)
    with pytest.raises(TypeError, match=f"cudnn.{name} must be a bool, not"):
        setattr(cudnn, name, value)
    assert getattr(cudnn, name) is True
    if CUDA_COMPILED:
        assert _C.cudnn_flags()[["benchmark", "deterministic"].index(name)] is True


def test_c_setter_rejects_anything_but_two_bools():
    for args in [(1, False), (False, None), (True,), (True, False, True)]:
        with pytest.raises(TypeError):
            _C.cudnn_set_flags(*args)


def test_availability_and_version_follow_the_build():
    assert cudnn.is_available() is CUDA_COMPILED
    if CUDA_COMPILED:
        version = cudnn.version()
        assert isinstance(version, int) and 90000 <= version < 100000, version
    else:
        assert cudnn.version() is None and _C.cudnn_version() == 0


@needs_cuda_build
def test_knobs_reach_the_cuda_backend():
    cudnn.benchmark = True
    assert _C.cudnn_flags() == (True, False)
    cudnn.deterministic = True
    cudnn.benchmark = False
    assert _C.cudnn_flags() == (False, True)


@needs_cuda_build
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ldd is Linux's")
def test_the_cuda_build_opens_cudnn_on_first_use():
    linked = subprocess.run(["ldd", _C.__file__], capture_output=True, text=True, check=True).stdout
    assert "libcudnn" not in linked, linked
    version = cudnn.version()  # opens cuDNN (no GPU needed)
    assert 90000 <= version < 100000
    assert gt.cuda._libraries(load=False)["cudnn"]["version"] == version


@pytest.mark.skipif(CUDA_COMPILED, reason="the CPU-only build's errors")
def test_cpu_only_build_says_cuda_is_missing_for_the_c_knobs():
    with pytest.raises(gt.CudaError, match="CUDA was not compiled in"):
        _C.cudnn_set_flags(True, False)
    with pytest.raises(gt.CudaError, match="CUDA was not compiled in"):
        _C.cudnn_flags()


# ------------------------------------------------------------------ on a GPU

N, C, H, W, CLASSES = 4, 4, 9, 8, 5


def conv_model(seed=0):
    """Grouped 'same' conv with bias, then strided, dilated, bias-free; (N, 6, 5, 3) into a head."""
    gt.random.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(C, 6, 3, padding=1, groups=2), nn.ReLU(),
                         nn.Conv2d(6, 6, (3, 2), stride=2, padding=(1, 0), dilation=(1, 2), bias=False),
                         nn.Tanh(), nn.Conv2d(6, 6, 1, groups=6), nn.Flatten(), nn.Linear(6 * 5 * 3, CLASSES))


def images(seed=7):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, C, H, W)).astype(np.float32), rng.integers(0, CLASSES, N).astype(np.int64)


def step_result(model, precision="fp32"):
    x, y = images()
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), None, precision=precision, gradient_accumulation_steps=2)
    out = step(x, y)
    model.eval()
    return out.loss, model.compiled.read_gradients(), model(x)


@pytest.mark.cuda
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-3), ("fp16", 3e-2), ("bf16", 6e-2)])
def test_conv_model_on_cuda_matches_the_cpu(precision, tol):
    gt.backends.set_tf32(False)
    loss_cpu, grads_cpu, out_cpu = step_result(conv_model(), precision)
    loss_gpu, grads_gpu, out_gpu = step_result(conv_model().to("cuda"), precision)
    assert loss_gpu == pytest.approx(loss_cpu, rel=tol)
    assert np.max(np.abs(grads_gpu - grads_cpu)) <= tol * np.max(np.abs(grads_cpu))
    np.testing.assert_allclose(out_gpu, out_cpu, rtol=tol, atol=tol * np.max(np.abs(out_cpu)))


@pytest.mark.cuda
def test_deterministic_algorithms_give_the_same_bits_every_run():
    cudnn.deterministic = True
    runs = [step_result(conv_model(1).to("cuda")) for _ in range(3)]
    for loss, grads, out in runs[1:]:
        assert loss == runs[0][0]
        assert np.array_equal(grads.view(np.uint32), runs[0][1].view(np.uint32))
        assert np.array_equal(out.view(np.uint32), runs[0][2].view(np.uint32))


@pytest.mark.cuda
def test_benchmark_chooses_once_per_shape_and_matches_the_cpu():
    cudnn.benchmark = True
    before = _C.cudnn_cached_choices()
    loss_gpu, grads_gpu, _ = step_result(conv_model(2).to("cuda"))
    chosen = _C.cudnn_cached_choices()
    assert chosen - before == 3  # the model's three convolution shapes, planned once
    step_result(conv_model(2).to("cuda"))  # the same shapes: nothing new is measured
    assert _C.cudnn_cached_choices() == chosen
    loss_cpu, grads_cpu, _ = step_result(conv_model(2))
    assert loss_gpu == pytest.approx(loss_cpu, rel=1e-3)
    assert np.max(np.abs(grads_gpu - grads_cpu)) <= 1e-3 * np.max(np.abs(grads_cpu))
