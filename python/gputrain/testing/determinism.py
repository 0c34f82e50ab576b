"""Bit-for-bit comparison of training state (weights, optimizer and scaler state) and a
reproducibility assertion: the same seed must give the same bits (DESIGN.md principle 4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gputrain import random
from gputrain.step import TrainStep

_NUMPY_SEEDS = 1 << 32  # np.random.seed takes 0 <= seed < 2**32


def seed_all(seed: int) -> None:
    """Seed gputrain's generator (gputrain.random.manual_seed) and NumPy's global one."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int, not {type(seed).__name__}")
    if not 0 <= seed < _NUMPY_SEEDS:
        raise ValueError(f"seed must be in [0, 2**32) (NumPy's range), got {seed}")
    random.manual_seed(int(seed))
    np.random.seed(int(seed))


def training_state(obj: Any) -> dict[str, Any]:
    """Copies of everything a run's result depends on, flattened to {path: leaf}.

    A TrainStep gives its model's, optimizer's and scaler's state; any other object with a state_dict() gives
    that; dicts, lists and tuples are walked. Paths read like Python:
    ``model['0.weight']``, ``optimizer['state'][0]['exp_avg']``.
    """
    flat: dict[str, Any] = {}
    _flatten(_unwrap(obj), "", flat)
    return flat


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, TrainStep):
        parts = {"model": obj.model, "optimizer": obj.optimizer, "scaler": obj.scaler}
        return {name: part for name, part in parts.items() if part is not None}
    if not isinstance(obj, (Mapping, np.ndarray)) and callable(getattr(obj, "state_dict", None)):
        return obj.state_dict()
    return obj


def _flatten(obj: Any, path: str, flat: dict[str, Any]) -> None:
    obj = _unwrap(obj)
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            _flatten(value, f"{path}[{key!r}]" if path else str(key), flat)
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            _flatten(value, f"{path}[{index}]", flat)
    elif isinstance(obj, (np.ndarray, np.generic)):
        flat[path] = np.array(obj, copy=True)
    else:
        flat[path] = obj


def _bits(array: np.ndarray) -> np.ndarray:
    """The array's elements as unsigned integers of the same width (NaN == NaN, -0 != +0)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.kind in "fciuMmb" and flat.dtype.itemsize in (1, 2, 4, 8):
        return flat.view(f"u{flat.dtype.itemsize}")
    return flat.view(np.uint8).reshape(flat.size, -1) if flat.size else flat.view(np.uint8)


def _array_difference(a: np.ndarray, b: np.ndarray) -> str | None:
    if a.dtype != b.dtype or a.shape != b.shape:
        return f": {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    bits_a, bits_b = _bits(a), _bits(b)
    unequal = bits_a != bits_b
    if unequal.ndim > 1:
        unequal = unequal.any(axis=1)
    positions = np.flatnonzero(unequal)
    if positions.size == 0:
        return None
    first = int(positions[0])
    index = f"[{', '.join(str(int(i)) for i in np.unravel_index(first, a.shape))}]" if a.ndim else ""
    bits = (f" (bits {int(bits_a[first]):#x} vs {int(bits_b[first]):#x})" if bits_a.ndim == 1 else "")
    return (f"{index}: {a.reshape(-1)[first]!s} vs {b.reshape(-1)[first]!s}{bits}; "
            f"{positions.size} of {a.size} elements differ")


def _leaf_difference(a: Any, b: Any) -> str | None:
    """None when the leaves are bit-identical, else what differs (appended to the leaf's path)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return f": {type(a).__name__} vs {type(b).__name__}"
        return _array_difference(a, b)
    if isinstance(a, float) and isinstance(b, float):
        same = np.float64(a).view(np.uint64) == np.float64(b).view(np.uint64)
    else:
        same = type(a) is type(b) and a == b
    return None if same else f": {a!r} vs {b!r}"


def assert_bit_identical(a: Any, b: Any, *, names: tuple[str, str] = ("a", "b")) -> None:
    """Assert two training states are bit-for-bit equal (see training_state for what is read).

    The AssertionError names the first differing tensor and index with both values and their
    bits, how many elements of it differ, the other differing entries, and any missing ones.
    """
    state_a, state_b = training_state(a), training_state(b)
    missing = [path for path in state_a if path not in state_b]
    extra = [path for path in state_b if path not in state_a]
    problems = []
    for name, only in zip(names, (missing, extra)):
        if only:
            problems.append(f"entries only in {name}: " + ", ".join(only))
    differing = [(path, d) for path in state_a if path in state_b
                 for d in [_leaf_difference(state_a[path], state_b[path])] if d is not None]
    if differing:
        problems.append(f"first difference ({names[0]} vs {names[1]}) at {differing[0][0]}{differing[0][1]}")
        if len(differing) > 1:
            problems.append(f"{len(differing) - 1} more entries differ: " + ", ".join(p for p, _ in differing[1:]))
    if problems:
        raise AssertionError("training states are not bit-identical:\n  " + "\n  ".join(problems))


def assert_reproducible(factory: Callable[[], Any], *, seed: int = 0) -> Any:
    """Run `factory` twice, each time after seed_all(seed), and assert bit-identical results.

    `factory()` builds and trains whatever it tests and returns the trained TrainStep, model,
    optimizer or a dict of them (e.g. ``{"model": model, "optimizer": opt}``); its state is
    copied before the second run. Returns the second run's result.
    """
    if not callable(factory):
        raise TypeError(f"factory must be callable, not {type(factory).__name__}")
    seed_all(seed)
    first = training_state(factory())
    seed_all(seed)
    second = factory()
    assert_bit_identical(first, second, names=("run 1", "run 2"))
    return second
