"""Trainer: Hugging Face's training loop over gputrain's one-call step.

    args = gt.TrainingArguments(output_dir="run", num_train_epochs=3, per_device_train_batch_size=32,
                                eval_strategy="epoch", save_strategy="epoch", bf16=True)
    trainer = gt.Trainer(model, args, train_dataset=(x, y), eval_dataset=(x_val, y_val),
                         compute_metrics=gt.metrics.classification_metrics("macro"))
    trainer.train()                      # or train(resume_from_checkpoint=True)
    trainer.evaluate()                   # {"eval_loss": ..., "eval_accuracy": ..., ...}

Gradient accumulation keeps Hugging Face's meaning (gradient_accumulation_steps loader batches
per optimizer step) and each optimizer step stays one C call: the training loader yields
per_device_train_batch_size * gradient_accumulation_steps rows at a time (the same rows, in the
same order, as that many consecutive batches), and TrainStep splits them into micro-batches of
at most per_device_train_batch_size rows. The loss of a step is the mean over all its rows, as
Hugging Face's since transformers 4.46 (the loss summed over the group's items divided by
num_items_in_batch) -- also for the last, shorter group of an epoch, which is split into the
fewest equal micro-batches of at most per_device_train_batch_size rows. (With ignore_index
labels, each micro-batch's mean over its counted rows is averaged instead.)

The model's dropout stream (its seed and step), the loader's position, the optimizer, scheduler,
scaler and EMA are all in a checkpoint, so a run stopped (or killed) and resumed ends
bit-identical to an uninterrupted one. A resume reads and checks every file of the checkpoint
(against its manifest.json of SHA-256s, then every field: gputrain._resume) before it changes
anything; a damaged checkpoint raises gputrain.CheckpointError. With ema_decay set, evaluate() and predict() run with
the averaged weights; the trained weights are what the model holds outside them, and
save_model() writes both (model.safetensors and model_ema.safetensors).

With a gputrain.peft.PeftModel (get_peft_model), as transformers' Trainer with a PEFT model,
checkpoints and save_model() hold PEFT's adapter files (adapter_config.json,
adapter_model.safetensors) instead of model.safetensors, and the optimizer keeps state for the
trainable parameters only: the frozen base is not saved (but in model_ema.safetensors with
ema_decay: the EMA averages every parameter). A resume (or load_best_model_at_end)
needs the model rebuilt as it was (the same base and LoraConfig); a checkpoint of another adapter
(another r, target set, ...) or of a whole model is refused naming the field or tensor.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from gputrain import _C, _resume, backends, distributed, memory, random
from gputrain import checkpoint as ckpt
from gputrain import memory_plan as mp
from gputrain._info import precision_note
from gputrain._resume import GPUTRAIN_STATE_NAME, TRAINER_STATE_NAME
from gputrain._vocab import parse_device
from gputrain.amp import GradScaler
from gputrain.data import DataLoader, LengthGroupedSampler, RaggedArray
from gputrain.data.collate import DataCollatorWithPadding, to_numpy
from gputrain.metrics import EvalPrediction, PredictionOutput
from gputrain.nn.loss import CrossEntropyLoss, MSELoss
from gputrain.nn.module import Module
from gputrain.nn.sequence import TokenEmbedding, _first_leaf, pack_for
from gputrain.optim import EMA, SGD, AdamW, AdamW8bit, get_scheduler, param_groups_llrd, param_groups_weight_decay
from gputrain.peft import PeftModel, _internal_key
from gputrain.step import TrainStep
from gputrain.trainer_callback import (
    CallbackHandler,
    DefaultFlowCallback,
    PrinterCallback,
    ProgressCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)
from gputrain.training_args import EIGHT_BIT_NAMES, TrainingArguments

__all__ = ["TRAINER_KEYWORDS", "EvalPrediction", "PredictionOutput", "TrainOutput", "Trainer",
           "trainer_keywords_markdown"]

logger = logging.getLogger("gputrain.trainer")

HISTORY_NAME = "history.jsonl"


class TrainOutput(NamedTuple):
    """What train() returns (Hugging Face's TrainOutput)."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


def _is_pair(dataset: Any) -> bool:
    """An (inputs, labels) pair of arrays (not a list of two examples)."""
    return (isinstance(dataset, (tuple, list)) and len(dataset) == 2
            and not any(isinstance(part, (Mapping, tuple)) for part in dataset))


def _is_examples(dataset: Any) -> bool:
    """A list or map-style Dataset (__len__ and __getitem__) of per-example dicts or (x, y) tuples,
    as Hugging Face's datasets and PyTorch's Dataset subclasses give them."""
    if dataset is None or isinstance(dataset, (DataLoader, Mapping, np.ndarray)) or _is_pair(dataset):
        return False
    return hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")


def _check_dataset(name: str, dataset: Any) -> None:
    """A dataset is a DataLoader, an (inputs, labels) pair of arrays, or a list / map-style
    Dataset of examples (turned into a DataLoader before this check)."""
    if dataset is None or isinstance(dataset, DataLoader):
        return
    if not _is_pair(dataset):
        raise TypeError(f"{name} must be an (inputs, labels) pair of arrays, a mapping of columns, a list or "
                        f"map-style Dataset of examples, or a gputrain.DataLoader; not {type(dataset).__name__}")
    x, y = (np.asarray(to_numpy(a)) for a in dataset)
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y):
        raise ValueError(f"{name}: inputs and labels must have the same number of rows, got shapes "
                         f"{x.shape} and {y.shape}")
    if len(x) == 0:
        raise ValueError(f"{name} has no rows")


_COLUMNS = ("input_ids", "attention_mask", "token_type_ids", "position_ids")
_LABEL_KEYS = ("labels", "label", "label_ids")  # HF's collators rename label / label_ids to labels


def _read_columns(model: Module) -> tuple[str, ...] | None:
    """The text columns the model reads (input_ids and what its TokenEmbedding takes), or None
    for a model whose first layer is not a TokenEmbedding (it reads one input column)."""
    first = _first_leaf(model)
    if not isinstance(first, TokenEmbedding):
        return None
    return ("input_ids",) + (("attention_mask",) if first.attention_mask else ()) + \
        (("token_type_ids",) if first.type_vocab_size else ()) + (("position_ids",) if first.position_ids else ())


def _batch_to_pair(model: Module, name: str, batch: Any, label_names: Any = None,
                   remove_unused: bool = True) -> tuple[Any, Any]:
    """A batch (or a mapping dataset) as the (inputs, labels) the model reads: a mapping of columns
    ({"input_ids", "attention_mask", "token_type_ids", "labels" / "label" / "label_ids"}, or one
    input column and the labels for other models), or an (inputs, labels) tuple as given."""
    if not isinstance(batch, Mapping):
        if isinstance(batch, (tuple, list)) and len(batch) == 2:
            return to_numpy(batch[0]), to_numpy(batch[1])
        raise TypeError(f"{name}: a batch must be an (inputs, labels) pair or a dict of columns with labels, "
                        f"not {type(batch).__name__}")
    keys = tuple(label_names) if label_names else _LABEL_KEYS
    labels = [key for key in keys if key in batch]
    if len(labels) != 1:
        raise ValueError(f"{name}: a dict batch needs exactly one label column among {list(keys)} (label_names); "
                         f"got columns {sorted(batch)}")
    reads = _read_columns(model)
    inputs = [key for key in batch if key not in labels]
    wanted = [key for key in inputs if key in (reads or _COLUMNS)] if reads is not None else inputs
    unused = sorted(set(inputs) - set(wanted))
    if reads is None and len(wanted) != 1:
        raise ValueError(f"{name}: {type(model).__name__} reads one input column (its first layer is not a "
                         f"TokenEmbedding); the batch has {sorted(inputs)} besides {labels[0]!r}")
    if unused and not remove_unused:
        raise ValueError(f"{name}: columns {unused} are not read by {type(model).__name__} (it reads "
                         f"{list(reads or wanted)}); set remove_unused_columns=True to drop them")
    y = to_numpy(batch[labels[0]])
    shift = getattr(model, "shift_labels", None)  # a causal LM's labels are its input ids, as in transformers
    if callable(shift):
        y = shift(y)
    if reads is None:
        return to_numpy(batch[wanted[0]]), y
    if "input_ids" not in batch:
        raise ValueError(f"{name}: a dict batch for {type(model).__name__} needs 'input_ids'; got {sorted(batch)}")
    get = {key: (to_numpy(batch[key]) if key in batch and key in reads else None) for key in _COLUMNS}
    pack = getattr(model, "pack", None)  # a model's own packing fills in a missing mask / token types
    if get["position_ids"] is not None:
        packed = pack_for(model, get["input_ids"], get["attention_mask"], None, get["position_ids"])
    else:
        packed = (pack if callable(pack) else lambda *a: pack_for(model, *a))(
            get["input_ids"], get["attention_mask"], get["token_type_ids"])
    return packed, np.asarray(y)


