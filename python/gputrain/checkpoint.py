"""Checkpoint files: arrays in safetensors, everything else in JSON, written atomically.

A checkpoint is a directory `checkpoint-<step>/` in the output directory:

    model.safetensors        the model's state_dict() (PyTorch names)
    model_ema.safetensors    the EMA of the weights (same names), when ema_decay is set
    optimizer.safetensors    per-parameter state arrays: "<index>.<name>" (exp_avg, exp_avg_sq, ...)
    optimizer.json           param_groups (hyperparameters, parameter indices) and per-parameter steps
    scheduler.json           the LR scheduler's state_dict()
    scaler.json              the GradScaler's state_dict() (fp16 only)
    ema.json                 the EMA's decay and update count
    gputrain_state.json      the exact-resume state: the model's dropout stream (seed, step), the
                             loader's position, the logging accumulators and the callbacks' state
    trainer_state.json       TrainerState (Hugging Face's file)
    training_args.json       the TrainingArguments

The directory is written under a temporary name, every file and the directory are fsynced,
and it is renamed into place, so a run killed at any moment leaves either the complete
checkpoint or none (a leftover temporary directory is removed by the next save). No pickle.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["PREFIX_CHECKPOINT_DIR", "get_last_checkpoint", "sorted_checkpoints", "write_checkpoint"]

PREFIX_CHECKPOINT_DIR = "checkpoint"
_CHECKPOINT_RE = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
_TEMPORARY_PREFIX = f".tmp-{PREFIX_CHECKPOINT_DIR}-"


def _safetensors() -> Any:
    try:
        import safetensors.numpy
    except ImportError:
        raise ImportError("checkpoints need the safetensors package (a gputrain dependency): "
                          "pip install safetensors") from None
    return safetensors.numpy


def save_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Writes named arrays to a safetensors file (contiguous copies, shapes kept)."""
    _safetensors().save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path)


def load_arrays(path: str) -> dict[str, np.ndarray]:
    return _safetensors().load_file(path)


def save_json(path: str, value: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, sort_keys=True)
        f.write("\n")


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
    directory, whose files are fsynced before it is renamed into place; returns the path.
    An existing checkpoint of the same step is replaced."""
    import shutil  # here, not at `import gputrain`

    os.makedirs(output_dir, exist_ok=True)
    final = os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
    temporary = os.path.join(output_dir, f"{_TEMPORARY_PREFIX}{step}")
    for name in os.listdir(output_dir):  # debris of a run killed while saving
        if name.startswith(_TEMPORARY_PREFIX):
            shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)
    os.makedirs(temporary)
    try:
        write(temporary)
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
    return final


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


def read_optimizer(directory: str) -> dict[str, Any]:
    """The optimizer's state_dict() as save_optimizer wrote it."""
    meta = load_json(os.path.join(directory, "optimizer.json"))
    arrays = load_arrays(os.path.join(directory, "optimizer.safetensors"))
    state: dict[int, dict[str, Any]] = {}
    for key, value in arrays.items():
        index, name = key.split(".", 1)
        state.setdefault(int(index), {})[name] = value
    for index, step in meta["steps"].items():
        state.setdefault(int(index), {})["step"] = np.array(step, dtype=np.float32)
    groups = meta["param_groups"]
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


def save_ema(directory: str, ema: Any, names: list[str]) -> None:
    state = ema.state_dict()
    save_arrays(os.path.join(directory, "model_ema.safetensors"), dict(zip(names, state["shadow"])))
    save_json(os.path.join(directory, "ema.json"), {k: v for k, v in state.items() if k != "shadow"})


def read_ema(directory: str, names: list[str]) -> dict[str, Any]:
    """The EMA's state_dict() as save_ema wrote it (shadow arrays in the order of `names`)."""
    arrays = load_arrays(os.path.join(directory, "model_ema.safetensors"))
    missing = [name for name in names if name not in arrays]
    if missing:
        raise KeyError(f"{directory}: model_ema.safetensors lacks {missing}")
    return {**load_json(os.path.join(directory, "ema.json")), "shadow": [arrays[n] for n in names]}


def to_json_state(state: dict[str, Any]) -> dict[str, Any]:
    """A scheduler's or scaler's state_dict as JSON-able values."""
    return _plain(state)
