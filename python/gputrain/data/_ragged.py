"""RaggedArray: rows of different lengths, gathered by the DataLoader with padding."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class RaggedArray:
    """Rows of different lengths: row i is values[offsets[i]:offsets[i + 1]] (each item may have
    a trailing shape). In a DataLoader batch a RaggedArray comes out as one array of shape
    (batch, longest row of the batch, *item shape), padded with `pad_value`; with
    `pad_to_multiple_of=8` the batch's width is rounded up to a multiple of 8 (as Hugging Face's
    DataCollatorWithPadding(pad_to_multiple_of=8), for tensor cores)."""

    def __init__(self, values: Any, offsets: Any, pad_value: Any = 0, pad_to_multiple_of: int = 1) -> None:
        if (isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, (int, np.integer))
                or not 1 <= pad_to_multiple_of <= 65536):
            raise ValueError(f"pad_to_multiple_of must be an int in [1, 65536], got {pad_to_multiple_of!r}")
        values = np.ascontiguousarray(values)
        try:
            offsets = np.require(offsets, np.int64, ["C_CONTIGUOUS", "ALIGNED"])  # C reads them as int64
        except OverflowError:
            raise ValueError("offsets must be item offsets that fit in int64") from None
        if values.ndim < 1:
            raise ValueError("values must have at least one dimension (the items)")
        if values.dtype.hasobject:
            raise TypeError(f"values hold Python objects (dtype {values.dtype}); use a numeric dtype")
        if offsets.ndim != 1 or len(offsets) < 1:
            raise ValueError("offsets must be a 1-D array of len(rows) + 1 item offsets")
        if offsets[0] < 0 or offsets[-1] > len(values) or np.any(np.diff(offsets) < 0):
            raise ValueError(f"offsets must be non-decreasing within [0, {len(values)}]")
        self.values = values
        self.offsets = offsets
        self.pad_to_multiple_of = int(pad_to_multiple_of)
        try:
            self.pad = np.full(values.shape[1:], pad_value, dtype=values.dtype)
        except OverflowError:
            raise ValueError(f"pad_value {pad_value!r} does not fit the values' dtype {values.dtype}") from None

    @classmethod
    def from_sequences(cls, sequences: Sequence[Any], dtype: Any = None, pad_value: Any = 0) -> "RaggedArray":
        """Concatenates `sequences` (arrays with the same trailing shape) into one RaggedArray."""
        arrays = [np.asarray(s, dtype=dtype) for s in sequences]
        if not arrays:
            raise ValueError("sequences is empty")
        lengths = np.array([len(a) for a in arrays], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return cls(np.concatenate(arrays), offsets, pad_value)

    @property
    def lengths(self) -> np.ndarray:
        """Items per row, int64."""
        return np.diff(self.offsets)

    def padded_width(self, longest: int) -> int:
        """The width of a batch whose longest row has `longest` items."""
        return -(-longest // self.pad_to_multiple_of) * self.pad_to_multiple_of

    def field(self) -> tuple[Any, ...]:
        """What the C loader gathers: (values, offsets, one padding item[, width multiple])."""
        if self.pad_to_multiple_of > 1:
            return self.values, self.offsets, self.pad, self.pad_to_multiple_of
        return self.values, self.offsets, self.pad

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index]:self.offsets[index + 1]]

    def __repr__(self) -> str:
        multiple = f", pad_to_multiple_of={self.pad_to_multiple_of}" if self.pad_to_multiple_of > 1 else ""
        return f"RaggedArray({len(self)} rows, {len(self.values)} items of {self.values.dtype}{multiple})"
