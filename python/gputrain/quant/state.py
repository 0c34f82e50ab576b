"""QuantState: a 4-bit tensor's quantization state as bitsandbytes' QuantState holds it, its
double quantization (compress_statistics), and its tensors in a "bnb-4bit" safetensors checkpoint
(bitsandbytes' QuantState.as_dict(packed=True) / from_dict)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain.quant import blockwise
from gputrain.quant.codes import DYNAMIC_SIGNED, code_table

_DTYPE_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
NESTED_BLOCKSIZE = 256  # bitsandbytes' quantize_4bit(compress_statistics=True)


@dataclass
class QuantState:
    """The state of one NF4/FP4 tensor. Without double quantization absmax is float32 (one per
    block); with it (nested) absmax holds uint8 codes of absmax - offset, quantized blockwise with
    nested_code (the signed dynamic map) and nested_blocksize, nested_absmax one float32 per nested
    block."""

    quant_type: str                 # "nf4" or "fp4"
    blocksize: int                  # elements per block (32 ... 4096)
    shape: tuple[int, ...]          # shape of the original tensor
    dtype: str                      # its dtype: "f32", "f16" or "bf16"
    absmax: np.ndarray              # (blocks,) float32, or uint8 codes when nested
    code: np.ndarray                # (16,) float32: bitsandbytes' quant_map
    offset: float | None = None     # nested: the mean subtracted before quantizing absmax (an f32)
    nested_absmax: np.ndarray | None = None   # nested: (ceil(blocks / 256),) float32
    nested_code: np.ndarray | None = None     # nested: (256,) float32 map
    nested_blocksize: int | None = None       # nested: 256

    @property
    def nested(self) -> bool:
        """Whether absmax is double-quantized (compress_statistics)."""
        return self.nested_absmax is not None

    def block_absmax(self, device: str = "cpu") -> np.ndarray:
        """The float32 absmax of every block (undoing double quantization: bitsandbytes'
        dequantize_blockwise(absmax, state2) + offset, in float32)."""
        if not self.nested:
            return np.asarray(self.absmax, np.float32)
        assert self.nested_code is not None and self.nested_blocksize is not None
        am = blockwise.dequantize_codes(self.absmax, self.nested_absmax, self.nested_code, self.absmax.size,
                                        self.nested_blocksize, 8, "f32", device)
        return (am + np.float32(self.offset)).astype(np.float32)


def quantize_4bit(x: Any, blocksize: int = 64, quant_type: str = "nf4", compress_statistics: bool = False,
                  device: str = "cpu") -> tuple[np.ndarray, QuantState]:
    """bitsandbytes.functional.quantize_4bit: (packed uint8 of shape (ceil(n / 2), 1), QuantState).
    compress_statistics quantizes the absmax as bitsandbytes does: offset = mean(absmax) (f32),
    then 8-bit blockwise (blocksize 256, the signed dynamic map) of absmax - offset."""
    dt = blockwise.value_bits(x)[1]
    packed, absmax = blockwise.quantize_4bit_codes(x, quant_type, blocksize, device)
    quant_map = code_table(quant_type).copy()
    quant_map[quant_map == 0] = 0.0  # bitsandbytes' quant_map (get_4bit_type) holds +0.0 at FP4's code 8
    state = QuantState(quant_type, int(blocksize), tuple(np.shape(x)), dt, absmax, quant_map)
    if compress_statistics:
        offset = np.float32(np.mean(absmax, dtype=np.float64))
        qabs, abs2 = blockwise.quantize_codes((absmax - offset).astype(np.float32), DYNAMIC_SIGNED,
                                              NESTED_BLOCKSIZE, 8, device)
        state.absmax, state.offset = qabs, float(offset)
        state.nested_absmax, state.nested_code = abs2, DYNAMIC_SIGNED.copy()
        state.nested_blocksize = NESTED_BLOCKSIZE
    return packed.reshape(-1, 1), state


def dequantize_4bit(packed: np.ndarray, state: QuantState, device: str = "cpu") -> np.ndarray:
    """bitsandbytes.functional.dequantize_4bit: the tensor of state.shape and state.dtype."""
    n = int(np.prod(state.shape))
    code = np.asarray(state.code, np.float32)
    if state.quant_type == "fp4":
        code = code_table("fp4")  # bitsandbytes' kernels decode code 8 as -0.0 (codes.py)
    out = blockwise.dequantize_codes(np.asarray(packed), state.block_absmax(device), code, n, state.blocksize,
                                     4, state.dtype, device)
    return out.reshape(state.shape)


def _json_key(quant_type: str) -> str:
    return f"quant_state.bitsandbytes__{quant_type}"


def to_tensors(state: QuantState) -> dict[str, np.ndarray]:
    """The state's tensors under a weight's name ("<weight>." + key), as bitsandbytes' as_dict(packed=True)
    writes them: absmax, quant_map, [nested_absmax, nested_quant_map,] and a uint8 JSON of the rest."""
    info: dict[str, Any] = {"quant_type": state.quant_type, "blocksize": state.blocksize,
                            "dtype": _DTYPE_NAMES[state.dtype], "shape": list(state.shape)}
    out = {"absmax": np.asarray(state.absmax), "quant_map": np.asarray(state.code, np.float32)}
    if state.nested:
        out["nested_absmax"] = np.asarray(state.nested_absmax, np.float32)
        out["nested_quant_map"] = np.asarray(state.nested_code, np.float32)
        info.update(nested_blocksize=state.nested_blocksize, nested_dtype="float32", nested_offset=state.offset)
    out[_json_key(state.quant_type)] = np.frombuffer(json.dumps(info).encode("utf-8"), np.uint8).copy()
    return out


def _tensor(tensors: dict[str, np.ndarray], key: str, dtype: Any, where: str) -> np.ndarray:
    if key not in tensors:
        raise ValueError(f"{where}: tensor {key!r} is missing")
    t = np.asarray(tensors[key])
    if t.dtype != dtype:
        raise ValueError(f"{where}: tensor {key!r} has dtype {t.dtype}, expected {np.dtype(dtype)}")
    return t


def from_tensors(tensors: dict[str, np.ndarray], where: str = "quant_state") -> QuantState:
    """A QuantState from a weight's quant-state tensors (keys without the "<weight>." prefix):
    absmax, quant_map, optional nested_absmax / nested_quant_map, and one
    quant_state.bitsandbytes__nf4 / __fp4 JSON. Refuses anything missing or inconsistent."""
    keys = [k for k in tensors if k.startswith("quant_state.bitsandbytes__")]
    if len(keys) != 1 or keys[0].rsplit("__", 1)[1] not in ("nf4", "fp4"):
        raise ValueError(f"{where}: expected one quant_state.bitsandbytes__nf4 or __fp4 tensor, found {keys}")
    try:
        info = json.loads(bytes(_tensor(tensors, keys[0], np.uint8, where)).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: {keys[0]} is not UTF-8 JSON ({e})") from None
    quant_type = info.get("quant_type")
    if quant_type != keys[0].rsplit("__", 1)[1]:
        raise ValueError(f"{where}: quant_type {quant_type!r} differs from the tensor name {keys[0]!r}")
    dtypes = {v: k for k, v in _DTYPE_NAMES.items()}
    if info.get("dtype") not in dtypes:
        raise ValueError(f"{where}: dtype {info.get('dtype')!r} is not float32, float16 or bfloat16")
    blocksize = blockwise.check_blocksize(info.get("blocksize"), blockwise.BLOCKSIZES_4BIT)
    shape = tuple(int(d) for d in info.get("shape") or ())
    blocks = -(-int(np.prod(shape)) // blocksize)
    code = _tensor(tensors, "quant_map", np.float32, where)
    if code.shape != (16,):
        raise ValueError(f"{where}: quant_map has shape {code.shape}, expected (16,)")
    nested = "nested_absmax" in tensors
    absmax = _tensor(tensors, "absmax", np.uint8 if nested else np.float32, where)
    if absmax.shape != (blocks,):
        raise ValueError(f"{where}: absmax has shape {absmax.shape}, expected ({blocks},) for shape {shape} "
                         f"and blocksize {blocksize}")
    state = QuantState(quant_type, blocksize, shape, dtypes[info["dtype"]], absmax, code)
    if nested:
        nb = blockwise.check_blocksize(info.get("nested_blocksize"), None)
        n_abs = _tensor(tensors, "nested_absmax", np.float32, where)
        n_code = _tensor(tensors, "nested_quant_map", np.float32, where)
        if n_abs.shape != (-(-blocks // nb),) or n_code.shape != (256,) or info.get("nested_dtype") != "float32":
            raise ValueError(f"{where}: nested_absmax {n_abs.shape} / nested_quant_map {n_code.shape} / "
                             f"nested_dtype {info.get('nested_dtype')!r} do not fit {blocks} blocks of {nb}")
        offset = info.get("nested_offset")
        if not isinstance(offset, (int, float)) or not np.isfinite(offset):
            raise ValueError(f"{where}: nested_offset must be a finite number, got {offset!r}")
        state.offset, state.nested_absmax, state.nested_code, state.nested_blocksize = float(offset), n_abs, n_code, nb
    return state


def read_bnb4bit(path: str, weight: str) -> tuple[np.ndarray, QuantState]:
    """(packed uint8 weight, QuantState) of `weight` (e.g. "model.layers.0.mlp.up_proj.weight") in a
    bnb-4bit safetensors file."""
    from safetensors import safe_open

    with safe_open(path, framework="np") as f:
        names = [k for k in f.keys() if k == weight or k.startswith(weight + ".")]
        if weight not in names:
            raise ValueError(f"{path}: no tensor {weight!r}")
        tensors = {k[len(weight) + 1:]: f.get_tensor(k) for k in names if k != weight}
        packed = f.get_tensor(weight)
    if packed.dtype != np.uint8:
        raise ValueError(f"{path}: {weight} has dtype {packed.dtype}, a bnb-4bit weight is uint8")
    state = from_tensors(tensors, f"{path}: {weight}")
    if packed.size != -(-int(np.prod(state.shape)) // 2):
        raise ValueError(f"{path}: {weight} has {packed.size} bytes, shape {state.shape} packs into "
                         f"{-(-int(np.prod(state.shape)) // 2)}")
    return packed, state
