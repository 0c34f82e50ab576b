"""Arrow tables and Hugging Face `datasets` as DataLoader input: each column is converted once
into what the array path gathers, with no per-row Python.

    loader = gt.DataLoader(ds, batch_size=32, shuffle=True, columns=["input_ids", "label"])

Fixed-width numeric and boolean columns become NumPy arrays (zero-copy for a column with one
chunk and no nulls; booleans, which Arrow packs in bits, are copied), fixed-size lists become
2-D (or deeper) arrays, and variable-length lists (token ids) become RaggedArray from Arrow's
offsets and values, padded per batch. Batches are dicts keyed by column name. pyarrow is
imported only when a table is given; `datasets` is never imported (a `datasets.Dataset` is
recognised by its `.data.table`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from gputrain.data._ragged import RaggedArray


def _is_arrow_table(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "Table" and cls.__module__.startswith("pyarrow")


def arrow_table(obj: Any) -> Any:
    """The pyarrow Table behind `obj` (a Table, or a `datasets.Dataset` with its selection or
    shuffle applied), or None when `obj` is not one."""
    if _is_arrow_table(obj):
        return obj
    table = getattr(getattr(obj, "data", None), "table", None)
    if not _is_arrow_table(table):
        return None
    indices = getattr(obj, "_indices", None)  # datasets' select/shuffle/filter: rows of the table
    if indices is not None:
        indices = getattr(indices, "table", indices)  # datasets wraps it as it wraps the table
        table = table.take(indices.column(0))  # one gather in Arrow's C++
    return table


def _numeric(array: Any, name: str) -> np.ndarray:
    """One Arrow array (no nulls) of a fixed-width type as a NumPy array."""
    import pyarrow as pa

    kind = array.type
    if pa.types.is_fixed_size_list(kind):
        values = _numeric(array.flatten(), name)  # flatten() honours a slice's offset
        return values.reshape((len(array), kind.list_size) + values.shape[1:])
    if pa.types.is_boolean(kind):
        return array.to_numpy(zero_copy_only=False)
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return array.to_numpy(zero_copy_only=True)
    raise TypeError(f"column {name!r} has type {kind}, which the DataLoader cannot gather; numeric, "
                    "boolean and (fixed-size) lists of them are supported (name the columns to load with columns=)")


def _check_nulls(array: Any, what: str) -> None:
    if array.null_count:
        raise ValueError(f"{what} has {array.null_count} null value(s); fill or drop them "
                         "(e.g. table.fill_null or table.drop_null) before the DataLoader")


def _column(column: Any, name: str) -> np.ndarray | RaggedArray:
    import pyarrow as pa

    array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    _check_nulls(array, f"column {name!r}")
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        values = array.values  # offsets index these directly, also in a sliced array
        _check_nulls(values, f"column {name!r} (in its items)")
        return RaggedArray(_numeric(values, name), array.offsets.to_numpy())
    if pa.types.is_fixed_size_list(array.type):
        _check_nulls(array.flatten(), f"column {name!r} (in its items)")
    return _numeric(array, name)


def arrow_columns(data: Any, columns: Sequence[str] | None = None) -> dict[str, np.ndarray | RaggedArray]:
    """The columns of a pyarrow Table or `datasets.Dataset` (all, or those named in `columns`,
    in that order) as NumPy arrays and RaggedArrays."""
    table = arrow_table(data)
    if table is None:
        raise TypeError(f"data must be a pyarrow Table or a datasets.Dataset, not {type(data).__name__}")
    names = list(table.column_names)
    if columns is None:
        columns = names
    elif isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError("columns must be a list of column names")
    missing = [c for c in columns if c not in names]
    if missing:
        raise KeyError(f"columns {missing} are not in the table (its columns: {names})")
    if not columns:
        raise ValueError("columns is empty; name at least one column")
    return {name: _column(table.column(name), name) for name in columns}


__all__ = ["arrow_columns", "arrow_table"]
