"""Grouped-query attention, sliding windows and per-query key starts (segments: left padding,
packed documents) in the attention op and the attention layer kind.

The op against the float64 reference of tests/_attention_reference.py (transformers' arithmetic:
repeat_kv, masks ANDed, dk/dv of a kv head summed over its query heads) in f32, f16 and bf16,
forward and backward; the CUDA kernels' per-thread arithmetic (tests/_attention_harness.c) and
the simulated device against the CPU op's bits; exact identities (grouped heads = expanded heads
for out, lse and dq; a window >= seq and zero key starts change no bit); empty rows (0, -inf, no
NaN); the layer spec ("attention", embed_dim, num_heads, dropout, causal, num_kv_heads,
head_dim, window, scale) and its errors."""

from __future__ import annotations

import ctypes
import math

import numpy as np
import pytest

import _attention_reference as aref
import _c_harness
import _reference as ref
import gputrain as gt
from gputrain import _C
from gputrain import _C_testing
from gputrain import functional as F

nn = gt.nn
DT_CODES = {"f32": 0, "f16": 1, "bf16": 2}


def left_padding(batch, seq, rng):
    """Segments of left-padded rows: pads [0, p) form one segment, the tokens [p, T) another."""
    pads = rng.integers(0, seq, size=batch)
    i = np.arange(seq)[None]
    return np.where(i < pads[:, None], 0, pads[:, None]).astype(np.int64)


def packed(batch, seq, rng):
    """Packed documents: each query's first key is its document's first position."""
    starts = np.zeros((batch, seq), np.int64)
    for b in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, seq), size=min(3, seq - 1), replace=False))
        for t in range(seq):
            starts[b, t] = max([0, *[c for c in cuts if c <= t]])
    return starts


def wild(batch, seq, rng):
    """Any int64: negative (limits nothing), beyond the query (an empty row under causal), >= T."""
    return rng.integers(-3, seq + 3, size=(batch, seq)).astype(np.int64)


STARTS = {"none": None, "left": left_padding, "packed": packed, "wild": wild}

# (batch, heads, kv_heads, seq, head_dim, causal, window, starts, masked, dropout_p)
CASES = [
    (2, 4, 2, 67, 32, True, 0, "none", True, 0.0),
    (1, 4, 1, 67, 24, True, 20, "none", False, 0.0),
    (2, 4, 2, 130, 16, True, 50, "none", False, 0.2),
    (2, 2, 2, 67, 32, False, 10, "none", True, 0.0),
    (2, 4, 2, 67, 24, True, 0, "left", False, 0.0),
    (1, 4, 2, 150, 16, True, 30, "packed", False, 0.1),
    (2, 4, 1, 70, 16, False, 0, "packed", True, 0.0),
    (2, 4, 2, 67, 16, True, 7, "wild", True, 0.0),
    (3, 4, 4, 1, 16, True, 1, "none", False, 0.0),
]
IDS = [f"H{c[1]}K{c[2]}T{c[3]}D{c[4]}{'c' if c[5] else 'f'}W{c[6]}-{c[7]}{'-len' if c[8] else ''}"
       f"{'-drop' if c[9] else ''}" for c in CASES]
KEY = dict(seed=17, layer=3, step=2, offset=11)


def make(case, dt="f32", seed=0):
    """q, k, v, dout and the options of a case (functional's keywords)."""
    batch, heads, kv, seq, dim, causal, window, starts, masked, p = case
    rng = np.random.default_rng(seed)
    q = ref.to_dtype(rng.standard_normal((batch, heads, seq, dim)), dt)
    k, v = (ref.to_dtype(rng.standard_normal((batch, kv, seq, dim)), dt) for _ in range(2))
    dout = ref.to_dtype(rng.standard_normal((batch, heads, seq, dim)), dt)
    lengths = rng.integers(1, seq + 1, size=batch).astype(np.int64) if masked else None
    key_starts = None if STARTS[starts] is None else STARTS[starts](batch, seq, rng)
    options = dict(causal=causal, key_lengths=lengths, window=window, key_starts=key_starts,
                   dropout_p=p, **KEY)
    return q, k, v, dout, options


