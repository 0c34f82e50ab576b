"""group_by_length: transformers' LengthGroupedSampler order over gputrain's Philox permutation,
checked against orders transformers computed (tests/fixtures/make_length_grouped_fixtures.py),
and the Trainer drawing its batches that way."""

from __future__ import annotations

import os

import numpy as np
import pytest

import gputrain as gt
from gputrain.data import LengthGroupedSampler, RaggedArray, RandomSampler
from gputrain.data.sampler import group_by_length

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "length_grouped.npz")


def test_the_order_is_transformers_for_the_same_permutation():
    cases = np.load(FIXTURE)
    for i in range(len(cases.files) // 4):
        lengths, permuted = cases[f"lengths_{i}"], cases[f"permuted_{i}"]
        got = group_by_length(permuted, lengths, int(cases[f"batch_size_{i}"]))
        np.testing.assert_array_equal(got, cases[f"grouped_{i}"], err_msg=f"case {i}")


def test_each_epoch_groups_its_own_philox_permutation():
    lengths = np.random.default_rng(0).integers(1, 30, size=200)
    sampler = LengthGroupedSampler(4, lengths=lengths, seed=7)
    for epoch in (0, 1):
        permuted = RandomSampler(200, seed=7).rows(epoch)
        np.testing.assert_array_equal(sampler.rows(epoch), group_by_length(permuted, lengths, 4))
    assert not np.array_equal(sampler.rows(0), sampler.rows(1))
    first, second = list(sampler), list(sampler)  # each iteration is the next epoch, as RandomSampler's
    assert first == sampler.rows(0).tolist() and second == sampler.rows(1).tolist()
    assert lengths[first[0]] == lengths.max()  # the longest row leads


def test_megabatches_are_sorted_longest_first():
    lengths = np.random.default_rng(1).integers(0, 1000, size=1000)
    rows = LengthGroupedSampler(5, lengths=lengths, seed=3).rows(0)
    assert sorted(rows.tolist()) == list(range(1000))
    mega = 50 * 5
    for start in range(0, 1000, mega):
        chunk = lengths[rows[start:start + mega]]
        assert np.all(np.diff(chunk[1:]) <= 0)  # its first row may be the swapped-in longest one


def test_shards_wrap_around_as_transformers_distributed_sampler():
    lengths = np.arange(10)
    full = LengthGroupedSampler(2, lengths=lengths, seed=1).grouped_rows(0)
    shards = [LengthGroupedSampler(2, lengths=lengths, seed=1, num_replicas=3, rank=r).rows(0) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]
    padded = np.concatenate([full, full[:2]])
    for rank, shard in enumerate(shards):
        np.testing.assert_array_equal(shard, padded[rank::3])
    dropped = LengthGroupedSampler(2, lengths=lengths, seed=1, num_replicas=3, rank=2, drop_last=True)
    np.testing.assert_array_equal(dropped.rows(0), full[2:9:3])


def test_lengths_come_from_examples_or_a_ragged_column():
    examples = [{"input_ids": [1] * n, "label": 0} for n in (3, 9, 1, 4)]
    assert LengthGroupedSampler(2, dataset=examples).lengths.tolist() == [3, 9, 1, 4]
    ragged = RaggedArray(np.arange(17), np.array([0, 3, 12, 13, 17]))
    assert LengthGroupedSampler(2, dataset={"input_ids": ragged}).lengths.tolist() == [3, 9, 1, 4]
    other = [{"ids": [1] * n} for n in (2, 5)]
    assert LengthGroupedSampler(2, dataset=other, model_input_name="ids").lengths.tolist() == [2, 5]


@pytest.mark.parametrize("kwargs, error, match", [
    ({}, ValueError, "One of dataset and lengths"),
    ({"dataset": [(1, 2)]}, ValueError, "'input_ids' key"),
    ({"lengths": [3, -1]}, ValueError, "non-negative"),
    ({"lengths": [[1, 2]]}, ValueError, "1-D"),
    ({"lengths": []}, ValueError, "non-empty"),
    ({"lengths": [1.5]}, ValueError, "ints"),
])
def test_bad_lengths_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        LengthGroupedSampler(2, **kwargs)


def test_bad_batch_size_and_rank_are_refused():
    with pytest.raises(ValueError, match="batch_size"):
        LengthGroupedSampler(0, lengths=[1])
    with pytest.raises(ValueError, match="rank"):
        LengthGroupedSampler(1, lengths=[1], num_replicas=2, rank=2)


def _examples(n):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        length = int(rng.integers(2, 40))
        ids = rng.integers(3, 40, size=length)
        out.append({"input_ids": ids.tolist(), "attention_mask": [1] * length, "label": int(ids[0] % 2)})
    return out


def test_the_trainer_draws_length_grouped_batches(tmp_path):
    examples = _examples(96)
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=2,
                                group_by_length=True, disable_tqdm=True, save_strategy="no", seed=4)
    model = gt.models.TransformerClassifier(vocab_size=40, num_classes=2, max_len=48, d_model=16, num_layers=1,
                                            num_heads=2)
    trainer = gt.Trainer(model, args, train_dataset=examples)
    assert not any("group_by_length" in note for note in args.not_applicable())
    trainer.train()
    sampler = trainer.train_dataloader.sampler
    assert isinstance(sampler, LengthGroupedSampler) and sampler.batch_size == 8
    lengths = np.array([len(e["input_ids"]) for e in examples])
    first = [len(examples[i]["input_ids"]) for i in sampler.rows(0)[:8]]
    assert max(first) == lengths.max()
    random_pad = sum(lengths[b].max() for b in RandomSampler(96, seed=4).rows(0).reshape(-1, 8))
    grouped_pad = sum(lengths[b].max() for b in sampler.rows(0).reshape(-1, 8))
    assert grouped_pad < random_pad  # the point of grouping: less padding


def test_the_trainer_refuses_group_by_length_over_equal_rows(tmp_path):
    x, y = np.zeros((8, 4), np.float32), np.zeros(8, np.int64)
    args = gt.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=1,
                                group_by_length=True, disable_tqdm=True, save_strategy="no")
    with pytest.raises(ValueError, match="group_by_length=True"):
        gt.Trainer(gt.nn.Sequential(gt.nn.Linear(4, 2)), args, train_dataset=(x, y)).train()
