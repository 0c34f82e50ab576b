"""Text data: TokenDataset windows, RaggedArray rows gathered with padding, bucket_by_length."""

from __future__ import annotations

import numpy as np
import pytest

import gputrain as gt
from gputrain.data import RaggedArray, RandomSampler, TokenDataset, bucket_by_length

TOKENS = (np.arange(1000) * 7 % 50257).astype(np.uint16)


@pytest.mark.parametrize("block_size,stride", [(16, None), (16, 1), (16, 5), (1, None), (999, None), (1000, None)])
def test_token_dataset_length_and_windows(block_size, stride):
    data = TokenDataset(TOKENS, block_size, stride)
    step = stride or block_size
    starts = list(range(0, len(TOKENS) - block_size, step))
    assert len(data) == len(starts)
    if starts:
        x, y = data[len(data) - 1]
        np.testing.assert_array_equal(x, TOKENS[starts[-1]:starts[-1] + block_size])
        np.testing.assert_array_equal(y, TOKENS[starts[-1] + 1:starts[-1] + block_size + 1])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("stride", [None, 1, 3])
def test_token_batches_equal_numpy_windows(num_workers, stride):
    data = TokenDataset(TOKENS, 32, stride)
    loader = gt.DataLoader(data, batch_size=8, shuffle=True, seed=1, num_workers=num_workers)
    starts = np.arange(len(data)) * (stride or 32)
    order = gt.data.RandomSampler(len(data), seed=1).rows(0)
    seen = 0
    for x, y in loader:
        idx = order[seen:seen + len(x)]
        seen += len(x)
        assert x.dtype == np.uint16 and x.shape[1] == 32
        np.testing.assert_array_equal(x, TOKENS[starts[idx][:, None] + np.arange(32)])
        np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
        np.testing.assert_array_equal(y[:, -1], TOKENS[starts[idx] + 32])
    assert seen == len(data)


def test_random_windows_with_replacement_from_a_memmap(tmp_path):
    path = tmp_path / "train.bin"
    TOKENS.tofile(path)
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    data = TokenDataset(tokens, 64, stride=1)
    sampler = RandomSampler(data, replacement=True, num_samples=4 * 50, seed=3)
    loader = gt.DataLoader(data, batch_size=4, sampler=sampler, num_workers=2)
    assert len(loader) == 50
    for x, y in loader:
        for row in range(4):
            start = int(np.flatnonzero(TOKENS == x[row, 0])[0])
            np.testing.assert_array_equal(x[row], TOKENS[start:start + 64])


def test_token_dataset_bad_arguments():
    with pytest.raises(ValueError, match="1-D"):
        TokenDataset(TOKENS.reshape(10, 100), 4)
    with pytest.raises(TypeError, match="integer array"):
        TokenDataset(TOKENS.astype(np.float32), 4)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        TokenDataset(TOKENS, 0)
    with pytest.raises(ValueError, match="stride must be a positive int"):
        TokenDataset(TOKENS, 4, stride=0)
    with pytest.raises(IndexError, match="out of range"):
        TokenDataset(TOKENS, 100)[9]
    assert len(TokenDataset(TOKENS[:5], 8)) == 0
    assert list(gt.DataLoader(TokenDataset(TOKENS[:5], 8), batch_size=2)) == []


def sequences(count=60, seed=0, features=None):
    rng = np.random.default_rng(seed)
    shape = lambda n: (n,) if features is None else (n, features)
    return [rng.integers(1, 100, size=shape(int(rng.integers(0, 40)))).astype(np.int32) for _ in range(count)]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("features", [None, 3])
def test_ragged_rows_come_out_padded_to_the_batch_longest(num_workers, features):
    seqs = sequences(features=features)
    ragged = RaggedArray.from_sequences(seqs, pad_value=-1)
    labels = np.arange(len(seqs))
    loader = gt.DataLoader((ragged, ragged.lengths, labels), batch_size=7, shuffle=True, seed=2,
                           num_workers=num_workers)
    seen = []
    for tokens, lengths, ids in loader:
        width = int(lengths.max())
        assert tokens.shape[:2] == (len(ids), width) and tokens.dtype == np.int32
        if features:
            assert tokens.shape[2] == features
        for row, i in enumerate(ids):
            n = len(seqs[i])
            np.testing.assert_array_equal(tokens[row, :n], seqs[i])
            assert (tokens[row, n:] == -1).all()
        seen.extend(ids.tolist())
    assert sorted(seen) == list(range(len(seqs)))


