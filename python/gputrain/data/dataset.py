"""Dataset base classes with PyTorch's protocol, and how a DataLoader tells datasets apart.

A map-style dataset has `__len__` and `__getitem__(index)` (optionally `__getitems__(indices)`
for a whole batch); an iterable dataset has `__iter__`. Subclassing is optional: any object with
these methods works, torch.utils.data.Dataset subclasses included (torch is never imported).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, Iterator, TypeVar

import numpy as np

from gputrain.data._ragged import RaggedArray
from gputrain.data._structure import Rebuild, flatten

T_co = TypeVar("T_co", covariant=True)

ARRAYS = "arrays"  # NumPy arrays (or a structure of them) gathered by the C loader
MAP = "map"  # __len__ + __getitem__
ITERABLE = "iterable"  # __iter__


class Dataset(Generic[T_co]):
    """A map-style dataset: subclasses define __getitem__ and __len__."""

    def __getitem__(self, index: int) -> T_co:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")


class IterableDataset(Dataset[T_co]):
    """An iterable dataset: subclasses define __iter__. With num_workers > 0 every worker
    process iterates its own copy; shard by gputrain.data.get_worker_info() as in PyTorch."""

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


def _is_torch_iterable(dataset: Any) -> bool:
    return any(c.__name__ == "IterableDataset" and c.__module__.startswith("torch.") for c in type(dataset).__mro__)


def _list_of_samples(dataset: Any) -> bool:
    """A non-empty list whose first item is not an array (a list of arrays is array fields)."""
    return isinstance(dataset, list) and len(dataset) > 0 and not isinstance(dataset[0], (np.ndarray, RaggedArray))


def _array_like(dataset: Any) -> bool:
    """Data meant for the array path, even when flatten() refuses it."""
    return (isinstance(dataset, (np.ndarray, RaggedArray, tuple, Mapping, str, bytes))
            or hasattr(dataset, "__gputrain_data__"))


def classify(dataset: Any) -> tuple[str, tuple[list[Any], Rebuild] | None]:
    """(ARRAYS, flatten(dataset)), (MAP, None) or (ITERABLE, None); a TypeError naming the type
    for anything else."""
    if isinstance(dataset, IterableDataset) or _is_torch_iterable(dataset):
        return ITERABLE, None
    array_error = None
    if not isinstance(dataset, Dataset) or hasattr(dataset, "__gputrain_data__"):
        try:  # a structure of arrays; a ValueError (mismatched lengths...) is the caller's
            return ARRAYS, flatten(dataset)
        except (TypeError, ValueError) as error:  # not a structure of arrays: a list of samples is
            if not _list_of_samples(dataset) and (isinstance(error, ValueError) or _array_like(dataset)):
                raise  # a dataset; arrays, or a tuple, dict or list of them with a mistake, are not
            array_error = error
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return MAP, None
    if hasattr(dataset, "__iter__"):
        return ITERABLE, None
    raise TypeError("dataset must be a NumPy array (or a tuple/list/dict of arrays), a map-style dataset "
                    "(__len__ and __getitem__) or an iterable dataset (__iter__), not "
                    f"{type(dataset).__name__}" + (f" ({array_error})" if array_error else ""))


__all__ = ["Dataset", "IterableDataset"]