def run_functional(q, k, v, dout, options):
    out, lse = F.scaled_dot_product_attention(q, k, v, **options)
    return (out, lse, *F.scaled_dot_product_attention_backward(dout, q, k, v, out, lse, **options))


def reference(q, k, v, dout, options):
    mult = aref.multipliers(q.shape, options["dropout_p"], *KEY.values())
    masks = dict(causal=options["causal"], key_lengths=options["key_lengths"], mult=mult,
                 window=options["window"], key_starts=options["key_starts"])
    return (*aref.attention(q, k, v, **masks), *aref.attention_backward(dout, q, k, v, **masks))


# --- the op against the float64 reference ---------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_op_matches_the_float64_reference(case):
    q, k, v, dout, options = make(case)
    out, lse, dq, dk, dv = run_functional(q, k, v, dout, options)
    want = reference(q, k, v, dout, options)
    assert dk.shape == k.shape and dv.shape == v.shape
    np.testing.assert_allclose(out, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lse, want[1], rtol=1e-6, atol=2e-6)
    for name, got, grad in zip(("dq", "dk", "dv"), (dq, dk, dv), want[2:]):
        np.testing.assert_allclose(got, grad, rtol=1e-4, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("dt", ["f16", "bf16"])
@pytest.mark.parametrize("case", [CASES[2], CASES[5], CASES[7]], ids=[IDS[2], IDS[5], IDS[7]])
def test_half_precision_matches_the_reference(case, dt):
    """Half inputs, f32 arithmetic, one rounding of each output: out within 1 ulp of the rounded
    reference; gradients (f32 sums of rounded terms) within a few ulps of their size."""
    q, k, v, dout, options = make(case, dt)
    got = run_functional(q, k, v, dout, options)
    want = reference(q, k, v, dout, options)
    ref.assert_close(got[0], want[0], dt, atol=1e-2 if dt == "bf16" else 2e-3, err_msg="out")
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    ulp = {"f16": 2e-3, "bf16": 1.6e-2}[dt]
    for name, g, w in zip(("dq", "dk", "dv"), got[2:], want[2:]):
        error = np.abs(ref.f64(g) - w).max()
        assert error <= 4 * ulp * (np.abs(w).max() + 1.0), f"{name}: off by {error:.3g}"


@pytest.mark.parametrize("causal", [False, True])
def test_gradients_match_finite_differences(causal):
    case = (1, 4, 2, 9, 8, causal, 4, "wild", True, 0.0)
    q, k, v, dout, options = make(case, seed=3)
    _, _, *grads = run_functional(q, k, v, dout, options)
    masks = dict(causal=causal, key_lengths=options["key_lengths"], window=4,
                 key_starts=options["key_starts"])
    inputs = [ref.f64(q), ref.f64(k), ref.f64(v)]
    for index, got in enumerate(grads):
        def f(x, index=index):
            args = list(inputs)
            args[index] = x
            return aref.attention(*args, **masks)[0]
        ref.assert_grad(got, ref.numerical_grad(f, inputs[index], ref.f64(dout)), rtol=1e-4,
                        atol=1e-5, err_msg="qkv"[index])


# --- exact identities ------------------------------------------------------------------------------


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_grouped_heads_give_the_expanded_heads_bits_for_out_lse_and_dq(dt):
    """Query head h reads kv head h // (H / K): the same numbers in the same order as plain
    attention over repeated k, v. dk and dv sum the group in f32 before one rounding, so they
    equal the expanded gradients' group sums only approximately."""
    q, k, v, dout, options = make((2, 6, 2, 70, 16, True, 25, "packed", True, 0.15), dt)
    got = run_functional(q, k, v, dout, options)
    expanded = run_functional(q, aref.repeat_kv(k, 6), aref.repeat_kv(v, 6), dout, options)
    for name, a, b in zip(("out", "lse", "dq"), got[:3], expanded[:3]):
        assert ref.same_bits(a, b), name
    tolerance = 1e-5 if dt == "f32" else 2e-2
    for name, a, b in zip(("dk", "dv"), got[3:], expanded[3:]):
        np.testing.assert_allclose(ref.f64(a), aref.sum_groups(ref.f64(b), 2), rtol=tolerance,
                                   atol=tolerance, err_msg=name)


def test_a_covering_window_and_zero_key_starts_change_no_bit():
    q, k, v, dout, options = make((2, 4, 2, 67, 16, True, 0, "none", True, 0.1))
    plain = run_functional(q, k, v, dout, options)
    for extra in (dict(window=67), dict(window=1000), dict(key_starts=np.zeros((2, 67), np.int64)),
                  dict(key_starts=np.full((2, 67), -5, np.int64))):
        got = run_functional(q, k, v, dout, {**options, **extra})
        assert all(ref.same_bits(a, b) for a, b in zip(got, plain)), extra


def test_rows_that_see_no_key_give_zeros_and_no_nan():
    """Empty visible ranges (key_starts past the query under causal masking, past every key, or
    key_lengths 0): out 0, lse -inf, dq 0, and nothing added to dk, dv."""
    batch, heads, kv, seq, dim = 2, 4, 2, 9, 8
    q, k, v, dout, _ = make((batch, heads, kv, seq, dim, True, 0, "none", False, 0.0))
    starts = np.tile(np.arange(seq, dtype=np.int64), (batch, 1))
    starts[0, 3] = 7            # query 3 of entry 0 starts after itself: nothing visible
    starts[0, 5] = seq + 100    # past every key
    options = dict(causal=True, key_starts=starts, key_lengths=np.array([seq, 0]))
    out, lse, dq, dk, dv = run_functional(q, k, v, dout, options)
    for array in (out, dq, dk, dv):
        assert np.all(np.isfinite(array))
    empty = [(0, 3), (0, 5)] + [(1, t) for t in range(seq)]
    for b, t in empty:
        assert np.all(out[b, :, t] == 0) and np.all(lse[b, :, t] == -np.inf) and np.all(dq[b, :, t] == 0)
    assert np.all(dk[1] == 0) and np.all(dv[1] == 0)
    # entry 0: each remaining query sees exactly itself, so out = v of its kv head
    for t in set(range(seq)) - {3, 5}:
        np.testing.assert_allclose(out[0, :, t], np.repeat(v[0, :, t], 2, axis=0), rtol=1e-6)
    want = reference(q, k, v, dout, dict(options, window=0, dropout_p=0.0))
    for name, got, w in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv), (want[0], *want[2:])):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=name)


