"""Exact mid-epoch resume: state_dict() is O(1), and load_state_dict() continues with exactly
the batches that were left, for any worker settings on either side, without gathering the
skipped ones."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gputrain as gt

N = 97
DATA = (np.arange(N * 5, dtype=np.float32).reshape(N, 5), np.arange(N))


def ids(batches):
    return [b[1].tolist() for b in batches]


def make(**kwargs):
    base = dict(batch_size=6, shuffle=True, seed=21)
    base.update(kwargs)
    return gt.DataLoader(DATA, **base)


SETTINGS = [
    dict(num_workers=0),
    dict(num_workers=1),
    dict(num_workers=2, prefetch_factor=3),
    dict(num_workers=2, persistent_workers=True),
]


@pytest.mark.parametrize("before", SETTINGS)
@pytest.mark.parametrize("after", SETTINGS)
def test_resume_mid_epoch_across_worker_settings(before, after):
    reference = make()
    epochs = [ids(reference) for _ in range(3)]
    loader = make(**before)
    assert ids(loader) == epochs[0]
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(7)]
    assert head == epochs[1][:7]
    state = loader.state_dict()
    assert (state["epoch"], state["batches_yielded"], state["next_batch"], state["done"]) == (1, 7, 7, [])
    resumed = make(**after)
    resumed.load_state_dict(state)
    assert ids(resumed) == epochs[1][7:]
    assert ids(resumed) == epochs[2]


def test_resume_does_not_gather_skipped_batches():
    loader = make(num_workers=0)
    it = iter(loader)
    for _ in range(10):
        next(it)
    resumed = make(num_workers=0)
    resumed.load_state_dict(loader.state_dict())
    it = iter(resumed)
    rest = list(it)
    assert len(rest) == len(loader) - 10
    assert it.engine.engine.stats()["batches_gathered"] == len(rest)


def test_state_is_constant_size():
    big = gt.DataLoader(np.zeros((1_000_000, 1), np.uint8), batch_size=10, shuffle=True, seed=0, num_workers=2)
    it = iter(big)
    for _ in range(3):
        next(it)
    assert len(json.dumps(big.state_dict())) < 200


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_out_of_order_resume_yields_every_batch_once():
    reference = sorted(ids(make()))
    loader = make(num_workers=3, in_order=False, prefetch_factor=4)
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(9)]
    state = loader.state_dict()
    assert state["batches_yielded"] == 9 and state["next_batch"] + len(state["done"]) == 9
    assert all(b > state["next_batch"] for b in state["done"])
    resumed = make(num_workers=2, in_order=False)
    resumed.load_state_dict(state)
    assert sorted(head + ids(resumed)) == reference


def test_resume_with_a_random_seed_restores_it():
    loader = make(seed=None, num_workers=1)
    it = iter(loader)
    head = [next(it)[1].tolist() for _ in range(4)]
    rest_expected = [b[1].tolist() for b in it]
    other = make(seed=None)
    assert other.seed != loader.seed
    fresh_state = dict(loader.state_dict())
    fresh_state.update(epoch=0, next_batch=4, batches_yielded=4, done=[])
    other.load_state_dict(fresh_state)
    assert other.seed == loader.seed
    assert ids(other) == rest_expected
    assert head  # the first part was consumed before saving


def test_state_after_a_full_epoch_starts_the_next():
    loader = make()
    first = ids(loader)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["batches_yielded"] == 0
    fresh = make()
    fresh.load_state_dict(state)
    second = ids(fresh)
    assert second != first
    reference = make()
    ids(reference)  # epoch 0
    assert second == ids(reference)  # epoch 1


def test_break_then_state_then_load_into_the_same_loader():
    loader = make(num_workers=2, persistent_workers=True)
    for i, _ in enumerate(loader):
        if i == 4:
            break
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_yielded"] == 5
    loader.load_state_dict(state)
    assert ids(loader) == ids(make())[5:]


def test_state_before_iterating_and_after_set_epoch():
    loader = make()
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["batches_yielded"] == 0
    loader.set_epoch(4)
    assert loader.state_dict()["epoch"] == 4


def test_resume_with_a_batch_sampler():
    lists = [[i, (i * 7) % N] for i in range(30)]
    loader = gt.DataLoader(DATA, batch_sampler=lists, num_workers=2)
    it = iter(loader)
    for _ in range(11):
        next(it)
    resumed = gt.DataLoader(DATA, batch_sampler=lists)
    resumed.load_state_dict(loader.state_dict())
    assert ids(resumed) == lists[11:]


def test_load_state_dict_rejects_bad_states():
    loader = make()
    state = loader.state_dict()
    with pytest.raises(KeyError, match=r"missing keys \['seed'\]"):
        loader.load_state_dict({k: v for k, v in state.items() if k != "seed"})
    with pytest.raises(ValueError, match="saved from a loader with 3 batches per epoch; this one has 17"):
        loader.load_state_dict(dict(state, num_batches=3))
    with pytest.raises(ValueError, match="version 9"):
        loader.load_state_dict(dict(state, version=9))
    with pytest.raises(ValueError, match=r"state_dict\['done'\] entries must be in \[4, 16\], got 2"):
        loader.load_state_dict(dict(state, next_batch=3, done=[2]))
    with pytest.raises(ValueError, match="inconsistent"):
        loader.load_state_dict(dict(state, next_batch=3, done=[5, 5]))
    with pytest.raises(TypeError, match=r"epoch'\] must be an int"):
        loader.load_state_dict(dict(state, epoch="1"))
