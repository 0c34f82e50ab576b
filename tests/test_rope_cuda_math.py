"""The CUDA rotary-embedding kernel's arithmetic, run on the host: tests/_rope_harness.c (compiled
here with the system C compiler) runs the per-thread function of csrc/ops/rope_hd.h -- the code
every thread of cuda/ops_rope.cu runs -- over the kernel's whole grid, in reverse order. Checked
bit for bit against the CPU op and the NumPy reference of Hugging Face's code, forward and
backward, f32/f16/bf16, partial rotary dims, (B, H, T, D) and (B, T, H, D) strides, in place and
out of place. No GPU is needed; the CUDA op itself runs only where a GPU is present."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import _c_harness
import _reference as ref
import _rope_reference as rref
from gputrain import _C
from gputrain import functional as F

DT_CODES = {"f32": 0, "f16": 1, "bf16": 2}


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    so = _c_harness.build("_rope_harness.c", tmp_path_factory.mktemp("harness"))
    so.gt_harness_rope.restype = None
    return so.gt_harness_rope


def int64s(*values):
    return (ctypes.c_int64 * len(values))(*values)


def run(harness, x, positions, inv_freq, dt, *, layout="bhtd", backward=False, in_place=False,
        attention_factor=1.0):
    """The harness on raw buffers (x and the result in `layout`; positions None: position t);
    returns the result."""
    if layout == "bhtd":
        batch, heads, seq, dim = x.shape
        strides = (heads * seq * dim, seq * dim, dim)
    else:
        batch, seq, heads, dim = x.shape
        strides = (seq * heads * dim, dim, heads * dim)
    x = np.ascontiguousarray(x)
    out = x if in_place else np.full_like(x, np.nan)
    positions = None if positions is None else np.ascontiguousarray(positions, np.int64)
    harness(ctypes.c_int(backward), int64s(batch, heads, seq, dim, 2 * inv_freq.shape[0]),
            ctypes.c_void_p(x.ctypes.data), ctypes.c_void_p(out.ctypes.data), int64s(*strides),
            ctypes.c_void_p(None if positions is None else positions.ctypes.data),
            ctypes.c_int64(0 if positions is None or positions.shape[0] == 1 else seq),
            ctypes.c_void_p(inv_freq.ctypes.data), ctypes.c_int(DT_CODES[dt]), ctypes.c_float(attention_factor))
    return out


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (48, 0.5)])
def test_harness_gives_the_cpu_ops_bits(harness, dt, backward, head_dim, partial):
    inv = F.rope_inv_freq(head_dim, 500000.0, partial, {"rope_type": "llama3", "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8192})
    rng = np.random.default_rng(0)
    x = ref.to_dtype(rng.standard_normal((2, 3, 11, head_dim)), dt)
    pos = rng.integers(0, 100000, size=(2, 11)).astype(np.int64)
    op = F.rotary_embedding_backward if backward else F.rotary_embedding
    expected = op(x, pos, inv)
    assert ref.same_bits(run(harness, x, pos, inv, dt, backward=backward), expected)
    assert ref.same_bits(expected, rref.apply(x, pos, inv, dt, backward=backward))
    assert ref.same_bits(run(harness, x.copy(), pos, inv, dt, backward=backward, in_place=True), expected)
    bthd = np.ascontiguousarray(x.transpose(0, 2, 1, 3))
    got = run(harness, bthd, pos[:1], inv, dt, layout="bthd", backward=backward)
    assert ref.same_bits(got, op(bthd, pos[:1], inv, layout="bthd"))


@pytest.mark.parametrize("dt", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("backward", [False, True])
def test_harness_attention_factor_and_default_positions_give_the_cpu_ops_bits(harness, dt, backward):
    inv = F.rope_inv_freq(32, 10000.0)
    rng = np.random.default_rng(1)
    x = ref.to_dtype(rng.standard_normal((2, 3, 7, 32)), dt)
    raw = x.view(np.uint16) if dt == "bf16" else x
    arange = np.arange(7, dtype=np.int64)[None]
    for factor in (1.0, 1.25):
        cpu = np.empty_like(raw)
        _C.op_rope(cpu, raw, arange, inv, dt, 1, backward=backward, attention_factor=factor)
        got = run(harness, x, None, inv, dt, backward=backward, attention_factor=factor)
        assert ref.same_bits(got, cpu.view(x.dtype)), factor
        assert ref.same_bits(got, rref.apply(x, np.repeat(arange, 2, 0), inv, dt, backward=backward,
                                             attention_factor=factor))
