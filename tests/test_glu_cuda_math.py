"""The CUDA gated-activation kernels' arithmetic, run on the host: tests/_glu_harness.c (compiled
here with the system C compiler) runs the per-thread functions of csrc/ops/glu_hd.h -- the code
every thread of cuda/ops_glu.cu runs -- over the kernels' whole grid in reverse order. Checked bit
for bit against the CPU op (whose loops run the same element math), every activation, f32/f16/bf16,
forward and backward, din aliasing in. No GPU is needed."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import _c_harness
import _reference as ref
from gputrain import functional as F

DT_CODES = {"f32": 0, "f16": 1, "bf16": 2}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    so = _c_harness.build("_glu_harness.c", tmp_path_factory.mktemp("harness"))
    so.gt_harness_glu.restype = None
    return so.gt_harness_glu


def call(harness, backward, out, dout, x, kind, dt):
    rows, inter = x.shape[0], x.shape[1] // 2
    harness(ctypes.c_int(backward), ctypes.c_int64(rows), ctypes.c_int64(inter), ctypes.c_void_p(out.ctypes.data),
            ctypes.c_void_p(0 if dout is None else dout.ctypes.data), ctypes.c_void_p(x.ctypes.data),
            ctypes.c_int(F.ACTIVATIONS[kind]), ctypes.c_int(DT_CODES[dt]))


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kind", sorted(F.ACTIVATIONS))
def test_harness_gives_the_cpu_ops_bits(harness, dt, kind):
    rng = np.random.default_rng(0)
    x = ref.to_dtype(2 * rng.standard_normal((9, 2 * 23)), dt)
    dout = ref.to_dtype(rng.standard_normal((9, 23)), dt)
    out = np.full((9, 23), np.nan, x.dtype)
    call(harness, 0, out, None, x, kind, dt)
    assert ref.same_bits(out, F.gated_activation(x, kind))
    din = np.full_like(x, np.nan)
    call(harness, 1, din, dout, x, kind, dt)
    expected = F.gated_activation_backward(dout, x, kind)
    assert ref.same_bits(din, expected)
    in_place = x.copy()
    call(harness, 1, in_place, dout, in_place, kind, dt)
    assert ref.same_bits(in_place, expected)