# --- the CUDA kernels' arithmetic and the simulated device ------------------------------------------


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    so = _c_harness.build("_attention_harness.c", tmp_path_factory.mktemp("gqa_harness"))
    so.gt_harness_attention.restype = ctypes.c_int
    return so.gt_harness_attention


def pointer(array):
    return ctypes.c_void_p(0 if array is None else array.ctypes.data)


def int64s(*values):
    return (ctypes.c_int64 * len(values))(*values)


def harness_call(harness, sizes, arrays, strides, options, dt, backward):
    """One harness call: sizes (B, H, T, D, K); arrays q, k, v, out, lse, dout, dq, dk, dv;
    strides of q, k/v and out in elements."""
    starts, lengths = options.get("key_starts"), options.get("key_lengths")
    starts = None if starts is None else np.ascontiguousarray(starts, np.int64)
    lengths = None if lengths is None else np.ascontiguousarray(lengths, np.int64)
    status = harness(
        ctypes.c_int(backward), int64s(*sizes), *map(pointer, arrays), *(int64s(*s) for s in strides),
        ctypes.c_float(1.0 / math.sqrt(sizes[3])), ctypes.c_int(options["causal"]), pointer(lengths),
        ctypes.c_int64(options["window"]), pointer(starts), ctypes.c_double(options["dropout_p"]),
        (ctypes.c_uint64 * 4)(*KEY.values()), ctypes.c_int(DT_CODES[dt]))
    assert status == 0


