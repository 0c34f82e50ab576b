"""Sampling orders computed in C: the Philox-Feistel permutation is a bijection, a pure
function of (seed, epoch), and close to uniform; shards match DistributedSampler's rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gputrain import _C
from gputrain.data import BatchSampler, DistributedSampler, RandomSampler, SequentialSampler
from gputrain.data.sampler import ORDER_ARRAY, ORDER_PERMUTED, ORDER_REPLACEMENT, ORDER_SEQUENTIAL, make_order


def perm(n, seed=0, epoch=0):
    return _C.sampler_rows(n, make_order(ORDER_PERMUTED, n, seed=seed, epoch=epoch))


@pytest.mark.parametrize("n", list(range(0, 70)) + [255, 256, 257, 1000, 4096, 65537])
def test_permutation_is_a_bijection(n):
    rows = perm(n, seed=n, epoch=3)
    assert rows.dtype == np.int64 and len(rows) == n
    np.testing.assert_array_equal(np.sort(rows), np.arange(n))


def test_large_permutation_is_a_bijection():
    n = (1 << 20) + 3  # domain 2^21: cycle-walking on about half of the positions
    rows = perm(n, seed=12345)
    assert np.bincount(rows, minlength=n).max() == 1


def test_permutation_known_values():
    # pins the algorithm: a saved state_dict must resume the same order in later releases
    assert perm(10, seed=0, epoch=0).tolist() == [0, 3, 1, 5, 4, 9, 8, 7, 6, 2]
    assert perm(1000, seed=2**64 - 1, epoch=2**33)[:8].tolist() == [429, 503, 910, 838, 153, 278, 24, 518]


def test_pure_function_of_seed_and_epoch():
    a, b = perm(1000, seed=7, epoch=2), perm(1000, seed=7, epoch=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, perm(1000, seed=7, epoch=3))
    assert not np.array_equal(a, perm(1000, seed=8, epoch=2))
    assert not np.array_equal(a, np.arange(1000))


def test_first_position_is_uniform():
    n, trials = 6, 6000
    firsts = np.array([perm(n, seed=s)[0] for s in range(trials)])
    counts = np.bincount(firsts, minlength=n)
    expected = trials / n
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 25.7  # chi-square, 5 degrees of freedom, p = 1e-4


def test_pairs_are_unbiased():
    rows = np.stack([perm(50, seed=s) for s in range(400)])
    below = (rows[:, :-1] < rows[:, 1:]).mean()
    assert abs(below - 0.5) < 0.02
    # displacement of an element is spread over the whole range, not local
    positions = np.argsort(rows, axis=1)[:, 0]
    assert positions.std() > 10


def test_replacement_draws_are_uniform():
    rows = _C.sampler_rows(7, make_order(ORDER_REPLACEMENT, 70000, seed=1))
    counts = np.bincount(rows, minlength=7)
    chi2 = ((counts - 10000) ** 2 / 10000).sum()
    assert rows.min() >= 0 and rows.max() < 7 and chi2 < 27.9  # 6 dof, p = 1e-4


def reference_shard(order, num_replicas, rank, drop_last):
    """PyTorch's DistributedSampler.__iter__ applied to an index list."""
    indices = list(order)
    n = len(indices)
    if drop_last and n % num_replicas:
        num_samples = -(-(n - num_replicas) // num_replicas)
    else:
        num_samples = -(-n // num_replicas)
    total = num_samples * num_replicas
    if not drop_last:
        padding = total - n
        if padding <= n:
            indices += indices[:padding]
        else:
            indices += (indices * -(-padding // n))[:padding]
    else:
        indices = indices[:total]
    return indices[rank:total:num_replicas]


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 60), num_replicas=st.integers(1, 9), drop_last=st.booleans(), shuffle=st.booleans(),
       seed=st.integers(0, 2**63), epoch=st.integers(0, 5))
def test_shards_match_distributed_sampler(n, num_replicas, drop_last, shuffle, seed, epoch):
    base = perm(n, seed=seed, epoch=epoch).tolist() if shuffle else list(range(n))
    for rank in range(num_replicas):
        sampler = DistributedSampler(n, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                                     drop_last=drop_last)
        sampler.set_epoch(epoch)
        expected = reference_shard(base, num_replicas, rank, drop_last)
        assert list(sampler) == expected
        assert len(sampler) == len(expected)


def test_array_order_checks_its_indices():
    order = make_order(ORDER_ARRAY, 0, indices=np.array([2, 0, 1]))
    assert _C.sampler_rows(3, order).tolist() == [2, 0, 1]
    with pytest.raises(IndexError, match="index 3 out of range for 3 samples"):
        _C.sampler_rows(3, make_order(ORDER_ARRAY, 0, indices=np.array([3])))
    with pytest.raises(IndexError, match="index -1 out of range"):
        _C.sampler_rows(3, make_order(ORDER_ARRAY, 0, indices=np.array([-1])))
    with pytest.raises(ValueError, match="1-D"):
        _C.sampler_rows(3, make_order(ORDER_ARRAY, 0, indices=np.zeros((2, 2), np.int64)))
    with pytest.raises(ValueError, match="needs its index array"):
        _C.sampler_rows(3, make_order(ORDER_ARRAY, 3))


def test_bad_order_descriptions():
    with pytest.raises(ValueError, match="unknown sampling order 9"):
        _C.sampler_rows(3, make_order(9, 3))
    with pytest.raises(ValueError, match="sequential order over 3 rows"):
        _C.sampler_rows(3, make_order(ORDER_SEQUENTIAL, 4))
    with pytest.raises(ValueError, match="empty dataset"):
        _C.sampler_rows(0, make_order(ORDER_PERMUTED, 4))
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"):
        _C.sampler_rows(3, make_order(ORDER_SEQUENTIAL, 3, num_replicas=2, rank=2))
    with pytest.raises(ValueError, match="must be in"):
        _C.sampler_rows(3, make_order(ORDER_SEQUENTIAL, 3, seed=-1))
    with pytest.raises(KeyError, match="lacks epoch"):
        _C.sampler_rows(3, {"kind": 0, "base_length": 3, "seed": 0})
    with pytest.raises(TypeError, match="order must be a dict"):
        _C.sampler_rows(3, [0, 3])


def test_sampler_classes_iterate_their_rows():
    assert list(SequentialSampler(np.zeros((4, 2)))) == [0, 1, 2, 3]
    sampler = RandomSampler(np.zeros(20), seed=3)
    assert list(sampler) == perm(20, seed=3, epoch=0).tolist()
    assert list(sampler) == perm(20, seed=3, epoch=1).tolist()
    assert list(BatchSampler(range(7), 3, False)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(BatchSampler(range(7), 3, True)) == [[0, 1, 2], [3, 4, 5]]
    assert len(BatchSampler(range(7), 3, False)) == 3 and len(BatchSampler(range(7), 3, True)) == 2


def test_distributed_sampler_defaults_from_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    sampler = DistributedSampler(np.zeros(10))
    assert (sampler.num_replicas, sampler.rank, len(sampler)) == (4, 3, 3)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK='x' is not an int"):
        DistributedSampler(np.zeros(10))


@pytest.mark.parametrize("n,num_replicas", [(60000, 1), (1000, 3), (70001, 2), (5, 1)])
def test_every_simd_level_gives_the_same_rows(n, num_replicas):
    supported = _C.build_info()["simd_supported"]
    levels = {"scalar": ["scalar"], "avx2": ["scalar", "avx2"], "avx512": ["scalar", "avx2", "avx512"]}[supported]
    order = make_order(ORDER_PERMUTED, 3 * n, seed=99, epoch=4, num_replicas=num_replicas, rank=num_replicas - 1)
    results = []
    try:
        for level in levels:
            _C.set_simd_level(level)
            results.append(_C.sampler_rows(n, order))
    finally:
        _C.set_simd_level(supported)
    for rows in results[1:]:
        np.testing.assert_array_equal(rows, results[0])
    # three passes over the rows (num_samples = 3n): each pass is its own permutation
    if num_replicas == 1:
        passes = results[0].reshape(3, n)
        assert all(np.array_equal(np.sort(p), np.arange(n)) for p in passes)
        assert not np.array_equal(passes[0], passes[1])
