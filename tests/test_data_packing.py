"""gputrain.data.pack_sequences and DataCollatorWithFlattening: document boundaries (positions
restarting at 0, -100 labels at each document's first token, or its last with shift_labels),
splitting, padding, both strategies, dict batches through the DataLoader, bad input; and a packed
row through the float64 Llama reference gives every document the loss it has alone."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import gputrain as gt
from gputrain.data import DataCollatorWithFlattening, pack_sequences

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _llama_reference as ref  # noqa: E402

KEYS = ["input_ids", "attention_mask", "position_ids", "labels"]


def documents_of(packed: dict, row: int) -> list[list[int]]:
    """The documents of one row, read back from position_ids == 0 (HF's rule), padding dropped."""
    ids, mask, pos = packed["input_ids"][row], packed["attention_mask"][row], packed["position_ids"][row]
    docs: list[list[int]] = []
    for t in np.flatnonzero(mask):
        if pos[t] == 0:
            docs.append([])
        docs[-1].append(int(ids[t]))
    return docs


def test_wrap_rows_boundaries_and_labels():
    docs = [[11, 12, 13], [21, 22], [31, 32, 33, 34, 35, 36, 37], [41]]
    packed = pack_sequences(docs, 5)
    assert sorted(packed) == sorted(KEYS)
    assert all(a.dtype == np.int64 and a.shape == (3, 5) for a in packed.values())
    np.testing.assert_array_equal(packed["input_ids"], [[11, 12, 13, 21, 22], [31, 32, 33, 34, 35],
                                                        [36, 37, 41, 0, 0]])
    np.testing.assert_array_equal(packed["position_ids"], [[0, 1, 2, 0, 1], [0, 1, 2, 3, 4], [0, 1, 0, 0, 0]])
    np.testing.assert_array_equal(packed["attention_mask"], [[1] * 5, [1] * 5, [1, 1, 1, 0, 0]])
    # HF's convention: labels = input_ids, -100 at every document's (and piece's) first token and on padding
    np.testing.assert_array_equal(packed["labels"], [[-100, 12, 13, -100, 22], [-100, 32, 33, 34, 35],
                                                     [-100, 37, -100, -100, -100]])
    # every row starts a document; the long one is split, its continuation a document of its own
    assert [documents_of(packed, r) for r in range(3)] == [[[11, 12, 13], [21, 22]], [[31, 32, 33, 34, 35]],
                                                           [[36, 37], [41]]]


def test_shift_labels_are_the_next_token_of_the_same_document():
    docs = [[11, 12, 13], [21, 22], [31, 32, 33, 34, 35, 36, 37], [41]]
    shifted = pack_sequences(docs, 5, shift_labels=True)["labels"]
    np.testing.assert_array_equal(shifted, [[12, 13, -100, 22, -100], [32, 33, 34, 35, -100],
                                            [37, -100, -100, -100, -100]])
    # the same targets as HF's labels, shifted by one within each row
    hf = pack_sequences(docs, 5)["labels"]
    np.testing.assert_array_equal(shifted[:, :-1], hf[:, 1:])


def test_a_row_exactly_full_adds_no_padding_row():
    packed = pack_sequences([np.arange(1, 5), np.arange(5, 9)], 4)
    assert packed["input_ids"].shape == (2, 4)
    assert packed["attention_mask"].all()
    packed = pack_sequences([[1, 2, 3, 4, 5, 6, 7, 8, 9]], 3)  # a long document: three pieces
    np.testing.assert_array_equal(packed["position_ids"], [[0, 1, 2]] * 3)
    np.testing.assert_array_equal(packed["labels"][:, 0], [-100] * 3)


def test_best_fit_splits_only_long_documents():
    docs = [[1] * 3, [2] * 7, [3] * 2, [4] * 4, [5] * 1, [6] * 12]
    packed = pack_sequences(docs, 5, strategy="best_fit", pad_token_id=99)
    rows = [documents_of(packed, r) for r in range(len(packed["input_ids"]))]
    pieces = sorted(tuple(d) for row in rows for d in row)
    expected = sorted([(1,) * 3, (2,) * 5, (2,) * 2, (3,) * 2, (4,) * 4, (5,), (6,) * 5, (6,) * 5, (6,) * 2])
    assert pieces == expected  # only the 7- and 12-token documents were split, into 5-token pieces
    assert len(rows) == 6  # 29 tokens: best-fit decreasing fills 6 rows of 5
    for r, row in enumerate(rows):
        used = sum(len(d) for d in row)
        assert used <= 5
        np.testing.assert_array_equal(packed["attention_mask"][r], [1] * used + [0] * (5 - used))
        assert (packed["input_ids"][r, used:] == 99).all() and (packed["labels"][r, used:] == -100).all()
    again = pack_sequences(docs, 5, strategy="best_fit", pad_token_id=99)
    assert all(np.array_equal(packed[k], again[k]) for k in KEYS)


def test_every_token_is_packed_once_in_order_for_wrap():
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 1000, rng.integers(0, 40)) for _ in range(60)]
    packed = pack_sequences(iter(docs), 16)  # any iterable, empty documents dropped
    flat = packed["input_ids"][packed["attention_mask"] == 1]
    np.testing.assert_array_equal(flat, np.concatenate(docs))
    assert (packed["attention_mask"][:-1] == 1).all()  # only the last row is padded
    labelled = (packed["labels"] != -100).sum()
    starts = (packed["position_ids"] == 0) & (packed["attention_mask"] == 1)
    assert labelled == len(flat) - starts.sum()


