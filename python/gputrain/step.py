"""TrainStep: one call into C per training step (DESIGN.md principle 2).

    model = gt.nn.Sequential(gt.nn.Linear(64, 256), gt.nn.GELU(), gt.nn.Linear(256, 10))
    optimizer = gt.optim.AdamW(model.parameters(), lr=3e-3)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, micro_batches=4)
    for x, y in loader:
        out = step(x, y)          # every micro-batch, clipping, the update: one C call
        print(out.loss)

The batch given to a call is split into `micro_batches` equal micro-batches; each one's mean loss
is divided by their number, as Hugging Face's Trainer does. (`gradient_accumulation_steps` has
Hugging Face's meaning everywhere: loader batches per optimizer step, a TrainingArguments knob. The
TrainStep keyword of that name, which meant micro_batches, still works for one release with a
DeprecationWarning.)

A micro-batch whose targets are all `ignore_index` adds 0 to the loss and nothing to the gradients
(and still counts in the divisor); a step where every target is ignored reports loss 0.0, its
gradients are zero, and the optimizer runs as usual (momentum and weight decay still act, as in
PyTorch, whose backward gives an all-ignored batch a zero gradient). The functional
`gputrain.functional.cross_entropy` (like `torch.nn.functional.cross_entropy`) returns NaN for
such a batch instead. They differ on purpose: the step's loss is the objective whose gradient it
applies, summed over micro-batches and all-reduced over ranks, so a NaN for one empty
micro-batch would turn the whole step's loss NaN on every rank while its update is well defined
(Hugging Face's Trainer has to filter such NaNs out of its logs, `logging_nan_inf_filter`).

R-Drop (``rdrop_alpha > 0``, Liang et al. 2021; cross-entropy only): each micro-batch of B rows
is stacked on itself into 2B rows on the host (row i and row B + i are one example), so one forward
runs both dropout passes with independent masks (Philox's counter runs over the row index) and one
backward takes both; the activation memory is that of 2B rows (memory_plan shows it). The loss,
reported and differentiated, is the cross-entropy averaged over both passes plus rdrop_alpha times
the symmetric KL ``(KL(p1||p2) + KL(p2||p1)) / 2`` averaged over the pairs ("batchmean"; the paper's
code sums the KL over the batch instead: its alpha is ours divided by the rows counted per pass). A
pair whose target is ignore_index has neither term. rdrop_alpha=0 is exactly the plain step.

Threads: a step runs without the GIL and holds its model, optimizer and scaler while it runs; a
call from another thread that would read or change one of them (another step, optimizer.step(),
add_param_group, state_dict, model(x), scaler.update(), EMA.update(), ...) raises RuntimeError
"... is in use by another thread" instead of racing with it.

Syncs: on a device model a step waits once, for its small result record (loss, norm, inf flag).
With ``sync=False`` (no spike guard, which decides the update from that record on the host;
inputs as DeviceArrays) it waits for nothing. With a GradScaler (the optimizer's whole state on
the device, a scheduler that is a pure function of the step such as LambdaLR) the device skips or
applies each update from its inf flag and updates its own scaler; the host resolves the steps in
order from their records (its scaler, the optimizer's step counts, scheduler.step() when the
update ran) once their events completed, waiting only when 7 are unresolved; reading an output,
step.synchronize(), or the scaler's or optimizer's state_dict() resolves them first, and changing
the scaler or the optimizer's hyperparameters while steps are in flight is refused. Without a
scaler: max_grad_norm's clip is decided on the
device (which leaves the gradients clipped in place, as torch's clip_grad_norm_ does), and the
returned output reads the record when one of its fields is first read; a step reads the record
of the step two calls before it only if that output is still alive and unread (the device keeps
two records).
An error of the queued work (a target out of range) then surfaces when a record is read, after
the updates queued behind it have run. With a GradScaler the records come back behind events, which
carry no error: it surfaces at the next synchronous read of the device (the parameters, a model
state_dict(), a sync=True step).

Ctrl-C: a step on the main thread (with Python's default SIGINT handler) notices the interrupt
between micro-batches and between a micro-batch's forward and backward, abandons the step before
its optimizer update and raises KeyboardInterrupt: weights, optimizer state, scaler and step
count are as before the call (gradients it had begun to overwrite read as None). Once the update
has started the step runs to its end and KeyboardInterrupt follows it.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gputrain import _C, backends, distributed
from gputrain._state_checks import check_keys, check_mapping, integer, real
from gputrain._vocab import c_dtype
from gputrain.amp import GradScaler
from gputrain.data.transfer import DeviceArray
from gputrain.nn.layers import Dropout
from gputrain.nn.loss import CrossEntropyLoss, MSELoss
from gputrain.nn.module import Module
from gputrain.nn.parameter import Parameter
from gputrain.nn.sequence import needs_packing, pack_for
from gputrain.optim.optimizer import Optimizer

_RING = 8  # GT_OPTIM_RING: sync=False steps with a scaler in flight at most


def _scaler_state(scaler: GradScaler) -> tuple[Any, ...]:
    """The scaler's state, read without resolving steps in flight."""
    return (scaler._scale, scaler._growth_tracker, scaler._growth_factor, scaler._backoff_factor,
            scaler._growth_interval, scaler.min_scale, scaler.skipped_steps, scaler.consecutive_skipped_steps)


