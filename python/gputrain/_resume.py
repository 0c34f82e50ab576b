"""A Trainer's resume, validate then apply: every file of a checkpoint is read and every field
checked -- types, ranges, shapes, dtypes, and the consistency of step counts and of the
schedule's position across files -- into new values (a ResumePlan) before any live object
changes; Trainer._apply_resume then applies them with steps that cannot refuse.

One check function per file kind. Each raises gputrain.CheckpointError naming the file and the
field; the components' own checks (their _stage_state_dict, which load_state_dict runs too) are
turned into CheckpointErrors naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from gputrain import checkpoint as ckpt
from gputrain import peft
from gputrain.checkpoint import CheckpointError, CheckpointFiles
from gputrain.trainer_callback import TrainerState

__all__ = ["ResumePlan", "check_weights", "read_and_check"]

TRAINER_STATE_NAME = "trainer_state.json"
GPUTRAIN_STATE_NAME = "gputrain_state.json"
_STEP_DIR_RE = re.compile(rf"^{ckpt.PREFIX_CHECKPOINT_DIR}-(\d+)$")
_LOGGING_KEYS = ("loss_sum", "steps", "last_logged_step", "grad_norm", "total_loss", "total_steps")
_MAX_INT64 = 2**63 - 1


@dataclasses.dataclass
class ResumePlan:
    """Everything a checkpoint restores, checked; nothing of it is live yet."""

    state: TrainerState                 # trainer_state.json
    extra: dict[str, Any]               # gputrain_state.json: model_step, micro_batch_rows, logging, done, callbacks
    model: Any                          # the model's staged weights (Module._stage_state_dict)
    ema: Any                            # the EMA's staged state, or None without an EMA
    optimizer: Any                      # the optimizer's staged groups and states
    scheduler: Any                      # the scheduler's staged attributes
    scaler: Any                         # the scaler's staged values, or None without fp16
    loader: Any                         # the loader's staged position


# -- small checks that name the file and the field --------------------------------------------

def _int(files: CheckpointFiles, file: str, field: str, value: Any, low: int | None = None,
         high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise files.error(file, field, f"must be an int, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise files.error(file, field, f"must be in [{low}, {high}], got {value}")
    return value


def _number(files: CheckpointFiles, file: str, field: str, value: Any, finite: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise files.error(file, field, f"must be a number, got {value!r}")
    if finite and not math.isfinite(value):
        raise files.error(file, field, f"must be finite, got {value!r}")
    return float(value)


def _object(files: CheckpointFiles, file: str, field: str | None, value: Any,
            keys: tuple[str, ...] = (), optional: tuple[str, ...] = (), exact: bool = True) -> dict[str, Any]:
    """`value` as a JSON object with the keys `keys` (and maybe `optional`; others refused when exact)."""
    if not isinstance(value, dict):
        raise files.error(file, field, f"must be a JSON object, not {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    unexpected = [k for k in value if k not in keys and k not in optional] if exact else []
    if missing or unexpected:
        raise files.error(file, field, f"missing keys {missing}, unexpected keys {unexpected}")
    return value


def _staged(files: CheckpointFiles, file: str, stage: Callable[..., Any], *args: Any, within: str = "") -> Any:
    """stage(*args) -- a component's _stage_state_dict -- with its refusal as a CheckpointError
    (`within`: the field of `file` that holds the component's state)."""
    try:
        return stage(*args)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as error:
        if isinstance(error, CheckpointError):
            raise
        message = str(error.args[0] if isinstance(error, KeyError) and error.args else error)
        field, message = _field_of(message)
        field = ".".join(part for part in (within, field) if part) or None
        raise files.error(file, field, message) from None


def _field_of(message: str) -> tuple[str | None, str]:
    """(field, rest) of a component's message naming an entry, e.g. "state_dict['param_groups'][0]['lr']
    must be ..." -> ("param_groups[0].lr", "must be ..."); (None, message) when it names none."""
    match = re.match(r"state_dict((?:\[[^\]]*\])+):? (.*)", message, re.DOTALL)
    if match is None:
        return None, message
    return re.sub(r"\['([^']*)'\]", r".\1", match.group(1)).lstrip("."), match.group(2)


# -- one check per file kind ------------------------------------------------------------------

def check_trainer_state(files: CheckpointFiles) -> TrainerState:
    """trainer_state.json: every TrainerState field of its type and range, global_step in
    [0, max_steps] and the step of the directory's name (unknown keys are Hugging Face's: ignored)."""
    file = TRAINER_STATE_NAME
    names = [f.name for f in dataclasses.fields(TrainerState)]
    values = _object(files, file, None, files.json(file), tuple(names), exact=False)
    max_steps = _int(files, file, "max_steps", values["max_steps"], 0)
    step = _int(files, file, "global_step", values["global_step"], 0, max_steps)
    for name in ("logging_steps", "eval_steps", "save_steps", "num_train_epochs"):
        _int(files, file, name, values[name], 0)
    if values["epoch"] is not None and _number(files, file, "epoch", values["epoch"]) < 0:
        raise files.error(file, "epoch", f"must be >= 0, got {values['epoch']!r}")
    if values["train_batch_size"] is not None:
        _int(files, file, "train_batch_size", values["train_batch_size"], 1)
    if values["best_metric"] is not None:  # a NaN metric is a value a run can log
        _number(files, file, "best_metric", values["best_metric"], finite=False)
    if values["best_global_step"] is not None:
        _int(files, file, "best_global_step", values["best_global_step"], 0, step)
    if values["best_model_checkpoint"] is not None and not isinstance(values["best_model_checkpoint"], str):
        raise files.error(file, "best_model_checkpoint", f"must be a path, got {values['best_model_checkpoint']!r}")
    for name in ("is_local_process_zero", "is_world_process_zero"):
        if not isinstance(values[name], bool):
            raise files.error(file, name, f"must be true or false, got {values[name]!r}")
    history = values["log_history"]
    if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
        raise files.error(file, "log_history", "must be a list of JSON objects")
    match = _STEP_DIR_RE.match(os.path.basename(os.path.normpath(files.directory)))
    if match and int(match.group(1)) != step:
        raise files.error(file, "global_step", f"is {step}, but the directory is the checkpoint of step "
                                               f"{match.group(1)}")
    return TrainerState(**{name: values[name] for name in names})


def check_gputrain_state(files: CheckpointFiles, global_step: int) -> dict[str, Any]:
    """gputrain_state.json: the dropout stream, micro-batch size, logging sums, the steps last
    evaluated and saved (none beyond global_step), the callbacks' states and the loader position
    (its layout; the loader checks its values)."""
    file = GPUTRAIN_STATE_NAME
    extra = _object(files, file, None, files.json(file),
                    ("model_seed", "model_step", "loader", "logging", "done", "callbacks"),
                    ("micro_batch_rows", "world_size", "checkpoint_format"))
    if "checkpoint_format" in extra and extra["checkpoint_format"] != ckpt.FORMAT_VERSION:
        raise files.error(file, "checkpoint_format", f"{extra['checkpoint_format']!r} is not a format this "
                                                     f"gputrain reads ({ckpt.FORMAT_VERSION})")
    _int(files, file, "model_seed", extra["model_seed"], 0, 2**64 - 1)
    _int(files, file, "model_step", extra["model_step"], 0, _MAX_INT64)
    micro_batch_rows = _int(files, file, "micro_batch_rows", extra.get("micro_batch_rows", 0), 0)  # 0: as now
    world_size = _int(files, file, "world_size", extra.get("world_size", 1), 1)
    logging = _object(files, file, "logging", extra["logging"], _LOGGING_KEYS)
    for key in ("loss_sum", "total_loss", "grad_norm"):  # a NaN loss or norm is a value a run can log
        _number(files, file, f"logging.{key}", logging[key], finite=False)
    for key in ("steps", "last_logged_step", "total_steps"):
        _int(files, file, f"logging.{key}", logging[key], 0, global_step)
    done = _object(files, file, "done", extra["done"], ("eval", "save"))
    for key in ("eval", "save"):
        _int(files, file, f"done.{key}", done[key], -1, global_step)
    callbacks = _object(files, file, "callbacks", extra["callbacks"], exact=False)
    _object(files, file, "loader", extra["loader"], exact=False)
    return {**extra, "world_size": world_size, "micro_batch_rows": micro_batch_rows, "logging": dict(logging),
            "done": dict(done), "callbacks": dict(callbacks)}


def check_model(files: CheckpointFiles, model: Any) -> Any:
    """model.safetensors: the model's names, each array stored in its parameter's dtype (no silent
    cast) and of its shape, every value finite. For a PeftModel, its adapter files instead
    (check_adapter)."""
    if isinstance(model, peft.PeftModel):
        return check_adapter(files, model)
    if not files.has("model.safetensors") and files.has(peft.WEIGHTS_NAME):
        raise files.error(peft.WEIGHTS_NAME, None, "the checkpoint holds a PEFT adapter and no base weights, but "
                                                   f"the model is a {type(model).__name__} without an adapter: "
                                                   "resume it onto gputrain.peft.get_peft_model(base, config) "
                                                   f"with the config of its {peft.CONFIG_NAME}")
    own = model.state_dict()
    weights = files.arrays("model.safetensors", {name: value.dtype for name, value in own.items()})
    return _staged(files, "model.safetensors", model._stage_state_dict, weights)


# adapter_config.json fields that decide the adapter's tensors or its math: a resume needs the model's values
# (init_lora_weights does not: the checkpoint's tensors replace the initial ones)
_ADAPTER_FIELDS = ("peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "lora_dropout", "target_modules",
                   "modules_to_save", "bias", "rank_pattern", "alpha_pattern", "layers_to_transform",
                   "exclude_modules", "fan_in_fan_out", "lora_bias")


def _comparable(value: Any) -> Any:
    """A config value as compared: a list of names as a sorted list (PEFT's order is a set's)."""
    return sorted(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else value


def check_adapter(files: CheckpointFiles, model: Any) -> Any:
    """adapter_config.json and adapter_model.safetensors (PEFT's files) for a PeftModel: the
    config's fields that make the adapter (r, lora_alpha, target_modules, use_dora, ...) are the
    model's, the tensors exactly the model's adapter keys, float32, of their shapes, finite."""
    if not files.has(peft.CONFIG_NAME) and files.has("model.safetensors"):
        raise files.error("model.safetensors", None, "the checkpoint holds a whole model and no PEFT adapter, but "
                                                     "the model is a PeftModel: resume it onto the model it was "
                                                     "trained as")
    config = files.json(peft.CONFIG_NAME)
    if not isinstance(config, dict):
        raise files.error(peft.CONFIG_NAME, None, f"must be a JSON object, not {type(config).__name__}")
    own = model.peft_config[peft.ADAPTER].to_dict()
    for field in _ADAPTER_FIELDS:
        if _comparable(config.get(field)) != _comparable(own[field]):
            raise files.error(peft.CONFIG_NAME, field, f"is {config.get(field)!r} in the checkpoint, but the model's "
                                                       f"adapter has {own[field]!r} (build the model with the "
                                                       "checkpoint's LoraConfig)")
    expected = model.adapter_state_dict()
    arrays = files.arrays(peft.WEIGHTS_NAME)
    for key in expected:
        if key not in arrays:
            raise files.error(peft.WEIGHTS_NAME, key, "missing: the model's adapter has this tensor")
    for key, value in arrays.items():
        if key not in expected:
            raise files.error(peft.WEIGHTS_NAME, key, "is not a tensor of the model's adapter")
        if value.shape != expected[key].shape:
            raise files.error(peft.WEIGHTS_NAME, key, f"has shape {value.shape}, the model's adapter "
                                                      f"{expected[key].shape}")
        if not np.isfinite(value).all():
            raise files.error(peft.WEIGHTS_NAME, key, "holds NaN or infinite values")
    state = {peft._internal_key(key): value for key, value in arrays.items()}
    return _staged(files, peft.WEIGHTS_NAME, lambda s: model._stage_state_dict(s, strict=False), state)


def check_ema(files: CheckpointFiles, ema: Any, names: list[str]) -> Any:
    """ema.json and model_ema.safetensors."""
    state = ckpt.read_ema(files, names)
    return _staged(files, "ema.json / model_ema.safetensors", ema._stage_state_dict, state)


def check_optimizer(files: CheckpointFiles, optimizer: Any, global_step: int) -> tuple[Any, dict[str, Any]]:
    """optimizer.json and optimizer.safetensors: the optimizer's checks (groups, hyperparameter
    ranges, one state array of each parameter's shape), and no parameter stepped more often than
    the run (global_step). Returns (staged, the state dict read)."""
    state = ckpt.read_optimizer(files)
    staged = _staged(files, "optimizer.json / optimizer.safetensors", optimizer._stage_state_dict, state)
    for index, entries in state["state"].items():
        step = entries.get("step")
        if step is not None and step > global_step:
            raise files.error("optimizer.json", f"steps.{index}",
                              f"{step} optimizer steps, more than trainer_state.json's global_step {global_step}")
    return staged, state


def check_scheduler(files: CheckpointFiles, scheduler: Any, global_step: int,
                    optimizer_state: dict[str, Any]) -> Any:
    """scheduler.json: the scheduler's checks, and its position is the run's: last_epoch =
    global_step, _step_count = last_epoch + 1, base_lrs and _last_lr the optimizer groups'
    initial_lr and lr (optimizer.json)."""
    file = "scheduler.json"
    state = files.json(file)
    staged = _staged(files, file, scheduler._stage_state_dict, state)
    if staged["last_epoch"] != global_step:
        raise files.error(file, "last_epoch", f"is {staged['last_epoch']}, but trainer_state.json's global_step is "
                                              f"{global_step} (the schedule steps once per optimizer step)")
    if staged["_step_count"] != staged["last_epoch"] + 1:
        raise files.error(file, "_step_count", f"is {staged['_step_count']}, expected last_epoch + 1 = "
                                               f"{staged['last_epoch'] + 1}")
    for g, group in enumerate(optimizer_state["param_groups"]):
        for key, own in (("base_lrs", "initial_lr"), ("_last_lr", "lr")):
            if own in group and staged[key][g] != group[own]:
                raise files.error(file, f"{key}[{g}]", f"is {staged[key][g]!r}, but optimizer.json's "
                                                      f"param_groups[{g}].{own} is {group[own]!r}")
    return staged


def check_scaler(files: CheckpointFiles, scaler: Any) -> Any:
    """scaler.json (fp16 only): there exactly when the scaler is on, with the scaler's checks."""
    if (scaler is not None) != files.has("scaler.json"):
        raise files.error("scaler.json", None, f"{'present' if files.has('scaler.json') else 'missing'}: the "
                                               f"checkpoint was saved with fp16={files.has('scaler.json')}, "
                                               f"resumed with fp16={scaler is not None}")
    if scaler is None:
        return None
    return _staged(files, "scaler.json", scaler._stage_state_dict, files.json("scaler.json"))


def check_loader(files: CheckpointFiles, loader: Any, state: dict[str, Any]) -> Any:
    """gputrain_state.json's "loader": the loader's checks of the position (as this world size
    reads it)."""
    return _staged(files, GPUTRAIN_STATE_NAME, loader._stage_state_dict, state, within="loader")


def read_and_check(trainer: Any, directory: str) -> ResumePlan:
    """The ResumePlan of a checkpoint directory for `trainer`; changes nothing."""
    files = ckpt.read_checkpoint_files(directory)
    state = check_trainer_state(files)
    extra = check_gputrain_state(files, state.global_step)
    model = check_model(files, trainer.model)
    ema = check_ema(files, trainer.ema, trainer._param_names()) if trainer.ema is not None else None
    optimizer, optimizer_state = check_optimizer(files, trainer.optimizer, state.global_step)
    scheduler = check_scheduler(files, trainer.lr_scheduler, state.global_step, optimizer_state)
    scaler = check_scaler(files, trainer.scaler)
    loader_state = _staged(files, GPUTRAIN_STATE_NAME, trainer._loader_state_for_world, extra["loader"],
                           extra["world_size"], within="loader")
    loader = check_loader(files, trainer.train_dataloader, loader_state)
    return ResumePlan(state, extra, model, ema, optimizer, scheduler, scaler, loader)


def check_weights(trainer: Any, directory: str) -> tuple[Any, Any]:
    """The staged weights (and EMA) of a checkpoint directory, for load_best_model_at_end."""
    files = ckpt.read_checkpoint_files(directory)
    model = check_model(files, trainer.model)
    ema = check_ema(files, trainer.ema, trainer._param_names()) if trainer.ema is not None else None
    return model, ema