def harness_contiguous(harness, q, k, v, dout, options, dt):
    batch, heads, seq, dim = q.shape
    kv = k.shape[1]
    sizes = (batch, heads, seq, dim, kv)
    strides = ((heads * seq * dim, seq * dim, dim), (kv * seq * dim, seq * dim, dim),
               (heads * seq * dim, seq * dim, dim))
    out, lse = np.full_like(q, np.nan), np.zeros((batch, heads, seq), np.float32)
    harness_call(harness, sizes, (q, k, v, out, lse, None, None, None, None), strides, options, dt, 0)
    grads = (np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan))
    harness_call(harness, sizes, (q, k, v, out, lse, dout, *grads), strides, options, dt, 1)
    return out, lse, *grads


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_cuda_kernels_arithmetic_gives_the_cpu_bits(harness, case):
    for dt in ("f32", "bf16") if case[3] > 1 else ("f32",):
        q, k, v, dout, options = make(case, dt)
        got = harness_contiguous(harness, q, k, v, dout, options, dt)
        want = run_functional(q, k, v, dout, options)
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, want):
            assert ref.same_bits(a, b), f"{dt} {name}"


def test_the_cuda_kernels_arithmetic_in_f16_and_the_fused_decoder_layout(harness):
    """The decoder's fused (B, T, (H + 2K) D) projection [q heads | k heads | v heads] and (B, T,
    H D) output, read and written in place with strides: the bits of contiguous operands."""
    batch, heads, kv, seq, dim, dt = 2, 4, 2, 70, 24, "f16"
    case = (batch, heads, kv, seq, dim, True, 33, "left", False, 0.1)
    q, k, v, dout, options = make(case, dt)
    want = run_functional(q, k, v, dout, options)
    width = (heads + 2 * kv) * dim
    fused = np.concatenate([x.transpose(0, 2, 1, 3).reshape(batch, seq, -1) for x in (q, k, v)], axis=-1)
    flat = np.ascontiguousarray(fused).reshape(-1)
    sizes = (batch, heads, seq, dim, kv)
    in_strides = (seq * width, dim, width)
    out_strides = (seq * heads * dim, dim, heads * dim)
    strides = (in_strides, in_strides, out_strides)
    out = np.full((batch, seq, heads, dim), np.nan, fused.dtype)
    lse = np.zeros((batch, heads, seq), np.float32)
    views = (flat, flat[heads * dim:], flat[(heads + kv) * dim:])
    harness_call(harness, sizes, (*views, out, lse, None, None, None, None), strides, options, dt, 0)
    assert ref.same_bits(np.ascontiguousarray(out.transpose(0, 2, 1, 3)), want[0])
    assert ref.same_bits(lse, want[1])
    dout_fused = np.ascontiguousarray(dout.transpose(0, 2, 1, 3))
    din = np.full_like(flat, np.nan)
    harness_call(harness, sizes, (*views, out, lse, dout_fused, din, din[heads * dim:],
                                  din[(heads + kv) * dim:]), strides, options, dt, 1)
    din = din.reshape(batch, seq, width)
    parts = np.split(din, [heads * dim, (heads + kv) * dim], axis=-1)
    for name, part, w in zip(("dq", "dk", "dv"), parts, want[2:]):
        got = np.ascontiguousarray(part.reshape(batch, seq, -1, dim).transpose(0, 2, 1, 3))
        assert ref.same_bits(got, w), name