def _check_deferrable(optimizer: Any, scheduler: Any) -> None:
    """sync=False with a GradScaler: the device decides each update from its inf flag, with constants
    the host computed before; refuses what would need the result on the host first."""
    if optimizer is None:
        raise ValueError("optimizer: sync=False with a GradScaler needs an optimizer (its deferred steps resolve "
                         "the scaler's updates)")
    if getattr(optimizer, "cpu_offload_fraction", 0.0):
        raise ValueError("cpu_offload_fraction: sync=False with a GradScaler needs the whole optimizer state on the "
                         "device (cpu_offload_fraction=0); use sync=True with offload")
    if scheduler is not None and not callable(getattr(scheduler, "lrs_ahead", None)):
        raise ValueError(f"scheduler: sync=False with a GradScaler needs a schedule that is a pure function of the "
                         f"step (gputrain.optim.LambdaLR and Hugging Face's schedules: lrs_ahead), not "
                         f"{type(scheduler).__name__}")


@dataclass(frozen=True)
class StepOutput:
    """What one training step reports."""

    loss: float         # mean of the micro-batches' mean losses (unscaled)
    grad_norm: float    # global L2 norm of the gradients (NaN when not computed or skipped)
    skipped: bool       # True when the update was skipped: the loss scaler found inf/NaN or
                        # the spike guard an outlier
    scale: float        # the loss scale used (1.0 without a scaler)
    outlier: bool = False  # True when the spike guard skipped the update


class DeferredStepOutput:
    """What a ``TrainStep(sync=False)`` step reports: StepOutput's fields, read from the
    device's step record (one wait) when the first of them is read."""

    __slots__ = ("_read", "_out", "__weakref__")

    def __init__(self, read: Callable[[], dict[str, Any]]) -> None:
        self._read: Callable[[], dict[str, Any]] | None = read  # reads the record; None once read
        self._out: StepOutput | None = None  # the result, once read

    def result(self) -> StepOutput:
        """The step's StepOutput (reads the record the first time: waits for the step)."""
        if self._out is None:
            assert self._read is not None
            self._out = StepOutput(**self._read())
            self._read = None
        return self._out

    @property
    def loss(self) -> float:
        """StepOutput.loss of this step (reads the record: waits for the step)."""
        return self.result().loss

    @property
    def grad_norm(self) -> float:
        """StepOutput.grad_norm of this step (reads the record: waits for the step)."""
        return self.result().grad_norm

    @property
    def skipped(self) -> bool:
        """StepOutput.skipped of this step (reads the record: waits for the step)."""
        return self.result().skipped

    @property
    def scale(self) -> float:
        """StepOutput.scale of this step (reads the record: waits for the step)."""
        return self.result().scale

    @property
    def outlier(self) -> bool:
        """StepOutput.outlier of this step (reads the record: waits for the step)."""
        return self.result().outlier

    def __repr__(self) -> str:
        return repr(self._out) if self._out is not None else "DeferredStepOutput(<not read yet>)"


