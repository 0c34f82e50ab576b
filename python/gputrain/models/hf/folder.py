"""from_pretrained / save_pretrained: Hugging Face model folders, and the registry of families.

A folder holds ``config.json`` and the weights: ``model.safetensors``, or shards
``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``. Loading goes:

1. config.json is read, its ``model_type`` (or, without one, its ``architectures``) picks a
   family from :data:`FAMILIES`, and the family parses every field (see config.py) -- nothing
   is built yet;
2. every shard's header is read and checked (names, dtypes, shapes, sizes against the file, the
   index against the shards) against the tensors the family expects;
3. only then is the model built, and each tensor is read on its own, straight into its parameter.

So bad input raises (FileNotFoundError / ValueError naming the file, field or tensor) before a
model exists, and no shard is ever held in memory whole.

A family is one module (gpt2.py is the first) that registers a :class:`Family`: how to parse the
config, which tensors a checkpoint must hold (names and shapes as stored), how to build the model,
and how to describe a model as config.json fields when saving.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain._vocab import c_dtype, parse_precision
from gputrain.models.hf import quantized
from gputrain.models.hf.config import HFConfig
from gputrain.models.hf.safetensors_io import FLOAT_DTYPES, INDEX, SINGLE, checkpoint_tensors, read_tensor, shard_names
from gputrain.nn.module import Module
from gputrain.nn.qlinear import QUANT_TYPES_4BIT, QLinear, quantized_linears
from gputrain.nn.sequence import FrozenTokenEmbedding


@dataclass(frozen=True)
class Family:
    """One model family: ``model_type`` as config.json spells it, the ``architectures`` it builds
    (the first is written by save_pretrained) and the four functions of the folder format.

    parse(config) -> spec: reads every field of the HFConfig (implemented, refused, or irrelevant);
        builds nothing.
    tensors(spec) -> {name: shape}: the tensors a checkpoint must hold, as stored (HF's names and
        layouts).
    canonical(name, spec) -> name or None: a stored name as it appears in tensors(spec) (another
        spelling of the same checkpoint, e.g. without a prefix), None for entries to skip (buffers).
    build(spec) -> model: the model, its parameters still at their initial values. The model has
        ``_hf_load_tensor(name, array)`` (one stored tensor into its parameter, unchecked values
        aside), ``_hf_loaded()`` (after the last one) and ``_hf_config()`` (config.json fields).
    quantizable(spec) -> [weight names]: the Linear weights ``quantization=`` stores quantized
        (None: the family cannot be quantized); then ``build(spec, linear=factory)`` builds those
        layers with the factory (gputrain.models.hf.quantized) and the model also has
        ``_hf_load_quantized(name, packed, state)`` (a bnb-4bit weight as stored).
    """

    model_type: str
    architectures: tuple[str, ...]
    parse: Callable[[HFConfig], Any]
    tensors: Callable[[Any], dict[str, tuple[int, ...]]]
    canonical: Callable[[str, Any], str | None]
    build: Callable[..., Module]
    quantizable: Callable[[Any], list[str]] | None = None


FAMILIES: dict[str, Family] = {}  # model_type -> family


def register_family(family: Family) -> Family:
    """Add `family` to FAMILIES under its model_type, so from_pretrained dispatches to it; ValueError if that
    model_type is taken. Returns the family."""
    if family.model_type in FAMILIES:
        raise ValueError(f"a family for model_type {family.model_type!r} is already registered")
    FAMILIES[family.model_type] = family
    return family


def _family_of(config: HFConfig) -> Family:
    model_type = config.raw("model_type", None)
    architectures = config.raw("architectures", None)
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise ValueError(f"{config.path}: field 'architectures' must be a list of class names, got {architectures!r}")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f"{config.path}: field 'model_type' must be a string, got {model_type!r}")
    if model_type is None:
        matches = [f for f in FAMILIES.values() if set(architectures or ()) & set(f.architectures)]
        if not matches:
            raise ValueError(f"{config.path}: no field 'model_type', and field 'architectures' = {architectures!r} "
                             f"names no class gputrain builds")
        family = matches[0]
    elif model_type not in FAMILIES:
        raise ValueError(f"{config.path}: field 'model_type' = {model_type!r} is not supported (gputrain loads "
                         f"{', '.join(sorted(FAMILIES))})")
    else:
        family = FAMILIES[model_type]
    other = [a for a in architectures or () if a not in family.architectures]
    if other:
        raise ValueError(f"{config.path}: field 'architectures' = {architectures!r}: gputrain's {family.model_type} "
                         f"family builds {', '.join(family.architectures)}, not {other[0]} (whose head it "
                         "would leave out)")
    return family


def _precision(dtype: Any, config: HFConfig) -> str:
    """The canonical precision ('fp32', 'bf16', 'fp16') of from_pretrained's dtype."""
    saved = config.dtype()
    if dtype is None:
        return "fp32"
    if isinstance(dtype, str) and dtype == "auto":
        return saved or "fp32"
    return parse_precision(dtype, "dtype")  # gputrain's one vocabulary: names, NumPy or torch dtypes


