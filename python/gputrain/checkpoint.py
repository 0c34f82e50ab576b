"""Checkpoint files: arrays in safetensors, everything else in JSON, written atomically.

A checkpoint is a directory `checkpoint-<step>/` in the output directory:

    model.safetensors        the model's state_dict() (PyTorch names); for a gputrain.peft.PeftModel, instead:
    adapter_model.safetensors    the adapter and modules_to_save under PEFT's keys (float32), and
    adapter_config.json          its LoraConfig: PEFT's files, as PeftModel.save_pretrained writes them (the
                                 frozen base is not saved: a resume needs the same base and get_peft_model)
    model_ema.safetensors    the EMA of the weights (same names), when ema_decay is set (of every parameter:
                             a PeftModel's frozen base too)
    optimizer.safetensors    per-parameter state arrays: "<index>.<name>" (exp_avg, exp_avg_sq, ...; AdamW8bit's
                             uint8 state1, state2 and float32 absmax1, absmax2) of the parameters the
                             optimizer steps (the Trainer's own: those with requires_grad)
    optimizer.json           param_groups (hyperparameters, parameter indices) and per-parameter steps
    scheduler.json           the LR scheduler's state_dict()
    scaler.json              the GradScaler's state_dict() (fp16 only)
    ema.json                 the EMA's decay and update count
    gputrain_state.json      the exact-resume state: the model's dropout stream (seed, step), the
                             loader's position, the logging accumulators and the callbacks' state
    trainer_state.json       TrainerState (Hugging Face's file)
    training_args.json       the TrainingArguments
    manifest.json            the format version and the size and SHA-256 of every file above,
                             written last

The directory is written under a temporary name, every file and the directory are fsynced,
and it is renamed into place, so a run killed at any moment leaves either the complete
checkpoint or none (a leftover temporary directory is removed by the next save). No pickle.

Every file is written through save_arrays / save_bytes / save_json / save_text, which hash the
bytes they write; write_checkpoint then writes manifest.json from those hashes.
read_checkpoint_files reads a checkpoint's files once and checks them against its manifest, so a flipped byte, a
truncated file or an edited header is found before anything is parsed. A damaged checkpoint
raises CheckpointError (a ValueError) naming the file and the field. A checkpoint written
before the manifest existed (no format version anywhere) still loads, with a
LegacyCheckpointWarning; one that has a format version but no manifest is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["FORMAT_VERSION", "MANIFEST_NAME", "PREFIX_CHECKPOINT_DIR", "CheckpointError", "LegacyCheckpointWarning",
           "get_last_checkpoint", "read_checkpoint_files", "sorted_checkpoints", "write_checkpoint"]

PREFIX_CHECKPOINT_DIR = "checkpoint"
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
_TEMPORARY_PREFIX = f".tmp-{PREFIX_CHECKPOINT_DIR}-"
MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1  # manifest.json's "format_version" (and gputrain_state.json's "checkpoint_format")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from: a file missing, damaged (its SHA-256 is not the
    manifest's) or unreadable, or a field of the wrong type, out of range or inconsistent with
    another file. `file` names the file (None: the directory), `field` the entry (None: the whole
    file). Raised before anything is changed: a failed resume leaves the Trainer as it was."""

    def __init__(self, directory: str, file: str | None, field: str | None, message: str) -> None:
        where = os.path.join(directory, file) if file else directory
        super().__init__(f"{where}: {field + ': ' if field else ''}{message}")
        self.directory, self.file, self.field = directory, file, field


class LegacyCheckpointWarning(UserWarning):
    """A checkpoint written before checkpoints had a manifest: its files cannot be checked for damage."""


# Files being written into checkpoint directories: directory -> {name: {"size", "sha256"}}.
# write_checkpoint opens an entry for its temporary directory; the save_* functions record the
# hash of what they write there; the manifest is written from it.
_RECORDING: dict[str, dict[str, dict[str, Any]]] = {}


