"""gputrain.backends: the TF32 switch, reported as not applicable without a CUDA device."""

from __future__ import annotations

import pytest

import gputrain
from gputrain import backends


@pytest.fixture
def restore_tf32():
    before = backends.tf32
    yield
    backends.tf32 = before


def test_tf32_is_a_settable_bool_the_step_can_read(restore_tf32):
    assert gputrain.backends is backends
    backends.tf32 = True
    assert backends.tf32 is True and backends.tf32_enabled() is True
    backends.set_tf32(False)
    assert backends.tf32 is False and backends.tf32_enabled() is False


@pytest.mark.parametrize("bad", [1, "yes", None, 1.0])
def test_tf32_rejects_non_bools(restore_tf32, bad):
    with pytest.raises(TypeError, match="tf32 must be a bool"):
        backends.tf32 = bad
    assert backends.tf32 is False


def test_tf32_status_says_not_applicable_on_the_cpu(restore_tf32):
    if gputrain._C.cuda_device_count() > 0:
        backends.tf32 = True
        assert backends.tf32_status() == "enabled"
        return
    assert backends.tf32_status().startswith("not applicable (off)")
    backends.tf32 = True
    assert backends.tf32_status().startswith("not applicable (requested)")
    assert "cuBLAS/cuDNN" in backends.tf32_status()


@pytest.mark.cuda
def test_tf32_reaches_the_cublas_handles(restore_tf32):
    backends.tf32 = True
    assert gputrain._C.cuda_tf32_enabled() is True
    backends.tf32 = False
    assert gputrain._C.cuda_tf32_enabled() is False
