"""Trainer callbacks with Hugging Face's shape: TrainerState, TrainerControl, TrainerCallback,
the flow rules that decide when to log, evaluate and save, a tqdm progress bar, and early
stopping.

    class PrintLoss(gt.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logging.getLogger("mine").info("step %d: %s", state.global_step, logs)

Every event gets (args, state, control, **kwargs) with kwargs model, optimizer, lr_scheduler,
train_dataloader, eval_dataloader (and logs / metrics where the event has them); a callback
may set the control's flags, which the Trainer reads after the event.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gputrain.training_args import TrainingArguments

__all__ = [
    "CallbackHandler",
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "PrinterCallback",
    "ProgressCallback",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
]

logger = logging.getLogger("gputrain.trainer")


@dataclass
class TrainerState:
    """Where training is (saved as trainer_state.json in every checkpoint), Hugging Face's fields."""

    epoch: float | None = None            # epochs done, fractional within an epoch
    global_step: int = 0                  # optimizer steps done (a step the scaler skipped counts)
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int = 0
    log_history: list[dict[str, float]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True

    def to_json_string(self) -> str:
        """The state as indented JSON with sorted keys (trainer_state.json in a checkpoint)."""
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json_string(cls, text: str) -> TrainerState:
        """A TrainerState from to_json_string()'s text; keys this version does not know are dropped."""
        values = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class TrainerControl:
    """Flags callbacks set to change the flow; the Trainer resets the per-step ones."""

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False


class TrainerCallback:
    """Hooks called at the Trainer's events; override the ones you need (all do nothing here)."""

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Called at the end of Trainer.__init__."""
        pass

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> Any:
        """Called at the beginning of train(), before the first step."""
        pass

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> Any:
        """Called at the end of train()."""
        pass

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> Any:
        """Called at the beginning of each epoch."""
        pass

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> Any:
        """Called at the end of each epoch; may set control.should_log/should_evaluate/should_save."""
        pass

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> Any:
        """Called before each optimizer step (its gradient_accumulation_steps loader batches)."""
        pass

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Called after each optimizer step; may set the control's flags (log, evaluate, save, stop)."""
        pass

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> Any:
        """Called after an evaluation, with its metrics (eval_-prefixed) in kwargs['metrics']."""
        pass

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Called after predict(), with its metrics in kwargs['metrics']."""
        pass

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Called after a checkpoint is saved."""
        pass

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Called when the Trainer logs, with the values in kwargs['logs'] (a callback may add to them)."""
        pass

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           **kwargs: Any) -> Any:
        """Called after each batch of an evaluation or prediction."""
        pass


class CallbackHandler(TrainerCallback):
    """Calls every callback in order for each event; a callback may return a new control."""

    def __init__(self, callbacks: list[TrainerCallback], **objects: Any) -> None:
        self.callbacks: list[TrainerCallback] = []
        self._handlers: dict[str, list[Any]] = {}  # event -> the bound methods that override it
        for callback in callbacks:
            self.add_callback(callback)
        self.objects = objects  # model, optimizer, lr_scheduler, dataloaders: passed to every event

    def add_callback(self, callback: TrainerCallback | type[TrainerCallback]) -> None:
        """Append a callback (an instance, or a class to instantiate); a second one of the same class is added
        with a warning, as in Hugging Face."""
        instance = callback() if isinstance(callback, type) else callback
        if not isinstance(instance, TrainerCallback):
            raise TypeError(f"callbacks must be TrainerCallback instances or classes, not {type(instance).__name__}")
        if any(type(existing) is type(instance) for existing in self.callbacks):
            logger.warning("You are adding a %s to the callbacks of this Trainer, but there is already one. "
                           "The current list of callbacks is:\n%s", type(instance).__name__, self.callback_list)
        self.callbacks.append(instance)
        self._handlers = {}

    @property
    def callback_list(self) -> str:
        """The callbacks' class names, one per line."""
        return "\n".join(type(c).__name__ for c in self.callbacks)

    def _overriding(self, event: str) -> list[Any]:
        """The callbacks' methods for `event` that do something (the base class's do nothing), in
        order: an event no callback overrides costs one dict look-up (two happen every step)."""
        handlers = self._handlers.get(event)
        if handlers is None:
            base = getattr(TrainerCallback, event)
            handlers = [getattr(c, event) for c in self.callbacks
                        if getattr(type(c), event, None) is not base or event in getattr(c, "__dict__", ())]
            self._handlers[event] = handlers
        return handlers

    def call_event(self, event: str, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   **kwargs: Any) -> TrainerControl:
        """Call `event` (e.g. 'on_step_end') on every callback that overrides it, in order, with the handler's
        objects (model, optimizer, ...) and `kwargs`; returns the control (a callback may return a new one)."""
        handlers = self._overriding(event)
        if handlers:
            kwargs = {**self.objects, **kwargs}
            for handler in handlers:
                result = handler(args, state, control, **kwargs)
                if result is not None:
                    control = result
        return control


def _every(step: int, interval: int) -> bool:
    return interval > 0 and step % interval == 0


class DefaultFlowCallback(TrainerCallback):
    """Hugging Face's flow: log, evaluate and save by the strategies, and stop at max_steps."""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> TrainerControl:
        """Set the control's flags from the arguments' strategies: log at the first step (logging_first_step)
        and every logging_steps, evaluate and save every eval_steps/save_steps, and at max_steps stop
        (evaluating and saving there as Hugging Face does)."""
        step = state.global_step
        if step == 1 and args.logging_first_step:
            control.should_log = True
        if args.logging_strategy == "steps" and _every(step, state.logging_steps):
            control.should_log = True
        if args.eval_strategy == "steps" and _every(step, state.eval_steps) and args.eval_delay <= step:
            control.should_evaluate = True
        if args.save_strategy == "steps" and _every(step, state.save_steps):
            control.should_save = True
        if step >= state.max_steps:
            control.should_training_stop = True
            if args.eval_strategy == "steps" and args.eval_delay <= step:  # HF: evaluate at the last step too
                control.should_evaluate = True
            if args.save_strategy != "no":
                control.should_save = True
        return control

    def on_epoch_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> TrainerControl:
        """With the 'epoch' strategies: log, evaluate (after eval_delay) and save at the end of each epoch."""
        if args.logging_strategy == "epoch":
            control.should_log = True
        if args.eval_strategy == "epoch" and args.eval_delay <= (state.epoch or 0.0):
            control.should_evaluate = True
        if args.save_strategy == "epoch":
            control.should_save = True
        return control


def _shown(logs: dict[str, Any], max_str_len: int = 100) -> dict[str, Any]:
    """Logs as Hugging Face prints them: floats with 4 significant digits, long strings cut."""
    shown: dict[str, Any] = {}
    for key, value in logs.items():
        if isinstance(value, str) and len(value) > max_str_len:
            shown[key] = (f"[String too long to display, length: {len(value)} > {max_str_len}. "
                          "Consider increasing `max_str_len` if needed.]")
        elif isinstance(value, float):
            shown[key] = f"{value:.4g}"
        else:
            shown[key] = value
    shown.pop("total_flos", None)
    return shown


class ProgressCallback(TrainerCallback):
    """Hugging Face's: a tqdm.auto bar over the optimizer steps (a widget in notebooks), one over
    the batches of each evaluation, and each log written above the bar as a dict line."""

    def __init__(self, max_str_len: int = 100) -> None:
        from tqdm.auto import tqdm  # lazily: `import gputrain` stays fast

        self._tqdm = tqdm
        self.max_str_len = max_str_len
        self.bar: Any = None  # the training bar (HF's training_bar)
        self.prediction_bar: Any = None

    @property
    def training_bar(self) -> Any:
        """The tqdm bar over the optimizer steps (None outside train())."""
        return self.bar

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """Open the training bar on the main process, at the resumed step."""
        if state.is_world_process_zero:
            self.bar = self._tqdm(total=state.max_steps, initial=state.global_step, dynamic_ncols=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """Advance the training bar to the global step."""
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_prediction_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                           eval_dataloader: Any = None, **kwargs: Any) -> None:
        """Advance (opening it first) the bar over the evaluation batches; nothing for a loader without a
        length."""
        if not state.is_world_process_zero or eval_dataloader is None:
            return
        if self.prediction_bar is None:
            try:
                total = len(eval_dataloader)
            except TypeError:
                return
            self.prediction_bar = self._tqdm(total=total, leave=self.bar is None, dynamic_ncols=True)
        self.prediction_bar.update(1)

    def _close_prediction_bar(self) -> None:
        if self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """Close the evaluation bar."""
        self._close_prediction_bar()

    def on_predict(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                   **kwargs: Any) -> None:
        """Close the prediction bar."""
        self._close_prediction_bar()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        """Write the logs above the training bar as a dict line (floats to 4 significant digits)."""
        if state.is_world_process_zero and self.bar is not None and logs:
            self.bar.write(str(_shown(logs, self.max_str_len)))

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Close the training bar."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class PrinterCallback(TrainerCallback):
    """Hugging Face's: prints each log as a dict line (the default when disable_tqdm=True)."""

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        """Print the logs as a dict line on the main process."""
        if state.is_local_process_zero and logs:
            print(_shown(logs))


class EarlyStoppingCallback(TrainerCallback):
    """Stops training when metric_for_best_model has not improved by more than
    early_stopping_threshold for early_stopping_patience evaluations (Hugging Face's rule)."""

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float = 0.0) -> None:
        if isinstance(early_stopping_patience, bool) or not isinstance(early_stopping_patience, int) \
                or early_stopping_patience < 1:
            raise ValueError(f"early_stopping_patience must be an int >= 1, got {early_stopping_patience!r}")
        if isinstance(early_stopping_threshold, bool) or not isinstance(early_stopping_threshold, (int, float)) \
                or not early_stopping_threshold >= 0:
            raise ValueError(f"early_stopping_threshold must be a number >= 0, got {early_stopping_threshold!r}")
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = float(early_stopping_threshold)
        self.early_stopping_patience_counter = 0

    def state_dict(self) -> dict[str, int]:
        """The patience counter, saved in checkpoints so a resumed run stops where this one would."""
        return {"early_stopping_patience_counter": self.early_stopping_patience_counter}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Restore the patience counter from state_dict()."""
        self.early_stopping_patience_counter = int(state["early_stopping_patience_counter"])

    def check_metric_value(self, args: TrainingArguments, state: TrainerState, metric_value: float) -> None:
        """Reset the patience counter if `metric_value` beats state.best_metric by more than
        early_stopping_threshold (in the direction of greater_is_better), else count one more evaluation
        without improvement."""
        better = np.greater if args.greater_is_better else np.less
        if state.best_metric is None or (better(metric_value, state.best_metric)
                                         and abs(metric_value - state.best_metric) > self.early_stopping_threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """Check that metric_for_best_model is set and an eval_strategy evaluates (ValueError otherwise)."""
        if args.metric_for_best_model is None:
            raise ValueError("EarlyStoppingCallback requires metric_for_best_model to be defined")
        if args.eval_strategy == "no":
            raise ValueError("EarlyStoppingCallback requires an eval_strategy of 'steps' or 'epoch'")

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, float] | None = None, **kwargs: Any) -> None:
        """Count this evaluation (a non-finite metric counts as no improvement) and stop training once patience
        evaluations passed without improvement; a missing metric disables early stopping with a warning."""
        name = args.metric_for_best_model
        key = name if name.startswith("eval_") else f"eval_{name}"
        value = (metrics or {}).get(key)
        if value is None:
            logger.warning("early stopping required metric_for_best_model, but did not find %s so early stopping "
                           "is disabled", key)
            return
        if not math.isfinite(value):
            self.early_stopping_patience_counter += 1
        else:
            self.check_metric_value(args, state, value)
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True
