"""examples/nli.py runs end to end: from scratch (a WordPiece tokenizer trained on the standard
library's docstrings, masked-LM pre-training of a tiny BERT, save_pretrained, then
BertForSequenceClassification.from_pretrained(num_labels=3) fine-tuned on the generated pair task)
with tiny sizes, and with --model on a BERT fixture folder and TSV / JSONL files; and the generated
task's labels follow from the two sentences together, not from either alone."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "nli.py")
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
tokenizers = pytest.importorskip("tokenizers")
# a fresh interpreter per run, minutes under qemu, for code the rest of the suite covers there
pytestmark = pytest.mark.native_only


def run(*args: str, cwd: str, ok: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, EXAMPLE, "--threads", "1", "--workers", "2", "--batch", "8",
                             "--eval-batch", "16", "--output-dir", os.path.join(cwd, "out"), *args],
                            capture_output=True, text=True, timeout=300, cwd=cwd)
    if ok:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_from_scratch_pretrains_then_fine_tunes(tmp_path):
    out = run("--stdlib-files", "25", "--vocab", "300", "--seq-len", "32", "--mlm-seconds", "1", "--mlm-copies", "1",
              "--train-pairs", "64", "--test-pairs", "30", "--epochs", "1", cwd=str(tmp_path)).stdout
    assert "masked-LM:" in out and "WordPiece tokenizer: 300 tokens" in out
    assert "fine-tuning BertForSequenceClassification (3 labels: entailment, neutral, contradiction)" in out
    assert "epoch 1.00: eval loss" in out and "confusion (rows: true, columns: predicted)" in out
    assert "evaluation accuracy" in out and "beside: chance (majority class) accuracy" in out
    assert "on the hypothesis alone: accuracy" in out and "on the premise alone: accuracy" in out
    folder = tmp_path / "out" / "tiny-bert"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (folder / name).is_file(), name
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
    bad = run("--facts", "13", cwd=str(tmp_path), ok=False)
    assert bad.returncode != 0 and "--facts must be 1..12" in bad.stderr


def load_example():
    spec = importlib.util.spec_from_file_location("nli_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("facts", [1, 2, 4])
def test_the_generated_labels_need_both_sentences(facts):
    nli = load_example()
    premises, hypotheses, labels = nli.make_pairs(3000, facts, np.random.default_rng(0))
    assert np.bincount(labels, minlength=3).tolist() == [1000, 1000, 1000]
    adjectives = {word for pair in nli.ATTRIBUTES for word in pair}

    def fact(clause):  # "the <noun> is [not] <adjective>" -> (noun, (adjective, negated))
        words = clause.split()
        assert words[0] == "the" and words[2] == "is" and words[-1] in adjectives and len(words) in (4, 5)
        return words[1], (words[-1], len(words) == 5 and words[3] == "not")

    for premise, hypothesis, label in zip(premises, hypotheses, labels):
        clauses = premise.replace(" and ", ", ").split(", ")
        stated = dict(fact(clause) for clause in clauses)
        assert len(clauses) == len(stated) == facts
        subject, (attribute, negated) = fact(hypothesis)
        if nli.NLI_LABELS[label] == "entailment":
            assert stated.get(subject) == (attribute, negated), (premise, hypothesis)
        elif nli.NLI_LABELS[label] == "contradiction":
            assert stated.get(subject) == (attribute, not negated), (premise, hypothesis)
        else:
            assert subject not in stated and attribute in {a for a, _ in stated.values()}, (premise, hypothesis)
    # a bag-of-words regression on either sentence alone stays at chance on other draws ...
    test = nli.make_pairs(1500, facts, np.random.default_rng(1))
    for side in (0, 1):
        accuracy, f1 = nli.bag_of_words_baseline([premises, hypotheses][side], labels, test[side], test[2])
        assert accuracy < 0.39 and f1 < 0.39, (side, accuracy, f1)
    # ... while it does find a label that one sentence leaks (a word only contradictions have)
    leaky = [h + " never" if y == 2 else h for h, y in zip(hypotheses, labels)]
    leaky_test = [h + " never" if y == 2 else h for h, y in zip(test[1], test[2])]
    accuracy, _ = nli.bag_of_words_baseline(leaky, labels, leaky_test, test[2])
    assert accuracy > 0.6


WORDS = ["the", "cat", "dog", "bird", "sits", "runs", "on", "under", "mat", "table", "is", "not", "a", "red",
         "blue", "big", "small", "here", "there", "today"]


def bert_folder(tmp_path):
    """The tiny BERT fixture (vocabulary 99, 40 positions) with a WordPiece tokenizer of WORDS."""
    folder = tmp_path / "bert"
    shutil.copytree(os.path.join(FIXTURES, "hf", "bert-seqcls-tiny"), folder)
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "BertTokenizer", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
         "unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 40}))
    return folder


def triples(n: int, seed: int) -> list[tuple[str, str, str]]:
    import random
    rng = random.Random(seed)
    labels = ["entailment", "neutral", "contradiction"]
    rows = []
    for i in range(n):
        subject, place = rng.choice(["cat", "dog", "bird"]), rng.choice(["mat", "table"])
        premise = f"the {subject} is on the {place} today"
        label = labels[i % 3]
        hypothesis = {"entailment": f"the {subject} is on the {place}",
                      "contradiction": f"the {subject} is not on the {place}",
                      "neutral": f"a {rng.choice(['red', 'blue'])} bird runs there"}[label]
        rows.append((premise, hypothesis, label))
    return rows


def test_a_bert_folder_fine_tunes_on_tsv_and_jsonl(tmp_path):
    folder = bert_folder(tmp_path)
    train = tmp_path / "train.tsv"
    train.write_text("premise\thypothesis\tlabel\n" + "".join("\t".join(row) + "\n" for row in triples(48, 0)))
    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(json.dumps(dict(zip(("premise", "hypothesis", "label"), row))) + "\n"
                           for row in triples(15, 1)))
    out = run("--model", str(folder), "--train", str(train), "--eval", str(dev), "--epochs", "2",
              "--lr", "1e-3", cwd=str(tmp_path)).stdout
    assert "48 training pairs, 15 evaluation pairs" in out
    assert "epoch 1.00: eval loss" in out and "epoch 2.00: eval loss" in out
    assert out.count("entailment") >= 2 and "evaluation accuracy" in out
    # an evaluation label the training file lacks, and a tokenizer whose ids exceed the model's rows
    dev.write_text(json.dumps({"premise": "the cat", "hypothesis": "a dog", "label": "maybe"}) + "\n")
    bad = run("--model", str(folder), "--train", str(train), "--eval", str(dev), cwd=str(tmp_path), ok=False)
    assert bad.returncode != 0 and "labels ['maybe'] are not among the training labels" in bad.stderr
    shutil.copy(os.path.join(FIXTURES, "tok", "bert", "tokenizer.json"), folder / "tokenizer.json")
    bad = run("--model", str(folder), "--train", str(train), cwd=str(tmp_path), ok=False)
    assert bad.returncode != 0 and "but the model's vocabulary has 99 rows" in bad.stderr
