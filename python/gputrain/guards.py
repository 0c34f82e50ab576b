"""Trainer callbacks that guard a run: GPU health from NVML, and the loss-spike guard.

    trainer = gt.Trainer(model, args, train_dataset=..., callbacks=[
        gt.GPUHealthCallback(warn_temperature=80, stop_temperature=85, action="pause"),
        gt.LossSpikeCallback(window=128, z_loss=5.0, z_grad_norm=5.0),
    ])

GPUHealthCallback reads the GPU through NVML (the `nvidia-ml-py` package, `pip install
'gputrain[gpu]'`): at most every `check_interval_s` seconds at the end of a step it compares the
temperature with the training guides' thresholds -- a warning at `warn_temperature` (80 °C), and
at `stop_temperature` (85 °C) either a pause (the step loop sleeps until the GPU is below
`warn_temperature` again, at most `max_pause_s`, then stops) or a stop (with a checkpoint when
saving is on). Every log gets the temperature, utilisation, power and memory in use. Without the
package or a driver it warns once and checks nothing (`required=True`: a RuntimeError at
construction instead); it never stops a run for a failed reading.

LossSpikeCallback puts a gputrain.SpikeGuard on the Trainer's step: an update whose loss or
gradient norm is an outlier is skipped in C before it is applied, logged as a warning, and
counted in every log (`skipped_updates`); its windows are saved in checkpoints.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from gputrain import monitor
from gputrain._state_checks import integer, real
from gputrain.step import SpikeGuard
from gputrain.trainer_callback import TrainerCallback, TrainerControl, TrainerState
from gputrain.training_args import TrainingArguments

__all__ = ["GPUHealthCallback", "LossSpikeCallback"]

logger = logging.getLogger("gputrain.trainer")

ACTIONS = ("pause", "stop")

# A reading's keys in the logs.
_LOGGED = {"temperature_c": "gpu_temperature_c", "utilization_percent": "gpu_utilization_percent",
           "power_watts": "gpu_power_watts", "memory_used_bytes": "gpu_memory_used_bytes"}


def _positive(name: str, value: Any) -> float:
    return real(value, name, 0.0, low_open=True)


class GPUHealthCallback(TrainerCallback):
    """Watches GPU `device_index` through NVML; see the module's documentation.

    Args:
        warn_temperature: °C at which to warn (once per excursion above it).
        stop_temperature: °C at which to pause or stop (above warn_temperature).
        action: "pause" (sleep until below warn_temperature, at most max_pause_s, then stop) or "stop".
        check_interval_s: least seconds between two checks (0: every step).
        max_pause_s: the longest pause, in seconds.
        poll_interval_s: the seconds between readings during a pause.
        device_index: the GPU's NVML index.
        required: raise RuntimeError at construction when NVML cannot be used (default: warn once).
        nvml: a pynvml-like object to read from instead of importing pynvml (tests, wrappers).
        clock: time.monotonic by default.
        sleep: time.sleep by default.
    """

    def __init__(self, warn_temperature: float = 80.0, stop_temperature: float = 85.0, action: str = "pause",
                 check_interval_s: float = 10.0, max_pause_s: float = 600.0, poll_interval_s: float = 10.0,
                 device_index: int = 0, required: bool = False, nvml: Any = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], Any] = time.sleep) -> None:
        self.warn_temperature = _positive("warn_temperature", warn_temperature)
        self.stop_temperature = _positive("stop_temperature", stop_temperature)
        if self.stop_temperature <= self.warn_temperature:
            raise ValueError(f"stop_temperature ({stop_temperature}) must be above warn_temperature "
                             f"({warn_temperature})")
        if not isinstance(action, str) or action not in ACTIONS:
            raise ValueError(f"action must be 'pause' or 'stop', got {action!r}")
        self.check_interval_s = real(check_interval_s, "check_interval_s", 0.0)
        self.action = action
        self.max_pause_s = _positive("max_pause_s", max_pause_s)
        self.poll_interval_s = _positive("poll_interval_s", poll_interval_s)
        self.device_index = integer(device_index, "device_index", 0, 2**31 - 1)
        self._given = nvml
        self._clock, self._sleep = clock, sleep
        self._nvml: Any = None  # the open NVML module while training
        self._last_check = -math.inf  # clock() at the last check
        self._hot = False  # above warn_temperature at the last check (warn once per excursion)
        self.last_reading: dict[str, Any] | None = None  # monitor.gpu_stats()'s dict of the last reading
        self.num_warnings = 0  # excursions above warn_temperature
        self.num_pauses = 0
        self.paused_s = 0.0  # seconds spent in pauses
        self.unavailable_reason = ""  # why nothing is checked ("" while NVML answers)
        if required:
            nvml, reason = monitor._open_nvml(self._given)
            if nvml is None:
                raise RuntimeError(f"GPUHealthCallback(required=True): {reason}")
            try:
                self._check_index(nvml)
            finally:
                nvml.nvmlShutdown()

    def _check_index(self, nvml: Any) -> None:
        count = nvml.nvmlDeviceGetCount()
        if self.device_index >= count:
            raise RuntimeError(f"GPUHealthCallback: device_index {self.device_index} but NVML sees {count} GPU(s)")

    def _disable(self, reason: str) -> None:
        self.unavailable_reason = reason
        logger.warning("GPU health checks are off: %s", reason)
        if self._nvml is not None:
            self._close()

    def _close(self) -> None:
        nvml, self._nvml = self._nvml, None
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass

    def _read(self) -> dict[str, Any] | None:
        """One reading of the GPU (and last_reading), or None after disabling on an NVML error."""
        nvml = self._nvml
        try:
            self.last_reading = monitor._device_stats(nvml, self.device_index)
        except nvml.NVMLError as err:
            self._disable(f"NVML stopped answering ({err})")
            return None
        self._last_check = self._clock()
        return self.last_reading

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """Open NVML for device_index; without it the checks are off for this run, with a warning saying why."""
        nvml, reason = monitor._open_nvml(self._given)
        if nvml is None:
            self._disable(reason)
            return
        self._nvml, self.unavailable_reason = nvml, ""
        try:
            self._check_index(nvml)
        except (RuntimeError, nvml.NVMLError) as err:
            self._disable(str(err))
            return
        self._last_check = -math.inf

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """At most every check_interval_s: read the GPU's temperature; warn once per excursion above
        warn_temperature, and at stop_temperature pause until it cools below warn_temperature (at most
        max_pause_s) or stop training (saving a checkpoint when save_strategy allows)."""
        if self._nvml is None or self._clock() - self._last_check < self.check_interval_s:
            return
        reading = self._read()
        if reading is None:
            return
        temperature = reading["temperature_c"]
        if temperature is None:
            self._disable(f"GPU {self.device_index} reports no temperature")
            return
        if temperature >= self.stop_temperature:
            self._too_hot(args, state, control, temperature)
        elif temperature >= self.warn_temperature:
            if not self._hot:
                self.num_warnings += 1
                logger.warning("GPU %d at %g °C (warning at %g °C, %s at %g °C) at step %d", self.device_index,
                               temperature, self.warn_temperature, self.action, self.stop_temperature,
                               state.global_step)
            self._hot = True
        else:
            self._hot = False

    def _too_hot(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                 temperature: float) -> None:
        self._hot = True
        if self.action == "pause":
            self.num_pauses += 1
            logger.warning("GPU %d at %g °C (>= %g °C) at step %d: pausing until it is below %g °C (at most %g s)",
                           self.device_index, temperature, self.stop_temperature, state.global_step,
                           self.warn_temperature, self.max_pause_s)
            temperature = self._pause()
            if temperature is None or temperature < self.warn_temperature:
                self._hot = False
                return
        logger.error("GPU %d at %g °C at step %d: stopping training%s", self.device_index, temperature,
                     state.global_step, " (saving a checkpoint)" if args.save_strategy != "no" else "")
        control.should_training_stop = True
        if args.save_strategy != "no":
            control.should_save = True

    def _pause(self) -> float | None:
        """Sleeps until the GPU is below warn_temperature or max_pause_s passed; the last temperature."""
        start = self._clock()
        temperature = self.last_reading["temperature_c"]
        try:
            while temperature is not None and temperature >= self.warn_temperature:
                if self._clock() - start >= self.max_pause_s:
                    logger.error("GPU %d still at %g °C after a %g s pause", self.device_index, temperature,
                                 self.max_pause_s)
                    break
                self._sleep(self.poll_interval_s)
                reading = self._read()
                temperature = None if reading is None else reading["temperature_c"]
        finally:
            self.paused_s += self._clock() - start
        return temperature

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        """Add the GPU's current reading to the logs: gpu_temperature_c, gpu_utilization_percent,
        gpu_power_watts, gpu_memory_used_bytes (those NVML reports), and gpu_paused_s after a pause."""
        if logs is None or self._nvml is None:
            return
        reading = self._read()
        if reading is None:
            return
        logs.update({key: reading[name] for name, key in _LOGGED.items() if reading[name] is not None})
        if self.num_pauses:
            logs["gpu_paused_s"] = round(self.paused_s, 3)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Close NVML."""
        if self._nvml is not None:
            self._close()