def _match(family: Family, spec: Any, stored: dict[str, Any], folder: str, skip: set[str] | None = None
           ) -> dict[str, Any]:
    """{expected name: TensorRef}, every expected tensor present once, float, of its shape (but
    the names in `skip`, read elsewhere)."""
    expected = {name: shape for name, shape in family.tensors(spec).items() if name not in (skip or ())}
    found: dict[str, Any] = {}
    for name, ref in stored.items():
        canonical = family.canonical(name, spec)
        if canonical is None:
            continue
        if canonical not in expected:
            raise ValueError(f"{ref.path}: unexpected tensor {name!r} (a {family.model_type} checkpoint of this "
                             "config.json does not have it)")
        if canonical in found:
            raise ValueError(f"{ref.path}: tensor {name!r} appears twice (also as {found[canonical].name!r})")
        if ref.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{ref.path}: tensor {name!r} has dtype {ref.dtype}; gputrain loads floating-point "
                             f"weights ({', '.join(FLOAT_DTYPES)})")
        if ref.shape != tuple(expected[canonical]):
            raise ValueError(f"{ref.path}: tensor {name!r} has shape {ref.shape}, config.json implies "
                             f"{tuple(expected[canonical])}")
        found[canonical] = ref
    missing = [name for name in expected if name not in found]
    if missing:
        raise ValueError(f"{folder}: tensor {missing[0]!r} is missing from the checkpoint "
                         f"({len(missing)} missing in all)")
    return found


