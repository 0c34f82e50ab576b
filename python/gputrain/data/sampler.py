"""Samplers with PyTorch's names and arguments whose orders the C loader computes itself.

A gputrain sampler describes its order (sequential, a Philox permutation keyed by
(seed, epoch), draws with replacement, or DistributedSampler-style shards of either) instead
of producing indices in Python: the loader's workers compute the rows of any batch from
(seed, epoch, batch index) alone. Iterating a sampler yields exactly the rows the loader
gathers. Any other iterable of indices (and any batch sampler) also works: the loader then
reads its indices once per epoch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from gputrain import _C, distributed
from gputrain.data._ragged import RaggedArray
from gputrain.data._structure import flatten, num_samples

T_co = TypeVar("T_co", covariant=True)

ORDER_SEQUENTIAL = 0  # position p -> row p
ORDER_PERMUTED = 1  # a Philox permutation of the rows per (seed, epoch, pass)
ORDER_REPLACEMENT = 2  # independent uniform draws per (seed, epoch, position)
ORDER_ARRAY = 3  # rows listed in an index array


def dataset_length(data_source: Any) -> int:
    """Samples in a dataset: the first dimension of its arrays, or len() of anything else."""
    if isinstance(data_source, int) and not isinstance(data_source, bool):
        return data_source
    try:
        arrays, _ = flatten(data_source)
    except (TypeError, ValueError):
        return len(data_source)
    return num_samples(arrays)


def random_seed() -> int:
    """A fresh 63-bit seed from the operating system."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def seed_from(seed: int | None, generator: Any) -> int:
    """The seed of an order: `seed` if given, else drawn once from `generator` (a NumPy
    Generator/RandomState, or anything with initial_seed() such as a torch.Generator), else
    fresh from the operating system."""
    if seed is not None:
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int or None, not {type(seed).__name__}")
        return int(seed) % (1 << 64)
    if generator is None:
        return random_seed()
    if isinstance(generator, np.random.Generator):
        return int(generator.integers(0, 1 << 63))
    if isinstance(generator, np.random.RandomState):
        return int(generator.randint(0, 1 << 62))
    if hasattr(generator, "initial_seed"):
        return int(generator.initial_seed()) % (1 << 64)
    raise TypeError(
        "generator must be a numpy.random.Generator, a numpy.random.RandomState, an object with "
        f"initial_seed() (torch.Generator) or None, not {type(generator).__name__}"
    )


def make_order(kind: int, base_length: int, seed: int = 0, epoch: int = 0, indices: np.ndarray | None = None,
               num_replicas: int = 1, rank: int = 0, drop_last: bool = False) -> dict[str, Any]:
    """The order description the C loader reads (csrc/py/loader_sampler.c)."""
    return {"kind": kind, "base_length": base_length, "seed": seed, "epoch": epoch, "indices": indices,
            "num_replicas": num_replicas, "rank": rank, "drop_last": drop_last}


class Sampler(Generic[T_co]):
    """Base class of samplers: an iterable of dataset indices (PyTorch's Sampler)."""

    def __init__(self, data_source: Sized | None = None) -> None:
        pass

    def __iter__(self) -> Iterator[T_co]:
        raise NotImplementedError


