"""examples/finetune_lm.py runs end to end on a fresh machine: a small Llama-architecture model
from scratch over byte-level ids of the standard library's sources, through the Trainer (packed
rows, accumulation, checkpointing, a cosine schedule), and a GPT-2 folder fine-tuned the same way."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

# a fresh interpreter per run, minutes under qemu, for code the rest of the suite covers there
pytestmark = pytest.mark.native_only

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "finetune_lm.py")
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def run(*args: str, cwd: str) -> str:
    result = subprocess.run([sys.executable, EXAMPLE, "--steps", "4", "--seq-len", "64", "--batch", "2",
                             "--threads", "1", "--output-dir", os.path.join(cwd, "out"), *args],
                            capture_output=True, text=True, timeout=300, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_from_scratch_trains_evaluates_and_samples(tmp_path):
    out = run(cwd=str(tmp_path))
    assert "packed rows of 64" in out and "validation loss" in out and "sample:" in out
    assert os.path.isdir(tmp_path / "out" / "checkpoint-4")


def test_a_gpt2_folder_fine_tunes_with_its_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    folder = tmp_path / "gpt2"
    shutil.copytree(os.path.join(FIXTURES, "hf", "gpt2-tiny"), folder)
    # a word-level tokenizer whose 100 ids fit the tiny model's vocabulary
    words = ["[UNK]", *(f"w{i}" for i in range(60)), "def", "return", "self", "if", "else", "for", "in", "import",
             "class", "None", "True", "False", "not", "and", "or", "is", "with", "as", "from", "raise", "try",
             "except", "while", "yield", "lambda", "pass", "break", "continue", "global", "del", "assert",
             "elif", "finally", "print", "len", "range", "str", "int", "list"]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words[:100])}, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    out = run("--model", str(folder), cwd=str(tmp_path))
    assert "validation loss" in out