def from_pretrained(folder: str | os.PathLike, dtype: str | None = None, device: str | None = None,
                    quantization: str | None = None, blocksize: int = 64, quantize_embeddings: bool = False,
                    double_quant: bool | None = None) -> Module:
    """The model of a Hugging Face folder (config.json + safetensors weights), in eval mode as
    transformers returns it.

    dtype: the precision it computes in -- None or 'float32' (default), 'bfloat16', 'float16'
    (or gputrain's 'fp32'/'bf16'/'fp16'), or 'auto' for config.json's ``dtype``/``torch_dtype``;
    the parameters stay float32 master weights whatever the file stored (a TrainStep's
    precision= sets it anew; gputrain.peft.get_peft_model on a bf16/f16 model keeps the adapted
    layers' frozen weights in that precision alone). device: None or 'cpu', else a device string
    as Module.to takes. quantization: None, or 'nf4' / 'fp4' for frozen 4-bit weights in the
    decoder blocks' Linear layers (QLinear, blocks of `blocksize`), 'int8' for LLM.int8's
    row-wise int8 (one absmax per row), or 'bf16' / 'f16' for those weights frozen in half
    precision alone (no float32 master), stored while loading; a folder bitsandbytes saved in 4
    bits loads its packed weights as they are (see gputrain.models.hf.quantized).
    quantize_embeddings: with quantization 'nf4' / 'fp4', the token table and an untied LM head are
    stored so too (the decoders' quantize_embeddings_: what bitsandbytes leaves in 16 bits).
    double_quant: 4-bit weights hold their absmax double-quantized (QLinear(double_quant=True),
    bitsandbytes' bnb_4bit_use_double_quant): None means as a bnb-4bit folder stores them, and
    not for a float folder.
    Families: :data:`FAMILIES` (``gpt2`` today)."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: not a folder")
    if device is not None and not isinstance(device, str):
        raise TypeError(f"device must be None or a str, not {type(device).__name__}")
    config = HFConfig.load(folder)
    family = _family_of(config)
    quant = quantized.parse(quantization, blocksize, config, double_quant)
    if not isinstance(quantize_embeddings, bool):
        raise TypeError(f"quantize_embeddings must be a bool, not {type(quantize_embeddings).__name__}")
    if quantize_embeddings and (quant is None or quant.quant_type not in QUANT_TYPES_4BIT):
        raise ValueError(f"quantize_embeddings=True stores the embeddings in 4 bits: it needs quantization='nf4' "
                         f"or 'fp4', got {None if quant is None else quant.quant_type!r}")
    spec = family.parse(config)
    precision = _precision(dtype, config)
    config.finish(family.model_type)
    if quant is None:
        refs = _match(family, spec, checkpoint_tensors(folder), folder)
        return load_tensors(family.build(spec), refs, precision, device)
    if family.quantizable is None:
        raise ValueError(f"quantization: gputrain's {family.model_type} family cannot be quantized (the decoder "
                         "families can)")
    names = family.quantizable(spec)
    stored = checkpoint_tensors(folder)
    groups: dict[str, Any] = {}
    if quant.prequantized:
        stored, groups = quantized.split_stored(stored, names, lambda n: family.canonical(n, spec))
        shapes = family.tensors(spec)
        quant = quantized.check_groups(groups, {n: shapes[n] for n in names}, quant, folder)
    refs = _match(family, spec, stored, folder, skip=set(names) if quant.prequantized else set())
    model = family.build(spec, linear=quantized_linears(quant.quant_type, quant.blocksize, bool(quant.double_quant)))
    if quantize_embeddings:  # zero codes now, each table quantized as it is read below
        model._quantize_embeddings(quant.quant_type, quant.blocksize, double_quant=bool(quant.double_quant))
    quantized.load_groups(model, groups, names if quant.prequantized else [])
    return load_tensors(model, refs, precision, device)


def load_tensors(model: Module, refs: dict[str, Any], precision: str, device: str | None) -> Module:
    """Reads each checked tensor (name as the model knows it -> TensorRef) straight into its
    parameter, one in memory at a time (ValueError naming a tensor with NaN or infinities), then
    sets the compute precision, eval mode and the device: the last step of every loader."""
    for name, ref in refs.items():
        array = read_tensor(ref)
        if not np.isfinite(array).all():
            raise ValueError(f"{ref.path}: tensor {ref.name!r} holds NaN or infinite values")
        model._hf_load_tensor(name, array)
    model._hf_loaded()
    model.compiled.precision = c_dtype(precision)
    model.eval()
    if device is not None and device != "cpu":
        model.to(device)
    return model


DEFAULT_MAX_SHARD_SIZE = 2 * 1024**3
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|KiB|MiB|GiB)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _shard_size(value: int | str) -> int:
    if isinstance(value, str) and (m := _SIZE.match(value)):
        value = int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"max_shard_size must be a positive int of bytes or a size such as '500MB', got {value!r}")
    return value


def _atomic_write(path: str, write: Callable[[str], None]) -> None:
    import tempfile  # here, not at `import gputrain` (tests/test_import_light.py)

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def float_state_dict(model: Module) -> dict[str, np.ndarray]:
    """model.state_dict() with every weight held compactly as float32 values: a QLinear's
    dequantized (its absmax dropped; a half weight widened exactly) and a frozen token table
    (HalfTokenEmbedding, QTokenEmbedding) as its lookup reads it."""
    state = model.state_dict()
    for name, module in model.named_modules():
        if isinstance(module, (QLinear, FrozenTokenEmbedding)):
            for piece in ("absmax", "nested_absmax", "offset"):  # a half weight has none
                state.pop(f"{name}.weight.{piece}", None)
            state[f"{name}.weight"] = module.dequantize() if isinstance(module, QLinear) else module.table()
    return state


def save_pretrained(model: Module, folder: str | os.PathLike,
                    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE) -> None:
    """Writes `model` as a Hugging Face folder transformers loads: config.json and the state_dict
    (Hugging Face's names and layouts, float32) in model.safetensors, or, above `max_shard_size`
    bytes (int, or '500MB', '2GiB', ...), in shards model-0000k-of-0000n.safetensors (tensors in
    state_dict order, a new shard when the next would pass the size) with
    model.safetensors.index.json. Each file is written to a temporary name and renamed; weight
    files of an earlier save in the folder that this one does not use are removed."""
    import safetensors.numpy

    if not hasattr(model, "_hf_config"):
        raise TypeError(f"save_pretrained: a {type(model).__name__} has no Hugging Face family "
                        "(build it with gputrain.models.from_pretrained or a family's class)")
    limit = _shard_size(max_shard_size)
    config = model._hf_config()  # refuses a model the family cannot describe, before writing anything
    state = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in float_state_dict(model).items()}
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    shards: list[list[str]] = [[]]
    size = 0
    for name, array in state.items():
        if shards[-1] and size + array.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += array.nbytes
    files = [SINGLE] if len(shards) == 1 else shard_names(len(shards))
    for file, names in zip(files, shards, strict=True):
        part = {name: state[name] for name in names}
        _atomic_write(os.path.join(folder, file),
                      lambda tmp, part=part: safetensors.numpy.save_file(part, tmp, metadata={"format": "pt"}))
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(a.nbytes for a in state.values())},
                 "weight_map": {name: file for file, names in zip(files, shards, strict=True) for name in names}}
        _atomic_write(os.path.join(folder, INDEX), lambda tmp: _write_json(tmp, index))
    _atomic_write(os.path.join(folder, "config.json"), lambda tmp: _write_json(tmp, config))
    stale = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
    written = {*files, "config.json", *([INDEX] if len(files) > 1 else [])}
    for file in os.listdir(folder):  # weight files of an earlier save
        if (stale.match(file) or file in (SINGLE, INDEX)) and file not in written:
            os.unlink(os.path.join(folder, file))


def _write_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(value, file, indent=2, sort_keys=True)
        file.write("\n")