class OrderSampler(Sampler[int]):
    """A sampler whose order the C loader computes from (seed, epoch, position)."""

    epoch: int
    num_rows: int

    def order(self, epoch: int) -> dict[str, Any]:
        """The order description of epoch `epoch`."""
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Selects the order of epoch `epoch` (a DataLoader passes its own epoch instead)."""
        if not isinstance(epoch, (int, np.integer)) or isinstance(epoch, bool) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative int, got {epoch!r}")
        self.epoch = int(epoch)
        self._explicit_epoch = True

    def rows(self, epoch: int) -> np.ndarray:
        """The rows of epoch `epoch` as an int64 array (what a DataLoader gathers)."""
        return _C.sampler_rows(self.num_rows, self.order(epoch))

    def __iter__(self) -> Iterator[int]:
        return iter(self.rows(self.epoch).tolist())


class SequentialSampler(OrderSampler):
    """Samples in order 0, 1, ..., n - 1."""

    def __init__(self, data_source: Any) -> None:
        self.data_source = data_source
        self.num_rows = dataset_length(data_source)
        self.epoch = 0

    def order(self, epoch: int) -> dict[str, Any]:
        return make_order(ORDER_SEQUENTIAL, self.num_rows, epoch=epoch)

    def __len__(self) -> int:
        return self.num_rows


class _NextEpochSampler(OrderSampler):
    """An order sampler whose every iteration is the next epoch (PyTorch's RandomSampler draws
    a new order each time it is iterated)."""

    num_samples: int

    def __iter__(self) -> Iterator[int]:
        rows = self.rows(self.epoch)
        self.epoch += 1
        return iter(rows.tolist())

    def __len__(self) -> int:
        return self.num_samples


class RandomSampler(_NextEpochSampler):
    """Samples in a random order: a Philox permutation keyed by (seed, epoch), or
    `num_samples` independent draws when `replacement`. Each iteration advances the epoch,
    so iterating twice gives two different orders, as PyTorch's RandomSampler does."""

    def __init__(self, data_source: Any, replacement: bool = False, num_samples: int | None = None,
                 generator: Any = None, *, seed: int | None = None) -> None:
        if not isinstance(replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={replacement}")
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        self.num_rows = dataset_length(data_source)
        if num_samples is not None and (not isinstance(num_samples, int) or isinstance(num_samples, bool)
                                        or num_samples <= 0):
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        self.seed = seed_from(seed, generator)
        self.epoch = 0

    @property
    def num_samples(self) -> int:
        """Samples per epoch (len(data_source) unless given)."""
        return self.num_rows if self._num_samples is None else self._num_samples

    def order(self, epoch: int) -> dict[str, Any]:
        kind = ORDER_REPLACEMENT if self.replacement else ORDER_PERMUTED
        return make_order(kind, self.num_samples, seed=self.seed, epoch=epoch)


def _distributed_default(name: str, env: str, fallback: int) -> int:
    value = os.environ.get(env)
    if value is None:
        return fallback
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: environment variable {env}={value!r} is not an int") from None


class DistributedSampler(OrderSampler):
    """PyTorch's DistributedSampler: shard `rank` of `num_replicas`, padded by wrapping
    around (or truncated when `drop_last`) so that every rank has the same length. The order
    is a Philox permutation keyed by (seed, epoch) when `shuffle`. num_replicas/rank default
    to gputrain.distributed's world size and rank once init() ran, else to the WORLD_SIZE/RANK
    environment variables (set by torchrun), else 1/0. A DataLoader without a sampler uses one
    when distributed.init() joined several ranks."""

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        joined = distributed.is_initialized()  # else the launcher's variables, as PyTorch reads them
        if num_replicas is None:
            num_replicas = distributed.get_world_size() if joined else _distributed_default("num_replicas", "WORLD_SIZE", 1)
        if rank is None:
            rank = distributed.get_rank() if joined else _distributed_default("rank", "RANK", 0)
        if not isinstance(num_replicas, int) or num_replicas < 1:
            raise ValueError(f"num_replicas should be a positive integer value, but got num_replicas={num_replicas}")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed_from(seed, None)
        self.drop_last = drop_last
        self.epoch = 0
        self.num_rows = dataset_length(dataset)
        n = self.num_rows
        self.num_samples = n // num_replicas if drop_last else -(-n // num_replicas)
        self.total_size = self.num_samples * num_replicas

    def order(self, epoch: int) -> dict[str, Any]:
        kind = ORDER_PERMUTED if self.shuffle else ORDER_SEQUENTIAL
        return make_order(kind, self.num_rows, seed=self.seed, epoch=epoch, num_replicas=self.num_replicas,
                          rank=self.rank, drop_last=self.drop_last)

    def __len__(self) -> int:
        return self.num_samples


class LengthGroupedSampler(_NextEpochSampler):
    """transformers' LengthGroupedSampler (TrainingArguments(group_by_length=True)): each epoch a
    Philox permutation keyed by (seed, epoch) is cut into megabatches of `mega_batch_mult *
    batch_size` rows (mega_batch_mult: 50, or fewer so that there are 4 megabatches), each sorted
    by length, longest first (ties keep the permutation's order), and the longest row overall is
    swapped to the front so that an out-of-memory batch comes first. Lengths are `lengths`, else
    len(example[model_input_name]) of each example (default "input_ids"), or the row lengths of a
    ragged column of that name (gt.data.tokenize's). num_replicas > 1 shards the order as
    transformers' DistributedLengthGroupedSampler does (padded by wrapping around, or truncated
    when `drop_last`). Each iteration advances the epoch, as RandomSampler's does."""

    def __init__(self, batch_size: int, dataset: Any = None, lengths: Any = None,
                 model_input_name: str | None = None, generator: Any = None, *, seed: int | None = None,
                 num_replicas: int = 1, rank: int = 0, drop_last: bool = False) -> None:
        if not isinstance(batch_size, (int, np.integer)) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(num_replicas, int) or num_replicas < 1 or not isinstance(rank, int) \
                or not 0 <= rank < num_replicas:
            raise ValueError(f"num_replicas={num_replicas!r}, rank={rank!r}: need 0 <= rank < num_replicas")
        self.lengths = _example_lengths(dataset, lengths, model_input_name or "input_ids")
        self.batch_size = int(batch_size)
        self.seed = seed_from(seed, generator)
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        self.num_rows = len(self.lengths)
        n = self.num_rows
        self.num_samples = n // num_replicas if drop_last else -(-n // num_replicas)
        self.epoch = 0

    def grouped_rows(self, epoch: int) -> np.ndarray:
        """All rows of epoch `epoch` in grouped order (before any sharding)."""
        n = self.num_rows
        permuted = _C.sampler_rows(n, make_order(ORDER_PERMUTED, n, seed=self.seed, epoch=epoch))
        return group_by_length(permuted, self.lengths, self.batch_size)

    def order(self, epoch: int) -> dict[str, Any]:
        rows = self.grouped_rows(epoch)
        total = self.num_samples * self.num_replicas
        if total > len(rows):
            rows = np.concatenate([rows, np.resize(rows, total - len(rows))])
        rows = rows[self.rank:total:self.num_replicas]
        return make_order(ORDER_ARRAY, len(rows), indices=np.ascontiguousarray(rows, dtype=np.int64))


def group_by_length(permuted: np.ndarray, lengths: np.ndarray, batch_size: int) -> np.ndarray:
    """transformers' get_length_grouped_indices over a given permutation of the rows."""
    n = len(permuted)
    mega = max(min(n // (batch_size * 4), 50), 1) * batch_size
    groups = []
    for start in range(0, n, mega):
        rows = permuted[start:start + mega]
        groups.append(rows[np.argsort(-lengths[rows], kind="stable")])
    longest = int(np.argmax([lengths[g[0]] for g in groups]))  # the first of equal maxima
    groups[0][0], groups[longest][0] = groups[longest][0], groups[0][0]
    return np.concatenate(groups)


def _example_lengths(dataset: Any, lengths: Any, name: str) -> np.ndarray:
    """The examples' lengths as an int64 array (LengthGroupedSampler's sources)."""
    if lengths is None:
        if dataset is None:
            raise ValueError("One of dataset and lengths must be provided.")
        if isinstance(dataset, Mapping) and isinstance(dataset.get(name), RaggedArray):
            lengths = np.diff(dataset[name].offsets)
        elif len(dataset) and isinstance(dataset[0], Mapping) and name in dataset[0]:
            lengths = [len(example[name]) for example in dataset]
        else:
            raise ValueError("Can only automatically infer lengths for datasets whose items are dictionaries with "
                             f"an '{name}' key (or a mapping with a ragged '{name}' column)")
    try:
        array = np.asarray(lengths)
    except (TypeError, ValueError):
        raise TypeError("lengths must be a sequence of ints") from None
    if array.ndim != 1 or len(array) == 0 or array.dtype.kind not in "iu" or np.any(array < 0):
        raise ValueError(f"lengths must be a non-empty 1-D sequence of non-negative ints, got {array.dtype} "
                         f"of shape {array.shape}")
    return array.astype(np.int64)


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of `sampler` into lists of `batch_size` (PyTorch's BatchSampler)."""

    def __init__(self, sampler: Sampler[int] | Iterable[int], batch_size: int, drop_last: bool) -> None:
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch: list[int] = []
        for index in self.sampler:
            batch.append(int(index))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        length = len(self.sampler)  # type: ignore[arg-type]
        if self.drop_last:
            return length // self.batch_size
        return -(-length // self.batch_size)
