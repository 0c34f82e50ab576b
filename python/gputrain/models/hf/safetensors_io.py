"""Reading safetensors files one tensor at a time, and the folder's shard layout.

The header is parsed and checked here (an 8-byte little-endian length, a JSON object of
``name: {dtype, shape, data_offsets}``, then the data) rather than through the ``safetensors``
package's ``safe_open``: its NumPy reader cannot return bfloat16 tensors (NumPy has no such
dtype), and most decoder checkpoints are stored in bfloat16. Every tensor's extent is checked
against the file's size when the header is read, so a truncated shard is refused before anything
is built; then each tensor is read on its own (``readinto`` one buffer), converted to float32
and handed over, so a shard is never held in memory whole. Files are written with the
``safetensors`` package (``metadata={"format": "pt"}``, as transformers expects).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np

# safetensors dtype -> (NumPy dtype of the stored bits, bytes per element); all become float32
FLOAT_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2), "F64": (np.float64, 8)}
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lies: its file, dtype (safetensors' name), shape and byte range."""

    path: str
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def read_header(path: str) -> dict[str, TensorRef]:
    """The tensors of one safetensors file, checked against its size (ValueError naming the file
    and tensor for a malformed or truncated file, FileNotFoundError for a missing one)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: missing")
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: truncated ({size} bytes, not even a safetensors header)")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER or 8 + length > size:
            raise ValueError(f"{path}: truncated or not a safetensors file (header of {length} bytes, "
                             f"file of {size})")
        try:
            header = json.loads(file.read(length).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: the safetensors header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    data_start = 8 + length
    refs: dict[str, TensorRef] = {}
    end_of_data = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        ref = _tensor_ref(path, name, info, data_start)
        end_of_data = max(end_of_data, ref.start + ref.nbytes - data_start)
        refs[name] = ref
    if data_start + end_of_data > size:
        raise ValueError(f"{path}: truncated: its header describes {data_start + end_of_data} bytes, the "
                         f"file has {size}")
    return refs


def _tensor_ref(path: str, name: str, info: object, data_start: int) -> TensorRef:
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise ValueError(f"{where}: malformed header entry {info!r}")
    shape, offsets, dtype = info["shape"], info["data_offsets"], info["dtype"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"{where}: malformed shape {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            or offsets[1] < offsets[0]):
        raise ValueError(f"{where}: malformed data_offsets {offsets!r}")
    itemsize = FLOAT_DTYPES[dtype][1] if dtype in FLOAT_DTYPES else None
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if itemsize is not None and offsets[1] - offsets[0] != count * itemsize:
        raise ValueError(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, shape "
                         f"{tuple(shape)} in {dtype} needs {count * itemsize}")
    return TensorRef(path, name, str(dtype), tuple(shape), data_start + offsets[0], offsets[1] - offsets[0])


def read_tensor(ref: TensorRef) -> np.ndarray:
    """The tensor as a new float32 array (float16, bfloat16 and float64 converted exactly or by
    rounding to nearest); ValueError for another dtype or a file that changed since its header."""
    if ref.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{ref.path}: tensor {ref.name!r} has dtype {ref.dtype}; gputrain loads "
                         f"floating-point weights ({', '.join(FLOAT_DTYPES)})")
    stored, itemsize = FLOAT_DTYPES[ref.dtype]
    raw = np.empty(ref.nbytes // itemsize, dtype=stored)
    with open(ref.path, "rb") as file:
        file.seek(ref.start)
        got = file.readinto(memoryview(raw).cast("B"))
    if got != ref.nbytes:
        raise ValueError(f"{ref.path}: tensor {ref.name!r}: truncated (read {got} of {ref.nbytes} bytes)")
    if ref.dtype == "BF16":
        out = (raw.astype(np.uint32) << 16).view(np.float32)
    elif ref.dtype == "F32":
        out = raw
    else:
        with np.errstate(over="ignore"):
            out = raw.astype(np.float32)
    return out.reshape(ref.shape)


def shard_names(count: int) -> list[str]:
    """transformers' shard file names: model-00001-of-00003.safetensors, ..."""
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def read_index(folder: str) -> dict[str, str]:
    """The weight_map of ``model.safetensors.index.json``: tensor name -> shard file name."""
    path = os.path.join(folder, INDEX)
    try:
        with open(path, encoding="utf-8") as file:
            index = json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"{path}: no 'weight_map' object (tensor name -> shard file)")
    for name, shard in weight_map.items():
        if (not isinstance(shard, str) or not shard.endswith(".safetensors")
                or os.path.basename(shard) != shard or shard in (".", "..")):
            raise ValueError(f"{path}: weight_map[{name!r}] = {shard!r} is not a .safetensors file name "
                             "of this folder")
    return weight_map


def checkpoint_tensors(folder: str) -> dict[str, TensorRef]:
    """Every tensor of the folder's weights (model.safetensors, or the shards its index names),
    each header read and checked once; a tensor the index maps to a shard must be in that shard.
    Pickled weights (``*.bin``, ``*.pt``, ``*.pth``) are refused, never opened."""
    single, index = os.path.join(folder, SINGLE), os.path.join(folder, INDEX)
    if os.path.isfile(single):
        return read_header(single)
    if not os.path.isfile(index):
        pickled = sorted(f for f in os.listdir(folder) if f.endswith((".bin", ".pt", ".pth", ".ckpt")))
        if pickled:
            raise ValueError(f"{folder}: its weights are only in pickled file(s) ({', '.join(pickled)}); "
                             "gputrain never unpickles (it can run code): convert them to safetensors, "
                             "e.g. with transformers: model.save_pretrained(folder, safe_serialization=True)")
        raise FileNotFoundError(f"{folder}: no {SINGLE} and no {INDEX}")
    weight_map = read_index(folder)
    headers = {shard: read_header(os.path.join(folder, shard)) for shard in sorted(set(weight_map.values()))}
    refs: dict[str, TensorRef] = {}
    for name, shard in weight_map.items():
        if name not in headers[shard]:
            raise ValueError(f"{index}: maps tensor {name!r} to {shard}, which does not hold it")
        refs[name] = headers[shard][name]
    for shard, header in headers.items():
        unlisted = sorted(set(header) - set(weight_map))
        if unlisted:
            raise ValueError(f"{index}: no entry for tensor {unlisted[0]!r} of {shard} "
                             f"({len(unlisted)} tensor(s) of that shard are not in the weight_map)")
    return refs
