"""The structure of a dataset: one array, or tuples/lists/dicts of arrays (nested), flattened
to the list of arrays the C loader gathers, and rebuilt around each batch's views."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np

from gputrain.data._ragged import RaggedArray

Rebuild = Callable[[list[np.ndarray]], Any]


def _as_array(obj: Any, where: str) -> np.ndarray:
    """An array whose rows are contiguous (a strided first dimension is kept as it is)."""
    if isinstance(obj, np.ndarray):
        array = obj
    elif hasattr(obj, "__array__") or hasattr(obj, "__array_interface__"):
        array = np.asarray(obj)
    else:
        raise TypeError(
            f"data{where} must be a NumPy array (or a tuple/list/dict of arrays), "
            f"not {type(obj).__name__}"
        )
    if array.ndim == 0:
        raise ValueError(f"data{where} is 0-d; samples run along the first dimension")
    if array.dtype.hasobject:
        raise TypeError(f"data{where} holds Python objects (dtype {array.dtype}); use a numeric dtype")
    if array.ndim > 1 and not array[:1].flags.c_contiguous:
        array = np.ascontiguousarray(array)  # rows must be contiguous: one copy, once
    return array


def _tuple_builder(kind: type, fields: list[str] | None) -> Callable[[list[Any]], Any]:
    if kind is list:
        return list
    if fields is not None:  # a namedtuple
        return lambda items: kind(*items)
    if kind is tuple:
        return tuple
    return lambda items: kind(items)


def _mapping_builder(kind: type, keys: list[Any]) -> Callable[[list[Any]], Any]:
    def build(items: list[Any]) -> Any:
        try:
            return kind(zip(keys, items))
        except TypeError:  # a Mapping type that cannot be built from pairs
            return dict(zip(keys, items))

    return build


def flatten(data: Any, where: str = "") -> tuple[list[np.ndarray | RaggedArray], Rebuild]:
    """The arrays of `data` in order, and a function building the same structure from a list
    with one item per array."""
    if isinstance(data, RaggedArray):
        return [data], lambda items: items[0]
    if hasattr(data, "__gputrain_data__"):
        return flatten(data.__gputrain_data__(), where)
    if hasattr(data, "tensors") and isinstance(data.tensors, (tuple, list)):  # TensorDataset
        return flatten(tuple(data.tensors), where)
    if isinstance(data, Mapping):
        keys = list(data.keys())
        parts = [flatten(data[k], f"{where}[{k!r}]") for k in keys]
        return _combine(parts, _mapping_builder(type(data), keys))
    if isinstance(data, (tuple, list)):
        if len(data) == 0:
            raise ValueError(f"data{where} is an empty {type(data).__name__}; it needs at least one array")
        parts = [flatten(item, f"{where}[{i}]") for i, item in enumerate(data)]
        return _combine(parts, _tuple_builder(type(data), getattr(data, "_fields", None)))
    array = _as_array(data, where)
    return [array], lambda items: items[0]


def _combine(parts: list[tuple[list[np.ndarray], Rebuild]], build: Callable[[list[Any]], Any]) -> tuple[list[np.ndarray], Rebuild]:
    arrays: list[np.ndarray] = []
    spans: list[tuple[int, int, Rebuild]] = []
    for part_arrays, rebuild in parts:
        spans.append((len(arrays), len(arrays) + len(part_arrays), rebuild))
        arrays.extend(part_arrays)

    def rebuild_all(items: list[np.ndarray]) -> Any:
        return build([rebuild(items[start:stop]) for start, stop, rebuild in spans])

    return arrays, rebuild_all


def num_samples(arrays: list[np.ndarray | RaggedArray]) -> int:
    """The common first dimension; raises ValueError naming the mismatch."""
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(
            "data arrays must have the same first dimension (number of samples), got "
            + ", ".join(str(len(a)) for a in arrays)
        )
    return lengths.pop()