def run_op(backend, case, dt="f32"):
    """(out, lse, dq, dk, dv) through _C_testing.run_op on `backend`."""
    q, k, v, dout, options = make(case, dt)
    batch, heads, seq, dim = q.shape
    args = (batch, heads, seq, dim, options["causal"], 1.0 / math.sqrt(dim), options["dropout_p"],
            *KEY.values(), dt, k.shape[1], options["window"])
    out, lse = np.zeros_like(q), np.zeros((batch, heads, seq), np.float32)
    lengths, starts = options["key_lengths"], options["key_starts"]
    _C_testing.run_op(backend, "attention_forward", [q, k, v, out, lse, lengths, starts], args)
    grads = [np.full_like(q, np.nan), np.full_like(k, np.nan), np.full_like(v, np.nan)]
    _C_testing.run_op(backend, "attention_backward", [q, k, v, out, lse, dout, *grads, lengths, starts], args)
    return out, lse, *grads


def test_run_op_on_the_cpu_is_the_functional_op():
    for case in (CASES[1], CASES[5]):
        got, want = run_op("cpu", case), run_functional(*make(case))
        assert all(ref.same_bits(a, b) for a, b in zip(got, want))


@pytest.mark.sim
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_the_simulated_device_gives_the_cpu_bits(dt):
    for case in (CASES[2], CASES[5], CASES[7]):
        for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), run_op("sim", case, dt), run_op("cpu", case, dt)):
            assert ref.same_bits(a, b), f"{case} {name}"


def test_thread_counts_keep_the_bits():
    case = (2, 4, 2, 130, 16, True, 40, "packed", True, 0.1)
    with ref.num_threads(1):
        one = run_functional(*make(case))
    with ref.num_threads(2):
        two = run_functional(*make(case))
    assert all(ref.same_bits(a, b) for a, b in zip(one, two))


# --- bad arguments -------------------------------------------------------------------------------


def test_bad_arguments_raise_naming_them():
    q, k, v, _, _ = make((2, 4, 2, 5, 8, True, 0, "none", False, 0.0))
    with pytest.raises(ValueError, match=r"k must be \(batch, kv_heads, seq, head_dim\).*dividing q's 4 heads"):
        F.scaled_dot_product_attention(q, k[:, :1].repeat(3, axis=1), v[:, :1].repeat(3, axis=1))
    with pytest.raises(ValueError, match="v must have k's shape"):
        F.scaled_dot_product_attention(q, k, v[:, :1])
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        F.scaled_dot_product_attention(q, k, v, window=-1)
    with pytest.raises(ValueError, match="window must be an int"):
        F.scaled_dot_product_attention(q, k, v, window=2.5)
    with pytest.raises(ValueError, match=r"key_starts must have shape \(2, 5\)"):
        F.scaled_dot_product_attention(q, k, v, key_starts=np.zeros((2, 4), np.int64))
    with pytest.raises(TypeError, match="key_starts must be an integer array"):
        F.scaled_dot_product_attention(q, k, v, key_starts=np.zeros((2, 5)))
    out, lse = F.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match=r"dv: shape \(2, 4, 5, 8\) does not match k's shape \(2, 2, 5, 8\)"):
        _C.op_attention(out, lse.reshape(-1), q, k, v, "f32", True, 0.5, None, 0.0, 0, 0, 0, 0,
                        dout=out, dq=np.empty_like(q), dk=np.empty_like(k), dv=np.empty_like(q))
    with pytest.raises(ValueError, match="window: must be >= 0"):
        _C.op_attention(out, lse.reshape(-1), q, k, v, "f32", True, 0.5, None, 0.0, 0, 0, 0, 0, window=-2)
    with pytest.raises(ValueError, match=r"kv_heads: must be >= 1 and divide heads \(4\), got 3"):
        _C_testing.run_op("cpu", "attention_forward", [q, np.zeros((2, 3, 5, 8), np.float32),
                                               np.zeros((2, 3, 5, 8), np.float32), out,
                                               np.zeros((2, 4, 5), np.float32), None, None],
                  (2, 4, 5, 8, True, 0.5, 0.0, 0, 0, 0, 0, "f32", 3, 0))


