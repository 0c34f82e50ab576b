"""Backend math switches: `gputrain.backends.tf32 = True` allows TF32 tensor cores, and
`gputrain.backends.cudnn` holds torch.backends.cudnn's knobs for Conv2d on CUDA.

TF32 is a cuBLAS/cuDNN math mode for fp32 GEMMs and convolutions on NVIDIA GPUs (Ampere and
newer): inputs are rounded to a 10-bit mantissa, accumulation stays fp32. The CPU backend has
no such mode, so on a machine without a usable CUDA device the switch is recorded but
`tf32_status()` reports it as not applicable instead of ignoring it silently.
"""

from __future__ import annotations

import sys
import types

from gputrain import _C

_tf32 = False  # the switch as last set; read by the training step through tf32_enabled()


def tf32_enabled() -> bool:
    """Whether fp32 GEMMs and convolutions on CUDA may use TF32 (the training step reads this)."""
    return _tf32


def set_tf32(enabled: bool) -> None:
    """Allow (True) or forbid (False) TF32 math on CUDA devices."""
    global _tf32
    if not isinstance(enabled, bool):
        raise TypeError(f"tf32 must be a bool, not {type(enabled).__name__}")
    if _C.build_info()["cuda_compiled"]:
        _C.cuda_set_tf32(enabled)
    _tf32 = enabled


def tf32_status() -> str:
    """'enabled' or 'disabled' on a CUDA device; on the CPU, why TF32 is not applicable."""
    if _C.cuda_device_count() > 0:
        return "enabled" if _tf32 else "disabled"
    state = "requested" if _tf32 else "off"
    return (f"not applicable ({state}): TF32 is a cuBLAS/cuDNN math mode and no CUDA device "
            "is in use; CPU fp32 math is full fp32")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"cudnn.{name} must be a bool, not {type(value).__name__}")


class _CudnnModule(types.ModuleType):
    """`gputrain.backends.cudnn`, named as torch.backends.cudnn: how Conv2d's cuDNN algorithms
    are chosen on CUDA. Each shape's algorithms are chosen once, when a model is planned for it:

    - `benchmark` (False): False takes cuDNN's heuristic first choice; True measures the
      algorithms (cudnnFind*) once per shape and keeps the fastest (the guides'
      `torch.backends.cudnn.benchmark = True`).
    - `deterministic` (False): True keeps to algorithms cuDNN reports as deterministic (the same
      bits on every run; e.g. not the weight-gradient algorithms that add with atomics).

    The knobs apply to shapes planned after they are set. On a build without CUDA they are
    recorded (there is no cuDNN to tell) and `is_available()` is False.
    """

    _benchmark = False
    _deterministic = False

    @property
    def benchmark(self) -> bool:
        return self._benchmark

    @benchmark.setter
    def benchmark(self, value: bool) -> None:
        _check_bool("benchmark", value)
        self._apply(value, self._deterministic)

    @property
    def deterministic(self) -> bool:
        return self._deterministic

    @deterministic.setter
    def deterministic(self, value: bool) -> None:
        _check_bool("deterministic", value)
        self._apply(self._benchmark, value)

    def _apply(self, benchmark: bool, deterministic: bool) -> None:
        if self.is_available():
            _C.cudnn_set_flags(benchmark, deterministic)
        type(self)._benchmark = benchmark
        type(self)._deterministic = deterministic

    @staticmethod
    def is_available() -> bool:
        """Whether this build has the CUDA backend, which opens cuDNN for Conv2d when first needed."""
        return bool(_C.build_info()["cuda_compiled"])

    @staticmethod
    def version() -> int | None:
        """cuDNN's version as an int (e.g. 91900 for 9.19.0), None without CUDA (torch's convention).
        Loads cuDNN if no Conv2d has yet (no GPU needed); `gputrain.CudaError` if it cannot be."""
        return _C.cudnn_version() if _CudnnModule.is_available() else None


cudnn = _CudnnModule(__name__ + ".cudnn", _CudnnModule.__doc__)
sys.modules[cudnn.__name__] = cudnn


class _BackendsModule(types.ModuleType):
    """Makes `gputrain.backends.tf32` a checked, settable attribute of this module."""

    @property
    def tf32(self) -> bool:
        return tf32_enabled()

    @tf32.setter
    def tf32(self, enabled: bool) -> None:
        set_tf32(enabled)


sys.modules[__name__].__class__ = _BackendsModule

__all__ = ["cudnn", "set_tf32", "tf32_enabled", "tf32_status"]
