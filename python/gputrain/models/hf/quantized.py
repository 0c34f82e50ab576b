"""``from_pretrained(folder, quantization=...)``: decoder blocks with frozen 4-bit or int8 weights (QLinear).

Two sources, one result (every Linear of the decoder blocks a :class:`~gputrain.nn.QLinear`; the
embedding, the norms and the LM head stay float, as bitsandbytes leaves ``lm_head`` by default):

* a float folder with ``quantization="nf4"``, ``"fp4"`` or ``"int8"``: each weight is read on its
  own and quantized as it loads (gputrain.quant.quantize_4bit / int8_vectorwise_quant:
  bitsandbytes' codes, bit for bit), so no more than one float weight is ever in memory (with
  ``"bf16"`` or ``"f16"`` each is rounded to that half weight instead: not quantized, but stored
  the same way);
* a folder bitsandbytes saved in 4 bits (config.json ``quantization_config`` with
  ``load_in_4bit``; each weight stored as packed uint8 plus ``.absmax``, ``.quant_map``, optional
  ``.nested_absmax`` / ``.nested_quant_map`` and ``.quant_state.bitsandbytes__nf4`` / ``__fp4``):
  the packed codes load as they are, and a double-quantized absmax stays so (``double_quant=False``
  expands it to float32, bit-exact with bitsandbytes' dequantization); or in 8 bits (``load_in_8bit``; each weight int8 of its
  shape, the module's ``.SCB`` float32 row absmax and ``.weight_format`` 0, "row"): the codes load
  as they are. ``quantization=`` may be omitted or must name its type.

Everything is checked (names, dtypes, shapes, quant states' JSON) before the model is built.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain.models.hf.config import HFConfig
from gputrain.models.hf.safetensors_io import TensorRef
from gputrain.nn.qlinear import QUANT_TYPES_4BIT, check_quantization
from gputrain.quant import QuantState, from_tensors
from gputrain.quant.state import NESTED_BLOCKSIZE

_RAW_DTYPES = {"U8": np.uint8, "I8": np.int8, "F32": np.float32}
_INT8_KEYS = ("SCB", "weight_format")  # stored beside the module's weight, not under it
_STATE_KEYS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


@dataclass(frozen=True)
class Quantization:
    """How from_pretrained stores the decoder blocks' Linear weights."""

    quant_type: str     # "nf4", "fp4", "int8", or "bf16" / "f16" (half weights, not quantized)
    blocksize: int      # 4-bit: elements per absmax block (64: bitsandbytes' default)
    prequantized: bool  # True: the folder holds bitsandbytes' packed weights
    double_quant: bool | None  # 4-bit: the absmax held double-quantized; None: as a bnb-4bit folder stores it


def parse(quantization: Any, blocksize: Any, config: HFConfig, double_quant: Any = None) -> Quantization | None:
    """The quantization of from_pretrained's arguments and config.json's ``quantization_config``
    (read here, so config.finish accepts it); None for a float model. ValueError names the bad
    argument or field."""
    if quantization is not None:
        check_quantization(quantization, blocksize, where="from_pretrained")
    if double_quant is not None and not isinstance(double_quant, bool):
        raise TypeError(f"double_quant must be a bool or None, not {type(double_quant).__name__}")
    stored = config.raw("quantization_config", None)
    config.irrelevant("quantization_config")
    if stored is None:
        if double_quant and quantization not in QUANT_TYPES_4BIT:
            raise ValueError(f"double_quant=True compresses a 4-bit weight's absmax: it needs quantization='nf4' or "
                             f"'fp4', got {quantization!r}")
        return None if quantization is None else Quantization(quantization, blocksize, False, bool(double_quant))
    quant_type = _stored_type(stored, config.path)
    if quantization is not None and quantization != quant_type:
        raise ValueError(f"quantization={quantization!r}: {config.path} holds weights bitsandbytes quantized to "
                         f"{quant_type!r} (field 'quantization_config'); pass {quant_type!r} or None")
    if double_quant and quant_type == "int8":
        raise ValueError(f"double_quant=True: {config.path} holds int8 weights (a row absmax each, nothing to compress)")
    return Quantization(quant_type, 0, True, double_quant)  # the block size comes from the weights' quant states


