"""Text data: language-modelling windows over a flat token array, ragged sequences gathered
with padding, and length-bucketed batching.

    tokens = np.memmap("train.bin", dtype=np.uint16, mode="r")
    data = TokenDataset(tokens, block_size=1024)                  # contiguous blocks
    loader = gt.DataLoader(data, batch_size=8, shuffle=True)       # (x, y) batches, y = x shifted by 1
    windows = TokenDataset(tokens, block_size=1024, stride=1)      # every window: random windows
    loader = gt.DataLoader(windows, batch_size=8,                  # nanoGPT's get_batch, in C
                           sampler=gt.data.RandomSampler(windows, replacement=True, num_samples=8 * 1000))

    ragged = RaggedArray.from_sequences(list_of_token_arrays, pad_value=0)
    loader = gt.DataLoader((ragged, ragged.lengths, labels),
                           batch_sampler=bucket_by_length(ragged.lengths, batch_size=32, seed=0))
    for tokens, lengths, labels in loader:   # tokens: (32, longest in batch), padded with 0
        ...
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from gputrain import _C
from gputrain.data._ragged import RaggedArray
from gputrain.data.sampler import ORDER_PERMUTED, Sampler, make_order, seed_from

_BATCH_ORDER_KEY = 0x9E3779B97F4A7C15  # seeds the order of the batches apart from the rows'


class TokenDataset:
    """Windows of `block_size` tokens over a 1-D token array (any integer dtype, np.memmap
    included): sample i is (x, y) with x = tokens[i*stride : i*stride + block_size] and y the
    same window one token later. stride = block_size (default) gives contiguous blocks;
    stride = 1 gives every window, which shuffling or a RandomSampler turns into random
    windows. The DataLoader gathers windows straight from `tokens`, without copying them."""

    def __init__(self, tokens: Any, block_size: int, stride: int | None = None) -> None:
        tokens = np.asarray(tokens) if not isinstance(tokens, np.ndarray) else tokens
        if tokens.ndim != 1:
            raise ValueError(f"tokens must be a 1-D array, got shape {tokens.shape}")
        if tokens.dtype.kind not in "iu":
            raise TypeError(f"tokens must be an integer array, got dtype {tokens.dtype}")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        stride = block_size if stride is None else stride
        if not isinstance(stride, int) or isinstance(stride, bool) or stride < 1:
            raise ValueError(f"stride must be a positive int, got {stride!r}")
        if tokens.strides[0] != tokens.itemsize:
            tokens = np.ascontiguousarray(tokens)
        self.tokens = tokens
        self.block_size = block_size
        self.stride = stride
        usable = len(tokens) - block_size - 1  # the last window needs one more token for y
        self._length = usable // stride + 1 if usable >= 0 else 0

    def _windows(self, shift: int) -> np.ndarray:
        """All windows starting `shift` tokens in, as a read-only strided view."""
        itemsize = self.tokens.itemsize
        base = self.tokens[shift:shift + 1] if self._length == 0 else self.tokens[shift:]
        return np.lib.stride_tricks.as_strided(base, shape=(self._length, self.block_size),
                                               strides=(self.stride * itemsize, itemsize), writeable=False)

    def __gputrain_data__(self) -> tuple[np.ndarray, np.ndarray]:
        """The (x, y) window arrays the DataLoader gathers from."""
        return self._windows(0), self._windows(1)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if not -self._length <= index < self._length:
            raise IndexError(f"window {index} out of range for {self._length} windows")
        start = (index % self._length) * self.stride
        return (self.tokens[start:start + self.block_size], self.tokens[start + 1:start + self.block_size + 1])

    def __repr__(self) -> str:
        return f"TokenDataset({len(self.tokens)} tokens, block_size={self.block_size}, stride={self.stride})"


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of indices whose lengths are close (see `bucket_by_length`). Each epoch's
    batches are a pure function of (seed, epoch); iterating it standalone advances the epoch."""

    def __init__(self, lengths: Any, batch_size: int, boundaries: Sequence[int] | None, pool_batches: int,
                 shuffle: bool, seed: int, drop_last: bool) -> None:
        self.lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        self.batch_size = batch_size
        self.boundaries = None if boundaries is None else np.asarray(sorted(boundaries), dtype=np.int64)
        self.pool_batches = pool_batches
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self._num_batches = len(self.batch_arrays(0)[1]) - 1

    def _groups(self, epoch: int) -> list[np.ndarray]:
        """Index groups of similar lengths, each sorted by length (ties in a random order)."""
        n = len(self.lengths)
        order = (_C.sampler_rows(n, make_order(ORDER_PERMUTED, n, seed=self.seed, epoch=epoch))
                 if self.shuffle else np.arange(n, dtype=np.int64))
        if self.boundaries is not None:
            bucket = np.searchsorted(self.boundaries, self.lengths[order], side="right")
            by_bucket = np.argsort(bucket, kind="stable")
            order, bucket = order[by_bucket], bucket[by_bucket]
            cuts = np.flatnonzero(np.diff(bucket)) + 1
            return [g[np.argsort(self.lengths[g], kind="stable")] for g in np.split(order, cuts)]
        pool = self.pool_batches * self.batch_size if self.shuffle else max(n, 1)
        return [g[np.argsort(self.lengths[g], kind="stable")] for g in np.split(order, range(pool, n, pool))]

    def batch_arrays(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(indices, offsets) of epoch `epoch`: batch b is indices[offsets[b]:offsets[b + 1]]."""
        batches: list[np.ndarray] = []
        for group in self._groups(epoch):
            stop = len(group) - len(group) % self.batch_size if self.drop_last else len(group)
            batches.extend(group[s:s + self.batch_size] for s in range(0, stop, self.batch_size))
        if self.shuffle and len(batches) > 1:
            batch_order = _C.sampler_rows(len(batches), make_order(
                ORDER_PERMUTED, len(batches), seed=(self.seed ^ _BATCH_ORDER_KEY) % (1 << 64), epoch=epoch))
            batches = [batches[b] for b in batch_order]
        lengths = np.array([len(b) for b in batches], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        indices = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
        return indices, offsets

    def set_epoch(self, epoch: int) -> None:
        """Selects the batches of epoch `epoch` for standalone iteration."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        indices, offsets = self.batch_arrays(self.epoch)
        self.epoch += 1
        return iter([indices[offsets[b]:offsets[b + 1]].tolist() for b in range(len(offsets) - 1)])

    def __len__(self) -> int:
        return self._num_batches


def bucket_by_length(lengths: Any, batch_size: int, *, boundaries: Sequence[int] | None = None,
                     pool_batches: int = 50, shuffle: bool = True, seed: int | None = None,
                     drop_last: bool = False) -> BucketBatchSampler:
    """A batch sampler grouping sequences of similar length, for `DataLoader(batch_sampler=...)`
    with a RaggedArray: each batch is padded only to its own longest sequence.

    With `boundaries` (sorted lengths), a batch takes sequences of one bucket
    [boundaries[i-1], boundaries[i]); otherwise sequences are drawn in pools of
    `pool_batches * batch_size` random ones and sorted by length inside a pool. With
    `shuffle` (default) the pools/buckets are filled in a random order and the batches are
    yielded in a random order, both pure functions of (seed, epoch)."""
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
        raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
    if not isinstance(pool_batches, int) or pool_batches < 1:
        raise ValueError(f"pool_batches must be a positive int, got {pool_batches!r}")
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (len(lengths) and lengths.min() < 0):
        raise ValueError("lengths must be a 1-D array of non-negative integers")
    return BucketBatchSampler(lengths, batch_size, boundaries, pool_batches, bool(shuffle), seed_from(seed, None),
                              bool(drop_last))


__all__ = ["BucketBatchSampler", "RaggedArray", "TokenDataset", "bucket_by_length"]