# --- the layer kind --------------------------------------------------------------------------------


class Core(nn.Module):
    """The raw attention kind, as a decoder family module writes it."""

    def __init__(self, embed_dim, heads, kv_heads, head_dim, window, scale, causal=True, dropout=0.0):
        super().__init__()
        self.args = (embed_dim, heads, dropout, causal, kv_heads, head_dim, window, scale)

    def _spec(self) -> tuple:
        return ("attention", *self.args)


def test_the_layer_reads_the_fused_projection_and_matches_the_op():
    """H = 4 query heads of D = 24 (embed_dim = H D = 96, as a decoder passes it), K = 2 kv heads,
    window 5, Gemma-style scale: the layer's (B, T, H D) output is the op's on the split input."""
    batch, seq, heads, kv, dim, window, scale = 2, 11, 4, 2, 24, 5, 0.125
    model = nn.Sequential(Core(heads * dim, heads, kv, dim, window, scale))
    rng = np.random.default_rng(4)
    x = rng.standard_normal((batch, seq, (heads + 2 * kv) * dim)).astype(np.float32)
    out = model(x)
    assert out.shape == (batch, seq, heads * dim)
    split = np.split(x, [heads * dim, (heads + kv) * dim], axis=-1)
    q, k, v = (np.ascontiguousarray(p.reshape(batch, seq, -1, dim).transpose(0, 2, 1, 3)) for p in split)
    want, _ = F.scaled_dot_product_attention(q, k, v, causal=True, window=window, scale=scale)
    assert ref.same_bits(out, np.ascontiguousarray(want.transpose(0, 2, 1, 3)).reshape(out.shape))
    x = rng.standard_normal((batch, seq, 3 * heads * dim)).astype(np.float32)
    default = nn.Sequential(Core(heads * dim, heads, 0, 0, 0, 0.0))(x)
    q, k, v = (np.ascontiguousarray(p.reshape(batch, seq, -1, dim).transpose(0, 2, 1, 3))
               for p in np.split(x, 3, axis=-1))
    # scale 0.0: 1 / sqrt(D) as MultiheadAttention always had it, rounded in float32 arithmetic
    want, _ = F.scaled_dot_product_attention(q, k, v, causal=True,
                                             scale=float(np.float32(1) / np.sqrt(np.float32(dim))))
    assert ref.same_bits(default, np.ascontiguousarray(want.transpose(0, 2, 1, 3)).reshape(default.shape))


def gqa_model(precision_seed=0):
    gt.random.manual_seed(precision_seed)
    heads, kv, dim = 4, 2, 8
    return nn.Sequential(nn.Linear(12, (heads + 2 * kv) * dim, bias=False),
                         Core(heads * dim, heads, kv, dim, 6, 0.0, dropout=0.1),
                         nn.Linear(heads * dim, 3))


def test_a_training_step_matches_the_reference_gradients():
    """Linear -> attention (K = 2 of H = 4, window 6) -> Linear with MSE: every parameter gradient
    from the float64 reference (the op's backward through the fused layout)."""
    model = nn.Sequential(nn.Linear(12, 64, bias=False), Core(32, 4, 2, 8, 6, 0.0), nn.Linear(32, 3, bias=False))
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 9, 12)).astype(np.float32)
    y = rng.standard_normal((2, 9, 3)).astype(np.float32)
    w1, w2 = (ref.f64(p.data) for p in model.parameters())
    qkv = ref.f64(x) @ w1.T
    q, k, v = (p.reshape(2, 9, -1, 8).transpose(0, 2, 1, 3) for p in np.split(qkv, [32, 48], axis=-1))
    att, _ = aref.attention(q, k, v, True, window=6)
    h = att.transpose(0, 2, 1, 3).reshape(2, 9, 32)
    pred = h @ w2.T
    dpred = 2 * (pred - y) / pred.size
    dw2 = dpred.reshape(-1, 3).T @ h.reshape(-1, 32)
    dh = (dpred @ w2).reshape(2, 9, 4, 8).transpose(0, 2, 1, 3)
    dq, dk, dv = aref.attention_backward(dh, q, k, v, True, window=6)
    dqkv = np.concatenate([g.transpose(0, 2, 1, 3).reshape(2, 9, -1) for g in (dq, dk, dv)], axis=-1)
    dw1 = dqkv.reshape(-1, 64).T @ ref.f64(x).reshape(-1, 12)
    out = gt.TrainStep(model, nn.MSELoss())(x, y)
    assert out.loss == pytest.approx(np.mean((pred - y) ** 2), rel=1e-5)
    for got, want in zip((p.grad for p in model.parameters()), (dw1, dw2)):
        assert np.linalg.norm(got - want) <= 2e-5 * np.linalg.norm(want) + 1e-7


