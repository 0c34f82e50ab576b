"""Backend math switches: `gputrain.backends.tf32 = True` allows TF32 tensor cores.

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


class _BackendsModule(types.ModuleType):
    """Makes `gputrain.backends.tf32` a checked, settable attribute of this module."""

    @property
    def tf32(self) -> bool:
        return tf32_enabled()

    @tf32.setter
    def tf32(self, enabled: bool) -> None:
        set_tf32(enabled)


sys.modules[__name__].__class__ = _BackendsModule

__all__ = ["set_tf32", "tf32_enabled", "tf32_status"]