def _as_pair(model: Module, name: str, dataset: Any, args: TrainingArguments | None = None) -> Any:
    """A Hugging Face style mapping of columns as the (inputs, labels) pair of arrays the model
    reads (gputrain.nn.pack_inputs); anything else as given."""
    if not isinstance(dataset, Mapping):
        return dataset
    label_names = None if args is None else args.label_names
    remove = True if args is None else args.remove_unused_columns
    return _batch_to_pair(model, name, dataset, label_names, remove)


def _pad_id(model: Module, processing_class: Any) -> int:
    """The padding id of HF's default collator: the tokenizer's, else the model's, else 0."""
    for owner in (processing_class, model, getattr(model, "config", None)):
        value = getattr(owner, "pad_token_id", None) if owner is not None else None
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return int(value)
    return 0


def _micro_batches(rows: int, max_rows: int) -> int:
    """The fewest equal micro-batches of at most max_rows rows that `rows` splits into."""
    count = -(-rows // max_rows)
    while rows % count:
        count += 1
    return count


def _train_batches(args: TrainingArguments, dataset: Any) -> int:
    """Loader batches of per_device_train_batch_size rows per epoch (0 without a dataset)."""
    if dataset is None:
        return 0
    if isinstance(dataset, DataLoader):
        batches = len(dataset)
    else:
        count = len(dataset) if isinstance(dataset, _Examples) else len(to_numpy(dataset[0]))
        rows, size = -(-count // distributed.get_world_size()), args.per_device_train_batch_size
        batches = rows // size if args.dataloader_drop_last else -(-rows // size)
    if batches == 0:
        raise ValueError(f"train_dataset gives no batch of per_device_train_batch_size="
                         f"{args.per_device_train_batch_size} rows (dataloader_drop_last="
                         f"{args.dataloader_drop_last})")
    return batches


def _resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda:0" if _C.cuda_device_count() > 0 else "cpu"
    return parse_device(device)  # canonical: "cpu", "cuda:N" or "sim:N"


class _Examples:
    """A list or map-style Dataset of examples and the collator that makes its batches; or a
    mapping of columns with ragged ones (gt.data.tokenize's), which the DataLoader pads per batch
    (collator None, `rows` its number of rows)."""

    def __init__(self, dataset: Any, collator: Callable[[list[Any]], Any] | None, rows: int | None = None) -> None:
        self.dataset = dataset
        self.collator = collator
        self.rows = len(dataset) if rows is None else rows

    def __len__(self) -> int:
        return self.rows


def _ragged_columns(name: str, dataset: Any) -> _Examples | None:
    """A mapping of columns with a RaggedArray among them, as examples the DataLoader pads per
    batch (each batch then goes through _batch_to_pair); None for anything else."""
    if not isinstance(dataset, Mapping) or not any(isinstance(v, RaggedArray) for v in dataset.values()):
        return None
    lengths = {key: len(value) for key, value in dataset.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{name}: the columns have different numbers of rows: {lengths}")
    rows = next(iter(lengths.values()))
    if rows == 0:
        raise ValueError(f"{name} has no rows")
    return _Examples(dict(dataset), None, rows)


# Trainer(...) keyword -> (status, meaning in gputrain); statuses as TrainingArguments' FIELD_TABLE.
TRAINER_KEYWORDS: dict[str, tuple[str, str]] = {
    "model": ("supported", "a gputrain.nn.Module"),
    "args": ("supported", "TrainingArguments (default: TrainingArguments())"),
    "data_collator": ("supported", "list of examples -> batch, for list / map-style datasets of examples; default: "
                                   "pad input_ids with the tokenizer's or model's pad id (else 0), attention_mask and "
                                   "token_type_ids with 0, label / label_ids renamed labels"),
    "train_dataset": ("supported", "examples (list / map-style Dataset of dicts or (x, y)), an (inputs, labels) pair "
                                   "of arrays, a mapping of columns, or a gputrain.DataLoader (dict or tuple batches)"),
    "eval_dataset": ("supported", "as train_dataset"),
    "processing_class": ("supported", "kept as trainer.processing_class; its pad_token_id pads the default collator's "
                                      "input_ids"),
    "model_init": ("refused", "no hyperparameter search; build the model before the Trainer"),
    "compute_loss_func": ("refused", "the loss is inside the fused C step; pass loss_fn=gt.nn.CrossEntropyLoss(...) "
                                     "or gt.nn.MSELoss()"),
    "compute_metrics": ("supported", "EvalPrediction -> dict of metrics (gputrain.metrics has common ones)"),
    "callbacks": ("supported", "TrainerCallback instances or classes, after the default flow and progress ones"),
    "optimizers": ("refused", "(None, None) only: the optimizer and schedule come from TrainingArguments (optim, "
                              "learning_rate, weight_decay, adam_*, lr_scheduler_type, warmup_steps)"),
    "optimizer_cls_and_kwargs": ("refused", "None only: the optimizer comes from TrainingArguments.optim"),
    "preprocess_logits_for_metrics": ("supported", "(logits, labels) -> what EvalPrediction.predictions holds, "
                                                   "per evaluation batch"),
    "tokenizer": ("transformers 4 name", "of processing_class"),
    "loss_fn": ("gputrain", "CrossEntropyLoss (default, with label_smoothing_factor) or MSELoss"),
}


def trainer_keywords_markdown() -> str:
    """The Markdown table of Trainer(...)'s keywords: name, status, meaning here."""
    lines = ["| keyword | status | meaning in gputrain |", "|---|---|---|"]
    lines += [f"| `{name}` | {status} | {meaning} |" for name, (status, meaning) in TRAINER_KEYWORDS.items()]
    return "\n".join(lines) + "\n"


class _ConsoleHandler(logging.StreamHandler):
    """The gputrain.trainer logger's own handler (HF's library handler): prints the start-up block
    and warnings without configuring logging; silent once the root logger has handlers (then the
    record reaches them instead, once)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property  # type: ignore[override]
    def stream(self) -> Any:  # the current sys.stderr (notebooks and pytest replace it)
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass

    def filter(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        return not logging.getLogger().handlers and super().filter(record)


def _install_console_handler() -> None:
    if not any(isinstance(h, _ConsoleHandler) for h in logger.handlers):
        logger.addHandler(_ConsoleHandler())


class Trainer:
    """Trains `model` as Hugging Face's Trainer does, one C call per optimizer step.

    The keywords are Hugging Face's, in its order (TRAINER_KEYWORDS says what each means here):
        model: a gputrain.nn.Module.
        args: TrainingArguments (default: TrainingArguments()).
        data_collator: makes a batch of a list of examples (default: padding, as HF's
            DataCollatorWithPadding).
        train_dataset / eval_dataset: a list or map-style Dataset of examples (dicts such as
            {"input_ids", "attention_mask", "labels"}, or (x, y) tuples), an (inputs, labels) pair of
            arrays, a mapping of columns, or a gputrain.DataLoader yielding dict or (inputs, labels)
            batches (then its batch size and options are used as given).
        processing_class (tokenizer): kept; its pad_token_id pads the default collator's input_ids.
        compute_metrics: EvalPrediction -> dict of metrics (see gputrain.metrics).
        callbacks: TrainerCallback instances or classes, after the default flow and progress ones.
        preprocess_logits_for_metrics: (logits, labels) -> predictions, per evaluation batch.
        model_init, compute_loss_func, optimizers, optimizer_cls_and_kwargs: refused unless left at
            their defaults (the message names the alternative).
        loss_fn: CrossEntropyLoss (default, with label_smoothing_factor) or MSELoss.
    """

    def __init__(self, model: Module | None = None, args: TrainingArguments | None = None,
                 data_collator: Callable[[list[Any]], Any] | None = None, train_dataset: Any = None,
                 eval_dataset: Any = None, processing_class: Any = None, model_init: Any = None,
                 compute_loss_func: Any = None,
                 compute_metrics: Callable[[EvalPrediction], dict[str, float]] | None = None,
                 callbacks: list[TrainerCallback | type[TrainerCallback]] | None = None,
                 optimizers: tuple[Any, Any] = (None, None), optimizer_cls_and_kwargs: Any = None,
                 preprocess_logits_for_metrics: Callable[[Any, Any], Any] | None = None, *,
                 tokenizer: Any = None, loss_fn: CrossEntropyLoss | MSELoss | None = None) -> None:
        args = TrainingArguments() if args is None else args
        self._refuse_keywords(model_init, compute_loss_func, optimizers, optimizer_cls_and_kwargs,
                              preprocess_logits_for_metrics, data_collator)
        if tokenizer is not None and processing_class is not None and tokenizer is not processing_class:
            raise ValueError("give processing_class only (tokenizer is transformers 4's name of it)")
        processing_class = processing_class if processing_class is not None else tokenizer
        if isinstance(model, Module) and isinstance(args, TrainingArguments):
            collator = data_collator or DataCollatorWithPadding(_pad_id(model, processing_class))
            train_dataset = self._source(model, args, "train_dataset", train_dataset, collator)
            eval_dataset = self._source(model, args, "eval_dataset", eval_dataset, collator)
        batches = self._check_arguments(model, args, train_dataset, eval_dataset, compute_metrics, callbacks)
        self.loss_fn = self._make_loss(loss_fn, args)
        self.device = _resolve_device(args.device)  # everything above only checks; from here on, effects
        self.model = model
        self.args = args
        self.data_collator = data_collator
        self.processing_class = processing_class
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self._train_source = train_dataset
        self.train_dataset = train_dataset.dataset if isinstance(train_dataset, _Examples) else train_dataset
        self._eval_source = eval_dataset
        self.eval_dataset = eval_dataset.dataset if isinstance(eval_dataset, _Examples) else eval_dataset
        self.compute_metrics = compute_metrics
        self._set_up_logging()
        random.manual_seed(args.seed)  # HF's set_seed: whatever is built from here on is reproducible
        self._apply_memory_cap()
        if self.device != "cpu":
            model.to(self.device)
        self.state = TrainerState()
        self.control = TrainerControl()
        self.optimizer: Any = None
        self.lr_scheduler: Any = None
        self.scaler: GradScaler | None = None
        self.ema: EMA | None = None
        self.train_dataloader: DataLoader | None = None
        self._micro_cap = 0  # rows per micro-batch at most (auto_find_batch_size may lower it)
        self._offload = args.cpu_offload_fraction  # (auto_find_batch_size may raise it)
        self._step: TrainStep | None = None
        self._grouped = False  # True: a user DataLoader whose batches are gathered into groups
        self._updates_per_epoch = 0
        self._batches_per_epoch = batches  # loader batches of per_device_train_batch_size rows (HF's epoch unit)
        # losses since the last log, and of the whole run (train_loss: their mean over all steps, as HF's)
        self._logged = {"loss_sum": 0.0, "steps": 0, "last_logged_step": 0, "grad_norm": math.nan,
                        "total_loss": 0.0, "total_steps": 0}
        self._done = {"eval": -1, "save": -1}  # the steps last evaluated and saved at
        if train_dataset is not None:
            self._setup_training(batches)
        bar = self._progress_bar()
        default = [DefaultFlowCallback] + ([ProgressCallback] if bar else [PrinterCallback] if self._prints() else [])
        self.callback_handler = CallbackHandler(
            default + list(callbacks or []), model=model, optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler, train_dataloader=self.train_dataloader, train_step=self._step)
        self.control = self.callback_handler.call_event("on_init_end", args, self.state, self.control)

    @staticmethod
    def _refuse_keywords(model_init: Any, compute_loss_func: Any, optimizers: Any, optimizer_cls_and_kwargs: Any,
                         preprocess_logits_for_metrics: Any, data_collator: Any) -> None:
        given = {"model_init": model_init is not None, "compute_loss_func": compute_loss_func is not None,
                 "optimizers": tuple(optimizers or (None, None)) != (None, None),
                 "optimizer_cls_and_kwargs": optimizer_cls_and_kwargs is not None}
        for name, refused in given.items():
            if refused:
                raise ValueError(f"Trainer({name}=...) is not supported by gputrain: {TRAINER_KEYWORDS[name][1]}")
        for name, value in (("preprocess_logits_for_metrics", preprocess_logits_for_metrics),
                            ("data_collator", data_collator)):
            if value is not None and not callable(value):
                raise TypeError(f"{name} must be callable, not {type(value).__name__}")

    @staticmethod
    def _source(model: Module, args: TrainingArguments, name: str, dataset: Any, collator: Any) -> Any:
        """What the Trainer reads a dataset from: examples with their collator, a DataLoader, a
        mapping with ragged columns (padded per batch), or an (inputs, labels) pair (any other
        mapping of columns becomes one)."""
        if _is_examples(dataset):
            if len(dataset) == 0:
                raise ValueError(f"{name} has no examples")
            return _Examples(dataset, collator)
        columns = _ragged_columns(name, dataset)
        return columns if columns is not None else _as_pair(model, name, dataset, args)

    def _set_up_logging(self) -> None:
        """HF's logging: the gputrain.trainer logger at log_level on the main process (passive:
        INFO unless the user set a level) and log_level_replica elsewhere, with its own console
        handler when nothing else would print."""
        main = distributed.is_main_process()
        logger.setLevel(self.args.process_log_level(main))
        _install_console_handler()

    def _prints(self) -> bool:
        """The loss lines without a bar (HF's PrinterCallback): on the main process."""
        return distributed.is_main_process()

    # -- construction ----------------------------------------------------------------------------
    @staticmethod
    def _check_arguments(model: Any, args: Any, train_dataset: Any, eval_dataset: Any, compute_metrics: Any,
                         callbacks: Any) -> int:
        """Every check of the constructor's arguments (nothing changes); returns the loader
        batches per epoch."""
        if not isinstance(model, Module):
            raise TypeError(f"model must be a gputrain.nn.Module, not {type(model).__name__}")
        if not isinstance(args, TrainingArguments):
            raise TypeError(f"args must be a gputrain.TrainingArguments, not {type(args).__name__}")
        for name, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            if not isinstance(dataset, _Examples):
                _check_dataset(name, dataset)
        if args.eval_strategy != "no" and eval_dataset is None:
            raise ValueError(f"You have set args.eval_strategy to {args.eval_strategy!r} but you didn't pass an "
                             "eval_dataset to Trainer. Either set args.eval_strategy to 'no' or pass an eval_dataset.")
        if compute_metrics is not None and not callable(compute_metrics):
            raise TypeError(f"compute_metrics must be callable, not {type(compute_metrics).__name__}")
        for callback in callbacks or []:
            if not (isinstance(callback, TrainerCallback)
                    or (isinstance(callback, type) and issubclass(callback, TrainerCallback))):
                raise TypeError(f"callbacks must be TrainerCallback instances or classes, not "
                                f"{type(callback).__name__}")
        return _train_batches(args, train_dataset)

    @staticmethod
    def _make_loss(loss_fn: Any, args: TrainingArguments) -> CrossEntropyLoss | MSELoss:
        if loss_fn is None:
            return CrossEntropyLoss(label_smoothing=args.label_smoothing_factor)
        if not isinstance(loss_fn, (CrossEntropyLoss, MSELoss)):
            raise TypeError(f"loss_fn must be CrossEntropyLoss or MSELoss, not {type(loss_fn).__name__}")
        if args.label_smoothing_factor and getattr(loss_fn, "label_smoothing", None) != args.label_smoothing_factor:
            raise ValueError(f"label_smoothing_factor={args.label_smoothing_factor} conflicts with "
                             f"loss_fn={loss_fn!r}: give the smoothing in one place")
        return loss_fn

    def _apply_memory_cap(self) -> None:
        if self.args.memory_limit is not None:
            memory.set_memory_limit(self.args.memory_limit, device=self._memory_device())
        elif self.args.memory_fraction is not None:
            memory.set_memory_fraction(self.args.memory_fraction, device=self._memory_device())

    def _memory_device(self) -> str:
        return self.device

    def _progress_bar(self) -> bool:
        """HF's default: a bar unless disable_tqdm, on the main process (tqdm is a dependency;
        without it, the loss lines are printed as with disable_tqdm)."""
        if self.args.disable_tqdm or not distributed.is_main_process():
            return False
        try:
            import tqdm.auto  # noqa: F401  (lazily: `import gputrain` stays fast)
        except ImportError:
            return False
        return True

    def _loader(self, dataset: Any, batch_size: int, shuffle: bool) -> DataLoader:
        if isinstance(dataset, DataLoader):
            return dataset
        args = self.args
        workers = args.dataloader_num_workers
        if isinstance(dataset, _Examples):
            data, collate = dataset.dataset, dataset.collator
        else:
            data, collate = (np.asarray(to_numpy(dataset[0])), np.asarray(to_numpy(dataset[1]))), None
        seed = args.seed if args.data_seed is None else args.data_seed
        sampler = None
        if shuffle and args.train_sampling_strategy == "group_by_length":
            sampler, shuffle = self._length_grouped_sampler(data, batch_size, seed), False
        return DataLoader(data, batch_size=batch_size, shuffle=shuffle and args.train_sampling_strategy != "sequential",
                          sampler=sampler, seed=seed, num_workers=workers,
                          collate_fn=collate, prefetch_factor=args.dataloader_prefetch_factor,
                          pin_memory=args.dataloader_pin_memory and self.device != "cpu",
                          pin_memory_device=self.device if self.device != "cpu" else "",
                          persistent_workers=args.dataloader_persistent_workers,
                          multiprocessing_context=args.dataloader_multiprocessing_context if workers else None,
                          in_order=args.dataloader_in_order)

    def _length_grouped_sampler(self, data: Any, batch_size: int, seed: int) -> LengthGroupedSampler:
        """HF's group_by_length order: lengths from the dataset's length_column_name column when
        it has one, else from its examples' (or ragged column's) first model input."""
        column = self.args.length_column_name
        names = getattr(data, "column_names", None) or (list(data) if isinstance(data, Mapping) else [])
        lengths = data[column] if column in names else None
        inputs = getattr(self.processing_class, "model_input_names", None) or ["input_ids"]
        if isinstance(data, tuple) and lengths is None:
            raise ValueError("group_by_length=True: an (inputs, labels) pair of arrays has one length; give the "
                             "examples as dicts with 'input_ids', a datasets.Dataset with a "
                             f"{column!r} column, or gt.data.tokenize's ragged columns")
        return LengthGroupedSampler(batch_size, dataset=data, lengths=lengths, model_input_name=inputs[0], seed=seed,
                                    num_replicas=distributed.get_world_size(), rank=distributed.get_rank())

    def _pair(self, name: str, batch: Any) -> tuple[Any, Any]:
        """A loader's batch as (inputs, labels): dicts of columns (HF's) or tuples."""
        return _batch_to_pair(self.model, name, batch, self.args.label_names, self.args.remove_unused_columns)

    def _setup_training(self, batches: int) -> None:
        args = self.args
        accumulation = args.gradient_accumulation_steps
        if isinstance(self._train_source, DataLoader):
            self.train_dataloader = self._train_source
            self._grouped = accumulation > 1
        else:
            self.train_dataloader = self._loader(self._train_source, args.per_device_train_batch_size * accumulation,
                                                 shuffle=True)
        self._micro_cap = (self.train_dataloader.batch_size or 0) if self._grouped else args.per_device_train_batch_size
        self._updates_per_epoch = -(-batches // accumulation)
        max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * self._updates_per_epoch)
        self.state.max_steps = max_steps
        self.state.num_train_epochs = math.ceil(max_steps / self._updates_per_epoch)
        self.state.train_batch_size = args.per_device_train_batch_size
        self.state.logging_steps = self._interval(args.logging_steps, max_steps)
        self.state.eval_steps = self._interval(args.eval_steps, max_steps) if args.eval_steps else 0
        self.state.save_steps = self._interval(args.save_steps, max_steps)
        self._fit_memory()  # before the optimizer, EMA, loader slots and activations exist
        self.optimizer = self._make_optimizer()
        self.lr_scheduler = get_scheduler(args.lr_scheduler_type, self.optimizer,
                                          num_warmup_steps=args.get_warmup_steps(max_steps),
                                          num_training_steps=max_steps,
                                          scheduler_specific_kwargs=args.lr_scheduler_kwargs)
        self.scaler = GradScaler() if args.fp16 else None
        if args.ema_decay is not None:
            self.ema = EMA(self.model, decay=args.ema_decay)
        max_grad_norm = args.max_grad_norm if args.max_grad_norm else None
        self._step = TrainStep(self.model, self.loss_fn, self.optimizer, precision=args.precision,
                               gradient_checkpointing=args.gradient_checkpointing, max_grad_norm=max_grad_norm,
                               scaler=self.scaler, scheduler=self.lr_scheduler, log_grad_norm=True, tf32=args.tf32,
                               rdrop_alpha=args.rdrop_alpha, loss_chunk_rows=args.loss_chunk_rows)

    @staticmethod
    def _interval(value: float, max_steps: int) -> int:
        """HF: steps given as a ratio in (0, 1) are that share of max_steps, rounded up."""
        return math.ceil(max_steps * value) if value < 1 else int(value)

    def _param_groups(self) -> list[dict[str, Any]]:
        """The optimizer's parameter groups (lists of Parameters: nothing allocated)."""
        args = self.args
        if args.llrd is not None:
            return param_groups_llrd(self.model, args.learning_rate, args.llrd, args.weight_decay)
        return param_groups_weight_decay(self.model, args.weight_decay)

    def _make_optimizer(self) -> Any:
        args = self.args
        groups = self._param_groups()
        if args.optim == "sgd":
            return SGD(groups, lr=args.learning_rate)
        if args.optim in EIGHT_BIT_NAMES:
            return AdamW8bit(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                             eps=args.adam_epsilon, weight_decay=args.weight_decay, cpu_offload_fraction=self._offload)
        return AdamW(groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon,
                     weight_decay=args.weight_decay, cpu_offload_fraction=self._offload, zero_stage=args.zero_stage)

    # -- the memory plan ---------------------------------------------------------------------------
    def memory_plan(self) -> mp.MemoryPlan:
        """Every byte the training run takes from gputrain's allocator, per memory kind ("cpu",
        "pinned", "cuda:N"), computed before it is allocated by the C planners of the code that
        allocates it: the model's parameters, gradients and half copy, the optimizer's state on the
        device and offloaded to pinned memory, the EMA, the loss scaler's scratch, the activation
        arena of one micro-batch (activations, recompute, backward scratch, loss buffers,
        workspace; the other gradient_checkpointing setting's arena is in `alternatives`) and the
        loader's slots and row indices. After the first optimizer step each pool's peak, less what
        it held before the model was built, is the plan's total for it, to the byte (peaks reset
        after the model is built: its layers compile one by one first). print() shows it against
        the limits.
        """
        shape = self._sample_shape()
        if self.train_dataloader is None or shape is None or not self._group_rows():
            raise ValueError("Trainer.memory_plan: the plan is a training run's: it needs a train_dataset of "
                             "fixed-shape rows and batches of a known size")
        return self._plan_for(self._micro_cap, self._offload)

    def _sample_shape(self) -> tuple[int, ...] | None:
        """The shape of one input row: None without a train_dataset, for ragged rows, for dict
        batches, or when a transform or collate_fn may change what the model receives."""
        loader = self.train_dataloader
        if loader is None or loader.transform is not None or loader.collate_fn is not None:
            return None
        if not (isinstance(loader.dataset, (tuple, list)) and len(loader.dataset) == 2):
            return None  # dict batches (columns packed per batch) or a Dataset object
        first = (getattr(loader, "_arrays", None) or [None])[0]  # none over Dataset objects
        return tuple(first.shape[1:]) if isinstance(first, np.ndarray) else None

    def _group_rows(self) -> int:
        """Rows of one optimizer step (of a full group; 0 when the loader's batch size is unknown)."""
        batch = self.train_dataloader.batch_size or 0
        return batch * self.args.gradient_accumulation_steps if self._grouped else batch

    def _plan_for(self, micro_cap: int, offload: float) -> mp.MemoryPlan:
        """The plan with micro-batches of at most micro_cap rows and this offload fraction."""
        args, group = self.args, self._group_rows()
        rows = group // _micro_batches(group, micro_cap or group)
        rows *= 2 if args.rdrop_alpha else 1  # R-Drop: the step stacks each micro-batch on itself
        kind = "sgd" if args.optim == "sgd" else "adamw8bit" if args.optim in EIGHT_BIT_NAMES else "adamw"
        shards = distributed.get_world_size() if args.zero_stage else 1  # ZeRO-1: one rank's share
        param_groups = self._param_groups()  # the parameters with requires_grad: frozen ones keep no state
        groups = ({},) * len(param_groups)  # a device optimizer's update table has a row per group
        # AdamW8bit's state is planned per parameter (blocks of 256 start at each); AdamW's by the total
        numels = tuple(p.numel() for group in param_groups for p in group["params"])
        optimizer = mp.OptimizerSpec(kind, numels if kind == "adamw8bit" else (sum(numels),), groups,
                                     cpu_offload_fraction=offload, zero_shards=shards)
        return mp.plan_training(self.model, (rows, *self._sample_shape()), precision=args.precision,
                                checkpointing=args.gradient_checkpointing, optimizer=optimizer,
                                ema=args.ema_decay is not None, scaler=args.fp16,
                                loader=mp.LoaderSpec.of(self.train_dataloader), loss_chunk_rows=args.loss_chunk_rows)

    def _fit_memory(self) -> None:
        """Plans the run before anything of it is allocated. Over the memory limit: with
        auto_find_batch_size, smaller micro-batches (more of them per step: the same rows per
        optimizer step), then a higher cpu_offload_fraction (AdamW, AdamW8bit), each change logged;
        without it, or when nothing fits, gputrain.OutOfMemoryError with the plan."""
        if self._sample_shape() is None or not self._group_rows():
            logger.info("memory plan: skipped (ragged rows, a transform or collate_fn, or batches of unknown size)")
            return
        available = mp.available_memory(self.model)
        plan = self._plan_for(self._micro_cap, self._offload)
        if not plan.over(available):
            return
        if self.args.auto_find_batch_size:
            can_offload = self.args.optim != "sgd"
            sizes = mp.micro_batch_sizes(self._group_rows(), self._micro_cap)
            fitted = mp.fit(self._plan_for, available, sizes, self._offload, can_offload)
            if fitted is not None:
                self._apply_fit(plan, fitted, f"the memory plan exceeds the memory limit "
                                              f"({mp.describe_over(plan, available)})")
                return
        if not self.args.auto_find_batch_size:
            hint = "set auto_find_batch_size=True to fit it with smaller micro-batches"
        else:
            hint = "nothing fits, not even micro-batches of 1 row or the most offload"
        raise _C.OutOfMemoryError(f"Trainer: the training run needs more memory than the limit leaves "
                                  f"({mp.describe_over(plan, available)}); {hint}, or raise memory_limit / "
                                  f"memory_fraction.\n{plan}")

    def _apply_fit(self, before: mp.MemoryPlan, fitted: tuple[int, float, mp.MemoryPlan], reason: str) -> None:
        cap, offload, plan = fitted
        group = self._group_rows()
        if cap != self._micro_cap:
            logger.warning("auto_find_batch_size: %s; micro-batches of %d rows instead of %d: %d per optimizer "
                           "step, the same %d rows per step", reason, group // _micro_batches(group, cap),
                           group // _micro_batches(group, self._micro_cap or group), _micro_batches(group, cap),
                           group)  # rows of the loader (the plan's are twice these with R-Drop)
        if offload != self._offload:
            logger.warning("auto_find_batch_size: %s; cpu_offload_fraction %g instead of %g", reason, offload,
                           self._offload)
        self._micro_cap, self._offload = cap, offload

    def _refit_after_oom(self, error: MemoryError) -> None:
        """After an OutOfMemoryError in a step (which abandons it before its update): the largest
        smaller micro-batch whose activation arena fits what is free now; re-raises `error` when none."""
        kind = self.model.compiled.device
        stats = memory.memory_stats(kind)
        live = self.model.compiled.live_arenas()["activations"]
        room = None if stats["limit_bytes"] is None else stats["limit_bytes"] - stats["reserved_bytes"] + live
        before = self._plan_for(self._micro_cap, self._offload)
        for cap in mp.micro_batch_sizes(self._group_rows(), (self._micro_cap or self._group_rows()) - 1):
            plan = self._plan_for(cap, self._offload)
            if room is None or plan.activation_arena <= room:
                reason = (f"a step ran out of memory ({error}); the activation arena must fit in "
                          f"{'what the system gives' if room is None else f'{room:,} bytes'}")
                self._apply_fit(before, (cap, self._offload, plan), reason)
                return
        raise error

    def _resume_micro_batches(self, saved: int) -> None:
        """Micro-batches as small as the checkpointed run's (auto_find_batch_size may have shrunk
        them), so that the rest of the run has its bits."""
        if saved and saved < (self._micro_cap or saved + 1):
            logger.warning("auto_find_batch_size: the checkpoint was trained with micro-batches of at most %d rows; "
                           "resuming with them instead of %d, for the same bits", saved, self._micro_cap)
            self._micro_cap = saved

    # -- what users see ---------------------------------------------------------------------------
    def _zero_note(self) -> str:
        """The startup block's word on ZeRO-1: which share of the optimizer state this rank keeps."""
        if not self.args.zero_stage:
            return ""
        shard = self.optimizer._shard
        if shard is None:
            return "; zero_stage 1 (one process: the whole state)"
        return f"; zero_stage 1: this rank keeps elements [{shard.first}, {shard.end}) of {shard.n}'s state"

    def _startup_block(self) -> str:
        args, step = self.args, self._step
        loader = self.train_dataloader
        examples = self._num_examples()
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)  # the rest is frozen
        total = self.model.compiled.num_parameters
        frozen = f" ({total - trainable:,} frozen: no gradient)" if trainable < total else ""
        lines = [
            "***** Running training *****",
            f"  Num examples = {examples:,}" if examples is not None else "  Num examples = unknown (iterable)",
            f"  Num Epochs = {self.state.num_train_epochs:,}",
            f"  Instantaneous batch size per device = {args.per_device_train_batch_size:,}",
            f"  Total train batch size (w. parallel, distributed & accumulation) = "
            f"{per_step * distributed.get_world_size():,}",
            f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}",
            f"  Total optimization steps = {self.state.max_steps:,}",
            f"  Number of trainable parameters = {trainable:,}{frozen}",
            f"  Optimization steps = {self._updates_per_epoch} per epoch x {self.state.num_train_epochs} epochs: "
            f"{self.state.max_steps} in all",
            f"  Batch = {args.per_device_train_batch_size} per device x {args.gradient_accumulation_steps} "
            f"accumulation = {args.per_device_train_batch_size * args.gradient_accumulation_steps} per step, in "
            f"micro-batches of at most {self._micro_cap or 'all'} rows (one C call per step)",
            f"  Device = {self.device}; precision = {args.precision}"
            f"{' with a dynamic loss scaler' if self.scaler is not None else ''}; TF32: {backends.tf32_status()}",
            f"  Optimizer = {type(self.optimizer).__name__} (fused, lr {args.learning_rate:g}, weight decay "
            f"{args.weight_decay:g}{', llrd %g' % args.llrd if args.llrd else ''}); offload fraction "
            f"{self._offload:g}{self._zero_note()}; schedule {args.lr_scheduler_type} with "
            f"{args.get_warmup_steps(self.state.max_steps)} warm-up steps",
            f"  Gradient clipping = {args.max_grad_norm or 'off'}; checkpointing = {args.gradient_checkpointing}; "
            f"set_to_none = {step.set_to_none}; EMA = {args.ema_decay if self.ema is not None else 'off'}; "
            f"R-Drop = {f'alpha {args.rdrop_alpha:g} (each micro-batch run twice)' if args.rdrop_alpha else 'off'}",
            f"  Loader = {loader.num_workers} workers, prefetch {loader.prefetch_factor}, "
            f"pinned {loader.pin_memory}",
        ]
        note = precision_note(args.precision, _C.build_info()["cpu_native_gemm"]) if self.device == "cpu" else ""
        if note:
            lines.append(f"  Precision note: {note}")
        try:
            lines.extend("  " + line for line in str(self.memory_plan()).splitlines())
        except (ValueError, MemoryError) as error:
            lines.append(f"  Memory plan unavailable: {error}")
        notes = args.not_applicable()
        if notes:
            lines.append("  Not applicable here (accepted, no effect):")
            lines.extend(f"    {note}" for note in notes)
        return "\n".join(lines)

    def _num_examples(self) -> int | None:
        source = self._train_source
        if isinstance(source, DataLoader):
            try:
                return len(source.dataset) if not isinstance(source.dataset, (tuple, list, dict)) else \
                    len(source) * (source.batch_size or 1)
            except TypeError:
                return None
        if isinstance(source, _Examples):
            return len(source)
        return len(to_numpy(source[0]))

    def _rewrite_history(self) -> None:
        """history.jsonl := state.log_history (a resumed run drops what came after its checkpoint);
        rank 0 writes it."""
        if not distributed.is_main_process():
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        with open(os.path.join(self.args.output_dir, HISTORY_NAME), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(entry) + "\n" for entry in self.state.log_history)

    def log(self, logs: dict[str, float]) -> None:
        """Adds `logs` (with epoch and step) to state.log_history and history.jsonl, and calls on_log;
        entries a callback adds to `logs` in on_log go into both too."""
        if self.state.epoch is not None:
            logs = {**logs, "epoch": self.state.epoch}
        output = {**logs, "step": self.state.global_step}
        self.state.log_history.append(output)
        self.control = self.callback_handler.call_event("on_log", self.args, self.state, self.control, logs=logs)
        output.update({k: v for k, v in logs.items() if k not in output})  # what callbacks added (GPU readings)
        if not distributed.is_main_process():  # every rank keeps log_history; rank 0 writes it
            return
        line = json.dumps(output)
        logger.debug("%s", line)  # the console shows logs through ProgressCallback / PrinterCallback, as HF
        os.makedirs(self.args.output_dir, exist_ok=True)
        with open(os.path.join(self.args.output_dir, HISTORY_NAME), "a", encoding="utf-8") as f:
            f.write(line + "\n")

    # -- training -----------------------------------------------------------------------------------
    def _groups(self) -> Any:
        """One epoch of (x, y, loader batches) groups, each one optimizer step's rows and the
        loader batches of per_device_train_batch_size rows they count as (HF's epoch unit)."""
        args = self.args
        batch = args.per_device_train_batch_size
        if not self._grouped:
            user_loader = isinstance(self._train_source, DataLoader)
            for item in self.train_dataloader:
                x, y = self._pair("train_dataset", item)
                if args.dataloader_drop_last and not user_loader:
                    keep = len(x) - len(x) % batch  # HF drops the last short batch, not the group
                    if keep == 0:
                        continue
                    x, y = x[:keep], y[:keep]
                yield x, y, (1 if user_loader else -(-len(x) // batch))
            return
        xs, ys = [], []
        for item in self.train_dataloader:  # copies: a loader's views are reused by later batches
            x, y = self._pair("train_dataset", item)
            xs.append(np.array(x))
            ys.append(np.array(y))
            if len(xs) == args.gradient_accumulation_steps:
                yield self._concatenate(xs), np.concatenate(ys), len(xs)
                xs, ys = [], []
        if xs:
            yield self._concatenate(xs), np.concatenate(ys), len(xs)

    @staticmethod
    def _concatenate(xs: list[np.ndarray]) -> np.ndarray:
        shapes = {x.shape[1:] for x in xs}
        if len(shapes) > 1:
            raise ValueError(f"train_dataset: the DataLoader's batches have different shapes {sorted(shapes)} and "
                             "cannot make one step of gradient_accumulation_steps batches; pad every batch to one "
                             "length, or pass the examples themselves (with data_collator) as train_dataset")
        return np.concatenate(xs)

    def _training_step(self, x: np.ndarray, y: np.ndarray) -> Any:
        step = self._step
        step.micro_batches = _micro_batches(len(x), self._micro_rows(len(x)))
        try:
            out = step(x, y)
        except _C.OutOfMemoryError as error:  # the step was abandoned before its update
            if not self.args.auto_find_batch_size:
                raise
            self._refit_after_oom(error)
            step.micro_batches = _micro_batches(len(x), self._micro_rows(len(x)))
            out = step(x, y)  # once: a second OutOfMemoryError propagates
        if self.ema is not None and not out.skipped:
            self.ema.update()
        return out

    def _micro_rows(self, rows: int) -> int:
        return self._micro_cap or rows

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None) -> TrainOutput:
        """Runs the training loop to max_steps (or until a callback stops it).

        resume_from_checkpoint: a checkpoint directory, or True for the last one in output_dir;
        training then continues exactly where that checkpoint was written. trial: refused (no
        hyperparameter_search); ignore_keys_for_eval: accepted, as evaluate()'s ignore_keys.
        """
        if trial is not None:
            raise ValueError("Trainer.train(trial=...) is not supported by gputrain: there is no "
                             "hyperparameter_search; build a Trainer per trial")
        if self._step is None:
            raise ValueError("Trainer: training requires a train_dataset")
        if resume_from_checkpoint is True:
            resume_from_checkpoint = ckpt.get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if resume_from_checkpoint not in (None, False):
            self._load_checkpoint(os.fspath(resume_from_checkpoint))
        else:
            self._check_fresh_start()
        args, state = self.args, self.state
        self._rewrite_history()
        if distributed.is_main_process():
            logger.info("%s", self._startup_block())
        self.model.train()
        self.control._new_training()
        self.control = self.callback_handler.call_event("on_train_begin", args, state, self.control)
        if args.eval_on_start and self._eval_source is not None:
            self.evaluate()
        start, start_step, rows_done = time.perf_counter(), state.global_step, 0
        while (state.global_step < state.max_steps and not self.control.should_training_stop
               and self.train_dataloader.state_dict()["epoch"] < state.num_train_epochs):
            rows_done += self._train_epoch()
        return self._finish_training(start, start_step, rows_done)

    def _check_fresh_start(self) -> None:
        """train() without a checkpoint starts at step 0 and epoch 0: a second train() is an error,
        and a DataLoader already iterated (to its end or part of it) restarts at epoch 0, said."""
        if self.state.global_step > 0:
            raise ValueError(f"Trainer.train: this Trainer has already trained {self.state.global_step} of "
                             f"{self.state.max_steps} steps; build a new Trainer for another run, or pass "
                             "resume_from_checkpoint to continue a saved one")
        position = self.train_dataloader.state_dict()
        if position["epoch"] or position["batches_yielded"]:
            logger.warning("train_dataset: the DataLoader was already iterated (epoch %d, %d batches into it); "
                           "training starts it again at epoch 0", position["epoch"], position["batches_yielded"])
            self.train_dataloader.set_epoch(0)

    def _batches_done(self, groups_done: int) -> int:
        """Loader batches of per_device_train_batch_size rows behind `groups_done` optimizer steps
        of the current epoch."""
        if isinstance(self._train_source, DataLoader) and not self._grouped:
            return groups_done
        return min(groups_done * self.args.gradient_accumulation_steps, self._batches_per_epoch)

    def _train_epoch(self) -> int:
        """Runs the rest of the loader's current epoch (or until a stop); returns the rows trained on."""
        args, state = self.args, self.state
        position = self.train_dataloader.state_dict()
        epoch, done = position["epoch"], position["batches_yielded"]
        in_epoch = -(-done // args.gradient_accumulation_steps) if self._grouped else done
        batches = min(done, self._batches_per_epoch) if self._grouped else self._batches_done(in_epoch)
        self.control._new_epoch()
        self.control = self.callback_handler.call_event("on_epoch_begin", args, state, self.control)
        rows = 0
        for x, y, count in self._groups():
            self.control = self.callback_handler.call_event("on_step_begin", args, state, self.control)
            out = self._training_step(x, y)
            rows += len(x)
            in_epoch += 1
            batches += count
            state.global_step += 1
            state.epoch = epoch + min(batches, self._batches_per_epoch) / self._batches_per_epoch  # HF's unit
            self._record(out)
            self.control._new_step()
            self.control = self.callback_handler.call_event("on_step_end", args, state, self.control)
            self._maybe_log_save_evaluate()
            last = in_epoch >= self._updates_per_epoch
            if self.control.should_training_stop or state.global_step >= state.max_steps:
                if not last:
                    return rows  # stopped inside the epoch: no epoch end
                break
            if self.control.should_epoch_stop:
                if not last:
                    self.train_dataloader.set_epoch(epoch + 1)  # the rest of this epoch is skipped
                break
        state.epoch = float(epoch + 1)
        self.control = self.callback_handler.call_event("on_epoch_end", args, state, self.control)
        self._maybe_log_save_evaluate()
        return rows

    def _record(self, out: Any) -> None:
        """Adds a step's loss to the running sums that logs and train_loss report."""
        logged = self._logged
        loss = out.loss
        if self.args.logging_nan_inf_filter and not math.isfinite(loss):  # HF: the mean of the logged steps
            loss = logged["loss_sum"] / max(logged["steps"], 1)
        logged["loss_sum"] += loss
        logged["steps"] += 1
        logged["total_loss"] += loss
        logged["total_steps"] += 1
        logged["grad_norm"] = out.grad_norm

    def _finish_training(self, start: float, start_step: int, rows_done: int) -> TrainOutput:
        args, state = self.args, self.state
        if args.load_best_model_at_end and state.best_model_checkpoint is not None:
            logger.info("Loading best model from %s (score: %s).", state.best_model_checkpoint, state.best_metric)
            self._load_weights(state.best_model_checkpoint)
        runtime = time.perf_counter() - start
        train_loss = self._logged["total_loss"] / max(self._logged["total_steps"], 1)
        steps = state.global_step - start_step
        metrics = {"train_runtime": round(runtime, 4),
                   "train_samples_per_second": round(rows_done / runtime, 3) if runtime > 0 else 0.0,
                   "train_steps_per_second": round(steps / runtime, 3) if runtime > 0 else 0.0,
                   "train_loss": train_loss}
        self.log(metrics)
        self.control = self.callback_handler.call_event("on_train_end", args, state, self.control)
        return TrainOutput(state.global_step, train_loss, metrics)

    def _maybe_log_save_evaluate(self) -> None:
        state, control = self.state, self.control
        if control.should_log and state.global_step > self._logged["last_logged_step"]:
            logs = {"loss": self._logged["loss_sum"] / max(self._logged["steps"], 1),
                    "grad_norm": self._logged["grad_norm"],
                    "learning_rate": self.lr_scheduler.get_last_lr()[0]}
            self._logged.update(loss_sum=0.0, steps=0, last_logged_step=state.global_step)
            self.log(logs)
        if control.should_evaluate and self._done["eval"] != state.global_step and self._eval_source is not None:
            self._done["eval"] = state.global_step
            metrics = self.evaluate()
            self._determine_best_metric(metrics)
        if control.should_save and self._done["save"] != state.global_step:
            self._done["save"] = state.global_step
            self._save_checkpoint()
            self.control = self.callback_handler.call_event("on_save", self.args, state, self.control)

    def _determine_best_metric(self, metrics: dict[str, float]) -> None:
        name = self.args.metric_for_best_model
        if name is None:
            return
        key = name if name.startswith("eval_") else f"eval_{name}"
        if key not in metrics:
            raise KeyError(f"The metric_for_best_model {name!r} is not among the evaluation metrics "
                           f"{sorted(metrics)}; consider changing metric_for_best_model")
        value = metrics[key]
        best = self.state.best_metric
        if best is None or (value > best if self.args.greater_is_better else value < best):
            self.state.best_metric = value
            self.state.best_global_step = self.state.global_step
            if self._done["save"] == self.state.global_step:  # this step's checkpoint was written before
                self.state.best_model_checkpoint = self._checkpoint_path()

    # -- evaluation ---------------------------------------------------------------------------------
    def _run_model(self, dataset: Any, name: str) -> tuple[np.ndarray, np.ndarray, float]:
        """(outputs, labels, mean loss over rows) for a dataset, with the EMA weights when kept."""
        loader = self._loader(dataset, self.args.per_device_eval_batch_size, shuffle=False)
        was_training = self.model.training
        self.model.eval()
        outputs, labels, loss_sum, rows = [], [], 0.0, 0
        swapped = self.ema is not None and not self.ema.swapped
        if swapped:
            self.ema.swap()
            self._refresh_half()
        try:
            for batch in loader:
                x, y = self._pair(name, batch)
                logits = self.model(x)
                labels_copy = np.array(y)
                loss_sum += self._eval_loss(logits, labels_copy) * len(x)
                rows += len(x)
                if self.preprocess_logits_for_metrics is not None:
                    logits = self.preprocess_logits_for_metrics(logits, labels_copy)
                outputs.append(logits)
                labels.append(labels_copy)
                self.control = self.callback_handler.call_event("on_prediction_step", self.args, self.state,
                                                                self.control, eval_dataloader=loader)
        finally:
            if swapped:
                self.ema.swap()
                self._refresh_half()
            self.model.train(was_training)
        return np.concatenate(outputs), np.concatenate(labels), loss_sum / max(rows, 1)

    def _eval_loss(self, logits: np.ndarray, labels: np.ndarray) -> float:
        """The loss of one evaluation batch; token-level outputs (batch, T, classes) with labels
        (batch, T), a causal LM's, are scored as the training step scores them: over every token."""
        if logits.ndim == 3 and labels.ndim == 2 and isinstance(self.loss_fn, CrossEntropyLoss):
            return self.loss_fn(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return self.loss_fn(logits, labels)

    def _refresh_half(self) -> None:
        compiled = self.model.compiled
        if compiled.precision != "f32":
            compiled.refresh_half_parameters()

    def _metrics(self, dataset: Any, prefix: str) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
        start = time.perf_counter()
        predictions, label_ids, loss = self._run_model(dataset, f"{prefix}_dataset")
        metrics = {"loss": float(loss)}
        if self.compute_metrics is not None and not self.args.prediction_loss_only:
            metrics.update(self.compute_metrics(EvalPrediction(predictions, label_ids)))
        runtime = time.perf_counter() - start
        metrics.update(runtime=round(runtime, 4), samples_per_second=round(len(predictions) / runtime, 3))
        return predictions, label_ids, {f"{prefix}_{k}": float(v) for k, v in metrics.items()}

    def _eval_source_of(self, name: str, dataset: Any) -> Any:
        collator = self.data_collator or DataCollatorWithPadding(_pad_id(self.model, self.processing_class))
        source = self._source(self.model, self.args, name, dataset, collator)
        if not isinstance(source, _Examples):
            _check_dataset(name, source)
        return source

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Loss and compute_metrics on eval_dataset, keys prefixed with `metric_key_prefix`_;
        logged. ignore_keys: accepted (HF's; the models return one output array, nothing to drop)."""
        if eval_dataset is None and self._eval_source is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset")
        dataset = self._eval_source if eval_dataset is None else self._eval_source_of("eval_dataset", eval_dataset)
        _, _, metrics = self._metrics(dataset, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.call_event("on_evaluate", self.args, self.state, self.control,
                                                        metrics=metrics)
        return metrics

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """The model's outputs on test_dataset, its labels, and the metrics (prefixed `test_`)."""
        if test_dataset is None:
            raise ValueError("Trainer: predict requires a test_dataset")
        test_dataset = self._eval_source_of("test_dataset", test_dataset)
        predictions, label_ids, metrics = self._metrics(test_dataset, metric_key_prefix)
        self.control = self.callback_handler.call_event("on_predict", self.args, self.state, self.control,
                                                        metrics=metrics)
        return PredictionOutput(predictions, label_ids, metrics)

    def hyperparameter_search(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: gputrain has no model_init / backends (optuna, ray) integration."""
        raise NotImplementedError("Trainer.hyperparameter_search is not supported by gputrain: build a Trainer per "
                                  "trial in your own loop (optuna's study.optimize works with a function that "
                                  "trains one and returns trainer.evaluate()[metric])")

    # -- saving and loading -------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None) -> None:
        """Writes model.safetensors (the trained weights), model_ema.safetensors (the EMA, when
        kept) and training_args.json to output_dir (default: args.output_dir). For a
        gputrain.peft.PeftModel, PEFT's adapter files (adapter_config.json, adapter_model.safetensors:
        what PeftModel.save_pretrained writes, which PEFT loads) instead of model.safetensors."""
        directory = self.args.output_dir if output_dir is None else output_dir
        if distributed.is_main_process():  # the ranks hold the same weights: rank 0 writes them
            os.makedirs(directory, exist_ok=True)
            self._write_model(directory)
        distributed.barrier()

    def _write_model(self, directory: str) -> None:
        if isinstance(self.model, PeftModel):  # only the adapter, in PEFT's files: the base is frozen
            self._check_adapter_holds_the_trained()
            for name, data in self.model.adapter_files().items():
                ckpt.save_bytes(os.path.join(directory, name), data)
        else:
            ckpt.save_arrays(os.path.join(directory, "model.safetensors"), dict(self.model.state_dict()))
        if self.ema is not None:
            ckpt.save_ema(directory, self.ema, self._param_names())
        ckpt.save_text(os.path.join(directory, "training_args.json"), self.args.to_json_string())

    def _check_adapter_holds_the_trained(self) -> None:
        """A PeftModel's files hold the adapter and modules_to_save: a parameter trained besides
        them (requires_grad set by hand) would be lost, so it is refused by name."""
        saved = {_internal_key(key) for key in self.model.adapter_state_dict()}
        lost = [name for name, p in self.model.named_parameters() if p.requires_grad and name not in saved]
        if lost:
            raise ValueError(f"model: {lost[0]!r} is trained but is not part of the PEFT adapter's files (the "
                             "adapter and modules_to_save), so a checkpoint would lose it; freeze it or name its "
                             "module in LoraConfig(modules_to_save=...)")

    def _param_names(self) -> list[str]:
        return [name for name, _ in self.model.named_parameters()]

    def _save_checkpoint(self) -> None:
        state = self.state
        if state.best_global_step == state.global_step and self.args.metric_for_best_model is not None:
            state.best_model_checkpoint = self._checkpoint_path()
        optimizer = self.optimizer.state_dict()  # a collective with zero_stage=1: every rank gathers it
        if distributed.is_main_process():  # the same weights and state on every rank: rank 0 writes them
            ckpt.write_checkpoint(self.args.output_dir, state.global_step,
                                  lambda directory: self._write_checkpoint_files(directory, optimizer))
            ckpt.rotate_checkpoints(self.args.output_dir, self.args.save_total_limit, state.best_model_checkpoint,
                                    self.args.load_best_model_at_end)
        distributed.barrier()  # no rank reads or rotates checkpoints before this one is complete

    def _checkpoint_path(self) -> str:
        return os.path.join(self.args.output_dir, f"{ckpt.PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")

    def _write_checkpoint_files(self, directory: str, optimizer: dict[str, Any]) -> None:
        self._write_model(directory)
        ckpt.save_optimizer(directory, optimizer)
        ckpt.save_json(os.path.join(directory, "scheduler.json"), ckpt.to_json_state(self.lr_scheduler.state_dict()))
        if self.scaler is not None:
            ckpt.save_json(os.path.join(directory, "scaler.json"), ckpt.to_json_state(self.scaler.state_dict()))
        compiled = self.model.compiled
        extra = {"checkpoint_format": ckpt.FORMAT_VERSION, "model_seed": compiled.seed, "model_step": compiled.step,
                 "micro_batch_rows": self._micro_cap,
                 "loader": ckpt.to_json_state(self.train_dataloader.state_dict()),
                 "logging": dict(self._logged), "done": dict(self._done), "world_size": distributed.get_world_size(),
                 "callbacks": {type(c).__name__: c.state_dict() for c in self.callback_handler.callbacks
                               if hasattr(c, "state_dict")}}
        ckpt.save_json(os.path.join(directory, GPUTRAIN_STATE_NAME), extra)
        ckpt.save_text(os.path.join(directory, TRAINER_STATE_NAME), self.state.to_json_string())

    def _loader_state_for_world(self, state: dict[str, Any], saved_world: int) -> dict[str, Any]:
        """The loader position of a checkpoint written by `saved_world` ranks for this world size:
        the same epoch with the same share of it done (the shards of another world size hold other
        rows, so the rest of that epoch is this world's order from there; later epochs are exact)."""
        world = distributed.get_world_size()
        if saved_world == world:
            return state
        num_batches = len(self.train_dataloader)
        global_done = (state["next_batch"] + len(state["done"])) * saved_world
        next_batch = min(num_batches, global_done // world)
        logger.warning("resuming a checkpoint of %d ranks on %d: epoch %d continues at batch %d of %d",
                       saved_world, world, state["epoch"], next_batch, num_batches)
        return {**state, "num_batches": num_batches, "next_batch": next_batch, "done": [],
                "batches_yielded": next_batch}

    def _load_weights(self, directory: str) -> None:
        """The model's weights (and EMA) of a checkpoint, all checked before either changes."""
        model, ema = _resume.check_weights(self, directory)
        self._apply_weights(model, ema)

    def _apply_weights(self, model: Any, ema: Any) -> None:
        self.model._apply_staged(model)
        if ema is not None:
            self.ema._apply_staged(ema)
        self.optimizer.reload_params()

    def _load_checkpoint(self, directory: str) -> None:
        """Restores everything a checkpoint holds: every file is read and every field checked
        (gputrain._resume) before anything changes; a damaged checkpoint raises
        gputrain.CheckpointError and leaves the Trainer as it was."""
        plan = _resume.read_and_check(self, directory)
        if plan.state.max_steps != self.state.max_steps:
            logger.warning("resuming a run planned for %d steps with %d steps", plan.state.max_steps,
                           self.state.max_steps)
        if plan.extra["model_seed"] != self.model.compiled.seed:
            logger.warning("the model's dropout seed (%d) is not the checkpoint's (%d): build the model after the "
                           "same gt.random.manual_seed to resume exactly", self.model.compiled.seed,
                           plan.extra["model_seed"])
        self._apply_resume(plan, directory)
        logger.info("Continuing training from checkpoint %s, global step %d", directory, self.state.global_step)

    def _apply_resume(self, plan: _resume.ResumePlan, directory: str) -> None:
        """Applies a checked ResumePlan. The steps that may still refuse come first and are undone
        when they do: the callbacks' load_state_dict (user code), then the C optimizer's; nothing
        after them can fail."""
        undo_callbacks = self._load_callback_states(plan.extra["callbacks"], directory)
        try:
            self.optimizer._apply_staged(plan.optimizer)  # restores itself when the C optimizer refuses
        except Exception as error:
            undo_callbacks()
            raise ckpt.CheckpointError(directory, "optimizer.json", None, str(error)) from error
        self._apply_weights(plan.model, plan.ema)
        self.lr_scheduler._apply_staged(plan.scheduler)
        if self.scaler is not None:
            self.scaler._apply_staged(plan.scaler)
        self.train_dataloader._apply_staged(plan.loader)
        extra = plan.extra
        self.model.compiled.step = extra["model_step"]
        self._resume_micro_batches(extra["micro_batch_rows"])
        self._logged = dict(extra["logging"])
        self._done = dict(extra["done"])
        keep = {"max_steps", "logging_steps", "eval_steps", "save_steps", "num_train_epochs", "train_batch_size"}
        for key, value in vars(plan.state).items():
            if key not in keep:
                setattr(self.state, key, value)

    def _load_callback_states(self, saved: dict[str, Any], directory: str) -> Callable[[], None]:
        """Loads the saved state of each callback that has one; returns what undoes it. A callback
        that refuses its state (CheckpointError) leaves every callback as it was."""
        loaded: list[tuple[Any, Any]] = []

        def undo() -> None:
            for callback, before in reversed(loaded):
                callback.load_state_dict(before)

        for callback in self.callback_handler.callbacks:
            name = type(callback).__name__
            if saved.get(name) is None or not hasattr(callback, "load_state_dict"):
                continue
            before = callback.state_dict()
            loaded.append((callback, before))
            try:
                callback.load_state_dict(saved[name])
            except Exception as error:
                undo()
                raise ckpt.CheckpointError(directory, GPUTRAIN_STATE_NAME, f"callbacks.{name}",
                                           f"{type(error).__name__}: {error}") from error
        return undo
