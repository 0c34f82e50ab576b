"""Learning-rate schedules with Hugging Face's names and formulas (transformers/optimization.py),
on a LambdaLR with PyTorch's semantics: constructing it sets every group's lr to
initial_lr * factor(0); each step() advances by one and sets initial_lr * factor(step).

Call `scheduler.step()` only after optimizer steps that ran (the training step skips it when
the loss scaler skipped the update), so the schedule follows real updates.
"""

from __future__ import annotations

import enum
import math
import numbers
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from gputrain._state_checks import check_keys, check_mapping, integer, real

__all__ = [
    "LambdaLR",
    "SchedulerType",
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_inverse_sqrt_schedule",
    "get_linear_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_scheduler",
]


# Keys of torch's LambdaLR.state_dict() that gputrain's has no use for (ignored when loaded).
_TORCH_ONLY_KEYS = ("verbose", "_get_lr_called_within_step", "_is_initial")


class LambdaLR:
    """lr of group i = initial_lr_i * lr_lambda_i(last_epoch) (torch.optim.lr_scheduler.LambdaLR)."""

    def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]],
                 last_epoch: int = -1) -> None:
        groups = optimizer.param_groups
        if last_epoch == -1:
            for group in groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for index, group in enumerate(groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{index}] "
                                   "when resuming an optimizer")
        if callable(lr_lambda):
            self.lr_lambdas = [lr_lambda] * len(groups)
        else:
            self.lr_lambdas = list(lr_lambda)
            if len(self.lr_lambdas) != len(groups):
                raise ValueError(f"Expected {len(groups)} lr_lambdas, but got {len(self.lr_lambdas)}")
        self.optimizer = optimizer
        self.base_lrs = [group["initial_lr"] for group in groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self.step()

    def get_lr(self) -> list[float]:
        """The learning rates for the current last_epoch."""
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]

    def step(self) -> None:
        """Advance one optimizer step and set every group's lr."""
        self._step_count += 1
        self.last_epoch += 1
        values = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def lrs_ahead(self, count: int) -> list[list[float]]:
        """The lr of every group for each of the next `count` updates, without stepping: row 0
        is the groups' lr now (what the next update uses), row j what j step() calls would set,
        initial_lr * lr_lambda(last_epoch + j). A deferred training step (TrainStep(sync=False)
        with a GradScaler) hands these to the device, which picks the row of the updates that
        ran; the lambdas must be pure functions of the step (Hugging Face's schedules are)."""
        count = integer(count, "count", 1, 2**31 - 1)
        rows = [[group["lr"] for group in self.optimizer.param_groups]]
        for j in range(1, count):
            epoch = self.last_epoch + j
            rows.append([base * fn(epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)])
        return rows

    def get_last_lr(self) -> list[float]:
        """The learning rates the last step() set."""
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        """Everything but the optimizer and the lambdas (as PyTorch's)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None] * len(self.lr_lambdas)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore last_epoch, base_lrs and the last lrs (the lambdas stay as constructed).

        The keys are state_dict()'s (KeyError otherwise); every value is checked (TypeError,
        ValueError: one finite lr >= 0 per group, last_epoch >= -1) before any is applied.
        """
        self._apply_staged(self._stage_state_dict(state_dict))

    def _apply_staged(self, staged: dict[str, Any]) -> None:
        """Sets what _stage_state_dict checked."""
        self.__dict__.update(staged)

    def _stage_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """load_state_dict's checks, changing nothing: the checked attributes to set."""
        check_mapping(state_dict, "state_dict")
        check_keys(state_dict, "state_dict", self.state_dict(), _TORCH_ONLY_KEYS)
        groups = len(self.lr_lambdas)
        staged: dict[str, Any] = {
            "last_epoch": integer(state_dict["last_epoch"], "state_dict['last_epoch']", -1),
            "_step_count": integer(state_dict["_step_count"], "state_dict['_step_count']", 0),
        }
        for key in ("base_lrs", "_last_lr"):
            values = state_dict[key]
            if not isinstance(values, (list, tuple)):
                raise TypeError(f"state_dict[{key!r}] must be a list, not {type(values).__name__}")
            if len(values) != groups:
                raise ValueError(f"state_dict[{key!r}] has {len(values)} entries, expected {groups} (one per group)")
            staged[key] = [real(v, f"state_dict[{key!r}][{i}]", 0.0) for i, v in enumerate(values)]
        lambdas = state_dict["lr_lambdas"]
        if not isinstance(lambdas, (list, tuple)) or len(lambdas) != groups:
            raise ValueError(f"state_dict['lr_lambdas'] must be a list of {groups} entries")
        return staged


