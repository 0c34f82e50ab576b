"""Checks shared by every load_state_dict: each is validated completely before anything is
applied, so a damaged state dict raises (KeyError for a wrong key set, TypeError for a wrong
type, ValueError for a wrong value) and leaves the object exactly as it was.

Every message names the entry, e.g. ``state_dict['param_groups'][0]['lr']``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

__all__ = ["check_keys", "check_mapping", "float32_array", "integer", "real"]


def check_mapping(value: Any, name: str) -> Mapping[Any, Any]:
    """`value` if it is a Mapping (TypeError naming `name` otherwise)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, not {type(value).__name__}")
    return value


def check_keys(state: Mapping[Any, Any], name: str, required: Iterable[str],
               optional: Iterable[str] = ()) -> None:
    """KeyError naming the missing and the unexpected keys of `state` (PyTorch's key set)."""
    required, optional = list(required), list(optional)
    missing = [k for k in required if k not in state]
    unexpected = [k for k in state if k not in required and k not in optional]
    if missing or unexpected:
        raise KeyError(f"{name}: missing keys {missing}, unexpected keys {unexpected}")


def real(value: Any, name: str, low: float | None = None, high: float | None = None, *,
         low_open: bool = False, high_open: bool = False) -> float:
    """A finite real number (a Python or NumPy scalar, or a one-element array) within the bounds."""
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iuf":
        value = value.reshape(()).item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float: out of any finite interval
        number = math.inf
    below = low is not None and (number <= low if low_open else number < low)
    above = high is not None and (number >= high if high_open else number > high)
    if not math.isfinite(number) or below or above:
        interval = (f"{'(' if low_open else '['}{'-inf' if low is None else low}, "
                    f"{'inf' if high is None else high}{')' if high_open or high is None else ']'}")
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return number


def integer(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """An int (Python or NumPy, not bool) within [low, high]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    number = int(value)
    if (low is not None and number < low) or (high is not None and number > high):
        raise ValueError(f"{name} must be in [{low}, {high}], got {number}")
    return number


def float32_array(value: Any, name: str, *, shape: tuple[int, ...],
                  nonnegative: bool = False) -> np.ndarray:
    """A C-contiguous float32 copy of a real-valued array-like of `shape`, every value finite
    (and >= 0 when asked)."""
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a real-valued array, not {type(value).__name__} ({error})") from None
    if array.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real-valued array, got dtype {array.dtype}")
    if array.shape != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {array.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        converted = np.array(array, dtype=np.float32, order="C")
    if not np.isfinite(converted).all():
        raise ValueError(f"{name} holds NaN or infinite values (or values beyond float32)")
    if nonnegative and (converted < 0).any():
        raise ValueError(f"{name} holds negative values")
    return converted
