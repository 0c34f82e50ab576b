"""gt.data.tokenize: a column of texts or text pairs into ragged id/mask/type columns that the
DataLoader pads per batch (to a multiple of 8 by default); each row equals the tokenizer's own
call on that example, and each batch equals the tokenizer's padded call on the batch's rows."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

import gputrain as gt  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tok"
PREMISES = ["The quick brown fox jumps over the lazy dog.", "Café naïve résumé", "", "Emoji 😀 are fun",
            "Whitespace   runs\tand\nnewlines", "a much longer premise that goes on and on about the committee "
            "and the budget and the schedule and the complaints", "short", "中文字符 日本語"]
HYPOTHESES = ["A fox jumps.", "", "The premise was empty.", "I love pizza", "x", "the committee met",
              "a short one", "CJK"]


@pytest.mark.parametrize("folder", ["bert", "roberta", "deberta"])
def test_rows_equal_the_tokenizer_call_and_batches_its_padded_call(folder):
    tok = gt.tokenizer_from_pretrained(FIXTURES / folder)
    columns = gt.data.tokenize(tok, PREMISES, HYPOTHESES, max_length=24)
    expected_keys = {"input_ids", "attention_mask"} | ({"token_type_ids"} if folder != "roberta" else set())
    assert set(columns) == expected_keys
    single = tok(PREMISES, HYPOTHESES, truncation=True, max_length=24)
    for key, ragged in columns.items():
        assert ragged.values.dtype == np.int64
        assert [ragged[i].tolist() for i in range(len(PREMISES))] == single[key], key
    labels = np.arange(len(PREMISES), dtype=np.int64)
    loader = gt.DataLoader({**columns, "labels": labels}, batch_size=3)
    for batch in loader:
        rows = batch["labels"].tolist()
        want = tok([PREMISES[i] for i in rows], [HYPOTHESES[i] for i in rows], padding=True, truncation=True,
                   max_length=24, pad_to_multiple_of=8, return_tensors="np")
        assert batch["input_ids"].shape[1] % 8 == 0
        for key in expected_keys:
            np.testing.assert_array_equal(batch[key], want[key], err_msg=key)


def test_single_texts_without_rounding_and_columns_of_other_kinds():
    tok = gt.tokenizer_from_pretrained(FIXTURES / "bert")
    want = tok(PREMISES, truncation=True)
    as_list = gt.data.tokenize(tok, PREMISES, pad_to_multiple_of=1)
    as_array = gt.data.tokenize(tok, np.array(PREMISES, dtype=object), pad_to_multiple_of=1)
    as_tuple = gt.data.tokenize(tok, tuple(PREMISES), pad_to_multiple_of=1)
    for columns in (as_list, as_array, as_tuple):
        assert [columns["input_ids"][i].tolist() for i in range(len(PREMISES))] == want["input_ids"]
    batch = next(iter(gt.DataLoader(as_list, batch_size=len(PREMISES))))
    assert batch["input_ids"].shape[1] == max(len(r) for r in want["input_ids"])  # no rounding
    pa = pytest.importorskip("pyarrow")
    arrow = gt.data.tokenize(tok, pa.chunked_array([PREMISES[:3], PREMISES[3:]]), pad_to_multiple_of=1)
    np.testing.assert_array_equal(arrow["input_ids"].values, as_list["input_ids"].values)


def test_chunks_encoded_on_a_thread_give_the_same_columns(monkeypatch):
    tok = gt.tokenizer_from_pretrained(FIXTURES / "deberta")
    whole = gt.data.tokenize(tok, PREMISES, HYPOTHESES)
    monkeypatch.setattr(importlib.import_module("gputrain.data._tokenize"), "CHUNK", 3)  # 8 rows: chunks of 3, 3 and 2
    chunked = gt.data.tokenize(tok, PREMISES, HYPOTHESES)
    for key in whole:
        np.testing.assert_array_equal(chunked[key].values, whole[key].values)
        np.testing.assert_array_equal(chunked[key].offsets, whole[key].offsets)
    with pytest.raises(TypeError, match=r"text_pairs\[7\] is int"):  # in the last chunk
        gt.data.tokenize(tok, PREMISES, HYPOTHESES[:7] + [7])


def test_non_text_rows_and_bad_arguments_raise_errors_naming_the_column():
    tok = gt.tokenizer_from_pretrained(FIXTURES / "bert")
    with pytest.raises(TypeError, match=r"texts\[2\] is NoneType"):
        gt.data.tokenize(tok, ["a", "b", None])
    with pytest.raises(TypeError, match=r"text_pairs\[1\] is float"):
        gt.data.tokenize(tok, ["a", "b"], ["c", float("nan")])
    with pytest.raises(TypeError, match="not one str"):
        gt.data.tokenize(tok, "a single text")
    with pytest.raises(ValueError, match="texts has 2 rows but text_pairs has 1"):
        gt.data.tokenize(tok, ["a", "b"], ["c"])
    with pytest.raises(TypeError, match="tokenizer must be"):
        gt.data.tokenize(object(), ["a"])
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        gt.data.tokenize(tok, ["a"], pad_to_multiple_of=0)


def test_ragged_array_rounds_batch_widths_up_to_the_multiple():
    values = np.arange(1, 12, dtype=np.int64)
    offsets = np.array([0, 3, 3, 11], dtype=np.int64)  # rows of 3, 0 and 8 items
    ragged = gt.data.RaggedArray(values, offsets, pad_value=-1, pad_to_multiple_of=4)
    batches = [b for b in gt.DataLoader(ragged, batch_size=2)]
    assert [b.shape for b in batches] == [(2, 4), (1, 8)]
    np.testing.assert_array_equal(batches[0], [[1, 2, 3, -1], [-1, -1, -1, -1]])
    np.testing.assert_array_equal(batches[1], [list(range(4, 12))])
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        gt.data.RaggedArray(values, offsets, pad_to_multiple_of=True)