def _stored_type(stored: Any, path: str) -> str:
    """The quant_type of a bitsandbytes quantization_config; refuses what gputrain cannot load."""
    where = f"{path}: field 'quantization_config'"
    if not isinstance(stored, dict):
        raise ValueError(f"{where} must be an object, got {type(stored).__name__}")
    if stored.get("quant_method", "bitsandbytes") != "bitsandbytes":
        raise ValueError(f"{where}: quant_method {stored.get('quant_method')!r} is not supported "
                         "(bitsandbytes 4-bit and 8-bit only)")
    _check_skip_modules(stored, where)
    if stored.get("load_in_8bit") or stored.get("_load_in_8bit"):
        if stored.get("llm_int8_has_fp16_weight"):
            raise ValueError(f"{where}: llm_int8_has_fp16_weight true stores float16 weights, not int8 codes; "
                             "load the float folder with quantization='int8'")
        return "int8"
    if not (stored.get("load_in_4bit") or stored.get("_load_in_4bit")):
        raise ValueError(f"{where}: expected load_in_4bit or load_in_8bit true (a bitsandbytes checkpoint)")
    quant_type = stored.get("bnb_4bit_quant_type", "fp4")
    if quant_type not in QUANT_TYPES_4BIT:
        raise ValueError(f"{where}: bnb_4bit_quant_type {quant_type!r} is not one of {QUANT_TYPES_4BIT}")
    if stored.get("bnb_4bit_quant_storage", "uint8") != "uint8":
        raise ValueError(f"{where}: bnb_4bit_quant_storage {stored.get('bnb_4bit_quant_storage')!r} is not "
                         "supported (uint8 only)")
    return quant_type


def _check_skip_modules(stored: dict[str, Any], where: str) -> None:
    skip = stored.get("llm_int8_skip_modules")
    if skip is not None and (not isinstance(skip, list) or not all(isinstance(s, str) for s in skip)):
        raise ValueError(f"{where}: llm_int8_skip_modules must be a list of names or null, got {skip!r}")


def split_stored(stored: dict[str, TensorRef], quantized: list[str], canonical: Any
                 ) -> tuple[dict[str, TensorRef], dict[str, dict[str, TensorRef]]]:
    """(the float tensors, {weight name: {"" : packed, "absmax": ..., ...}}) of a bnb-4bit folder:
    every stored name under one of the `quantized` weight names (after `canonical`) goes to the
    second."""
    wanted = set(quantized)
    floats: dict[str, TensorRef] = {}
    groups: dict[str, dict[str, TensorRef]] = {}
    for name, ref in stored.items():
        base, suffix = _quant_base(name, canonical, wanted)
        if base is None:
            floats[name] = ref
        else:
            groups.setdefault(base, {})[suffix] = ref
    return floats, groups


def _quant_base(name: str, canonical: Any, wanted: set[str]) -> tuple[str | None, str]:
    """(weight name, suffix) when `name` is a quantized weight or one of its state tensors."""
    if canonical(name) in wanted:
        return canonical(name), ""
    for key in _INT8_KEYS:
        if name.endswith("." + key):
            base = canonical(name[: -len(key)] + "weight")
            if base in wanted:
                return base, key
    for key in (*_STATE_KEYS, "quant_state.bitsandbytes__nf4", "quant_state.bitsandbytes__fp4"):
        if name.endswith("." + key):
            base = canonical(name[: -len(key) - 1])
            if base in wanted:
                return base, key
    return None, ""


def read_raw(ref: TensorRef) -> np.ndarray:
    """A uint8, int8 or float32 tensor as stored (the pieces of a bitsandbytes weight)."""
    if ref.dtype not in _RAW_DTYPES:
        raise ValueError(f"{ref.path}: tensor {ref.name!r} has dtype {ref.dtype}; a bitsandbytes weight's pieces "
                         "are U8, I8 or F32")
    with open(ref.path, "rb") as file:
        file.seek(ref.start)
        raw = file.read(ref.nbytes)
    if len(raw) != ref.nbytes:
        raise ValueError(f"{ref.path}: tensor {ref.name!r}: truncated (read {len(raw)} of {ref.nbytes} bytes)")
    return np.frombuffer(raw, _RAW_DTYPES[ref.dtype]).reshape(ref.shape).copy()