class LossSpikeCallback(TrainerCallback):
    """Skips the update of a step whose loss or gradient norm is an outlier (gputrain.SpikeGuard:
    z-score over the last `window` steps), logs each skip as a warning and adds the count to
    every log as `skipped_updates`."""

    def __init__(self, window: int = 128, z_loss: float | None = 5.0, z_grad_norm: float | None = 5.0) -> None:
        self.guard = SpikeGuard(window, z_loss, z_grad_norm)
        self._reported = 0  # skips already logged

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       train_step: Any = None, **kwargs: Any) -> None:
        """Install this callback's SpikeGuard on the Trainer's TrainStep (ValueError without a train_dataset)."""
        if train_step is None:
            raise ValueError("LossSpikeCallback needs a Trainer with a train_dataset (its train_step)")
        train_step.spike_guard = self.guard
        self._reported = self.guard.num_skipped

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """Log a warning for each update the guard skipped in this step (the loss and grad-norm z-scores and
        the running count)."""
        if self.guard.num_skipped != self._reported:
            self._reported = self.guard.num_skipped
            z_loss, z_norm = self.guard.last_z
            logger.warning("step %d: update skipped as a loss spike (loss z-score %.2f, grad norm z-score %.2f); "
                           "%d skipped so far", state.global_step, z_loss, z_norm, self._reported)

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, float] | None = None, **kwargs: Any) -> None:
        """Add skipped_updates (the guard's count so far) to the training logs."""
        if logs is not None and "loss" in logs:
            logs["skipped_updates"] = self.guard.num_skipped

    def state_dict(self) -> dict[str, Any]:
        """The guard's state (its windows and count), saved in checkpoints."""
        return self.guard.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state_dict() into the guard (checked before anything is applied)."""
        self.guard.load_state_dict(state)