def _safetensors() -> Any:
    try:
        import safetensors.numpy
    except ImportError:
        raise ImportError("checkpoints need the safetensors package (a gputrain dependency): "
                          "pip install safetensors") from None
    return safetensors.numpy


def _write_bytes(path: str, data: bytes) -> None:
    """Writes `data` to path; inside a checkpoint being written, records its size and SHA-256
    (of these bytes: the file is not read back) for the manifest."""
    with open(path, "wb") as f:
        f.write(data)
    recording = _RECORDING.get(os.path.dirname(os.path.abspath(path)))
    if recording is not None:
        recording[os.path.basename(path)] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Writes named arrays to a safetensors file (contiguous copies, shapes kept)."""
    _write_bytes(path, _safetensors().save({k: np.ascontiguousarray(v) for k, v in arrays.items()}))


def load_arrays(path: str) -> dict[str, np.ndarray]:
    return _safetensors().load_file(path)


def save_bytes(path: str, data: bytes) -> None:
    """Writes bytes made elsewhere (a PEFT adapter's files: gputrain.peft.PeftModel.adapter_files)."""
    _write_bytes(path, data)


def save_json(path: str, value: Any) -> None:
    save_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def save_text(path: str, text: str) -> None:
    _write_bytes(path, text.encode("utf-8"))


def load_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _fsync_path(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(output_dir: str, step: int, write: Callable[[str], None]) -> str:
    """Creates output_dir/checkpoint-<step> atomically: `write(directory)` fills a temporary
    directory through save_arrays / save_bytes / save_json / save_text, manifest.json is written
    last from the hashes they recorded (RuntimeError for a file written by other means), and the
    files are fsynced before the directory is renamed into place; returns the path. An existing
    checkpoint of the same step is replaced."""
    import shutil  # here, not at `import gputrain`

    os.makedirs(output_dir, exist_ok=True)
    final = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
    temporary = os.path.join(output_dir, f"{_TEMPORARY_PREFIX}{step}")
    for name in os.listdir(output_dir):  # debris of a run killed while saving
        if name.startswith(_TEMPORARY_PREFIX):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    os.makedirs(temporary)
    recording = _RECORDING[os.path.abspath(temporary)] = {}
    try:
        write(temporary)
        _write_manifest(temporary, recording)
        for name in os.listdir(temporary):
            _fsync_path(os.path.join(temporary, name))
        _fsync_path(temporary, directory=True)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(temporary, final)
        _fsync_path(output_dir, directory=True)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    finally:
        _RECORDING.pop(os.path.abspath(temporary), None)
    return final


def _write_manifest(directory: str, recorded: dict[str, dict[str, Any]]) -> None:
    """manifest.json from the hashes recorded while the files were written; written last, under
    a temporary name renamed into place. Every file of the directory must have been recorded."""
    unrecorded = sorted(set(os.listdir(directory)) - set(recorded))
    if unrecorded:
        raise RuntimeError(f"{directory}: {unrecorded} were not written through gputrain.checkpoint's save "
                           "functions, so the manifest has no hash of them")
    manifest = {"format_version": FORMAT_VERSION, "files": dict(sorted(recorded.items()))}
    partial = os.path.join(directory, f".{MANIFEST_NAME}.partial")
    with open(partial, "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, os.path.join(directory, MANIFEST_NAME))


# -- reading a checkpoint and checking it against its manifest ----------------------------------

_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# safetensors' dtype codes of the NumPy dtypes checkpoints hold
_DTYPE_CODES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16",
                np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.uint16): "U16",
                np.dtype(np.uint32): "U32", np.dtype(np.uint64): "U64", np.dtype(np.bool_): "BOOL"}


class CheckpointFiles:
    """The files of one checkpoint directory, read once (and, with a manifest, checked against
    it); json() and arrays() parse them, raising CheckpointError naming the file."""

    def __init__(self, directory: str, data: dict[str, bytes], legacy: bool) -> None:
        self.directory = directory
        self.data = data      # file name -> its bytes
        self.legacy = legacy  # True: written before the manifest existed (nothing was checked)

    def error(self, file: str | None, field: str | None, message: str) -> CheckpointError:
        return CheckpointError(self.directory, file, field, message)

    def has(self, name: str) -> bool:
        return name in self.data

    def _bytes(self, name: str) -> bytes:
        if name not in self.data:
            raise self.error(name, None, "missing" if self.legacy else "missing from the checkpoint's manifest")
        return self.data[name]

    def json(self, name: str) -> Any:
        try:
            return json.loads(self._bytes(name).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as error:
            if isinstance(error, CheckpointError):
                raise
            raise self.error(name, None, f"not valid JSON ({error})") from None

    def arrays(self, name: str, dtypes: dict[str, np.dtype] | None = None) -> dict[str, np.ndarray]:
        """The arrays of a safetensors file; `dtypes` (name -> dtype; default float32 for all)
        must match the header's, so that no array is silently reinterpreted or cast."""
        data = self._bytes(name)
        for key, code in _safetensors_dtypes(data, lambda message: self.error(name, None, message)).items():
            expected = np.dtype(np.float32) if dtypes is None or key not in dtypes else np.dtype(dtypes[key])
            if code != _DTYPE_CODES.get(expected):
                raise self.error(name, key, f"stored as {code}, expected {_DTYPE_CODES.get(expected, expected)}")
        reader = _safetensors()
        import safetensors

        try:
            return dict(reader.load(data))
        except (safetensors.SafetensorError, ValueError, TypeError) as error:  # a broken layout
            raise self.error(name, None, f"not a readable safetensors file ({error})") from None


def _safetensors_dtypes(data: bytes, error: Callable[[str], CheckpointError]) -> dict[str, str]:
    """Each tensor's dtype code in a safetensors file's header (the 8-byte header length, then JSON)."""
    if len(data) < 8:
        raise error("too short for a safetensors header")
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise error(f"header length {length} exceeds the file ({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + length].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as problem:
        raise error(f"the safetensors header is not valid JSON ({problem})") from None
    if not isinstance(header, dict):
        raise error("the safetensors header is not a JSON object")
    codes = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
            raise error(f"the header entry of {key!r} has no dtype")
        codes[key] = entry["dtype"]
    return codes


def _check_manifest(directory: str, manifest: Any) -> dict[str, dict[str, Any]]:
    """The "files" of a manifest.json, each with a size and a SHA-256 (CheckpointError otherwise)."""
    def error(field: str | None, message: str) -> CheckpointError:
        return CheckpointError(directory, MANIFEST_NAME, field, message)

    if not isinstance(manifest, dict):
        raise error(None, f"must be a JSON object, not {type(manifest).__name__}")
    version = manifest.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise error("format_version", f"must be an int, got {version!r}")
    if version != FORMAT_VERSION:
        raise error("format_version", f"{version} is not a format this gputrain reads ({FORMAT_VERSION})")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise error("files", "must be a non-empty JSON object of file entries")
    for name, entry in files.items():
        if os.path.basename(name) != name or name in ("", ".", "..", MANIFEST_NAME):
            raise error(f"files[{name!r}]", "is not a file name of the checkpoint")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) \
                or not _SHA256_RE.match(entry["sha256"]) or isinstance(entry.get("size"), bool) \
                or not isinstance(entry.get("size"), int) or entry["size"] < 0:
            raise error(f"files[{name!r}]", "must have a 'size' (int >= 0) and a 'sha256' (64 hex digits)")
    return files


def _read_file(directory: str, name: str) -> bytes:
    try:
        with open(os.path.join(directory, name), "rb") as f:
            return f.read()
    except OSError as error:
        raise CheckpointError(directory, name, None, f"cannot be read ({error.strerror or error})") from None


def read_checkpoint_files(directory: str) -> CheckpointFiles:
    """Reads every file of a checkpoint once. With a manifest, each file it lists must be there
    with its size and SHA-256; without one, the checkpoint must predate manifests (no
    "checkpoint_format" in gputrain_state.json): it loads with a LegacyCheckpointWarning."""
    if not os.path.isdir(directory):
        raise CheckpointError(directory, None, None, "not a checkpoint directory")
    if not os.path.exists(os.path.join(directory, MANIFEST_NAME)):
        return _read_legacy(directory)
    try:
        manifest = json.loads(_read_file(directory, MANIFEST_NAME).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        if isinstance(error, CheckpointError):
            raise
        raise CheckpointError(directory, MANIFEST_NAME, None, f"not valid JSON ({error})") from None
    data = {}
    for name, entry in _check_manifest(directory, manifest).items():
        if not os.path.isfile(os.path.join(directory, name)):
            raise CheckpointError(directory, name, None, "listed in the manifest but missing")
        content = _read_file(directory, name)
        if len(content) != entry["size"]:
            raise CheckpointError(directory, name, None, f"{len(content)} bytes, the manifest says {entry['size']} "
                                  "(truncated or damaged)")
        if hashlib.sha256(content).hexdigest() != entry["sha256"]:
            raise CheckpointError(directory, name, None, "its SHA-256 is not the manifest's: the file is damaged")
        data[name] = content
    return CheckpointFiles(directory, data, legacy=False)


def _read_legacy(directory: str) -> CheckpointFiles:
    data = {name: _read_file(directory, name) for name in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, name))}
    files = CheckpointFiles(directory, data, legacy=True)
    state = files.json("gputrain_state.json") if files.has("gputrain_state.json") else None
    if isinstance(state, dict) and "checkpoint_format" in state:
        raise CheckpointError(directory, MANIFEST_NAME, None,
                              f"missing, but gputrain_state.json says checkpoint_format "
                              f"{state['checkpoint_format']!r}: a checkpoint of that format has a manifest")
    warnings.warn(f"{directory} was written before checkpoints had a manifest (manifest.json): its files cannot "
                  "be checked for damage", LegacyCheckpointWarning, stacklevel=3)
    return files


def sorted_checkpoints(output_dir: str, best_model_checkpoint: str | None = None) -> list[str]:
    """Checkpoint directories oldest first; the best one moved to the end, as Hugging Face's
    _sorted_checkpoints, so that pruning keeps it."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_RE.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(match.group(1)), os.path.join(output_dir, name)))
    ordered = [path for _, path in sorted(found)]
    if best_model_checkpoint is not None:
        best = os.path.normpath(best_model_checkpoint)
        for index, path in enumerate(ordered):
            if os.path.normpath(path) == best:
                ordered.append(ordered.pop(index))
                break
    return ordered


def rotate_checkpoints(output_dir: str, save_total_limit: int | None, best_model_checkpoint: str | None,
                       load_best_model_at_end: bool) -> list[str]:
    """Deletes the oldest checkpoints beyond save_total_limit, never the best one; returns the deleted."""
    if save_total_limit is None:
        return []
    ordered = sorted_checkpoints(output_dir, best_model_checkpoint)
    limit = save_total_limit
    # Hugging Face: with a limit of 1 and the best model to be loaded at the end, the best and the
    # last checkpoint are both kept (the last one to resume from).
    if limit == 1 and load_best_model_at_end and best_model_checkpoint is not None and ordered \
            and os.path.normpath(ordered[-1]) == os.path.normpath(best_model_checkpoint):
        limit = 2
    doomed = ordered[:max(len(ordered) - limit, 0)]
    import shutil

    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def get_last_checkpoint(output_dir: str) -> str | None:
    """The checkpoint of the highest step in output_dir (None when there is none)."""
    ordered = sorted_checkpoints(output_dir)
    return ordered[-1] if ordered else None


# -- component states --------------------------------------------------------------------------

def _plain(value: Any) -> Any:
    """A JSON-able copy of a state value (tuples become lists, NumPy scalars Python numbers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


# Optimizer state stored as uint8: AdamW8bit's codes of its moments (gputrain.optim.AdamW8bit); the rest is float32.
_UINT8_STATE = ("state1", "state2")


def save_optimizer(directory: str, state: dict[str, Any]) -> None:
    """Writes an optimizer's state_dict() (taken by the caller: with ZeRO-1 it is a collective)."""
    arrays, steps = {}, {}
    for index, entries in state["state"].items():
        for name, value in entries.items():
            if name == "step":
                steps[str(index)] = float(np.asarray(value))
            else:
                arrays[f"{index}.{name}"] = np.asarray(value)
    save_arrays(os.path.join(directory, "optimizer.safetensors"), arrays)
    groups = [{k: _plain(v) for k, v in group.items()} for group in state["param_groups"]]
    save_json(os.path.join(directory, "optimizer.json"), {"param_groups": groups, "steps": steps})


def read_optimizer(files: CheckpointFiles) -> dict[str, Any]:
    """The optimizer's state_dict() as save_optimizer wrote it (optimizer.json and
    optimizer.safetensors), its layout checked; the optimizer checks the values."""
    meta = files.json("optimizer.json")
    if not isinstance(meta, dict) or set(meta) != {"param_groups", "steps"}:
        raise files.error("optimizer.json", None, "must be a JSON object with the keys 'param_groups' and 'steps'")
    if not isinstance(meta["param_groups"], list) or not all(isinstance(g, dict) for g in meta["param_groups"]):
        raise files.error("optimizer.json", "param_groups", "must be a list of JSON objects")
    if not isinstance(meta["steps"], dict):
        raise files.error("optimizer.json", "steps", f"must be a JSON object, not {type(meta['steps']).__name__}")
    state: dict[int, dict[str, Any]] = {}
    header = _safetensors_dtypes(files._bytes("optimizer.safetensors"),
                                 lambda message: files.error("optimizer.safetensors", None, message))
    codes = {key: np.uint8 for key in header if key.partition(".")[2] in _UINT8_STATE}
    for key, value in files.arrays("optimizer.safetensors", codes).items():
        index, _, name = key.partition(".")
        if not index.isdigit() or not name:
            raise files.error("optimizer.safetensors", key, "is not a '<parameter index>.<state name>' entry")
        state.setdefault(int(index), {})[name] = value
    for index, step in meta["steps"].items():
        if not index.isdigit():
            raise files.error("optimizer.json", f"steps[{index!r}]", "is not a parameter index")
        state.setdefault(int(index), {})["step"] = step  # checked by the optimizer
    groups = [dict(group) for group in meta["param_groups"]]
    for group in groups:
        if isinstance(group.get("betas"), list):
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


def save_ema(directory: str, ema: Any, names: list[str]) -> None:
    state = ema.state_dict()
    save_arrays(os.path.join(directory, "model_ema.safetensors"), dict(zip(names, state["shadow"])))
    save_json(os.path.join(directory, "ema.json"), {k: v for k, v in state.items() if k != "shadow"})


def read_ema(files: CheckpointFiles, names: list[str]) -> dict[str, Any]:
    """The EMA's state_dict() as save_ema wrote it (ema.json and model_ema.safetensors, shadow
    arrays in the order of `names`), its layout checked; the EMA checks the values."""
    arrays = files.arrays("model_ema.safetensors")
    missing, unexpected = [n for n in names if n not in arrays], sorted(set(arrays) - set(names))
    if missing or unexpected:
        raise files.error("model_ema.safetensors", None, f"missing arrays {missing}, unexpected arrays {unexpected}")
    meta = files.json("ema.json")
    if not isinstance(meta, dict) or "shadow" in meta:
        raise files.error("ema.json", None, "must be a JSON object of the EMA's decay, num_updates and use_warmup")
    return {**meta, "shadow": [arrays[n] for n in names]}


def to_json_state(state: dict[str, Any]) -> dict[str, Any]:
    """A scheduler's or scaler's state_dict as JSON-able values."""
    return _plain(state)