def test_dataloader_yields_dict_batches():
    packed = pack_sequences([np.arange(1, 30)] * 5, 8)
    batches = list(gt.DataLoader(packed, batch_size=4))
    assert [sorted(b) for b in batches] == [sorted(KEYS)] * len(batches)
    np.testing.assert_array_equal(np.concatenate([b["position_ids"] for b in batches]), packed["position_ids"])


def test_packed_row_gives_each_document_its_own_loss():
    """Through the float64 reference decoder (documents told apart by restarting positions, as
    transformers does): the packed rows' loss terms are exactly those of the documents run alone."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf", "qwen2-tiny")
    config, weights = ref.load(folder)
    rng = np.random.default_rng(1)
    docs = [rng.integers(3, config.vocab_size, n) for n in (5, 7, 3, 9)]  # two full rows
    packed = pack_sequences(docs, 12)
    logits = ref.causal_lm_logits(config, weights, packed["input_ids"], None, packed["position_ids"])
    def log_softmax(x: np.ndarray) -> np.ndarray:
        shifted = x - x.max()
        return shifted - np.log(np.exp(shifted).sum())

    terms = []  # the packed loss terms: position t scored on labels[t + 1] (HF's shift)
    for row in range(len(logits)):
        for t in np.flatnonzero(packed["labels"][row, 1:] != -100):
            terms.append(log_softmax(logits[row, t])[packed["labels"][row, t + 1]])
    alone = []
    for row in range(len(logits)):
        for doc in documents_of(packed, row):
            doc_logits = ref.causal_lm_logits(config, weights, np.array([doc]))[0]
            alone += [log_softmax(doc_logits[t])[doc[t + 1]] for t in range(len(doc) - 1)]
    assert len(terms) == sum(len(d) - 1 for d in docs)  # no document is split: every term is there
    np.testing.assert_allclose(terms, alone, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("documents, kwargs, error, match", [
    ([[1, 2]], dict(seq_len=0), ValueError, "seq_len"),
    ([[1, 2]], dict(seq_len=2.5), ValueError, "seq_len"),
    ([[1, 2]], dict(seq_len=True), ValueError, "seq_len"),
    ([[1, 2]], dict(seq_len=4, strategy="greedy"), ValueError, "strategy"),
    ([[1, 2]], dict(seq_len=4, pad_token_id=-1), ValueError, "pad_token_id"),
    ([[1, 2]], dict(seq_len=4, shift_labels=1), TypeError, "shift_labels"),
    ([[1, 2], [0.5, 1.5]], dict(seq_len=4), TypeError, r"documents\[1\].*integer"),
    ([[1, 2], [[1, 2]]], dict(seq_len=4), ValueError, r"documents\[1\].*1-D"),
    ([[1, -2]], dict(seq_len=4), ValueError, r"documents\[0\].*negative"),
    (["some text"], dict(seq_len=4), TypeError, r"documents\[0\].*tokenize"),
    ([[], []], dict(seq_len=4), ValueError, "no token"),
    ([], dict(seq_len=4), ValueError, "no token"),
    ("text", dict(seq_len=4), TypeError, "documents must be"),
    (np.arange(5), dict(seq_len=4), TypeError, "documents must be"),
    ({"input_ids": [1, 2]}, dict(seq_len=4), TypeError, "documents must be"),
    (5, dict(seq_len=4), TypeError, "documents must be"),
])
def test_bad_input_names_the_argument(documents, kwargs, error, match):
    with pytest.raises(error, match=match):
        pack_sequences(documents, **kwargs)


def test_two_dimensional_array_is_a_list_of_documents():
    packed = pack_sequences(np.array([[1, 2, 3], [4, 5, 6]]), 4)
    np.testing.assert_array_equal(packed["position_ids"], [[0, 1, 2, 0], [0, 1, 0, 0]])


# ---- the collator ----------------------------------------------------------------------------


def test_collator_as_transformers_writes_it():
    """The values of transformers' DataCollatorWithFlattening (5.25, return_tensors="np") on this
    batch, written out."""
    examples = [{"input_ids": [5, 6, 7]}, {"input_ids": []}, {"input_ids": np.array([8, 9])}]
    batch = DataCollatorWithFlattening()(examples)
    assert sorted(batch) == ["input_ids", "labels", "position_ids"]
    np.testing.assert_array_equal(batch["input_ids"], [[5, 6, 7, 8, 9]])
    np.testing.assert_array_equal(batch["labels"], [[-100, 6, 7, -100, 9]])
    np.testing.assert_array_equal(batch["position_ids"], [[0, 1, 2, 0, 1]])
    full = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True, separator_id=-1,
                                      position_ids_start=2)(
        [{"input_ids": [5, 6, 7], "labels": [1, 2, 3]}, {"input_ids": [8, 9], "labels": [-100, 4]}])
    np.testing.assert_array_equal(full["labels"], [[-1, 2, 3, -1, 4]])
    np.testing.assert_array_equal(full["position_ids"], [[2, 3, 4, 2, 3]])
    np.testing.assert_array_equal(full["seq_idx"], [[0, 0, 0, 1, 1]])
    assert full["seq_idx"].dtype == np.int32 and full["cu_seq_lens_q"].dtype == np.int32
    np.testing.assert_array_equal(full["cu_seq_lens_q"], [0, 3, 5])
    assert full["cu_seq_lens_k"] is full["cu_seq_lens_q"] and full["max_length_q"] == full["max_length_k"] == 3
    none = DataCollatorWithFlattening(return_position_ids=False)([{"input_ids": [1, 2]}])
    assert sorted(none) == ["input_ids", "labels"]


def test_collator_in_a_dataloader():
    examples = [{"input_ids": list(range(1, n + 1))} for n in (3, 4, 2, 5)]
    loader = gt.DataLoader(examples, batch_size=2, collate_fn=DataCollatorWithFlattening())
    batches = list(loader)
    assert [b["input_ids"].shape for b in batches] == [(1, 7), (1, 7)]
    np.testing.assert_array_equal(batches[1]["position_ids"], [[0, 1, 0, 1, 2, 3, 4]])


@pytest.mark.parametrize("examples, match", [
    ([], "every example is empty"),
    ([{"input_ids": []}], "every example is empty"),
    ([[1, 2, 3]], "example 0 must be a dict"),
    ([{"ids": [1]}], "example 0 must be a dict with 'input_ids'"),
    ([{"input_ids": [1, 2], "labels": [1]}], "example 0's labels"),
    ([{"input_ids": [1, 2], "labels": [1, 2]}, {"input_ids": [3]}], "every example has 'labels' or none"),
    ([{"input_ids": [1.0, 2.0]}], r"documents\[0\] must hold integer"),
])
def test_collator_bad_input(examples, match):
    with pytest.raises((TypeError, ValueError), match=match):
        DataCollatorWithFlattening()(examples)


def test_collator_bad_options():
    with pytest.raises(TypeError, match="return_seq_idx"):
        DataCollatorWithFlattening(return_seq_idx="yes")
    with pytest.raises(TypeError, match="separator_id"):
        DataCollatorWithFlattening(separator_id=None)
