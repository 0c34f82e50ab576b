"""gputrain.quant against bitsandbytes 0.50 (fixtures written by tests/fixtures/make_quant_fixtures.py
in a side environment): the C path (CPU and sim) and the NumPy reference give bitsandbytes' bytes,
absmax and dequantized values bit for bit, and bad input is refused before anything changes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gputrain import quant
from gputrain._cast import bfloat16
from gputrain.quant import blockwise, codes, reference

import _reference as ref

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "quant")
FIX = np.load(os.path.join(HERE, "bnb_quant.npz"))
DTS = ("f32", "bf16", "f16")


def as_array(values: np.ndarray, dt: str) -> np.ndarray:
    """Fixture values (halves as uint16 bits) as the array a user hands in."""
    if dt == "f32":
        return values
    if dt == "f16":
        return values.view(np.float16)
    assert bfloat16() is not None, "bf16 arrays need ml_dtypes (in the test extra)"
    return values.view(bfloat16())


def to_f32(values: np.ndarray, dt: str) -> np.ndarray:
    return values if dt == "f32" else reference.half_bits_to_f32(values, dt)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a).reshape(-1), np.ascontiguousarray(b).reshape(-1)
    return a.nbytes == b.nbytes and a.view(np.uint8).tobytes() == b.view(np.uint8).tobytes()


def plus_zero(values: np.ndarray, dt: str) -> np.ndarray:
    """values with -0.0 turned into +0.0 (f32 or half bits)."""
    v = np.ascontiguousarray(values).reshape(-1)
    if dt == "f32":
        return np.where(v == 0, np.float32(0), v)
    bits = v.view(np.uint16)
    return np.where(bits == 0x8000, np.uint16(0), bits)


def fp4_deq_matches(got: np.ndarray, deq: np.ndarray, dt: str, n: int) -> bool:
    """bitsandbytes' CPU dequantize_4bit falls back to its torch path for an odd last dimension,
    whose FP4 table holds +0.0 at code 8 where its C and CUDA kernels give -0.0 (codes.py): there
    the two may differ in the sign of zero only."""
    return same_bits(got, deq) or (n % 2 == 1 and same_bits(plus_zero(got, dt), plus_zero(deq, dt)))


def cases(prefix: str) -> list[str]:
    return sorted({k.rsplit("_meta", 1)[0] for k in FIX.files if k.startswith(prefix) and k.endswith("_meta")})


def test_codebooks_are_bitsandbytes():
    assert same_bits(codes.NF4, FIX["code_nf4"])
    assert same_bits(codes.DYNAMIC_SIGNED, FIX["code_dynamic"])
    assert same_bits(codes.DYNAMIC_UNSIGNED, FIX["code_dynamic_unsigned"])
    # FP4: the same values; code 8 is -0.0 as bitsandbytes' dequantization kernels decode it
    assert np.array_equal(codes.FP4, FIX["code_fp4"]) and np.signbit(codes.FP4[8])


@pytest.mark.parametrize("key", cases("q4_"))
def test_4bit_matches_bitsandbytes(key):
    fp4, dti, bs = (int(v) for v in FIX[key + "_meta"])
    dt, qt = DTS[dti], "fp4" if fp4 else "nf4"
    x, packed, absmax, deq = (FIX[key + s] for s in ("_x", "_packed", "_absmax", "_deq"))
    code = codes.code_table(qt)
    ref_packed, ref_absmax = reference.quantize_4bit(to_f32(x, dt), code, bs)
    assert same_bits(ref_packed, packed) and same_bits(ref_absmax, absmax)
    for device in ("cpu", "sim:0"):
        c_packed, state = quant.quantize_4bit(as_array(x, dt), blocksize=bs, quant_type=qt, device=device)
        assert same_bits(c_packed, packed) and same_bits(state.absmax, absmax), device
        assert same_bits(state.code, FIX["code_fp4" if fp4 else "code_nf4"])
        got = quant.dequantize_4bit(c_packed, state, device=device)
        assert fp4_deq_matches(got, deq, dt, x.size) if fp4 else same_bits(got, deq), device
    ref_deq = reference.dequantize_4bit(packed, absmax, code, bs, x.size)
    ref_deq = ref_deq if dt == "f32" else reference.f32_to_half_bits(ref_deq, dt)
    assert fp4_deq_matches(ref_deq, deq, dt, x.size) if fp4 else same_bits(ref_deq, deq)


@pytest.mark.parametrize("key", cases("q8_"))
def test_8bit_matches_bitsandbytes(key):
    signed, dti, bs = (int(v) for v in FIX[key + "_meta"])
    dt = DTS[dti]
    code = codes.DYNAMIC_SIGNED if signed else codes.DYNAMIC_UNSIGNED
    x, q, absmax, deq = (FIX[key + s] for s in ("_x", "_q", "_absmax", "_deq"))
    ref_q, ref_absmax = reference.quantize_blockwise(to_f32(x, dt), code, bs)
    assert same_bits(ref_q, q) and same_bits(ref_absmax, absmax)
    for device in ("cpu", "sim:0"):
        c_q, c_absmax = quant.quantize_blockwise(as_array(x, dt), code, blocksize=bs, device=device)
        assert c_q.shape == x.shape and same_bits(c_q, q) and same_bits(c_absmax, absmax), device
        out = quant.dequantize_blockwise(c_q, c_absmax, code, blocksize=bs, dtype=dt, device=device)
        assert same_bits(out, deq), device


def test_double_quantization_matches_bitsandbytes():
    x = as_array(FIX["dq_x"], "bf16")
    packed, state = quant.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=True)
    assert same_bits(packed, FIX["dq_packed"]) and same_bits(state.absmax, FIX["dq_qabsmax"])
    assert np.float32(state.offset) == FIX["dq_offset"][0]
    assert same_bits(state.nested_absmax, FIX["dq_absmax2"]) and state.nested_blocksize == 256
    for device in ("cpu", "sim:0"):
        assert same_bits(quant.dequantize_4bit(packed, state, device=device), FIX["dq_deq"])


def test_int8_rowwise_matches_bitsandbytes():
    w = FIX["i8_w"].view(np.float16)
    q, scale = quant.int8_vectorwise_quant(w)
    assert np.array_equal(q, FIX["i8_q"]) and same_bits(scale, FIX["i8_scale"])
    assert same_bits(quant.int8_vectorwise_dequant(q, scale), FIX["i8_deq"])


def test_bnb4bit_checkpoint_reads_dequantizes_and_writes_back():
    from safetensors.numpy import load_file
    path = os.path.join(HERE, "bnb4bit_layer.safetensors")
    packed, state = quant.read_bnb4bit(path, "model.proj.weight")
    assert state.quant_type == "nf4" and state.shape == (48, 192) and state.dtype == "bf16" and state.nested
    expected = np.load(os.path.join(HERE, "bnb4bit_layer_dequant.npy"))
    assert same_bits(quant.dequantize_4bit(packed, state), expected)
    file = {k: v for k, v in load_file(path).items() if k.startswith("model.proj.weight.")}
    written = {"model.proj.weight." + k: v for k, v in quant.to_tensors(state).items()}
    assert sorted(written) == sorted(file)
    for k, v in file.items():
        assert written[k].dtype == v.dtype and written[k].shape == v.shape and same_bits(written[k], v), k


@pytest.mark.parametrize("dt", DTS)
def test_c_path_equals_reference_on_random_input(dt):
    rng = np.random.default_rng(0)
    for n, bs in ((1, 64), (63, 32), (1000, 64), (4097, 4096), (777, 128)):
        x32 = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
        bits = x32 if dt == "f32" else reference.f32_to_half_bits(x32, dt)
        x = as_array(bits, dt)
        for qt in ("nf4", "fp4"):
            packed, state = quant.quantize_4bit(x, blocksize=bs, quant_type=qt)
            ref_packed, ref_absmax = reference.quantize_4bit(to_f32(bits, dt), codes.code_table(qt), bs)
            assert same_bits(packed, ref_packed) and same_bits(state.absmax, ref_absmax)
        q, absmax = quant.quantize_blockwise(x, blocksize=256)
        ref_q, ref_absmax = reference.quantize_blockwise(to_f32(bits, dt), codes.DYNAMIC_SIGNED, 256)
        assert same_bits(q, ref_q) and same_bits(absmax, ref_absmax)


@pytest.mark.parametrize("dt", DTS)
def test_4bit_dequantization_gives_the_reference_bits_at_every_simd_level(dt):
    """The vector kernels (whole vectors of a block) and the scalar tail, for blocks shorter and
    longer than a vector, odd counts, and scales that round to ties, f16 subnormals, inf and NaN."""
    rng = np.random.default_rng(3)
    scales = np.array([1.0, 3.0e-6, 7.0e4, 1e38, np.inf, np.nan, 1.0 + 2.0 ** -9, 0.0], np.float32)
    for qt in ("nf4", "fp4"):
        code = codes.code_table(qt)
        for n, bs in ((1, 64), (31, 32), (33, 32), (1000, 64), (4097, 128), (9000, 4096)):
            packed = rng.integers(0, 256, (n + 1) // 2, dtype=np.uint8)
            absmax = rng.choice(scales, -(-n // bs)) * rng.uniform(0.5, 2.0, -(-n // bs)).astype(np.float32)
            with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are among the cases
                want = reference.dequantize_4bit(packed, absmax, code, bs, n)
                want = want if dt == "f32" else reference.f32_to_half_bits(want, dt)
            for level in ref.simd_levels():
                with ref.simd_level(level):
                    got = blockwise.dequantize_codes(packed, absmax, code, n, bs, 4, dt)
                assert same_bits(got, want), (qt, n, bs, level)


@pytest.mark.parametrize("dt", DTS)
def test_8bit_dequantization_gives_the_reference_bits_at_every_simd_level(dt):
    """The gathering kernels and the scalar table and element paths, for blocks shorter and
    longer than a vector and than the table's threshold, with the signed and unsigned maps."""
    rng = np.random.default_rng(4)
    scales = np.array([1.0, 3.0e-6, 7.0e4, 1e38, np.inf, np.nan, 1.0 + 2.0 ** -9, 0.0], np.float32)
    for code in (codes.DYNAMIC_SIGNED, codes.DYNAMIC_UNSIGNED):
        for n, bs in ((1, 256), (15, 256), (17, 8), (1000, 256), (5000, 4096), (3 * 1031, 1031)):
            q = rng.integers(0, 256, n, dtype=np.uint8)
            absmax = rng.choice(scales, -(-n // bs)) * rng.uniform(0.5, 2.0, -(-n // bs)).astype(np.float32)
            with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are among the cases
                want = reference.dequantize_blockwise(q, absmax, code, bs)
                want = want if dt == "f32" else reference.f32_to_half_bits(want, dt)
            for level in ref.simd_levels():
                with ref.simd_level(level):
                    got = blockwise.dequantize_codes(q, absmax, code, n, bs, 8, dt)
                assert same_bits(got, want), (n, bs, level)


def test_bad_input_is_refused_and_nothing_changes():
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    before = x.copy()
    with pytest.raises(ValueError, match="blocksize must be one of"):
        quant.quantize_4bit(x, blocksize=48)
    with pytest.raises(ValueError, match="blocksize must be > 0"):
        quant.quantize_blockwise(x, blocksize=0)
    with pytest.raises(TypeError, match="float64"):
        quant.quantize_4bit(x.astype(np.float64))
    with pytest.raises(TypeError, match="int32"):
        quant.quantize_blockwise(np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="quant_type"):
        quant.quantize_4bit(x, quant_type="int4")
    bad = x.copy()
    bad[7] = np.nan
    with pytest.raises(ValueError, match=r"element \(7,\) is not finite"):
        quant.quantize_4bit(bad)
    with pytest.raises(ValueError, match=r"element \(3,\) is not finite"):
        quant.quantize_blockwise(np.array([0, 1, 2, np.inf], np.float16))
    q, absmax = quant.quantize_blockwise(x)
    with pytest.raises(ValueError, match="absmax: has 2 elements, expected 1"):
        quant.dequantize_blockwise(q, np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="dtype must be"):
        quant.dequantize_blockwise(q, absmax, dtype="f64")
    with pytest.raises(ValueError, match="w must be 2-D"):
        quant.int8_vectorwise_quant(x)
    assert same_bits(x, before)
    packed, state = quant.quantize_4bit(x, compress_statistics=True)
    tensors = quant.to_tensors(state)
    for key, damage in (("absmax", np.zeros(3, np.uint8)), ("quant_map", np.zeros(15, np.float32)),
                        ("nested_absmax", None)):
        broken = dict(tensors)
        if damage is None:
            del broken[key]
            broken["nested_quant_map"] = tensors["nested_quant_map"]
            with pytest.raises(ValueError, match="'absmax' has dtype uint8"):
                quant.from_tensors(broken)
        else:
            broken[key] = damage
            with pytest.raises(ValueError, match=key):
                quant.from_tensors(broken)
    broken = dict(tensors)
    broken["quant_state.bitsandbytes__nf4"] = np.frombuffer(b"{not json", np.uint8)
    with pytest.raises(ValueError, match="not UTF-8 JSON"):
        quant.from_tensors(broken)
    assert same_bits(quant.to_tensors(quant.from_tensors(tensors))["absmax"], tensors["absmax"])


def test_refcounts_do_not_leak():
    import sys
    x = np.ones(1000, np.float32)
    bounds, order = codes.sorted_bounds(codes.NF4)
    from gputrain import _C
    counts = [sys.getrefcount(a) for a in (x, bounds, order)]
    for _ in range(50):
        packed, absmax = _C.quantize_blockwise(x, "f32", bounds, order, 64, 4)
        _C.dequantize_blockwise(packed, absmax, codes.NF4, x.size, 64, 4, "f32")
    assert counts == [sys.getrefcount(a) for a in (x, bounds, order)]