def _warmup(step: int, num_warmup_steps: int) -> float:
    return float(step) / float(max(1, num_warmup_steps))


def _constant(step: int) -> float:
    return 1.0


def _constant_with_warmup(step: int, *, num_warmup_steps: int) -> float:
    if step < num_warmup_steps:
        return float(step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _linear(step: int, *, num_warmup_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    return max(0.0, float(num_training_steps - step) / float(max(1, num_training_steps - num_warmup_steps)))


def _cosine(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def _cosine_restarts(step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _polynomial(step: int, *, num_warmup_steps: int, num_training_steps: int, lr_end: float, power: float,
                lr_init: float) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    if step > num_training_steps:
        return lr_end / lr_init
    lr_range = lr_init - lr_end
    decay_steps = num_training_steps - num_warmup_steps
    pct_remaining = 1 - (step - num_warmup_steps) / decay_steps
    return (lr_range * pct_remaining**power + lr_end) / lr_init


def _inverse_sqrt(step: int, *, num_warmup_steps: int, timescale: int) -> float:
    if step < num_warmup_steps:
        return _warmup(step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((step + shift) / timescale)


def _steps(value: Any, name: str, minimum: int = 0) -> int:
    """A step count argument of a schedule: an int >= minimum (a bad one would otherwise fail
    later, e.g. divide by zero in the middle of training)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def get_constant_schedule(optimizer: Any, last_epoch: int = -1) -> LambdaLR:
    """lr stays at the optimizer's initial lr."""
    return LambdaLR(optimizer, _constant, last_epoch)


def get_constant_schedule_with_warmup(optimizer: Any, num_warmup_steps: int, last_epoch: int = -1) -> LambdaLR:
    """Linear warmup from 0, then constant."""
    num_warmup_steps = _steps(num_warmup_steps, "num_warmup_steps")
    return LambdaLR(optimizer, partial(_constant_with_warmup, num_warmup_steps=num_warmup_steps), last_epoch)


def get_linear_schedule_with_warmup(optimizer: Any, num_warmup_steps: int, num_training_steps: int,
                                    last_epoch: int = -1) -> LambdaLR:
    """Linear warmup from 0, then linear decay to 0 at num_training_steps."""
    num_warmup_steps = _steps(num_warmup_steps, "num_warmup_steps")
    num_training_steps = _steps(num_training_steps, "num_training_steps")
    fn = partial(_linear, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)
    return LambdaLR(optimizer, fn, last_epoch)


def get_cosine_schedule_with_warmup(optimizer: Any, num_warmup_steps: int, num_training_steps: int,
                                    num_cycles: float = 0.5, last_epoch: int = -1) -> LambdaLR:
    """Linear warmup, then a cosine from the initial lr to 0 (num_cycles=0.5: half a wave)."""
    num_warmup_steps = _steps(num_warmup_steps, "num_warmup_steps")
    num_training_steps = _steps(num_training_steps, "num_training_steps")
    fn = partial(_cosine, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
                 num_cycles=num_cycles)
    return LambdaLR(optimizer, fn, last_epoch)


def get_cosine_with_hard_restarts_schedule_with_warmup(optimizer: Any, num_warmup_steps: int,
                                                       num_training_steps: int, num_cycles: int = 1,
                                                       last_epoch: int = -1) -> LambdaLR:
    """Linear warmup, then num_cycles cosine decays to 0, each restarting at the initial lr."""
    num_warmup_steps = _steps(num_warmup_steps, "num_warmup_steps")
    num_training_steps = _steps(num_training_steps, "num_training_steps")
    fn = partial(_cosine_restarts, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
                 num_cycles=num_cycles)
    return LambdaLR(optimizer, fn, last_epoch)


def get_polynomial_decay_schedule_with_warmup(optimizer: Any, num_warmup_steps: int, num_training_steps: int,
                                              lr_end: float = 1e-7, power: float = 1.0,
                                              last_epoch: int = -1) -> LambdaLR:
    """Linear warmup, then polynomial decay from the initial lr to lr_end."""
    num_warmup_steps = _steps(num_warmup_steps, "num_warmup_steps")
    num_training_steps = _steps(num_training_steps, "num_training_steps", num_warmup_steps + 1)
    lr_init = optimizer.defaults["lr"]
    if not (lr_init > lr_end):
        raise ValueError(f"lr_end ({lr_end}) must be smaller than initial lr ({lr_init})")
    fn = partial(_polynomial, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps,
                 lr_end=lr_end, power=power, lr_init=lr_init)
    return LambdaLR(optimizer, fn, last_epoch)


def get_inverse_sqrt_schedule(optimizer: Any, num_warmup_steps: int, timescale: int | None = None,
                              last_epoch: int = -1) -> LambdaLR:
    """Linear warmup, then lr * 1/sqrt((step + timescale - warmup) / timescale)."""
    num_warmup_steps = _steps(num_warmup_steps, "num_warmup_steps")
    timescale = _steps(num_warmup_steps or 10_000 if timescale is None else timescale, "timescale", 1)
    fn = partial(_inverse_sqrt, num_warmup_steps=num_warmup_steps, timescale=timescale)
    return LambdaLR(optimizer, fn, last_epoch)


class SchedulerType(str, enum.Enum):
    """The schedule names of Hugging Face's get_scheduler."""

    LINEAR = "linear"
    COSINE = "cosine"
    COSINE_WITH_RESTARTS = "cosine_with_restarts"
    POLYNOMIAL = "polynomial"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    INVERSE_SQRT = "inverse_sqrt"

    @classmethod
    def _missing_(cls, value: object) -> Any:
        raise ValueError(f"{value!r} is not a valid {cls.__name__}, please select one of "
                         f"{[member.value for member in cls]}")


_SCHEDULES: dict[SchedulerType, Callable[..., LambdaLR]] = {
    SchedulerType.LINEAR: get_linear_schedule_with_warmup,
    SchedulerType.COSINE: get_cosine_schedule_with_warmup,
    SchedulerType.COSINE_WITH_RESTARTS: get_cosine_with_hard_restarts_schedule_with_warmup,
    SchedulerType.POLYNOMIAL: get_polynomial_decay_schedule_with_warmup,
    SchedulerType.CONSTANT: get_constant_schedule,
    SchedulerType.CONSTANT_WITH_WARMUP: get_constant_schedule_with_warmup,
    SchedulerType.INVERSE_SQRT: get_inverse_sqrt_schedule,
}


def get_scheduler(name: str | SchedulerType, optimizer: Any, num_warmup_steps: int | None = None,
                  num_training_steps: int | None = None,
                  scheduler_specific_kwargs: dict[str, Any] | None = None) -> LambdaLR:
    """A schedule by Hugging Face name, with its argument checks."""
    kind = SchedulerType(name)
    schedule = _SCHEDULES[kind]
    if kind is SchedulerType.CONSTANT:
        return schedule(optimizer)
    kwargs = dict(scheduler_specific_kwargs or {})
    if num_warmup_steps is None:
        raise ValueError(f"{kind.value} requires `num_warmup_steps`, please provide that argument.")
    if kind in (SchedulerType.CONSTANT_WITH_WARMUP, SchedulerType.INVERSE_SQRT):
        return schedule(optimizer, num_warmup_steps=num_warmup_steps, **kwargs)
    if num_training_steps is None:
        raise ValueError(f"{kind.value} requires `num_training_steps`, please provide that argument.")
    return schedule(optimizer, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, **kwargs)