def check_groups(groups: dict[str, dict[str, TensorRef]], shapes: dict[str, tuple[int, ...]], quant: Quantization,
                 folder: str) -> Quantization:
    """Checks every bitsandbytes weight (present; 4-bit: packed uint8 of its shape, its quant state's
    JSON and tensors; int8: see _check_int8) reading only the small pieces; returns `quant` with the
    one block size they share (int8: 0) and whether their absmax is held double-quantized (as they
    store it, unless quant.double_quant says; True for weights that are not is refused)."""
    quant_type = quant.quant_type
    blocksizes, nested = set(), set()
    for name in shapes:
        group = groups.get(name)
        if group is None or "" not in group:
            raise ValueError(f"{folder}: the quantized weight {name!r} is missing (a bitsandbytes checkpoint "
                             "quantizes every Linear of the decoder blocks; gputrain needs all of them)")
        if quant_type == "int8":
            _check_int8(group, name, shapes[name])
            continue
        state = _small_state(group, name)
        where = f"{group[''].path}: {name}"
        if state.quant_type != quant_type:
            raise ValueError(f"{where}: quant_type {state.quant_type!r} differs from quantization_config's "
                             f"{quant_type!r}")
        if tuple(state.shape) != tuple(shapes[name]):
            raise ValueError(f"{where}: quant state shape {tuple(state.shape)}, config.json implies {shapes[name]}")
        packed = group[""]
        size = -(-int(np.prod(shapes[name])) // 2)
        if packed.dtype != "U8" or int(np.prod(packed.shape)) != size:
            raise ValueError(f"{where}: packed weight is {packed.dtype} of shape {packed.shape}, expected {size} "
                             "U8 bytes")
        blocksizes.add(state.blocksize)
        nested.add(state.nested and state.nested_blocksize == NESTED_BLOCKSIZE)
    if len(blocksizes) > 1:
        raise ValueError(f"{folder}: the 4-bit weights use several block sizes {sorted(blocksizes)}; gputrain loads "
                         "one block size per model")
    if quant_type == "int8":
        return dataclasses.replace(quant, blocksize=0, double_quant=False)
    all_nested = nested == {True}
    if quant.double_quant and not all_nested:
        raise ValueError(f"double_quant=True: {folder} holds 4-bit weights whose absmax is not double-quantized "
                         f"(blocks of {NESTED_BLOCKSIZE}); pass double_quant=None or False")
    double = all_nested if quant.double_quant is None else quant.double_quant
    return dataclasses.replace(quant, blocksize=blocksizes.pop() if blocksizes else 64, double_quant=double)


def _check_int8(group: dict[str, TensorRef], name: str, shape: tuple[int, ...]) -> None:
    """An 8-bit weight: int8 codes of its shape, a float32 SCB a row, weight_format (if stored) 0."""
    where = f"{group[''].path}: {name}"
    codes, scb = group[""], group.get("SCB")
    if codes.dtype != "I8" or tuple(codes.shape) != tuple(shape):
        raise ValueError(f"{where}: the weight is {codes.dtype} of shape {tuple(codes.shape)}, expected I8 codes of "
                         f"shape {tuple(shape)}")
    if scb is None or scb.dtype != "F32" or tuple(scb.shape) != (shape[0],):
        got = "missing" if scb is None else f"{scb.dtype} of shape {tuple(scb.shape)}"
        raise ValueError(f"{where}: its SCB (the row absmax) is {got}, expected F32 of shape ({shape[0]},)")
    if "weight_format" in group and read_raw(group["weight_format"]).reshape(-1).tolist() != [0]:
        raise ValueError(f"{where}: weight_format is not 0 (bitsandbytes' row-major int8); other layouts are not "
                         "supported")


def _small_state(group: dict[str, TensorRef], name: str) -> QuantState:
    """The QuantState of a weight's group, read and checked whole (its pieces are small: absmax
    is one byte or float per block)."""
    tensors = {key: read_raw(ref) for key, ref in group.items() if key}
    return from_tensors(tensors, f"{group[''].path}: {name}")


def load_groups(model: Any, groups: dict[str, dict[str, TensorRef]], names: list[str]) -> None:
    """Reads each bitsandbytes weight (packed bytes and 4-bit state, or int8 codes and SCB) into its
    QLinear, one at a time."""
    for name in names:
        group = groups[name]
        state = read_raw(group["SCB"]) if "SCB" in group else _small_state(group, name)
        model._hf_load_quantized(name, read_raw(group[""]), state)