def test_ragged_edge_cases():
    empty_rows = RaggedArray(np.zeros(0, np.float32), np.zeros(4, np.int64))
    batch = next(iter(gt.DataLoader(empty_rows, batch_size=3)))
    assert batch.shape == (3, 0)
    single = RaggedArray.from_sequences([[1.5, 2.5], [3.5]], pad_value=np.nan)
    batch = next(iter(gt.DataLoader(single, batch_size=2)))
    np.testing.assert_array_equal(batch, [[1.5, 2.5], [3.5, np.nan]])
    assert len(single) == 2 and single[1].tolist() == [3.5]
    with pytest.raises(ValueError, match="non-decreasing"):
        RaggedArray(np.arange(5), [0, 3, 2, 5])
    with pytest.raises(ValueError, match="non-decreasing"):
        RaggedArray(np.arange(5), [0, 6])
    with pytest.raises(ValueError, match="1-D"):
        RaggedArray(np.arange(5), np.zeros((2, 2)))
    with pytest.raises(ValueError, match="sequences is empty"):
        RaggedArray.from_sequences([])
    with pytest.raises(ValueError, match="same first dimension"):
        gt.DataLoader((single, np.arange(3)))


def test_ragged_field_checked_by_the_engine():
    values, offsets = np.arange(6, dtype=np.int32), np.array([0, 2, 6], np.int64)
    with pytest.raises(ValueError, match="offsets run outside"):
        gt._C.LoaderEngine([(values, np.array([0, 7], np.int64), np.zeros((), np.int32))], 1, 0, 1)
    with pytest.raises(ValueError, match="one padding item"):
        gt._C.LoaderEngine([(values, offsets, np.zeros((), np.int64))], 1, 0, 1)
    with pytest.raises(ValueError, match="offsets decrease at row 0"):
        gt._C.LoaderEngine([(values, np.array([3, 1], np.int64), np.zeros((), np.int32))], 1, 0, 1)


def test_bucket_by_length_yields_every_index_once_with_less_padding():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 500, size=1000)
    sampler = bucket_by_length(lengths, batch_size=16, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 800 // 16 + -(-200 // 16)  # pools of 800 and 200 rows
    assert sorted(i for b in batches for i in b) == list(range(1000))
    padded = sum(len(b) * lengths[b].max() for b in batches)
    random_batches = np.array_split(rng.permutation(1000), len(batches))
    padded_random = sum(len(b) * lengths[b].max() for b in random_batches)
    assert padded < 0.7 * padded_random
    assert padded < 1.2 * lengths.sum()


def test_bucket_by_length_is_a_function_of_seed_and_epoch():
    lengths = np.random.default_rng(2).integers(1, 50, size=300)
    a, b = bucket_by_length(lengths, 8, seed=5), bucket_by_length(lengths, 8, seed=5)
    first = list(a)
    assert first == list(b)
    assert list(a) != first  # the next epoch
    indices, offsets = a.batch_arrays(0)
    assert [indices[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)] == first
    unshuffled = list(bucket_by_length(lengths, 8, shuffle=False))
    flat = [i for batch in unshuffled for i in batch]
    assert list(lengths[flat]) == sorted(lengths)


def test_bucket_boundaries_keep_a_batch_in_one_bucket():
    lengths = np.random.default_rng(3).integers(0, 100, size=400)
    boundaries = [10, 30, 60]
    sampler = bucket_by_length(lengths, 12, boundaries=boundaries, seed=1, drop_last=True)
    buckets = np.searchsorted(boundaries, lengths, side="right")
    batches = list(sampler)
    assert all(len(b) == 12 for b in batches)
    assert all(len(set(buckets[b])) == 1 for b in batches)
    assert len(batches) == sum(np.bincount(buckets) // 12) == len(sampler)


def test_bucketed_loader_with_ragged_rows_and_resume():
    seqs = sequences(count=200, seed=4)
    ragged = RaggedArray.from_sequences(seqs)
    lengths = ragged.lengths
    make = lambda **kw: gt.DataLoader((ragged, lengths), batch_sampler=bucket_by_length(lengths, 10, seed=7), **kw)
    loader = make(num_workers=2)
    expected = list(bucket_by_length(lengths, 10, seed=7))
    got = []
    it = iter(loader)
    for _ in range(6):
        tokens, lens = next(it)
        assert tokens.shape[1] == lens.max()
        got.append(lens.tolist())
    assert got == [lengths[b].tolist() for b in expected[:6]]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    rest = [lens.tolist() for _, lens in resumed]
    assert rest == [lengths[b].tolist() for b in expected[6:]]


def test_bucket_by_length_bad_arguments():
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        bucket_by_length([1, 2], 0)
    with pytest.raises(ValueError, match="non-negative integers"):
        bucket_by_length([1.5, 2], 2)
    with pytest.raises(ValueError, match="non-negative integers"):
        bucket_by_length([-1, 2], 2)
    with pytest.raises(ValueError, match="pool_batches"):
        bucket_by_length([1, 2], 2, pool_batches=0)
