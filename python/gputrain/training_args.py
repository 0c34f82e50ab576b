"""TrainingArguments: Hugging Face's names, meanings, defaults and checks for gputrain's Trainer.

    args = gt.TrainingArguments(output_dir="run", num_train_epochs=3, per_device_train_batch_size=32,
                                gradient_accumulation_steps=4, learning_rate=3e-3, bf16=True,
                                eval_strategy="epoch", save_strategy="epoch", ema_decay=0.999)

Every argument is checked when the object is built (`__post_init__`), with Hugging Face's
message where it has one, so a misconfiguration fails there and not inside a step. `to_dict()`,
`to_json_string()`, `from_dict()` and `from_json_file()` round-trip it (training_args.json in
every checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
import os
from dataclasses import dataclass, field
from typing import Any

from gputrain._vocab import parse_device
from gputrain.optim.schedule import SchedulerType
from gputrain.optim.zero import check_zero_stage

__all__ = ["IntervalStrategy", "OPTIMIZER_NAMES", "TrainingArguments"]

logger = logging.getLogger(__name__)

IntervalStrategy = ("no", "steps", "epoch")  # logging/eval/save strategies, as HF's IntervalStrategy
OPTIMIZER_NAMES = ("adamw_torch", "adamw_torch_fused", "adamw", "sgd")  # all AdamW names run the fused C AdamW


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _check_float(name: str, value: Any, low: float | None = None, high: float | None = None) -> None:
    if not _is_number(value):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be in {bounds}, got {value}")


def _check_bool(name: str, value: Any, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        raise TypeError(f"{name} must be a bool{' or None' if optional else ''}, not {type(value).__name__}")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _check_steps(name: str, value: Any) -> None:
    """HF's rule for logging/eval/save steps: a ratio of the total in (0, 1), or an integer > 1."""
    if not _is_number(value) or value <= 0:
        raise ValueError(f"--{name} must be a positive number, got {value!r}")
    if value > 1 and value != int(value):
        raise ValueError(f"--{name} must be an integer if bigger than 1: {value}")