class _Window:
    """The last `size` values with their running sum and sum of squares (llm.c's outlier
    detector keeps the same), summed exactly again every `size` values so rounding cannot drift."""

    __slots__ = ("values", "total", "squares", "count")

    def __init__(self, size: int, values: Sequence[float] = ()) -> None:
        self.values: deque[float] = deque(values, maxlen=size)  # the window, oldest first
        self.count = 0  # values appended since the sums were last made exact
        self._exact()

    def _exact(self) -> None:
        self.total = math.fsum(self.values)
        self.squares = math.fsum(v * v for v in self.values)
        self.count = 0

    def append(self, value: float) -> None:
        values = self.values
        if len(values) == values.maxlen:
            old = values[0]
            self.total -= old
            self.squares -= old * old
        values.append(value)
        self.total += value
        self.squares += value * value
        self.count += 1
        if self.count == values.maxlen:
            self._exact()

    def limit(self, z: float | None) -> float:
        """mean + z * std (population) of a full window; the largest float otherwise."""
        n = len(self.values)
        if z is None or n < self.values.maxlen:
            return sys.float_info.max
        mean = self.total / n
        std = math.sqrt(max(self.squares / n - mean * mean, 0.0))
        return mean + z * std if std > 0 else sys.float_info.max

    def z_score(self, value: float) -> float:
        """The z-score of `value` against a full window (NaN before; 0 for a constant window)."""
        n = len(self.values)
        if n < self.values.maxlen:
            return math.nan
        mean = self.total / n
        std = math.sqrt(max(self.squares / n - mean * mean, 0.0))
        return (value - mean) / std if std > 0 else 0.0


