"""Seeds: models draw their initialisation/dropout seed from one process-wide sequence."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

_MASK64 = (1 << 64) - 1
_base_seed = 0
_counter = itertools.count()


def manual_seed(seed: int) -> None:
    """Restart the seed sequence: models built afterwards in the same order get the same seeds."""
    global _base_seed, _counter
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, not {type(seed).__name__}")
    _base_seed = seed & _MASK64
    _counter = itertools.count()


def next_seed() -> int:
    """The next 64-bit seed of the sequence (splitmix64 of base + counter)."""
    z = (_base_seed + 0x9E3779B97F4A7C15 * (next(_counter) + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


@contextmanager
def sequence_kept() -> Iterator[None]:
    """Modules built inside draw seeds without moving the sequence: for layers that only hold
    values copied from another (a LoRA base stored anew), so the models built next get the seeds
    they would have got without them."""
    global _counter
    position = next(_counter)
    try:
        yield
    finally:
        _counter = itertools.count(position)
