"""One vocabulary for precisions and devices, parsed in one place each.

Precision: every API that takes one (``TrainStep(precision=)``, ``Module.summary(precision=)``,
``memory_plan.plan_training(precision=)``, ``cast(dtype=)``, the ``dtype=`` of the functional ops)
accepts the names ``"fp32"``, ``"bf16"``, ``"fp16"``, their aliases ``"f32"``/``"float32"``,
``"bf16"``/``"bfloat16"``, ``"f16"``/``"float16"``, NumPy dtypes (``np.float32``, ``np.float16``,
``ml_dtypes.bfloat16``) and ``torch.float32``/``torch.bfloat16``/``torch.float16`` (recognised by
name; torch is never imported). `parse_precision` gives the canonical name; `c_dtype` the C core's.

Device: ``"cpu"``, ``"cuda"``/``"cuda:N"``, ``"sim"``/``"sim:N"`` (the simulated device), where an
API allows it ``"auto"``, ``"pinned"`` or an int ordinal, and any object with torch.device's
``type`` and ``index`` attributes. `parse_device` gives the canonical ``"cpu"``, ``"cuda:N"`` or
``"sim:N"``; the C core receives that string and parses it with its one function
(``gt_device_parse`` in csrc/core/device.c).
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The canonical precision names.
PRECISIONS = ("fp32", "bf16", "fp16")

_PRECISION_ALIASES = {
    "fp32": "fp32", "f32": "fp32", "float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "f16": "fp16", "float16": "fp16",
}
_C_DTYPES = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}
_ACCEPTED = "'fp32', 'bf16' or 'fp16' (or 'f32'/'float32', 'bfloat16', 'f16'/'float16', or a NumPy/torch dtype)"


def parse_precision(value: Any, arg_name: str = "precision") -> str:
    """The canonical name ("fp32", "bf16" or "fp16") of a precision given as a name, a NumPy or
    ml_dtypes dtype (or scalar type), or a torch dtype; ValueError/TypeError naming `arg_name`."""
    if isinstance(value, str):
        if value in _PRECISION_ALIASES:
            return _PRECISION_ALIASES[value]
        raise ValueError(f"{arg_name} must be {_ACCEPTED}, got {value!r}")
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":  # torch.float16 and so on
        name = str(value).removeprefix("torch.")
        if name in _PRECISION_ALIASES:
            return _PRECISION_ALIASES[name]
        raise ValueError(f"{arg_name} must be {_ACCEPTED}, got {value}")
    if isinstance(value, (np.dtype, type)):
        try:
            name = np.dtype(value).name
        except TypeError:
            raise TypeError(f"{arg_name} must be a str or a float dtype, not the type {value.__name__}") from None
        if name in _PRECISION_ALIASES:
            return _PRECISION_ALIASES[name]
        raise ValueError(f"{arg_name} must be {_ACCEPTED}, got the dtype {name}")
    raise TypeError(f"{arg_name} must be a str such as 'bf16' or a dtype, not {type(value).__name__}")


def is_dtype(value: Any) -> bool:
    """True for a NumPy dtype or scalar type and a torch dtype (what `Module.to(dtype)` may get)."""
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return True
    return type(value).__module__ == "torch" and type(value).__name__ == "dtype"


def c_dtype(value: Any, arg_name: str = "precision") -> str:
    """The C core's dtype name ("f32", "bf16" or "f16") of any accepted precision."""
    return _C_DTYPES[parse_precision(value, arg_name)]


def precision_of_c_dtype(name: str) -> str:
    """The canonical precision of a C dtype name such as a compiled model's ``precision``."""
    return parse_precision(name, "dtype")


_DEVICE_KINDS = ("auto", "cpu", "pinned", "cuda", "sim")


def _device_text(device: Any, arg_name: str, allow_int: bool) -> str:
    """`device` as a string, before it is checked: ints and torch.device-like objects converted."""
    if isinstance(device, str):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        if not allow_int:
            raise TypeError(f"{arg_name} must be a str such as 'cuda:0', not an int ({device})")
        if device < 0:
            raise ValueError(f"{arg_name}: a device index must be >= 0, got {device}")
        return f"cuda:{device}"
    kind, index = getattr(device, "type", None), getattr(device, "index", False)
    if isinstance(kind, str) and (index is None or isinstance(index, int)):  # torch.device("cuda", 1)
        return kind if index is None else f"{kind}:{index}"
    raise TypeError(f"{arg_name} must be a str such as 'cpu', 'cuda:0' or 'sim', not {type(device).__name__}")


def _wanted(kinds: tuple[str, ...], none_ok: bool) -> str:
    """The accepted spellings for an error message: "None, 'cpu', 'cuda', 'cuda:N' or 'sim'"."""
    names = ["None"] if none_ok else []
    for kind in _DEVICE_KINDS:
        if kind in kinds:
            names += [f"'{kind}'"] if kind in ("auto", "cpu", "pinned") else [f"'{kind}'", f"'{kind}:N'"]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def parse_device(device: Any, arg_name: str = "device", *, kinds: tuple[str, ...] = ("cpu", "cuda", "sim"),
                 allow_int: bool = False, none_ok: bool = False, check: bool = False) -> str | None:
    """The canonical name of a device: "cpu", "cuda:N", "sim:N" (or "auto"/"pinned" when `kinds`
    holds them; None for None when `none_ok`). `device` is a str, an int ordinal of a CUDA device
    when `allow_int`, or a torch.device. With `check`, a "cuda:N" or "sim:N" that does not exist in
    this process is refused (CudaError / ValueError). A bad name raises ValueError naming
    `arg_name` and the accepted spellings."""
    if device is None and none_ok:
        return None
    if device is None:
        raise TypeError(f"{arg_name} must be {_wanted(kinds, False)}, not None")
    text = _device_text(device, arg_name, allow_int)
    kind, colon, digits = text.partition(":")
    wanted = _wanted(kinds, none_ok)
    index_ok = not colon or (digits.isdigit() and digits.isascii() and (digits == "0" or digits[0] != "0"))
    if kind not in kinds or not index_ok or (colon and kind in ("auto", "cpu", "pinned")):
        raise ValueError(f"{arg_name} must be {wanted}, got {device!r}")
    if kind in ("auto", "cpu", "pinned"):
        return kind
    index = int(digits) if colon else 0
    if index >= 2**31:
        raise ValueError(f"{arg_name}: device index {digits} is out of range in {device!r}")
    canonical = f"{kind}:{index}"
    if check:
        _check_exists(canonical, device, arg_name)
    return canonical


def _check_exists(canonical: str, device: Any, arg_name: str) -> None:
    from gputrain import _C

    if canonical.startswith("sim"):
        _C.memory_stats(device=canonical)  # ValueError naming the device unless sim:N exists
        return
    count = _C.cuda_device_count()
    if int(canonical[5:]) >= count:
        from gputrain.cuda import unavailable_reason

        reason = unavailable_reason() or f"{count} device(s)"
        raise _C.CudaError(f"{arg_name}={device!r}: CUDA device {canonical[5:]} is not available ({reason})")