@dataclass
class TrainingArguments:
    """The Trainer's settings, Hugging Face's where they exist (same names, meanings, defaults).

    Hugging Face arguments:
        output_dir: where checkpoints (checkpoint-<step>/), the history (history.jsonl) and
            save_model() go.
        num_train_epochs: epochs when max_steps <= 0 (a float: the last epoch may be partial).
        max_steps: optimizer steps to run; overrides num_train_epochs when > 0.
        per_device_train_batch_size / per_device_eval_batch_size: rows per loader batch.
        gradient_accumulation_steps: loader batches per optimizer step (the effective batch is
            per_device_train_batch_size * gradient_accumulation_steps). The last group of an
            epoch may be shorter; its loss is the mean over its rows, as HF's (see Trainer).
        learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon: the optimizer's.
            weight_decay is not applied to biases and 1-D parameters (LayerNorm weights).
        max_grad_norm: gradient clipping (0 or None: none).
        lr_scheduler_type, lr_scheduler_kwargs: a schedule of gt.optim.get_scheduler.
        warmup_ratio, warmup_steps: linear warm-up; warmup_steps > 0 overrides warmup_ratio.
        logging_strategy, logging_steps, logging_first_step: when the training loss is logged.
        eval_strategy, eval_steps: when evaluate() runs during training ("no", "steps", "epoch");
            eval_steps defaults to logging_steps.
        save_strategy, save_steps, save_total_limit: when checkpoints are written, how many kept.
        load_best_model_at_end, metric_for_best_model, greater_is_better: best-model tracking.
        seed: seeds gputrain's parameter/dropout seed sequence and the loader's shuffle.
        fp16 / bf16: mixed precision (fp16 with a dynamic GradScaler).
        tf32: TF32 matmuls on Ampere+ GPUs (None: leave the process setting); on the CPU it
            does not apply (the start-up log says so).
        gradient_checkpointing: keep block inputs only and recompute in the backward pass.
        auto_find_batch_size: when the run's memory plan (Trainer.memory_plan()) exceeds the
            memory limit, micro-batches shrink (to the largest divisor of the rows of a step that
            fits) and more of them make a
            step, so each optimizer step still sees per_device_train_batch_size *
            gradient_accumulation_steps rows; then, for AdamW on the CPU, cpu_offload_fraction is
            raised (0.25 ... 1). An OutOfMemoryError in a step (which abandons it before its
            update) is refitted the same way and the step retried once. Each change is logged
            with its reason. The trained bits are those of a run configured with the fitted
            micro-batch; they differ in the last bits from unsplit micro-batches, whose gradient
            sums over rows are rounded in another order.
        label_smoothing_factor: CrossEntropyLoss(label_smoothing=...).
        optim: "adamw_torch" (HF's default), "adamw_torch_fused", "adamw" (all the fused C
            AdamW) or "sgd" (SGD with learning_rate only, as HF's).
        dataloader_num_workers, dataloader_prefetch_factor, dataloader_pin_memory,
        dataloader_persistent_workers, dataloader_drop_last: gputrain.DataLoader's options.
        disable_tqdm: no progress bar (default: on when tqdm is installed and the
            gputrain.trainer logger shows INFO or WARNING).

    gputrain arguments:
        device: "auto" (a CUDA device when there is one, else "cpu"), "cpu", "cuda[:N]" or "sim[:N]"
            (the simulated device, which runs the device code path with the CPU's arithmetic).
        cpu_offload_fraction: the share of optimizer state kept in host memory (AdamW only).
        zero_stage: 1 shards the AdamW state over the ranks of a distributed run (ZeRO-1,
            gt.optim.AdamW(zero_stage=1): each rank keeps 1/N of it, the weights are bit-identical
            to 0's); 0 (default) keeps all of it on every rank. The name and values are DeepSpeed's
            (zero_optimization.stage, Accelerate's --zero_stage), which HF users pass through
            --deepspeed; 2 and 3 are not implemented. Checkpoints hold the whole state (gathered
            from every rank), so they resume on any world size. On an accelerator (sim; cuda
            compiled, not yet run on a GPU) the gradients are all-reduced, the parameters all-gathered.
        memory_limit / memory_fraction: a cap on gputrain's allocator for the device, in bytes
            or as a share of the device's memory, set when the Trainer is built (at most one).
            The Trainer plans the run before allocating it: a plan over the cap fails at
            construction with gputrain.OutOfMemoryError (or is fitted, see auto_find_batch_size).
        ema_decay: keep an EMA of the weights (gt.optim.EMA); evaluate()/predict() use it.
        llrd: layer-wise learning-rate decay over the model's top-level children (in (0, 1]).
        rdrop_alpha: R-Drop's weight; must be 0 for now (the fused step has no R-Drop loss yet).
    """

    output_dir: str = "trainer_output"
    num_train_epochs: float = 3.0
    max_steps: int = -1
    per_device_train_batch_size: int = 8
    per_device_eval_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float | None = 1.0
    lr_scheduler_type: str = "linear"
    lr_scheduler_kwargs: dict[str, Any] = field(default_factory=dict)
    warmup_ratio: float = 0.0
    warmup_steps: int = 0
    logging_strategy: str = "steps"
    logging_steps: float = 500
    logging_first_step: bool = False
    eval_strategy: str = "no"
    eval_steps: float | None = None
    save_strategy: str = "steps"
    save_steps: float = 500
    save_total_limit: int | None = None
    load_best_model_at_end: bool = False
    metric_for_best_model: str | None = None
    greater_is_better: bool | None = None
    seed: int = 42
    fp16: bool = False
    bf16: bool = False
    tf32: bool | None = None
    gradient_checkpointing: bool = False
    auto_find_batch_size: bool = False
    label_smoothing_factor: float = 0.0
    optim: str = "adamw_torch"
    dataloader_num_workers: int = 0
    dataloader_prefetch_factor: int | None = None
    dataloader_pin_memory: bool = True
    dataloader_persistent_workers: bool = False
    dataloader_drop_last: bool = False
    disable_tqdm: bool | None = None
    device: str = "auto"
    cpu_offload_fraction: float = 0.0
    zero_stage: int = 0
    memory_limit: int | None = None
    memory_fraction: float | None = None
    ema_decay: float | None = None
    llrd: float | None = None
    rdrop_alpha: float = 0.0

    def __post_init__(self) -> None:
        self._check_types()
        self._check_strategies()
        self._check_best_model()
        self._check_precision_and_loader()
        self._check_gputrain()

    # -- checks ------------------------------------------------------------------------------
    def _check_types(self) -> None:
        if not isinstance(self.output_dir, (str, os.PathLike)) or not str(self.output_dir):
            raise TypeError(f"output_dir must be a non-empty path, got {self.output_dir!r}")
        self.output_dir = os.fspath(self.output_dir)
        _check_float("num_train_epochs", self.num_train_epochs, 0.0)
        _check_int("max_steps", self.max_steps)
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ValueError("num_train_epochs must be > 0 when max_steps <= 0 (nothing to train)")
        _check_int("per_device_train_batch_size", self.per_device_train_batch_size, 1)
        _check_int("per_device_eval_batch_size", self.per_device_eval_batch_size, 1)
        _check_int("gradient_accumulation_steps", self.gradient_accumulation_steps, 1)
        _check_float("learning_rate", self.learning_rate, 0.0)
        _check_float("weight_decay", self.weight_decay, 0.0)
        for name in ("adam_beta1", "adam_beta2"):
            value = getattr(self, name)
            _check_float(name, value, 0.0)
            if value >= 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value}")
        _check_float("adam_epsilon", self.adam_epsilon, 0.0)
        if self.adam_epsilon == 0.0:
            raise ValueError("adam_epsilon must be > 0")
        if self.max_grad_norm is not None:
            _check_float("max_grad_norm", self.max_grad_norm, 0.0)
        self.lr_scheduler_type = SchedulerType(self.lr_scheduler_type).value
        if not isinstance(self.lr_scheduler_kwargs, dict):
            raise TypeError(f"lr_scheduler_kwargs must be a dict, not {type(self.lr_scheduler_kwargs).__name__}")
        _check_float("warmup_ratio", self.warmup_ratio)
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise ValueError("warmup_ratio must lie in range [0,1]")
        _check_int("warmup_steps", self.warmup_steps, 0)
        if self.warmup_ratio > 0 and self.warmup_steps > 0:
            logger.info("Both warmup_ratio and warmup_steps given, warmup_steps will override any effect "
                        "of warmup_ratio during training")
        _check_int("seed", self.seed)
        for name in ("logging_first_step", "load_best_model_at_end", "fp16", "bf16", "gradient_checkpointing",
                     "auto_find_batch_size", "dataloader_pin_memory", "dataloader_persistent_workers",
                     "dataloader_drop_last"):
            _check_bool(name, getattr(self, name))
        for name in ("tf32", "greater_is_better", "disable_tqdm"):
            _check_bool(name, getattr(self, name), optional=True)

    def _check_strategies(self) -> None:
        _check_choice("logging_strategy", self.logging_strategy, IntervalStrategy)
        _check_choice("eval_strategy", self.eval_strategy, IntervalStrategy)
        _check_choice("save_strategy", self.save_strategy, IntervalStrategy)
        if self.logging_strategy == "steps" and not self.logging_steps:
            raise ValueError(f"logging strategy {self.logging_strategy} requires non-zero --logging_steps")
        if self.logging_strategy == "steps":
            _check_steps("logging_steps", self.logging_steps)
        if self.eval_strategy == "steps" and not self.eval_steps:
            if self.logging_steps and self.logging_steps > 0:
                logger.info(f"using `logging_steps` to initialize `eval_steps` to {self.logging_steps}")
                self.eval_steps = self.logging_steps
            else:
                raise ValueError(f"evaluation strategy {self.eval_strategy} requires either non-zero "
                                 "--eval_steps or --logging_steps")
        if self.eval_strategy == "steps":
            _check_steps("eval_steps", self.eval_steps)
        if self.save_strategy == "steps":
            _check_steps("save_steps", self.save_steps)
        if self.save_total_limit is not None:
            _check_int("save_total_limit", self.save_total_limit, 1)

    def _check_best_model(self) -> None:
        if self.load_best_model_at_end:
            if self.eval_strategy != self.save_strategy:
                raise ValueError("--load_best_model_at_end requires the save and eval strategy to match, but found\n"
                                 f"- Evaluation strategy: {self.eval_strategy}\n- Save strategy: {self.save_strategy}")
            if self.eval_strategy == "no":
                raise ValueError("--load_best_model_at_end requires an eval_strategy and a save_strategy "
                                 "other than 'no'")
            if self.eval_strategy == "steps":
                self._check_save_multiple_of_eval()
            if self.metric_for_best_model is None:
                self.metric_for_best_model = "loss"
        if self.metric_for_best_model is not None:
            if not isinstance(self.metric_for_best_model, str) or not self.metric_for_best_model:
                raise TypeError(f"metric_for_best_model must be a metric name, got {self.metric_for_best_model!r}")
            if self.greater_is_better is None:
                self.greater_is_better = self.metric_for_best_model not in ("loss", "eval_loss")

    def _check_save_multiple_of_eval(self) -> None:
        save, evaluate = self.save_steps, self.eval_steps
        if (save < 1) != (evaluate < 1):
            raise ValueError("--load_best_model_at_end requires the saving steps to be a multiple of the evaluation "
                             "steps, which cannot get guaranteed when mixing ratio and absolute steps for "
                             f"save_steps {save} and eval_steps {evaluate}.")
        ratio = save / evaluate
        if abs(ratio - round(ratio)) > 1e-9 or round(ratio) < 1:
            raise ValueError("--load_best_model_at_end requires the saving steps to be a round multiple of the "
                             f"evaluation steps, but found {save}, which is not a round multiple of {evaluate}.")

    def _check_precision_and_loader(self) -> None:
        if self.fp16 and self.bf16:
            raise ValueError("At most one of fp16 and bf16 can be True, but not both")
        _check_float("label_smoothing_factor", self.label_smoothing_factor, 0.0, 1.0)
        _check_choice("optim", self.optim, OPTIMIZER_NAMES)
        _check_int("dataloader_num_workers", self.dataloader_num_workers, 0)
        if self.dataloader_prefetch_factor is not None:
            _check_int("dataloader_prefetch_factor", self.dataloader_prefetch_factor, 1)
            if self.dataloader_num_workers == 0:
                raise ValueError("--dataloader_prefetch_factor can only be set when data is loaded in a different "
                                 "process, i.e. when --dataloader_num_workers > 0.")
        if self.dataloader_persistent_workers and self.dataloader_num_workers == 0:
            raise ValueError("--dataloader_persistent_workers requires --dataloader_num_workers > 0")

    def _check_gputrain(self) -> None:
        parse_device(self.device, kinds=("auto", "cpu", "cuda", "sim"))  # the syntax; the Trainer checks it exists
        _check_float("cpu_offload_fraction", self.cpu_offload_fraction, 0.0, 1.0)
        if self.cpu_offload_fraction > 0 and self.optim == "sgd":
            raise ValueError("cpu_offload_fraction > 0 needs an AdamW optimizer (optim='adamw_torch'); "
                             "SGD keeps no offloadable state")
        self.zero_stage = check_zero_stage(self.zero_stage)
        if self.zero_stage and self.optim == "sgd":
            raise ValueError("zero_stage=1 shards AdamW's state (optim='adamw_torch'); SGD keeps none to shard")
        if self.memory_limit is not None and self.memory_fraction is not None:
            raise ValueError("give at most one of memory_limit (bytes) and memory_fraction (of the device)")
        if self.memory_limit is not None:
            _check_int("memory_limit", self.memory_limit, 1)
        if self.memory_fraction is not None:
            _check_float("memory_fraction", self.memory_fraction, 0.0, 1.0)
            if self.memory_fraction == 0.0:
                raise ValueError("memory_fraction must be in (0, 1], got 0.0")
        if self.ema_decay is not None:
            _check_float("ema_decay", self.ema_decay, 0.0, 1.0)
        if self.llrd is not None:
            _check_float("llrd", self.llrd, 0.0, 1.0)
            if self.llrd == 0.0:
                raise ValueError("llrd must be in (0, 1], got 0.0")
        _check_float("rdrop_alpha", self.rdrop_alpha, 0.0)
        if self.rdrop_alpha > 0:
            raise ValueError(f"rdrop_alpha={self.rdrop_alpha}: R-Drop needs a second dropout pass and a KL term "
                             "inside the fused training step, which gputrain does not have yet; use 0.0")

    # -- derived values -------------------------------------------------------------------------
    @property
    def train_batch_size(self) -> int:
        """Rows per loader batch (one device)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.per_device_eval_batch_size

    @property
    def precision(self) -> str:
        """TrainStep's precision name."""
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """HF's rule: warmup_steps when > 0, else ceil(num_training_steps * warmup_ratio)."""
        return self.warmup_steps if self.warmup_steps > 0 else math.ceil(num_training_steps * self.warmup_ratio)

    # -- serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainingArguments:
        """Arguments from to_dict()'s output; an unknown key raises (it may be a typo)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise TypeError(f"TrainingArguments got unknown arguments {unknown}")
        return cls(**values)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str]) -> TrainingArguments:
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_json_file(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json_string())