@pytest.mark.sim
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_training_step_on_sim_gives_the_cpu_bits(precision):
    def trained(device):
        model = gqa_model()
        if device != "cpu":
            model = model.to(device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                            precision=precision)
        rng = np.random.default_rng(1)
        losses = [step(rng.standard_normal((3, 10, 12)).astype(np.float32), rng.integers(0, 3, (3, 10))).loss
                  for _ in range(2)]
        return losses, model.state_dict()

    (cpu_losses, cpu_state), (sim_losses, sim_state) = trained("cpu"), trained("sim")
    assert cpu_losses == sim_losses
    assert all(ref.same_bits(cpu_state[k], sim_state[k]) for k in cpu_state)


def test_multihead_attention_passes_the_defaults():
    layer = nn.MultiheadAttention(8, 2, causal=True)
    spec = layer._spec_in({})
    assert spec[1][1] == ("attention", 8, 2, 0.0, True, 0, 0, 0, 0.0)


@pytest.mark.parametrize("spec, error, match", [
    (("attention", 64, 4, 0.0, True, 3, 16, 0, 0.0), ValueError,
     r"num_kv_heads: must divide num_heads \(4\), got 3"),
    (("attention", 64, 4, 0.0, True, 2, 24, 0, 0.0), ValueError,
     r"embed_dim: must be num_heads \* head_dim = 4 \* 24 when head_dim is given, got 64"),
    (("attention", 66, 4, 0.0, True, 0, 0, 0, 0.0), ValueError,
     r"MultiheadAttention needs embed_dim divisible by num_heads"),
    (("attention", 64, 4, 0.0, True, -1, 0, 0, 0.0), ValueError, r"MultiheadAttention num_kv_heads must be at least 0, got -1"),
    (("attention", 64, 4, 0.0, True, 0, 0, -4, 0.0), ValueError, r"MultiheadAttention window must be at least 0, got -4"),
    (("attention", 64, 4, 0.0, True, 0, 0, 0, -0.5), ValueError, r"scale must be in \[0, "),
    (("attention", 64, 4, 0.0, True, 0, 0, 0, 1e300), ValueError, r"scale: must be a finite float"),
    (("attention", 64, 4, 0.0, True), TypeError, r"takes 8 arguments \(embed_dim, num_heads, dropout, "
     r"causal, num_kv_heads, head_dim, window, scale\) after its kind, got 4"),
])
def test_spec_errors_name_the_argument(spec, error, match):
    with pytest.raises(error, match=match):
        _C.Model([spec], 0)


def test_a_wrong_input_width_is_refused_naming_the_layer():
    model = nn.Sequential(nn.Linear(5, 96), Core(96, 4, 2, 24, 0, 0.0))  # wants (4 + 4) 24 = 192
    with pytest.raises(ValueError, match=r"Attention\(num_heads=4, num_kv_heads=2, head_dim=24, window=0\)\) "
                                         r"expects 192 input features, but the layer before it gives 96"):
        model(np.zeros((1, 3, 5), np.float32))