class SpikeGuard:
    """Skips the update of a step whose loss or gradient norm is an outlier, as llm.c's
    outlier detector does: the z-score of the step's value against the mean and standard
    deviation of the last `window` steps' finite values. A step is an outlier when its loss's
    z-score is above `z_loss` or its gradient norm's above `z_grad_norm` (None: not checked),
    or when either is not finite. Until `window` values are in, only non-finite ones are.

    The threshold (mean + z * std of the window) goes into the C step, which decides between
    the gradients and the update: a skipped update leaves the weights, the optimizer state and
    the loss scaler exactly as they were, at no cost beyond the gradient norm (one C call, no
    snapshot). Every step's values enter the window, outliers included (llm.c's rule, so a
    lasting change of level is followed instead of skipping forever); unlike llm.c the window
    is the steps before this one.

        guard = gt.SpikeGuard(window=128, z_loss=5.0, z_grad_norm=5.0)
        step = gt.TrainStep(model, loss_fn, optimizer, spike_guard=guard)
        out = step(x, y)          # out.outlier: this update was skipped; guard.num_skipped in all
    """

    def __init__(self, window: int = 128, z_loss: float | None = 5.0, z_grad_norm: float | None = 5.0) -> None:
        self.window = integer(window, "window", 2, 2**31 - 1)
        self.z_loss = None if z_loss is None else real(z_loss, "z_loss", 0.0, low_open=True)
        self.z_grad_norm = None if z_grad_norm is None else real(z_grad_norm, "z_grad_norm", 0.0, low_open=True)
        self.num_skipped = 0  # updates skipped as outliers so far
        self.last_z: tuple[float, float] = (math.nan, math.nan)  # the last step's (loss, grad norm) z-scores
        self._windows = (_Window(self.window), _Window(self.window))  # losses, gradient norms

    def limits(self) -> tuple[float, float]:
        """The largest loss and gradient norm the next step may update with."""
        losses, norms = self._windows
        return losses.limit(self.z_loss), norms.limit(self.z_grad_norm)

    def observe(self, out: StepOutput) -> None:
        """Counts the step's verdict and adds its finite values to the windows."""
        losses, norms = self._windows
        self.last_z = (losses.z_score(out.loss), norms.z_score(out.grad_norm))
        self.num_skipped += bool(out.outlier)
        if math.isfinite(out.loss):
            losses.append(out.loss)
        if math.isfinite(out.grad_norm):
            norms.append(out.grad_norm)

    def state_dict(self) -> dict[str, Any]:
        """The windows and the count (checkpoints: a resumed run decides as this one would)."""
        return {"num_skipped": self.num_skipped, "losses": list(self._windows[0].values),
                "grad_norms": list(self._windows[1].values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict(): num_skipped and the two windows, all checked (ValueError/TypeError naming
        the key) before anything is applied."""
        check_mapping(state, "state")
        check_keys(state, "state", ("num_skipped", "losses", "grad_norms"))
        num_skipped = integer(state["num_skipped"], "state['num_skipped']", 0)
        windows = []
        for key in ("losses", "grad_norms"):
            if not isinstance(state[key], (list, tuple)) or len(state[key]) > self.window:
                raise ValueError(f"state[{key!r}] must be a list of at most {self.window} numbers")
            values = [real(v, f"state[{key!r}] entries") for v in state[key]]
            windows.append(_Window(self.window, values))
        self.num_skipped = num_skipped
        self._windows = (windows[0], windows[1])


_OLD_ACCUMULATION_NAME = (
    "TrainStep's gradient_accumulation_steps is deprecated: use micro_batches (the same meaning: equal "
    "parts each call's batch is split into). gradient_accumulation_steps keeps Hugging Face's meaning, "
    "loader batches per optimizer step, in TrainingArguments.")


def _has_dropout(model: Module) -> bool:
    """True when some layer of the model drops activations in training (Dropout, attention dropout)."""
    for m in model.modules():
        p = m.p if isinstance(m, Dropout) else getattr(m, "dropout", 0.0)
        if isinstance(p, (int, float)) and p > 0:
            return True
    return False


def _rdrop_alpha(value: Any, loss_fn: Any, model: Module, sync: bool) -> float:
    """The checked rdrop_alpha: a finite number >= 0; > 0 only with cross-entropy and sync=True
    (R-Drop stacks host batches). A model without dropout is warned about (its KL term is 0)."""
    alpha = real(value, "rdrop_alpha", 0.0)
    if alpha == 0.0:
        return 0.0
    if not isinstance(loss_fn, CrossEntropyLoss):
        raise ValueError(f"rdrop_alpha={alpha}: R-Drop's KL term compares class distributions; it applies to "
                         f"CrossEntropyLoss only, not {type(loss_fn).__name__}")
    if not sync:
        raise ValueError(f"rdrop_alpha={alpha}: R-Drop stacks each micro-batch on itself on the host, while "
                         "sync=False takes DeviceArrays; use sync=True with rdrop_alpha")
    if not _has_dropout(model):
        warnings.warn(f"rdrop_alpha={alpha}: the model has no dropout, so both passes give the same outputs and "
                      "the KL term is 0 (the step costs two forwards for plain cross-entropy)", stacklevel=3)
    return alpha


def _host_rows(a: Any, name: str) -> np.ndarray:
    """`a` as a host array of at least one dimension (R-Drop stacks it on the host)."""
    if isinstance(a, DeviceArray) or hasattr(a, "__cuda_array_interface__"):
        raise ValueError(f"{name}: rdrop_alpha stacks the batch on itself on the host; pass host arrays (NumPy), "
                         f"not arrays on a device")
    a = np.asarray(a)
    if a.ndim < 1:
        raise ValueError(f"{name}: expected a batch of rows, got a 0-d array")
    return a


def _stacked_pair(x: Any, y: Any, micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
    """The host batch (x, y) (N rows) with each of its micro-batches of B rows stacked on itself:
    2N rows, micro-batch m's rows i and B + i both row m * B + i (R-Drop's two passes). The split
    is checked here: 2N rows might split into micro-batches that pair the wrong rows."""
    x, y = _host_rows(x, "x"), _host_rows(y, "y")
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"y: expected {x.shape[0]} rows of targets to match x, got {y.shape[0]}")
    if x.shape[0] == 0 or x.shape[0] % micro_batches:
        raise ValueError(f"x: a batch of {x.shape[0]} rows does not split into {micro_batches} equal micro-batches "
                         "(micro_batches); use a batch size divisible by it")
    rows = x.shape[0] // micro_batches

    def stacked(a: np.ndarray) -> np.ndarray:
        parts = a.reshape(micro_batches, 1, rows, *a.shape[1:])
        return np.broadcast_to(parts, (micro_batches, 2, rows, *a.shape[1:])).reshape(2 * a.shape[0], *a.shape[1:])

    return stacked(x), stacked(y)


class TrainStep:
    """A compiled training step for one model, loss and optimizer.

    loss_chunk_rows=C (> 0) runs a model's last Linear (the LM head) and the cross-entropy C rows at
    a time, so the step holds C x vocabulary logits instead of the micro-batch's (csrc/nn/head_loss.c;
    the memory plan counts the block). The loss and the gradients below the head keep the unchunked
    bits when the GEMM library gives each row the same bits for any number of rows (oneDNN with
    AVX-512: blocks of >= 16 rows; not oneDNN's AVX2 f32 kernels, within rounding there); the head's weight gradient sums one GEMM per block (f32 rounding). It costs one more
    logits GEMM per block. Refused for other losses and for a model not ending in a Linear (e.g. a
    soft-capped Gemma 2/3 head). 0 (default): off. Forward, evaluate and predict still return whole logits.

    gradient_checkpointing: False, True (each unit, a Residual block or a decoder layer, keeps only
    its input and re-runs its forward in the backward) or "offload" (as True, and the units side by
    side, a decoder's layers, keep those inputs in pinned host memory: each is copied there after its
    forward on a stream of copies beside the compute, and back one unit ahead of the backward that
    reads it; the device holds two of them and the last unit's output, so the plan's kept
    activations stop growing with the number of layers). The results are the same bits either way.
    """

    def __init__(
        self,
        model: Module,
        loss_fn: CrossEntropyLoss | MSELoss,
        optimizer: Any = None,
        *,
        micro_batches: int = 1,
        gradient_accumulation_steps: int | None = None,
        precision: Any = "fp32",
        gradient_checkpointing: bool | str = False,
        max_grad_norm: float | None = None,
        scaler: Any = None,
        scheduler: Any = None,
        set_to_none: bool = True,
        log_grad_norm: bool = False,
        tf32: bool | None = None,
        spike_guard: SpikeGuard | None = None,
        sync: bool = True,
        rdrop_alpha: float = 0.0,
        loss_chunk_rows: int = 0,
    ) -> None:
        if not isinstance(model, Module):
            raise TypeError(f"model must be a gputrain.nn.Module, not {type(model).__name__}")
        for m in model.modules():  # a layer whose frozen parameters must stay frozen (gputrain.peft's LoRA)
            check = getattr(type(m), "_check_frozen", None)
            if check is not None:
                check(m)
        if not isinstance(loss_fn, (CrossEntropyLoss, MSELoss)):
            raise TypeError(f"loss_fn must be CrossEntropyLoss or MSELoss, not {type(loss_fn).__name__}")
        if gradient_accumulation_steps is not None:
            warnings.warn(_OLD_ACCUMULATION_NAME, DeprecationWarning, stacklevel=2)
            if micro_batches != 1:
                raise TypeError("TrainStep got both micro_batches and its deprecated name "
                                "gradient_accumulation_steps; give micro_batches only")
            micro_batches = gradient_accumulation_steps
        if isinstance(micro_batches, bool) or not isinstance(micro_batches, int):
            raise TypeError(f"micro_batches must be an int, not {type(micro_batches).__name__}")
        if not 1 <= micro_batches < 2**31:
            raise ValueError(f"micro_batches must be >= 1 and < 2**31, got {micro_batches}")
        c_precision = c_dtype(precision)
        if isinstance(gradient_checkpointing, str) and gradient_checkpointing != "offload":
            raise ValueError(f"gradient_checkpointing must be True, False or 'offload', got {gradient_checkpointing!r}")
        checkpointing = gradient_checkpointing if isinstance(gradient_checkpointing, str) else bool(gradient_checkpointing)
        if max_grad_norm is not None and not (isinstance(max_grad_norm, (int, float)) and max_grad_norm > 0
                                              and math.isfinite(max_grad_norm)):
            raise ValueError(f"max_grad_norm must be a positive finite number or None, got {max_grad_norm!r}")
        if scaler is not None and not isinstance(scaler, GradScaler):
            raise TypeError(f"scaler must be a gputrain.amp.GradScaler or None, not {type(scaler).__name__}")
        if spike_guard is not None and not isinstance(spike_guard, SpikeGuard):
            raise TypeError(f"spike_guard must be a gputrain.SpikeGuard or None, not {type(spike_guard).__name__}")
        if not isinstance(sync, bool):
            raise TypeError(f"sync must be a bool, not {type(sync).__name__}")
        if not sync and spike_guard is not None:
            raise ValueError("spike_guard: sync=False cannot take a spike guard, which decides the update from the "
                             "step's result on the host; use sync=True (one wait per step) with it")
        if scheduler is not None and not callable(getattr(scheduler, "step", None)):
            raise TypeError(f"scheduler must have a step() method (e.g. gputrain.optim.LambdaLR) or be None, "
                            f"not {type(scheduler).__name__}")
        if not sync and scaler is not None and scaler.is_enabled():
            _check_deferrable(optimizer, scheduler)
        self.rdrop_alpha = _rdrop_alpha(rdrop_alpha, loss_fn, model, sync)  # R-Drop's KL weight (0: off)
        if isinstance(loss_chunk_rows, bool) or not isinstance(loss_chunk_rows, int):
            raise TypeError(f"loss_chunk_rows must be an int (0: off), not {type(loss_chunk_rows).__name__}")
        if loss_chunk_rows and not isinstance(loss_fn, CrossEntropyLoss):
            raise ValueError(f"loss_chunk_rows={loss_chunk_rows}: the chunked LM-head loss is a cross-entropy, "
                             f"not {type(loss_fn).__name__}; use loss_chunk_rows=0")
        if loss_chunk_rows and self.rdrop_alpha > 0:
            raise ValueError(f"loss_chunk_rows={loss_chunk_rows}: R-Drop's loss (rdrop_alpha) is not chunked; use "
                             "loss_chunk_rows=0 to train with R-Drop")
        model.compiled.loss_chunk_rows = loss_chunk_rows  # checked in C (>= 0, a model ending with a Linear)
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.scaler = scaler
        self.scheduler = scheduler
        self.micro_batches = micro_batches  # equal parts each call's batch is split into
        self.max_grad_norm = float(max_grad_norm) if max_grad_norm is not None else 0.0
        self.set_to_none = bool(set_to_none)
        self.log_grad_norm = bool(log_grad_norm)
        self.spike_guard = spike_guard
        self.sync = sync
        self._calls = 0  # sync=False steps so far (step k writes device record k % 2)
        self._unread: list[weakref.ref[DeferredStepOutput] | None] = [None, None]  # by record
        self._in_flight: deque[DeferredStepOutput] = deque()  # sync=False with a scaler: unresolved, oldest first
        self._expected: tuple[Any, ...] = ()  # the scaler's and optimizer's state the steps in flight assume
        if tf32 is not None:
            backends.set_tf32(tf32)
        self.tf32_status = backends.tf32_status()  # on the CPU: why TF32 does not apply
        compiled = model.compiled
        self._checked: tuple[Any, ...] = ()  # (optimizer core, model, Parameter.generation) last checked
        self._step_config: tuple[tuple[Any, ...], _C.StepConfig] | None = None  # (settings, the C config)
        self._check_optimizer()
        compiled.precision = c_precision
        compiled.checkpointing = checkpointing

    def _config(self, scaler: GradScaler | None, guard: bool, sync: bool) -> _C.StepConfig:
        """The checked C settings of this step (a _C.StepConfig), built once and again only when one of
        them changed (micro_batches, max_grad_norm, optimizer, ... are public attributes, settable between calls)."""
        settings = (self._loss_spec(), self.micro_batches, self.set_to_none, self.max_grad_norm,
                    self.log_grad_norm, self.optimizer, scaler, guard, sync)
        cached = getattr(self, "_step_config", None)  # None: first call, or unpickled from before it
        if cached is None or cached[0] != settings:
            config = _C.StepConfig(
                settings[0],
                micro_batches=self.micro_batches,
                set_to_none=self.set_to_none,
                max_grad_norm=self.max_grad_norm,
                want_grad_norm=self.log_grad_norm,
                optimizer=self.optimizer,
                scaler=scaler,
                guard=guard,
                sync=sync,
            )
            cached = self._step_config = (settings, config)
        return cached[1]

    def _loss_spec(self) -> tuple[Any, ...]:
        """The loss function's spec, with R-Drop's weight when it is on."""
        spec = self.loss_fn._spec()
        return (*spec, self.rdrop_alpha) if self.rdrop_alpha > 0 else spec

    def _check_optimizer(self) -> None:
        """Refuses an optimizer with a parameter that is not the model's: the step computes the
        gradients of the model's parameters only, so it would update nothing or apply stale
        gradients, on any device. (Non-optimizers are checked in C.)"""
        self.model._sync_frozen()  # requires_grad False: no gradient, no weight-gradient work
        compiled = self.model._compiled
        if not isinstance(self.optimizer, Optimizer) or compiled is None:
            return
        generation = Parameter.generation
        self.optimizer._follow_params()  # parameters whose layer was moved into a container since
        checked = (self.optimizer._core, compiled, generation)
        if checked == self._checked:
            return
        for index, p in enumerate(self.optimizer._params()):
            if p._owner is not compiled:
                whose = "a standalone Parameter" if p._owner is None else f"{p.name!r} of another model"
                raise ValueError(f"optimizer: its parameter {index} (shape {p.shape}) is {whose}, not a "
                                 f"parameter of this {type(self.model).__name__}; the step computes gradients "
                                 "for the model's own parameters only: build the optimizer from "
                                 "model.parameters() or a subset of them")
        self._checked = checked

    def __call__(self, x: Any, y: Any, attention_mask: Any = None, token_type_ids: Any = None,
                 position_ids: Any = None) -> StepOutput | DeferredStepOutput:
        """One optimizer step on the batch (x, y): arrays (NumPy, or any host DLPack producer such
        as a PyTorch CPU tensor, read without a copy), or on a device model arrays on its device,
        read where they lie: the DeviceArrays of DataLoader(device=...), and other libraries'
        arrays through DLPack or __cuda_array_interface__ (CuPy, PyTorch CUDA tensors; float32
        inputs and int64 class indices, C-contiguous). The step's stream waits for the producer's
        work by an event, and the producer's object is kept alive until the step's work has run.
        With attention_mask and/or token_type_ids (batch, seq), x is input_ids of a model whose
        first layer is a TokenEmbedding reading them; they are split into micro-batches with x. A
        decoder's (position_ids=True) also takes position_ids, and (batch, seq) input_ids alone (mask
        ones, positions 0..seq-1)."""
        if attention_mask is not None or token_type_ids is not None or position_ids is not None or \
                (isinstance(x, np.ndarray) and needs_packing(self.model, x)):
            x = pack_for(self.model, x, attention_mask, token_type_ids, position_ids)
        self._check_optimizer()
        if self.rdrop_alpha > 0:
            x, y = _stacked_pair(x, y, self.micro_batches)
        if not self.sync and self.model.compiled.device != "cpu":
            if self.scaler is not None and self.scaler.is_enabled():
                return self._deferred_scaled_step(x, y)
            return self._deferred_step(x, y)
        scale_before = self.scaler.get_scale() if self.scaler is not None else None
        guard = self.spike_guard
        limits = {}
        if guard is not None:
            loss_limit, norm_limit = guard.limits()
            limits = {"guard_loss": loss_limit, "guard_grad_norm": norm_limit}
        result = _C.train_step(self._config(scaler=self.scaler, guard=guard is not None, sync=True),
                               self.model.compiled, x, y, comm=distributed.communicator(), **limits)
        if scale_before is not None:
            self.scaler._warn_if_below_one(scale_before)
        if self.scheduler is not None and not result["skipped"] and self.optimizer is not None:
            self.scheduler.step()
        out = StepOutput(**result)
        if guard is not None:
            guard.observe(out)
        return out

    def _deferred_step(self, x: Any, y: Any) -> DeferredStepOutput:
        """A sync=False step on a device model: queued, nothing waited for."""
        record = self._calls % 2
        kept = self._unread[record]
        earlier = kept() if kept is not None else None
        if earlier is not None:
            earlier.result()  # its record is about to be reused: read it now (a wait)
        compiled = self.model.compiled
        _C.train_step(self._config(scaler=None, guard=False, sync=False), compiled, x, y, record=record,
                      comm=distributed.communicator())
        self._calls += 1
        if self.scheduler is not None and self.optimizer is not None:
            self.scheduler.step()  # nothing can skip the update without a scaler or guard
        want_norm = self.log_grad_norm or self.max_grad_norm > 0  # as a synchronous step reports it
        out = DeferredStepOutput(functools.partial(_C.step_record, compiled, record, self.micro_batches,
                                                   want_norm))
        self._unread[record] = weakref.ref(out)
        return out

    # -- sync=False with a GradScaler: the device decides, the host resolves in order ----------
    def _deferred_scaled_step(self, x: Any, y: Any) -> DeferredStepOutput:
        """A sync=False step with a scaler: the update is skipped or applied on the device (its inf
        flag), with the device's scaler and the lrs of the next updates; the host resolves it (its
        scaler's update, the optimizer's step counts, scheduler.step() when the update ran) once
        its record is back, waiting only when GT_OPTIM_RING - 1 steps are unresolved."""
        core = getattr(self.optimizer, "_core", None)
        if not isinstance(core, _C.ModelOptimizer):
            raise ValueError("optimizer: sync=False with a GradScaler needs the optimizer of the model's "
                             "parameters on its device")
        if self._in_flight and self._state() != self._expected:
            raise ValueError("scaler: the GradScaler or the optimizer's hyperparameters changed while sync=False "
                             "steps were in flight; call step.synchronize() before changing them")
        self._resolve(wait=False)
        while core.pending >= _RING - 1:
            self._resolve_oldest(wait=True)
        lrs = np.asarray(self.scheduler.lrs_ahead(_RING), np.float64) if self.scheduler is not None else None
        record = self._calls % 2
        _C.train_step(self._config(scaler=self.scaler, guard=False, sync=False), self.model.compiled, x, y,
                      record=record, comm=distributed.communicator(), lrs=lrs)
        self._calls += 1
        if not self._in_flight:
            self._expected = self._state()
            self.scaler._bind_deferred(self.synchronize)
            self.optimizer._bind_deferred(self.synchronize)
        out = DeferredStepOutput(lambda: self._read_scaled(out))
        self._in_flight.append(out)
        return out

    def _state(self) -> tuple[Any, ...]:
        """What the steps in flight assume unchanged: the scaler's state and the optimizer's
        hyperparameters (the lr only without a scheduler, which sets it as steps resolve)."""
        skip = {"lr"} if self.scheduler is not None else set()
        groups = [{k: v for k, v in self.optimizer._hparams(g).items() if k not in skip}
                  for g in self.optimizer.param_groups]
        return _scaler_state(self.scaler), groups

    def _resolve_oldest(self, wait: bool) -> bool:
        """Resolves the oldest step in flight once its record is back (wait: waits for it)."""
        core = self.optimizer._core
        record = core.deferred_result(wait)
        if record is None:
            return False
        out = self._in_flight.popleft()
        found_inf = record["found_inf"]
        scale = self.scaler.get_scale()
        self.scaler._update(found_inf)
        self.scaler._warn_if_below_one(scale)
        core.resolve(not found_inf)
        if not found_inf and self.scheduler is not None:
            self.scheduler.step()
        want_norm = self.log_grad_norm or self.max_grad_norm > 0
        norm = math.sqrt(record["grad_sumsq"]) if want_norm and not found_inf else math.nan
        out._out = StepOutput(loss=record["loss_sum"] / self.micro_batches, grad_norm=norm,
                              skipped=found_inf, scale=scale)
        out._read = None
        self._expected = self._state()
        if not self._in_flight:
            self.scaler._bind_deferred(None)
            self.optimizer._bind_deferred(None)
        return True

    def _resolve(self, wait: bool, through: DeferredStepOutput | None = None) -> None:
        """Resolves the steps whose records are back (wait: all of them, or those up to `through`)."""
        while self._in_flight and (through is None or through._out is None):
            if not self._resolve_oldest(wait):
                return

    def _read_scaled(self, out: DeferredStepOutput) -> dict[str, Any]:
        self._resolve(wait=True, through=out)
        assert out._out is not None
        return dict(out._out.__dict__)

    def synchronize(self) -> None:
        """Resolves every sync=False step in flight (waits for the last one's record)."""
        self._resolve(wait=True)

    def __getstate__(self) -> dict[str, Any]:
        """copy.deepcopy and pickle: everything but the cache of the last optimizer check and the
        outputs of deferred steps (resolved first)."""
        self.synchronize()
        return {**self.__dict__, "_checked": (), "_unread": [None, None], "_in_flight": deque(), "_expected": (),
                "_step_config": None}

    @property
    def gradient_accumulation_steps(self) -> int:
        """Deprecated name of `micro_batches` (warns); `gradient_accumulation_steps` is a
        TrainingArguments knob with Hugging Face's meaning (loader batches per optimizer step)."""
        warnings.warn(_OLD_ACCUMULATION_NAME, DeprecationWarning, stacklevel=2)
        return self.micro_batches

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        warnings.warn(_OLD_ACCUMULATION_NAME, DeprecationWarning, stacklevel=2)
        self.micro_batches = value

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "gradient_accumulation_steps" in state:  # pickled before the rename
            state["micro_batches"] = state.pop("gradient_accumulation_steps")
        state.setdefault("rdrop_alpha", 0.0)  # pickled before R-Drop
        self.__dict__.update(state)

    def memory_plan(self, batch_shape: Sequence[int] | np.ndarray) -> dict[str, int]:
        """Bytes of every region for a batch of this shape (micro-batch = batch / accumulation;
        with rdrop_alpha, twice that: R-Drop's stacked micro-batch).

        `batch_shape` is the batch's shape, e.g. ``(64, 128)``, or a batch array itself (of any
        memory layout; only its shape is read). A shape too large for any memory raises
        gputrain.OutOfMemoryError; one the model cannot take, ValueError.
        """
        if isinstance(batch_shape, np.ndarray):
            batch_shape = batch_shape.shape
        if isinstance(batch_shape, (str, bytes)) or not isinstance(batch_shape, Sequence):
            raise TypeError(f"batch_shape must be a tuple of ints such as (64, 128), "
                            f"not {type(batch_shape).__name__}")
        shape = []
        for i, size in enumerate(batch_shape):
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
                raise TypeError(f"batch_shape[{i}] must be an int, not {type(size).__name__}")
            if size < 0:
                raise ValueError(f"batch_shape[{i}] must be >= 0, got {size}")
            shape.append(int(size))
        steps = self.micro_batches
        if not shape or shape[0] == 0 or shape[0] % steps:
            raise ValueError(f"batch_shape {tuple(shape)} does not split into {steps} equal micro-batches "
                             f"(micro_batches); use a batch size divisible by {steps}")
        micro = (shape[0] // steps * (2 if self.rdrop_alpha > 0 else 1), *shape[1:])  # R-Drop: stacked twice
        compiled = self.model.compiled
        self.model._sync_frozen()  # the frozen parameters' gradients are not planned
        return compiled.plan(micro, checkpointing=compiled.checkpointing, precision=compiled.precision)
