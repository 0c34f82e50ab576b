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

__all__ = ["FIELD_TABLE", "IntervalStrategy", "OPTIMIZER_NAMES", "TrainingArguments", "fields_markdown"]

logger = logging.getLogger(__name__)

IntervalStrategy = ("no", "steps", "epoch")  # logging/eval/save strategies, as HF's IntervalStrategy
OPTIMIZER_NAMES = ("adamw_torch", "adamw_torch_fused", "adamw", "sgd",  # all AdamW names run the fused C AdamW
                   "adamw_8bit", "adamw_bnb_8bit",  # gt.optim.AdamW8bit (bitsandbytes' AdamW8bit)
                   "paged_adamw_8bit", "paged_adamw_32bit")  # the same, the state offloaded (PAGED_NAMES)
EIGHT_BIT_NAMES = ("adamw_8bit", "adamw_bnb_8bit", "paged_adamw_8bit")
PAGED_NAMES = ("paged_adamw_8bit", "paged_adamw_32bit")  # cpu_offload_fraction 1 unless given


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
        warmup_steps, warmup_ratio: linear warm-up; warmup_steps >= 1 is a number of steps, in (0, 1)
            a share of the steps (transformers 5); warmup_ratio is transformers 4's share.
        logging_strategy, logging_steps, logging_first_step: when the training loss is logged.
        eval_strategy, eval_steps: when evaluate() runs during training ("no", "steps", "epoch");
            eval_steps defaults to logging_steps.
        save_strategy, save_steps, save_total_limit: when checkpoints are written, how many kept.
        load_best_model_at_end, metric_for_best_model, greater_is_better: best-model tracking.
        seed: seeds gputrain's parameter/dropout seed sequence and the loader's shuffle.
        fp16 / bf16: mixed precision (fp16 with a dynamic GradScaler).
        tf32: TF32 matmuls on Ampere+ GPUs (None: leave the process setting); on the CPU it
            does not apply (the start-up log says so).
        gradient_checkpointing: keep block inputs only and recompute in the backward pass;
            "offload" (gputrain's) keeps a decoder's layer inputs in pinned host memory
            (TrainStep's gradient_checkpointing).
        auto_find_batch_size: when the run's memory plan (Trainer.memory_plan()) exceeds the
            memory limit, micro-batches shrink (to the largest divisor of the rows of a step that
            fits) and more of them make a
            step, so each optimizer step still sees per_device_train_batch_size *
            gradient_accumulation_steps rows; then, for AdamW and AdamW8bit, cpu_offload_fraction is
            raised (0.25 ... 1). An OutOfMemoryError in a step (which abandons it before its
            update) is refitted the same way and the step retried once. Each change is logged
            with its reason. The trained bits are those of a run configured with the fitted
            micro-batch; they differ in the last bits from unsplit micro-batches, whose gradient
            sums over rows are rounded in another order.
        label_smoothing_factor: CrossEntropyLoss(label_smoothing=...).
        optim: "adamw_torch" (HF's default), "adamw_torch_fused", "adamw" (all the fused C
            AdamW), "adamw_8bit" or "adamw_bnb_8bit" (gt.optim.AdamW8bit, bitsandbytes' 8-bit
            AdamW: 2 bytes of state per parameter; no zero_stage) or "sgd" (SGD with learning_rate
            only, as HF's). "paged_adamw_8bit" / "paged_adamw_32bit" (bitsandbytes' state in CUDA
            unified memory, paged to the host on demand) are AdamW8bit / AdamW with their state in
            pinned host memory instead: cpu_offload_fraction 1 unless one is given.
        dataloader_num_workers, dataloader_prefetch_factor, dataloader_pin_memory,
        dataloader_persistent_workers, dataloader_drop_last: gputrain.DataLoader's options.
        disable_tqdm: no progress bar (the log lines are printed anyway, as HF's PrinterCallback).
        log_level / log_level_replica: the gputrain.trainer logger's level on the main process / the
            other ranks ("passive": INFO on the main process unless a level was set), as HF's.
        ... and every other field of transformers 5's TrainingArguments (and transformers 4's
        names still in scripts): FIELD_TABLE below says, for each, whether it is supported,
        not applicable here (accepted; listed in the Trainer's start-up block when set) or refused
        (with the alternative); fields_markdown() renders it as a table.

    gputrain arguments:
        device: "auto" (a CUDA device when there is one, else "cpu"), "cpu", "cuda[:N]" or "sim[:N]"
            (the simulated device, which runs the device code path with the CPU's arithmetic).
        cpu_offload_fraction: the share of optimizer state kept in host memory (AdamW, AdamW8bit);
            None (default): 1 for the paged optimizers, else 0. An explicit 0 keeps a paged
            optimizer's state on the device.
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
        loss_chunk_rows: rows per block of the training step's LM head + cross-entropy (TrainStep's
            loss_chunk_rows; 0, the default: the logits of a whole micro-batch at once). With C > 0
            only C x vocabulary logits are ever held; the model must end with a Linear.
        ema_decay: keep an EMA of the weights (gt.optim.EMA); evaluate()/predict() use it.
        llrd: layer-wise learning-rate decay over the model's top-level children (in (0, 1]).
        rdrop_alpha: R-Drop's weight (Liang et al. 2021; TrainStep(rdrop_alpha=...)): > 0 runs every
            micro-batch twice in one forward (independent dropout masks) and adds rdrop_alpha times
            the symmetric KL of the two passes, averaged over the examples, to their mean
            cross-entropy; the activation memory doubles. Cross-entropy only; 0 (default): off.
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
    lr_scheduler_kwargs: dict[str, Any] | None = field(default_factory=dict)
    warmup_ratio: float = 0.0
    warmup_steps: float = 0
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
    gradient_checkpointing: bool | str | None = False
    auto_find_batch_size: bool = False
    label_smoothing_factor: float = 0.0
    optim: str = "adamw_torch"
    dataloader_num_workers: int = 0
    dataloader_prefetch_factor: int | None = None
    dataloader_pin_memory: bool = True
    dataloader_persistent_workers: bool = False
    dataloader_drop_last: bool = False
    disable_tqdm: bool | None = None
    # Hugging Face arguments added for scripts written for transformers (see FIELD_TABLE)
    log_level: str = "passive"
    log_level_replica: str = "warning"
    log_on_each_node: bool = True
    logging_nan_inf_filter: bool = True
    eval_delay: float = 0
    eval_on_start: bool = False
    prediction_loss_only: bool = False
    data_seed: int | None = None
    use_cpu: bool = False
    remove_unused_columns: bool = True
    label_names: list[str] | None = None
    train_sampling_strategy: str = "random"
    length_column_name: str = "length"
    dataloader_multiprocessing_context: str | None = None
    dataloader_in_order: bool = True
    activation_checkpointing: bool | None = None
    activation_checkpointing_kwargs: dict[str, Any] | str | None = None
    gradient_checkpointing_kwargs: dict[str, Any] | str | None = None
    report_to: str | list[str] | None = "none"
    run_name: str | None = None
    project: str = "huggingface"
    trackio_space_id: str | None = None
    trackio_bucket_id: str | None = None
    trackio_static_space_id: Any = None
    torch_compile: bool = False
    torch_compile_backend: str | None = None
    torch_compile_mode: str | None = None
    bf16_full_eval: bool = False
    fp16_full_eval: bool = False
    average_tokens_across_devices: bool = True
    use_cache: bool = False
    torch_empty_cache_steps: int | None = None
    include_num_input_tokens_seen: str | bool = "no"
    eval_do_concat_batches: bool = True
    eval_use_gather_object: bool = False
    eval_accumulation_steps: int | None = None
    include_for_metrics: list[str] = field(default_factory=list)
    save_on_each_node: bool = False
    ignore_data_skip: bool = False
    restore_callback_states_from_checkpoint: bool = False
    full_determinism: bool = False
    skip_memory_metrics: bool = True
    do_train: bool = False
    do_eval: bool = False
    do_predict: bool = False
    resume_from_checkpoint: str | None = None
    local_rank: int = -1
    ddp_find_unused_parameters: bool | None = None
    ddp_bucket_cap_mb: int | None = None
    ddp_broadcast_buffers: bool | None = None
    ddp_static_graph: bool | None = None
    ddp_backend: str | None = None
    ddp_timeout: int = 1800
    debug: str | list[str] = ""
    push_to_hub: bool = False
    hub_token: str | None = None
    hub_private_repo: bool | None = None
    hub_model_id: str | None = None
    hub_strategy: str = "every_save"
    hub_always_push: bool = False
    hub_revision: str | None = None
    batch_eval_metrics: bool = False
    save_only_model: bool = False
    enable_jit_checkpoint: bool = False
    optim_args: str | None = None
    optim_target_modules: str | list[str] | None = None
    use_liger_kernel: bool = False
    liger_kernel_config: dict[str, bool] | None = None
    neftune_noise_alpha: float | None = None
    accelerator_config: dict[str, Any] | str | None = None
    parallelism_config: Any = None
    fsdp: str | list[str] | None = None
    fsdp_config: dict[str, Any] | str | None = None
    deepspeed: dict[str, Any] | str | None = None
    # transformers 4 names that scripts still pass (mapped onto the transformers 5 ones)
    evaluation_strategy: str | None = None
    group_by_length: bool = False
    overwrite_output_dir: bool = False
    logging_dir: str | None = None
    save_safetensors: bool = True
    # gputrain arguments
    device: str = "auto"
    cpu_offload_fraction: float | None = None
    zero_stage: int = 0
    memory_limit: int | None = None
    memory_fraction: float | None = None
    loss_chunk_rows: int = 0
    ema_decay: float | None = None
    llrd: float | None = None
    rdrop_alpha: float = 0.0

    def __post_init__(self) -> None:
        self._check_table_fields()
        self._check_types()
        self._check_strategies()
        self._check_best_model()
        self._check_precision_and_loader()
        self._check_gputrain()

    # -- checks ------------------------------------------------------------------------------
    def _check_table_fields(self) -> None:
        """Refused fields at their defaults; transformers 4 names and aliases mapped onto the fields
        the rest of the Trainer reads; HF's logging and sampling choices."""
        for f in dataclasses.fields(self):
            status, meaning = FIELD_TABLE[f.name]
            if status == REFUSED and getattr(self, f.name) != _field_default(f):
                raise ValueError(f"{f.name}={getattr(self, f.name)!r} is not supported by gputrain: {meaning}")
        if not self.save_safetensors:
            raise ValueError("save_safetensors=False is not supported by gputrain: checkpoints are safetensors")
        if self.evaluation_strategy is not None:
            if self.eval_strategy not in ("no", self.evaluation_strategy):
                raise ValueError(f"evaluation_strategy={self.evaluation_strategy!r} (transformers 4's name) and "
                                 f"eval_strategy={self.eval_strategy!r} disagree: give eval_strategy only")
            self.eval_strategy = self.evaluation_strategy
        _check_bool("group_by_length", self.group_by_length)
        _check_choice("train_sampling_strategy", self.train_sampling_strategy,
                      ("random", "sequential", "group_by_length", "batch_rebalance"))
        if self.group_by_length and self.train_sampling_strategy == "random":
            self.train_sampling_strategy = "group_by_length"
        for name in ("log_level", "log_level_replica"):
            _check_choice(name, getattr(self, name), tuple(_LOG_LEVELS))
        _check_bool("use_cpu", self.use_cpu)
        if self.use_cpu:
            if self.device not in ("auto", "cpu"):
                raise ValueError(f"use_cpu=True and device={self.device!r} disagree: give one of them")
            self.device = "cpu"
        if self.activation_checkpointing is not None:
            _check_bool("activation_checkpointing", self.activation_checkpointing)
            if self.gradient_checkpointing != "offload":
                self.gradient_checkpointing = bool(self.gradient_checkpointing) or self.activation_checkpointing
        if self.gradient_checkpointing is None:
            self.gradient_checkpointing = False
        if self.lr_scheduler_kwargs is None:
            self.lr_scheduler_kwargs = {}
        if isinstance(self.report_to, str):
            self.report_to = [] if self.report_to == "none" else [self.report_to]
        elif self.report_to is None:
            self.report_to = []
        if self.label_names is not None and (not isinstance(self.label_names, (list, tuple))
                                             or not all(isinstance(n, str) for n in self.label_names)):
            raise TypeError(f"label_names must be a list of column names, got {self.label_names!r}")
        _check_float("eval_delay", self.eval_delay, 0.0)
        if self.data_seed is not None:
            _check_int("data_seed", self.data_seed)
        for name in ("eval_on_start", "prediction_loss_only", "remove_unused_columns", "logging_nan_inf_filter",
                     "dataloader_in_order"):
            _check_bool(name, getattr(self, name))

    def not_applicable(self) -> list[str]:
        """One line per field set to something other than its default that has no effect here (the
        Trainer's start-up block shows them)."""
        notes = []
        for f in dataclasses.fields(self):
            status, meaning = FIELD_TABLE[f.name]
            value = getattr(self, f.name)
            if f.name == "report_to":
                if value:
                    notes.append(f"report_to={value!r}: {meaning}")
            elif status in (NOT_APPLICABLE, LEGACY) and value != _field_default(f) and f.name != "group_by_length":
                notes.append(f"{f.name}={value!r}: {meaning}")
        if self.train_sampling_strategy == "batch_rebalance":
            notes.append("train_sampling_strategy='batch_rebalance': batches are drawn in random order (each padded "
                         "to its longest row when a collator pads)")
        return notes

    def process_log_level(self, main: bool) -> int:
        """HF's get_process_log_level: log_level on the main process, log_level_replica on the
        others; 'passive' keeps the gputrain.trainer logger's level, INFO when none is set."""
        level = _LOG_LEVELS[self.log_level if main else self.log_level_replica]
        if level != -1:
            return level
        current = logging.getLogger("gputrain.trainer").level
        return current if current != logging.NOTSET else (logging.INFO if main else logging.WARNING)

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
        _check_float("warmup_steps", self.warmup_steps, 0.0)
        if self.warmup_steps > 1 and self.warmup_steps != int(self.warmup_steps):
            raise ValueError(f"warmup_steps must be an integer if bigger than 1 (below 1: a share of the steps), "
                             f"got {self.warmup_steps}")
        if self.warmup_ratio > 0 and self.warmup_steps > 0:
            logger.info("Both warmup_ratio and warmup_steps given, warmup_steps will override any effect "
                        "of warmup_ratio during training")
        _check_int("seed", self.seed)
        if not isinstance(self.gradient_checkpointing, bool) and self.gradient_checkpointing != "offload":
            raise TypeError(f"gradient_checkpointing must be a bool or 'offload', got {self.gradient_checkpointing!r}")
        for name in ("logging_first_step", "load_best_model_at_end", "fp16", "bf16",
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
        if self.cpu_offload_fraction is None:  # bitsandbytes' paged state lives in host-backed memory
            self.cpu_offload_fraction = 1.0 if self.optim in PAGED_NAMES else 0.0
        _check_float("cpu_offload_fraction", self.cpu_offload_fraction, 0.0, 1.0)
        if self.cpu_offload_fraction > 0 and self.optim == "sgd":
            raise ValueError("cpu_offload_fraction > 0 needs an AdamW optimizer (optim='adamw_torch'); "
                             "SGD keeps no offloadable state")
        self.zero_stage = check_zero_stage(self.zero_stage)
        if self.zero_stage and self.optim in EIGHT_BIT_NAMES:
            raise ValueError(f"zero_stage=1 shards AdamW's state (optim='adamw_torch'), not optim={self.optim!r}'s")
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
        _check_int("loss_chunk_rows", self.loss_chunk_rows, 0)
        if self.llrd is not None:
            _check_float("llrd", self.llrd, 0.0, 1.0)
            if self.llrd == 0.0:
                raise ValueError("llrd must be in (0, 1], got 0.0")
        _check_float("rdrop_alpha", self.rdrop_alpha, 0.0)

    # -- derived values -------------------------------------------------------------------------
    @property
    def train_batch_size(self) -> int:
        """Rows per loader batch (one device)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        """Rows per evaluation batch (one device): per_device_eval_batch_size."""
        return self.per_device_eval_batch_size

    @property
    def precision(self) -> str:
        """TrainStep's precision name."""
        return "fp16" if self.fp16 else "bf16" if self.bf16 else "fp32"

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """HF's rule: warmup_steps when >= 1; a share of the steps, ceil(num_training_steps *
        warmup_steps), when in (0, 1) (transformers 5); else transformers 4's warmup_ratio."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        ratio = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return math.ceil(num_training_steps * ratio)

    # -- serialisation -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field's value by name (from_dict's input)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_json_string(self) -> str:
        """to_dict() as indented JSON with sorted keys."""
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
        """Arguments from a JSON file written by to_json_file(); an unknown key raises."""
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def to_json_file(self, path: str | os.PathLike[str]) -> None:
        """Write to_json_string() to `path` (UTF-8)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_json_string())


# -- the status of every field: ONE table ------------------------------------------------------------
SUPPORTED = "supported"            # Hugging Face's meaning and default
LEGACY = "transformers 4 name"     # accepted and mapped onto the transformers 5 field named in the meaning
NOT_APPLICABLE = "not applicable"  # accepted; a value other than the default is reported in the start-up block
REFUSED = "refused"                # only the default is accepted; another value raises, naming the alternative
GPUTRAIN = "gputrain"              # gputrain's own argument

_HF = SUPPORTED
_NA = NOT_APPLICABLE

# field -> (status, what it means in gputrain). The default is the dataclass field's own (one place).
FIELD_TABLE: dict[str, tuple[str, str]] = {
    "output_dir": (_HF, "checkpoints, history.jsonl and save_model() go here"),
    "num_train_epochs": (_HF, "epochs when max_steps <= 0 (the last may be partial)"),
    "max_steps": (_HF, "optimizer steps; overrides num_train_epochs when > 0"),
    "per_device_train_batch_size": (_HF, "rows per loader batch"),
    "per_device_eval_batch_size": (_HF, "rows per evaluation batch"),
    "gradient_accumulation_steps": (_HF, "loader batches per optimizer step, one C call per step"),
    "learning_rate": (_HF, "the optimizer's peak learning rate"),
    "weight_decay": (_HF, "AdamW's decoupled decay, not on biases and 1-D parameters"),
    "adam_beta1": (_HF, "AdamW's beta1"),
    "adam_beta2": (_HF, "AdamW's beta2"),
    "adam_epsilon": (_HF, "AdamW's epsilon"),
    "max_grad_norm": (_HF, "gradient clipping by global norm (0 or None: off)"),
    "lr_scheduler_type": (_HF, "a schedule of gputrain.optim.get_scheduler"),
    "lr_scheduler_kwargs": (_HF, "extra arguments of the schedule"),
    "warmup_ratio": (LEGACY, "transformers 4's share of steps for warm-up; warmup_steps < 1 says it in transformers 5"),
    "warmup_steps": (_HF, "linear warm-up steps; a value < 1 is a share of the total steps (transformers 5)"),
    "logging_strategy": (_HF, "when the loss is logged: no, steps, epoch"),
    "logging_steps": (_HF, "steps between loss lines (< 1: a share of the total)"),
    "logging_first_step": (_HF, "log the first step too"),
    "eval_strategy": (_HF, "when evaluate() runs during training: no, steps (and at the last step), epoch"),
    "eval_steps": (_HF, "steps between evaluations (default: logging_steps)"),
    "save_strategy": (_HF, "when checkpoints are written: no, steps, epoch"),
    "save_steps": (_HF, "steps between checkpoints"),
    "save_total_limit": (_HF, "checkpoints kept (the best one too)"),
    "load_best_model_at_end": (_HF, "reload the best checkpoint's weights after training"),
    "metric_for_best_model": (_HF, "the evaluation metric that ranks checkpoints (default loss)"),
    "greater_is_better": (_HF, "whether a larger metric_for_best_model is better"),
    "seed": (_HF, "seeds parameters, dropout and the loader's shuffle"),
    "fp16": (_HF, "fp16 mixed precision with a dynamic loss scaler"),
    "bf16": (_HF, "bf16 mixed precision"),
    "tf32": (_HF, "TF32 matmuls on Ampere+ GPUs (None: leave the process setting)"),
    "gradient_checkpointing": (_HF, "keep block inputs only and recompute them in the backward pass "
                                    "(\"offload\": a decoder's in pinned host memory)"),
    "auto_find_batch_size": (_HF, "fit micro-batches (then offload) to the memory plan; retry a step once after "
                                  "an OutOfMemoryError"),
    "label_smoothing_factor": (_HF, "CrossEntropyLoss(label_smoothing=...)"),
    "optim": (_HF, "adamw_torch, adamw_torch_fused, adamw (the fused C AdamW), adamw_8bit / adamw_bnb_8bit "
                   "(gt.optim.AdamW8bit), sgd, or paged_adamw_8bit / paged_adamw_32bit (the same with the "
                   "state in pinned host memory)"),
    "dataloader_num_workers": (_HF, "gputrain.DataLoader's workers"),
    "dataloader_prefetch_factor": (_HF, "batches prefetched per worker"),
    "dataloader_pin_memory": (_HF, "pinned loader slots (on a device)"),
    "dataloader_persistent_workers": (_HF, "keep workers between epochs"),
    "dataloader_drop_last": (_HF, "drop the last short batch"),
    "disable_tqdm": (_HF, "no progress bar; the loss lines are printed anyway (HF's PrinterCallback)"),
    "log_level": (_HF, "the gputrain.trainer logger's level on the main process (passive: INFO unless set)"),
    "log_level_replica": (_HF, "the logger's level on the other ranks"),
    "log_on_each_node": (_NA, "one node: the main process logs"),
    "logging_nan_inf_filter": (_HF, "a NaN/inf step loss is logged as the mean of the logged steps before it"),
    "eval_delay": (_HF, "epochs or steps (by eval_strategy) before the first evaluation"),
    "eval_on_start": (_HF, "evaluate once before training"),
    "prediction_loss_only": (_HF, "evaluate()/predict() return the loss only (no compute_metrics)"),
    "data_seed": (_HF, "the loader's shuffle seed (default: seed)"),
    "use_cpu": (_HF, "train on the CPU (device='cpu')"),
    "remove_unused_columns": (_HF, "dict batches: columns the model does not read are dropped (False: an "
                                   "unknown column is an error)"),
    "label_names": (_HF, "the batch keys holding the labels (default labels, label, label_ids)"),
    "train_sampling_strategy": (_HF, "random, sequential or group_by_length (transformers' LengthGroupedSampler "
                                     "over a Philox permutation); batch_rebalance is accepted and runs random "
                                     "order (reported at start-up)"),
    "length_column_name": (_HF, "group_by_length reads the examples' lengths from this column when the dataset "
                                "has it"),
    "dataloader_multiprocessing_context": (_HF, "the workers' start method"),
    "dataloader_in_order": (_HF, "batches in sampler order"),
    "activation_checkpointing": (_HF, "transformers 5's name of gradient_checkpointing"),
    "activation_checkpointing_kwargs": (_NA, "every block is checkpointed; the kwargs have no counterpart"),
    "gradient_checkpointing_kwargs": (_NA, "every block is checkpointed; use_reentrant has no counterpart"),
    "report_to": (_NA, "no tracker integrations: logs go to the console and output_dir/history.jsonl"),
    "run_name": (_NA, "for trackers, which gputrain does not report to"),
    "project": (_NA, "for trackio, which gputrain does not report to"),
    "trackio_space_id": (_NA, "for trackio, which gputrain does not report to"),
    "trackio_bucket_id": (_NA, "for trackio, which gputrain does not report to"),
    "trackio_static_space_id": (_NA, "for trackio, which gputrain does not report to"),
    "torch_compile": (_NA, "each training step is already one compiled C call (fused forward, backward and "
                           "update); there is nothing for torch.compile to do"),
    "torch_compile_backend": (_NA, "see torch_compile"),
    "torch_compile_mode": (_NA, "see torch_compile"),
    "bf16_full_eval": (_NA, "evaluation runs the model's forward in the precision it holds"),
    "fp16_full_eval": (_NA, "evaluation runs the model's forward in the precision it holds"),
    "average_tokens_across_devices": (_NA, "the loss is the mean over the step's rows"),
    "use_cache": (_NA, "the models keep no key/value cache in training"),
    "torch_empty_cache_steps": (_NA, "gputrain's allocator plans memory before the run; nothing to empty"),
    "include_num_input_tokens_seen": (_NA, "tokens seen are not counted"),
    "eval_do_concat_batches": (_NA, "evaluation outputs are always concatenated"),
    "eval_use_gather_object": (_NA, "one process evaluates"),
    "eval_accumulation_steps": (_NA, "evaluation outputs are host arrays already"),
    "include_for_metrics": (_NA, "EvalPrediction holds predictions and label_ids"),
    "save_on_each_node": (_NA, "rank 0 saves"),
    "ignore_data_skip": (_NA, "a resume restores the loader's position without skipping batches"),
    "restore_callback_states_from_checkpoint": (_NA, "callbacks with state_dict() are always restored"),
    "full_determinism": (_NA, "runs are deterministic already (bit-identical resumes)"),
    "skip_memory_metrics": (_NA, "the memory plan is shown at start-up instead"),
    "do_train": (_NA, "read by scripts, not by the Trainer (as in HF)"),
    "do_eval": (_NA, "read by scripts, not by the Trainer (as in HF)"),
    "do_predict": (_NA, "read by scripts, not by the Trainer (as in HF)"),
    "resume_from_checkpoint": (_NA, "read by scripts; pass it to train(resume_from_checkpoint=...) (as in HF)"),
    "local_rank": (_NA, "set by the launcher (python -m gputrain.distributed)"),
    "ddp_find_unused_parameters": (_NA, "gputrain.distributed all-reduces every gradient"),
    "ddp_bucket_cap_mb": (_NA, "gputrain.distributed all-reduces every gradient"),
    "ddp_broadcast_buffers": (_NA, "gputrain.distributed all-reduces every gradient"),
    "ddp_static_graph": (_NA, "gputrain.distributed all-reduces every gradient"),
    "ddp_backend": (_NA, "gputrain.distributed has its own backend"),
    "ddp_timeout": (_NA, "gputrain.distributed has its own timeouts"),
    "debug": (_NA, "no debug modes; gputrain.guards checks values"),
    "push_to_hub": (REFUSED, "no Hub upload: save_model() writes model.safetensors (a PeftModel's adapter "
                             "files); upload output_dir with "
                             "huggingface_hub's upload_folder"),
    "hub_token": (_NA, "only with push_to_hub, which is refused"),
    "hub_private_repo": (_NA, "only with push_to_hub, which is refused"),
    "hub_model_id": (_NA, "only with push_to_hub, which is refused"),
    "hub_strategy": (_NA, "only with push_to_hub, which is refused"),
    "hub_always_push": (_NA, "only with push_to_hub, which is refused"),
    "hub_revision": (_NA, "only with push_to_hub, which is refused"),
    "batch_eval_metrics": (REFUSED, "compute_metrics gets the whole evaluation set; use prediction_loss_only or a "
                                    "smaller eval_dataset"),
    "save_only_model": (REFUSED, "checkpoints hold the whole state so that they resume exactly; call "
                                 "save_model() for the weights alone"),
    "enable_jit_checkpoint": (REFUSED, "no checkpoint on SIGTERM; use save_steps"),
    "optim_args": (REFUSED, "use adam_beta1, adam_beta2, adam_epsilon and weight_decay"),
    "optim_target_modules": (REFUSED, "GaLore-style optimizers do not exist here; use optim"),
    "use_liger_kernel": (REFUSED, "the training step is fused C already; leave it False"),
    "liger_kernel_config": (REFUSED, "see use_liger_kernel"),
    "neftune_noise_alpha": (REFUSED, "NEFTune noise is not implemented"),
    "accelerator_config": (REFUSED, "no Accelerate; the loader and device arguments are TrainingArguments'"),
    "parallelism_config": (REFUSED, "data parallelism only: launch with python -m gputrain.distributed"),
    "fsdp": (REFUSED, "no FSDP; zero_stage=1 shards the optimizer state"),
    "fsdp_config": (REFUSED, "no FSDP; zero_stage=1 shards the optimizer state"),
    "deepspeed": (REFUSED, "no DeepSpeed; zero_stage=1 is its ZeRO stage 1"),
    "evaluation_strategy": (LEGACY, "transformers 4's name of eval_strategy"),
    "group_by_length": (LEGACY, "transformers 4's train_sampling_strategy='group_by_length'"),
    "overwrite_output_dir": (LEGACY, "removed in transformers 5; output_dir is written into as it is"),
    "logging_dir": (LEGACY, "removed in transformers 5; logs go to output_dir/history.jsonl"),
    "save_safetensors": (LEGACY, "removed in transformers 5; checkpoints are safetensors (False is refused)"),
    "device": (GPUTRAIN, "auto, cpu, cuda[:N] or sim[:N]"),
    "cpu_offload_fraction": (GPUTRAIN, "share of AdamW's or AdamW8bit's state kept in host memory"),
    "zero_stage": (GPUTRAIN, "1: ZeRO-1, the AdamW state sharded over the ranks"),
    "memory_limit": (GPUTRAIN, "a cap on gputrain's allocator, in bytes"),
    "memory_fraction": (GPUTRAIN, "a cap on gputrain's allocator, a share of the device"),
    "loss_chunk_rows": (GPUTRAIN, "rows per block of the LM head + cross-entropy (0: whole logits)"),
    "ema_decay": (GPUTRAIN, "keep an EMA of the weights; evaluate()/predict() use it"),
    "llrd": (GPUTRAIN, "layer-wise learning-rate decay"),
    "rdrop_alpha": (GPUTRAIN, "R-Drop's KL weight: two dropout passes per micro-batch"),
}

_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
               "critical": logging.CRITICAL, "passive": -1}


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def fields_markdown() -> str:
    """The Markdown table of every TrainingArguments field: name, default, status, meaning here."""
    lines = ["| field | default | status | meaning in gputrain |", "|---|---|---|---|"]
    for f in dataclasses.fields(TrainingArguments):
        status, meaning = FIELD_TABLE[f.name]
        lines.append(f"| `{f.name}` | `{_field_default(f)!r}` | {status} | {meaning.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
