"""Fetching the samples of one batch from a Dataset object and collating them, the same way in
the calling thread (num_workers=0) and in a worker process: so both give the same batches."""

from __future__ import annotations

import itertools
from typing import Any, Callable, Iterator

import numpy as np

from gputrain.data.collate import build_batch, default_collate, default_convert, pad_collate, plan_batch
from gputrain.data.dataset import MAP


class Fetcher:
    """Turns batch indices (map-style) or the next items of an iterator (iterable) into one
    collated batch. `collate` returns ("spec", plan) when the default collate builds the batch
    (its arrays are allocated later, possibly in shared memory), else ("object", batch)."""

    def __init__(self, dataset: Any, kind: str, batch_size: int | None, drop_last: bool, auto_collation: bool,
                 collate_fn: Callable[[Any], Any] | None, transform: Callable[[Any], Any] | None) -> None:
        self.dataset = dataset
        self.kind = kind
        self.batch_size = batch_size  # samples per batch of an iterable dataset
        self.auto_collation = auto_collation  # False (batch_size=None): collate_fn sees one sample at a time
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.transform = transform
        self._iterator: Iterator[Any] | None = None

    def restart(self) -> None:
        """Starts iterating an iterable dataset from its beginning."""
        self._iterator = iter(self.dataset)

    def samples(self, indices: np.ndarray | None) -> list[Any] | None:
        """The samples of a batch; None when an iterable dataset has no (full) batch left."""
        if self.kind == MAP:
            assert indices is not None
            if not self.auto_collation:
                return [self.dataset[int(indices[0])]]
            getitems = getattr(self.dataset, "__getitems__", None)
            if getitems is not None:
                return list(getitems(indices.tolist()))
            return [self.dataset[i] for i in indices.tolist()]
        if self._iterator is None:
            self.restart()
        assert self._iterator is not None
        take = self.batch_size if self.auto_collation and self.batch_size is not None else 1
        items = list(itertools.islice(self._iterator, take))
        if not items or (self.drop_last and len(items) < take):
            return None
        return items

    def collate(self, samples: list[Any]) -> tuple[str, Any]:
        collate_fn = self.collate_fn
        if not self.auto_collation:  # collate_fn sees each sample alone
            batch = (collate_fn or default_convert)(samples[0])
        elif collate_fn in (None, default_collate, pad_collate) and self.transform is None:
            return "spec", plan_batch(samples, pad=collate_fn is pad_collate)
        else:
            batch = (collate_fn or default_collate)(samples)
        if self.transform is not None:
            batch = self.transform(batch)
        return "object", batch

    def batch(self, indices: np.ndarray | None) -> tuple[bool, Any]:
        """(True, the batch) with fresh arrays, or (False, None) at the end of an iterable."""
        samples = self.samples(indices)
        if samples is None:
            return False, None
        form, value = self.collate(samples)
        return True, build_batch(value) if form == "spec" else value
