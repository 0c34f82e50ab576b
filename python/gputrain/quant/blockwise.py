"""bitsandbytes-format quantization on the C path (ops.h quantize_blockwise /
dequantize_blockwise, run by the CPU backend or a device's op table). Arguments are checked here
before anything runs; the results equal gputrain.quant.reference bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np

from gputrain import _C
from gputrain._cast import bfloat16, is_bfloat16
from gputrain.quant.codes import DYNAMIC_SIGNED, code_table, sorted_bounds

BLOCKSIZES_4BIT = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # bitsandbytes' quantize_4bit
DTYPES = ("f32", "f16", "bf16")


def value_bits(x: Any, arg: str = "x") -> tuple[np.ndarray, str]:
    """(contiguous values, 'f32' / 'f16' / 'bf16') of a float32, float16 or ml_dtypes.bfloat16
    array (bf16 as uint16 bit patterns). Refuses other dtypes and non-finite values."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{arg} must be a numpy.ndarray, not {type(x).__name__}")
    if x.dtype == np.float32:
        out, dt = np.ascontiguousarray(x), "f32"
    elif x.dtype == np.float16:
        out, dt = np.ascontiguousarray(x).view(np.uint16), "f16"
    elif is_bfloat16(x.dtype):
        out, dt = np.ascontiguousarray(x).view(np.uint16), "bf16"
    else:
        raise TypeError(f"{arg}: dtype {x.dtype} cannot be quantized (float32, float16 or bfloat16)")
    return out, dt


def check_finite(x: np.ndarray, arg: str = "x") -> None:
    """Refuses NaN and infinities (bitsandbytes turns a NaN's whole block into NaN absmax and code
    255 / 15; gputrain refuses instead)."""
    bad = ~np.isfinite(x.astype(np.float32, copy=False)) if x.dtype != np.uint16 else None
    if bad is None:
        return
    if bad.any():
        index = np.unravel_index(int(np.argmax(bad)), x.shape)
        raise ValueError(f"{arg}: element {tuple(int(i) for i in index)} is not finite "
                         "(NaN and infinities cannot be quantized)")


def _finite_bits(bits: np.ndarray, dt: str, arg: str) -> None:
    exp = (bits >> 10) & 0x1F if dt == "f16" else (bits >> 7) & 0xFF
    bad = exp == (0x1F if dt == "f16" else 0xFF)
    if bad.any():
        index = np.unravel_index(int(np.argmax(bad)), bits.shape)
        raise ValueError(f"{arg}: element {tuple(int(i) for i in index)} is not finite "
                         "(NaN and infinities cannot be quantized)")


def prepared(x: Any, arg: str = "x") -> tuple[np.ndarray, str]:
    """value_bits, then the finiteness check."""
    v, dt = value_bits(x, arg)
    if dt == "f32":
        check_finite(v, arg)
    else:
        _finite_bits(v, dt, arg)
    return v, dt


def as_dtype(values: np.ndarray, dt: str) -> np.ndarray:
    """C results (f32, f16, or bf16 uint16 bits) as a NumPy array of that dtype (bf16: ml_dtypes'
    bfloat16 when installed, else its uint16 bits)."""
    if dt == "bf16":
        bf = bfloat16()
        return values.view(bf) if bf is not None else values.view(np.uint16)
    return values


def dtype_name(dtype: Any) -> str:
    """'f32', 'f16' or 'bf16' for a dtype argument given as those names or a NumPy dtype."""
    if isinstance(dtype, str):
        names = {"f32": "f32", "float32": "f32", "f16": "f16", "float16": "f16", "bf16": "bf16",
                 "bfloat16": "bf16"}
        if dtype in names:
            return names[dtype]
        raise ValueError(f"dtype must be 'f32', 'f16' or 'bf16', got {dtype!r}")
    d = np.dtype(dtype)
    if d == np.float32:
        return "f32"
    if d == np.float16:
        return "f16"
    if is_bfloat16(d):
        return "bf16"
    raise ValueError(f"dtype must be float32, float16 or bfloat16, got {d}")


