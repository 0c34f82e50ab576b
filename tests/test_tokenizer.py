"""gputrain.tokenizer_from_pretrained against transformers' own tokenizers: the folders and the
reference outputs in tests/fixtures/tok/ were made by tests/fixtures/make_tokenizer_fixtures.py
(tiny tokenizers trained with `tokenizers`, saved and called by transformers 5). Ids, masks and
type ids must be identical for every call setting; decode must give transformers' text."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

import gputrain as gt  # noqa: E402

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tok"
REFERENCE = json.loads(gzip.decompress((FIXTURES / "reference.json.gz").read_bytes()))
FOLDERS = list(REFERENCE["folders"])
PAIRS = [tuple(p) for p in REFERENCE["pairs"]]


def _needs(folder: str) -> None:
    if folder == "deberta-spm":
        pytest.importorskip("sentencepiece")
        pytest.importorskip("google.protobuf")


def load(folder: str) -> gt.text.PretrainedTokenizer:
    _needs(folder)
    return gt.tokenizer_from_pretrained(FIXTURES / folder)


def inputs(kind: str) -> tuple[object, object]:
    """The inputs of a reference case (as the fixture script builds them)."""
    rows = {"only_first": REFERENCE["only_first"], "only_second": REFERENCE["only_second"]}.get(kind, PAIRS)
    if kind == "first":
        return [a for a, _ in rows], None
    if kind == "second":
        return [b for _, b in rows], None
    if kind in ("pairs", "only_first", "only_second"):
        return [a for a, _ in rows], [b for _, b in rows]
    if kind == "one":
        return PAIRS[1][0], None
    if kind == "one_pair":
        return PAIRS[0][0], PAIRS[0][1]
    raise ValueError(kind)


def check_case(tok: object, case: dict, where: str) -> None:
    for attr, value in case["attrs"].items():
        setattr(tok, attr, value)
    text, pair = inputs(case["inputs"])
    got = tok(text, pair, **case["kwargs"])
    expected = case["output"]
    assert list(got) == list(expected), f"{where}: keys {list(got)} != {list(expected)}"
    for key, want in expected.items():
        if isinstance(want, dict):  # an array
            assert isinstance(got[key], np.ndarray) and got[key].dtype == np.int64, f"{where}: {key}"
            np.testing.assert_array_equal(got[key], np.array(want["array"], dtype=np.int64), err_msg=f"{where}: {key}")
        else:
            assert got[key] == want, f"{where}: {key}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_ids_masks_and_type_ids_match_transformers(folder):
    reference = REFERENCE["folders"][folder]
    for name, case in reference.items():
        if "inputs" in case:
            check_case(load(folder), case, f"{folder}/{name}")


@pytest.mark.parametrize("folder", FOLDERS)
def test_facts_encode_and_decode_match_transformers(folder):
    tok = load(folder)
    reference = REFERENCE["folders"][folder]
    facts = reference["facts"]
    assert tok.vocab_size == facts["vocab_size"] and len(tok) == facts["len"]
    assert tok.pad_token_id == facts["pad_token_id"]
    assert {k: getattr(tok, f"{k}_token_id") for k in facts["special_ids"]} == facts["special_ids"]
    assert tok.model_max_length == facts["model_max_length"]
    assert sorted(tok.model_input_names) == sorted(facts["model_input_names"])
    assert {t: tok.convert_tokens_to_ids(t) for t in facts["tokens_to_ids"]} == facts["tokens_to_ids"]
    assert [tok.encode(a, b) for a, b in PAIRS[:4]] == reference["encode"]["ids"]
    decode = reference["decode"]
    assert [tok.decode(ids) for ids in decode["ids"]] == decode["text"]
    assert tok.batch_decode(decode["ids"], skip_special_tokens=True) == decode["text_skip_special"]
    assert tok.decode(decode["ids"][:2]) == decode["text"][:2]  # a batch given to decode
    assert tok.decode(np.array(decode["ids"][0])) == decode["text"][0]


def test_byte_level_decode_round_trips_exactly():
    tok = load("roberta")
    texts = [a for a, _ in PAIRS if "<mask>" not in a] + [b for _, b in PAIRS]
    batch = tok(texts, add_special_tokens=False)
    assert tok.batch_decode(batch["input_ids"]) == texts
    ids = tok(texts, padding=True, return_tensors="np")["input_ids"]
    assert tok.batch_decode(ids, skip_special_tokens=True) == texts


def test_wordpiece_decode_round_trips_lowercased_words():
    tok = load("bert")
    text = "the quick brown fox jumps over the lazy dog"
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == text


@pytest.mark.parametrize("folder", FOLDERS)
def test_save_pretrained_then_load_gives_the_same_ids(folder, tmp_path):
    tok = load(folder)
    tok.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "tokenizer.json").is_file()
    for name, case in REFERENCE["folders"][folder].items():
        if "inputs" in case:
            check_case(gt.tokenizer_from_pretrained(tmp_path / "saved"), case, f"{folder} saved/{name}")
    again = gt.tokenizer_from_pretrained(tmp_path / "saved")
    assert len(again) == len(tok) and again.special_tokens_map == tok.special_tokens_map
    assert again.model_max_length == tok.model_max_length and again.model_input_names == tok.model_input_names


@pytest.mark.parametrize("folder", ["bert-vocab", "deberta-spm"])
def test_a_bare_vocabulary_file_is_read_as_its_family_with_the_defaults(folder, tmp_path):
    _needs(folder)
    bare = copy_folder(folder, tmp_path)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    (bare / "tokenizer_config.json").unlink()  # no class named: BERT's / DeBERTa's special tokens
    tok = gt.tokenizer_from_pretrained(bare)
    assert tok.model_max_length > 1e20 and config["model_max_length"] == 64
    check_case(tok, REFERENCE["folders"][folder]["pair_padded"], f"{folder} without tokenizer_config.json")


def test_output_forms_and_pickling():
    tok = load("bert")
    again = pickle.loads(pickle.dumps(tok))  # as a Dataset object's workers receive it
    assert again(PAIRS[0][0], PAIRS[0][1]) == tok(PAIRS[0][0], PAIRS[0][1])
    one = tok("a fox", "a dog")
    assert isinstance(one["input_ids"], list) and isinstance(one["input_ids"][0], int)
    assert one.input_ids == one["input_ids"]  # keys read as attributes, as BatchEncoding's
    arrays = tok("a fox", return_tensors="np")
    assert arrays["input_ids"].shape == (1, len(tok("a fox")["input_ids"]))
    assert tok([]) == {"input_ids": [], "token_type_ids": [], "attention_mask": []}


def test_bad_calls_raise_clear_errors():
    tok = load("bert")
    with pytest.raises(TypeError, match=r"text\[1\] is int"):
        tok(["a fox", 3])
    with pytest.raises(TypeError, match=r"text_pair\[0\] is NoneType"):
        tok(["a fox"], [None])
    with pytest.raises(TypeError, match="text must be a str or a list of str"):
        tok(42)
    with pytest.raises(ValueError, match="batch length"):
        tok(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="different lengths"):
        tok(["a", "a much longer text"], return_tensors="np")
    with pytest.raises(ValueError, match="return_tensors"):
        tok("a", return_tensors="pt")
    with pytest.raises(ValueError, match="padding must be"):
        tok("a", padding="sideways")
    with pytest.raises(ValueError, match="truncation must be"):
        tok("a", truncation="middle")
    with pytest.raises(ValueError, match="multiple of pad_to_multiple_of"):
        tok(["a"], padding=True, truncation=True, max_length=12, pad_to_multiple_of=8)
    with pytest.raises(ValueError, match="tokenizing failed"):  # only_second with a second text too short
        tok(["a long first text with many words in it"], ["b"], truncation="only_second", max_length=6)
    with pytest.raises(ValueError, match=r"token id -100 is not an id"):
        tok.decode([2, -100, 3])
    with pytest.raises(TypeError, match=r"sequences\[1\] must be a sequence of int"):
        tok.batch_decode([[2, 3], ["x"]])
    tok.pad_token = None
    with pytest.raises(ValueError, match="no padding token"):
        tok(["a", "b c"], padding=True)


def copy_folder(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def test_bad_folders_raise_errors_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        gt.tokenizer_from_pretrained(tmp_path / "missing")
    empty = tmp_path / "pickled"
    empty.mkdir()
    (empty / "vocab.pkl").write_bytes(b"\x80\x04not read")
    with pytest.raises(FileNotFoundError, match=r"no tokenizer.json, vocab.txt or spm.model.*vocab.pkl"):
        gt.tokenizer_from_pretrained(empty)
    broken = copy_folder("bert", tmp_path)
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": ')
    with pytest.raises(ValueError, match=r"tokenizer.json.*(parse|load)"):
        gt.tokenizer_from_pretrained(broken)
    (broken / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordPiece"}}')
    with pytest.raises(ValueError, match=r"tokenizer.json: not a tokenizer"):
        gt.tokenizer_from_pretrained(broken)
    spec = json.loads((FIXTURES / "bert" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["post_processor"]["special_tokens"]["[SEP]"]["ids"] = [9999]  # beyond the 420 tokens
    (broken / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer.json: the post-processor adds token id 9999 but the "
                                         r"vocabulary has 420 tokens"):
        gt.tokenizer_from_pretrained(broken)
    config = copy_folder("roberta", tmp_path)
    (config / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(ValueError, match=r"tokenizer_config.json: does not parse as JSON"):
        gt.tokenizer_from_pretrained(config)
    (config / "tokenizer_config.json").write_text('{"padding_side": "up"}')
    with pytest.raises(ValueError, match=r"tokenizer_config.json: padding_side"):
        gt.tokenizer_from_pretrained(config)
    wrong = copy_folder("bert-vocab", tmp_path)
    (wrong / "tokenizer_config.json").write_text('{"tokenizer_class": "RobertaTokenizer"}')
    with pytest.raises(ValueError, match=r"vocab.txt: only BERT-family"):
        gt.tokenizer_from_pretrained(wrong)


def test_spm_model_is_refused_naming_the_packages_without_sentencepiece(tmp_path, monkeypatch):
    folder = copy_folder("deberta-spm", tmp_path)
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import sentencepiece fails
    with pytest.raises(ImportError, match=r"spm.model: converting a SentencePiece model needs .*sentencepiece"):
        gt.tokenizer_from_pretrained(folder)


def test_spm_model_that_does_not_load_is_refused_naming_it(tmp_path):
    pytest.importorskip("sentencepiece")
    pytest.importorskip("google.protobuf")
    folder = copy_folder("deberta-spm", tmp_path)
    (folder / "spm.model").write_bytes(b"not a sentencepiece model")
    with pytest.raises(ValueError, match=r"spm.model: not a SentencePiece model"):
        gt.tokenizer_from_pretrained(folder)