def check_blocksize(blocksize: Any, allowed: tuple[int, ...] | None) -> int:
    """blocksize as an int: > 0, and one of `allowed` unless that is None."""
    if isinstance(blocksize, bool) or not isinstance(blocksize, (int, np.integer)):
        raise TypeError(f"blocksize must be an int, not {type(blocksize).__name__}")
    if allowed is not None and int(blocksize) not in allowed:
        raise ValueError(f"blocksize must be one of {allowed} (bitsandbytes' 4-bit block sizes), got {blocksize}")
    if blocksize <= 0:
        raise ValueError(f"blocksize must be > 0, got {blocksize}")
    return int(blocksize)


def quantize_codes(x: Any, code: np.ndarray, blocksize: int, bits: int, device: str = "cpu"
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(codes, absmax) of x with a (1 << bits)-entry code, on the C path."""
    v, dt = prepared(x)
    bounds, order = sorted_bounds(code)
    return _C.quantize_blockwise(v.reshape(-1), dt, bounds, order, blocksize, bits, device)


def dequantize_codes(codes: np.ndarray, absmax: np.ndarray, code: np.ndarray, n: int, blocksize: int,
                     bits: int, dtype: str, device: str = "cpu") -> np.ndarray:
    """n values code[c] * absmax, rounded to dtype, on the C path (flat)."""
    codes = np.ascontiguousarray(codes).reshape(-1)
    if codes.dtype != np.uint8:
        raise TypeError(f"codes must hold uint8, not {codes.dtype}")
    absmax = np.ascontiguousarray(absmax)
    if absmax.dtype != np.float32:
        raise TypeError(f"absmax must hold float32, not {absmax.dtype}")
    out = _C.dequantize_blockwise(codes, absmax.reshape(-1), np.ascontiguousarray(code, np.float32), n,
                                  blocksize, bits, dtype, device)
    return as_dtype(out, dtype)


def quantize_blockwise(x: Any, code: np.ndarray | None = None, blocksize: int = 256, device: str = "cpu"
                       ) -> tuple[np.ndarray, np.ndarray]:
    """bitsandbytes.functional.quantize_blockwise: (uint8 codes shaped like x, float32 absmax per
    block). code: a sorted 256-entry map (default create_dynamic_map(signed=True); the 8-bit
    optimizers' second moment uses DYNAMIC_UNSIGNED)."""
    code = DYNAMIC_SIGNED if code is None else np.asarray(code, np.float32)
    if code.shape != (256,) or not (np.diff(code) >= 0).all():
        raise ValueError(f"code must be 256 sorted float32 values, got shape {code.shape}")
    blocksize = check_blocksize(blocksize, None)
    codes, absmax = quantize_codes(x, code, blocksize, 8, device)
    return codes.reshape(np.shape(x)), absmax


def dequantize_blockwise(codes: np.ndarray, absmax: np.ndarray, code: np.ndarray | None = None,
                         blocksize: int = 256, dtype: Any = "f32", device: str = "cpu") -> np.ndarray:
    """bitsandbytes.functional.dequantize_blockwise: code[codes] * absmax of each block, in dtype,
    shaped like codes."""
    code = DYNAMIC_SIGNED if code is None else np.asarray(code, np.float32)
    if code.shape != (256,):
        raise ValueError(f"code must have 256 entries, got shape {code.shape}")
    blocksize = check_blocksize(blocksize, None)
    codes = np.asarray(codes)
    out = dequantize_codes(codes, absmax, code, codes.size, blocksize, 8, dtype_name(dtype), device)
    return out.reshape(codes.shape)


def quantize_4bit_codes(x: Any, quant_type: str, blocksize: int, device: str = "cpu"
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(packed bytes, absmax) of x in NF4/FP4 (no double quantization)."""
    code = code_table(quant_type)
    blocksize = check_blocksize(blocksize, BLOCKSIZES_4BIT)
    return quantize_codes(x, code, blocksize, 4, device)
