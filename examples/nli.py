"""Fine-tune a sentence-pair (NLI) classifier from an encoder folder (BERT, RoBERTa, XLM-RoBERTa,
DistilBERT) through gputrain's Trainer with the guides' settings: bf16 where the CPU multiplies it
natively (else fp32), per-device batch 48, evaluation batch 96, gradient accumulation 2, 4 loader
workers with prefetch 2, evaluation every epoch with early stopping on macro-F1; it prints accuracy
and macro-F1 per epoch and a confusion matrix at the end.

    python examples/nli.py --model FOLDER --train train.tsv [--eval dev.tsv] [--epochs 3]
    python examples/nli.py            # no folder: pre-train a tiny BERT, then fine-tune it

A data file is TSV, CSV (by extension) or JSONL with the fields premise, hypothesis, label (TSV/CSV:
a header row naming them); labels are names (entailment/neutral/contradiction or any others) or
integers 0..num_labels-1. Without --eval a seeded tenth of --train is held out. The folder's
tokenizer.json (or vocab.txt) tokenizes the pairs (the `tokenizers` package: pip install ".[text]").

Without --model it runs on a fresh machine in a few minutes, in three stages:
  1. a WordPiece tokenizer (the `tokenizers` package, BERT's lower-casing normalizer and
     pre-tokenizer) is trained on the docstrings of the standard library's modules;
  2. a tiny BERT-architecture encoder (BertForMaskedLM) is pre-trained with masked-LM on those
     docstrings for about a minute (15% of the tokens chosen as BERT does: 80% [MASK], 10% a random
     token, 10% unchanged; the loss on the chosen tokens only), then saved as a folder;
  3. BertForSequenceClassification.from_pretrained(folder, num_labels=3) puts a new head on that
     encoder and fine-tunes it on a generated pair task over frequent docstring words: 36 nouns
     (file, socket, queue, ...) and 12 pairs of opposite adjectives (open/closed, empty/full, ...).
     The premise states --facts facts "the <noun> is [not] <adjective>", distinct nouns and each fact
     an adjective of its own pair ("the file is open and the queue is not empty"); the hypothesis
     is one fact:
       entailment:    a fact of the premise ("the queue is not empty"),
       contradiction: a fact of the premise, negated if stated and stated if negated ("the queue
                      is empty"),
       neutral:       a noun the premise does not mention with the adjective of one of the
                      premise's facts, stated or negated at random ("the socket is empty").
     The labels are balanced (chance 1/3), and by construction each sentence alone is at chance:
     the premise is drawn without looking at the label, and whatever the label the hypothesis is a
     uniformly drawn noun with a uniformly drawn adjective, negated or not with probability 1/2. The
     model has to compare them: is the hypothesis's noun in the premise, and does the premise negate
     its fact as the hypothesis does?
     Beside the model's scores the example prints chance and a bag-of-words softmax regression
     fitted on the hypotheses alone and on the premises alone (both near 1/3). The test pairs are
     other draws than the training pairs.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import re
import sysconfig
import tempfile
import time
from typing import Any

import numpy as np

import gputrain as gt
from gputrain.models.hf import encoders

NLI_LABELS = ("entailment", "neutral", "contradiction")  # the order of MNLI's and SNLI's names
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# frequent words of the standard library's docstrings: nouns, and pairs of opposite adjectives
SUBJECTS = ("file", "socket", "buffer", "stream", "list", "string", "thread", "process", "module", "object", "value",
            "key", "path", "name", "server", "client", "connection", "queue", "lock", "parser", "result", "function",
            "method", "class", "argument", "attribute", "directory", "header", "message", "request", "response",
            "frame", "event", "archive", "node", "table")
ATTRIBUTES = (("open", "closed"), ("empty", "full"), ("true", "false"), ("valid", "invalid"), ("local", "remote"),
              ("public", "private"), ("absolute", "relative"), ("required", "optional"), ("new", "old"),
              ("first", "last"), ("short", "long"), ("binary", "text"))
TINY_BERT = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 256, "max_position_embeddings": 128, "type_vocab_size": 2,
             "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "pad_token_id": 0}
HEADS = {"bert": encoders.BertForSequenceClassification, "roberta": encoders.RobertaForSequenceClassification,
         "xlm-roberta": encoders.XLMRobertaForSequenceClassification,
         "distilbert": encoders.DistilBertForSequenceClassification}


# ---- the standard library's docstrings ---------------------------------------------------------

def stdlib_docstrings(max_files: int) -> list[tuple[str, list[str]]]:
    """(module file, its docstring paragraphs with whitespace collapsed) for up to max_files of the
    standard library's top-level modules, in name order; doctest paragraphs are left out."""
    stdlib = sysconfig.get_paths()["stdlib"]
    names = sorted(name for name in os.listdir(stdlib) if name.endswith(".py") and not name.startswith("_"))
    modules = []
    for name in names[:max_files]:
        try:
            with open(os.path.join(stdlib, name), encoding="utf-8") as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        paragraphs = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                for part in re.split(r"\n\s*\n", doc or ""):
                    text = " ".join(part.split())
                    if len(text) > 20 and ">>>" not in text:
                        paragraphs.append(text)
        if paragraphs:
            modules.append((name, paragraphs))
    if len(modules) < 10:
        raise SystemExit(f"only {len(modules)} standard-library modules with docstrings under {stdlib}")
    return modules


def train_wordpiece(texts: list[str], vocab_size: int, folder: str) -> None:
    """A BERT-style WordPiece tokenizer trained on texts, saved in folder as tokenizer.json and
    tokenizer_config.json (what gputrain.tokenizer_from_pretrained and transformers read)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                                                    show_progress=False))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 128,
              "unk_token": "[UNK]", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
              "mask_token": "[MASK]"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)


# ---- masked-LM pre-training --------------------------------------------------------------------

def mlm_rows(tokenizer: Any, paragraphs: list[str], seq_len: int) -> np.ndarray:
    """The paragraphs' tokens end to end, cut into rows of [CLS] + seq_len - 2 tokens + [SEP]."""
    ids = gt.data.tokenize(tokenizer, paragraphs, add_special_tokens=False, truncation=False)["input_ids"].values
    body = seq_len - 2
    rows = ids[:len(ids) // body * body].reshape(-1, body)
    cls = np.full((len(rows), 1), tokenizer.cls_token_id, np.int64)
    sep = np.full((len(rows), 1), tokenizer.sep_token_id, np.int64)
    return np.concatenate([cls, rows, sep], axis=1)


def mask_tokens(rows: np.ndarray, vocab_size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masking: 15% of the non-special tokens are chosen; of those 80% become [MASK], 10% a
    random non-special token, 10% stay. Returns (inputs, labels) with labels -100 where not chosen."""
    special = rows < len(SPECIALS)  # the tokenizer's ids 0..4 are its special tokens
    chosen = (rng.random(rows.shape) < 0.15) & ~special
    labels = np.where(chosen, rows, -100)
    draw = rng.random(rows.shape)
    inputs = rows.copy()
    inputs[chosen & (draw < 0.8)] = SPECIALS.index("[MASK]")
    swap = chosen & (draw >= 0.8) & (draw < 0.9)
    inputs[swap] = rng.integers(len(SPECIALS), vocab_size, int(swap.sum()))
    return inputs, labels


class TimeLimit(gt.TrainerCallback):
    """Stops training after `seconds` (checked after each optimizer step)."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start, self.stopped = seconds, 0.0, False

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if time.perf_counter() - self.start > self.seconds:
            control.should_training_stop = self.stopped = True
        return control


def pretrain(folder: str, tokenizer: Any, paragraphs: list[str], args: argparse.Namespace, precision: str) -> None:
    """A tiny BERT pre-trained with masked-LM for about args.mlm_seconds, saved in folder."""
    rows = mlm_rows(tokenizer, paragraphs, args.seq_len)
    rng = np.random.default_rng(0)
    copies = [mask_tokens(rows, tokenizer.vocab_size, rng) for _ in range(args.mlm_copies)]  # BERT's dupe_factor
    inputs, labels = (np.concatenate(part) for part in zip(*copies))
    model = encoders.BertForMaskedLM({**TINY_BERT, "vocab_size": tokenizer.vocab_size,
                                      "max_position_embeddings": max(TINY_BERT["max_position_embeddings"],
                                                                     args.seq_len)})
    print(f"masked-LM: {len(rows)} rows of {args.seq_len} tokens x {args.mlm_copies} maskings, "
          f"{sum(p.numel() for p in model.parameters()):,} parameters, up to {args.mlm_seconds:g} s")
    limit = TimeLimit(args.mlm_seconds)
    training_args = gt.TrainingArguments(
        output_dir=os.path.join(args.output_dir, "mlm"), per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.accumulation, num_train_epochs=1, learning_rate=1e-3, weight_decay=0.01,
        warmup_steps=0.05, lr_scheduler_type="linear", bf16=precision == "bf16", logging_steps=args.mlm_log_steps,
        save_strategy="no", eval_strategy="no", disable_tqdm=True, report_to="none", seed=0)
    trainer = gt.Trainer(model=model, args=training_args, callbacks=[limit],
                         train_dataset={"input_ids": inputs, "labels": labels})
    start = time.perf_counter()
    result = trainer.train()
    print(f"masked-LM: {result.global_step} steps in {time.perf_counter() - start:.0f} s"
          f"{' (time limit)' if limit.stopped else ''}, training loss {result.training_loss:.3f}")
    model.save_pretrained(folder)


# ---- the generated pair task -------------------------------------------------------------------

def premise_facts(rng: np.random.Generator, facts: int) -> tuple[list[tuple[int, int, int, int]], int]:
    """`facts` (subject, category, value, negated) facts for a premise: distinct SUBJECTS, each with
    one value of its own category of ATTRIBUTES, stated or negated; and one more subject, not among them."""
    categories = rng.choice(len(ATTRIBUTES), facts, replace=False)
    subjects = rng.choice(len(SUBJECTS), facts + 1, replace=False)
    values, negated = rng.integers(0, 2, facts), rng.integers(0, 2, facts)
    return [(int(s), int(c), int(v), int(n)) for s, c, v, n in zip(subjects, categories, values, negated)], \
        int(subjects[facts])


def sentence(subject: int, category: int, value: int, negated: int) -> str:
    return f"the {SUBJECTS[subject]} is {'not ' if negated else ''}{ATTRIBUTES[category][value]}"


def make_pairs(n: int, facts: int, rng: np.random.Generator) -> tuple[list[str], list[str], np.ndarray]:
    """n (premise, hypothesis, label) triples with balanced labels: the hypothesis takes a fact of
    the premise and keeps it (entailment), negates it if the premise states it and states it if the
    premise negates it (contradiction), or gives a subject the premise does not mention the fact's
    adjective, stated or negated at random (neutral)."""
    premises, hypotheses = [], []
    labels = rng.permutation(np.arange(n) % 3)
    for label in labels:
        triples, absent = premise_facts(rng, facts)
        clauses = [sentence(*fact) for fact in triples]
        premises.append(" and ".join([", ".join(clauses[:-1]), clauses[-1]] if facts > 1 else clauses))
        subject, category, value, negated = triples[int(rng.integers(facts))]
        if NLI_LABELS[label] == "contradiction":
            negated = 1 - negated
        elif NLI_LABELS[label] == "neutral":
            subject, negated = absent, int(rng.integers(2))
        hypotheses.append(sentence(subject, category, value, negated))
    return premises, hypotheses, labels.astype(np.int64)


def bag_of_words_baseline(train: list[str], train_labels: np.ndarray, test: list[str], test_labels: np.ndarray,
                          steps: int = 300) -> tuple[float, float]:
    """(accuracy, macro-F1) on test of a softmax regression on word counts fitted to train by full-batch
    gradient descent: what one sentence alone tells about the label."""
    words = sorted({word for text in train for word in text.split()})
    index = {word: i for i, word in enumerate(words)}

    def counts(texts: list[str]) -> np.ndarray:
        x = np.zeros((len(texts), len(words) + 1), np.float32)
        x[:, -1] = 1  # a bias column
        for row, text in enumerate(texts):
            for word in text.split():
                if word in index:
                    x[row, index[word]] += 1
        return x

    x, y = counts(train), np.eye(3, dtype=np.float32)[train_labels]
    w = np.zeros((x.shape[1], 3), np.float32)
    for _ in range(steps):
        logits = x @ w
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        w -= 0.5 * (x.T @ (p - y) / len(x) + 1e-4 * w)
    predicted = (counts(test) @ w).argmax(1)
    return gt.metrics.accuracy(test_labels, predicted), gt.metrics.f1_score(test_labels, predicted, average="macro")


def generated_task(args: argparse.Namespace) -> tuple[tuple, tuple, str]:
    """(train triples, test triples from other draws, a line with chance and the one-sentence baselines)."""
    train = make_pairs(args.train_pairs, args.facts, np.random.default_rng(1))
    test = make_pairs(args.test_pairs, args.facts, np.random.default_rng(2))
    hypothesis = bag_of_words_baseline(train[1], train[2], test[1], test[2])
    premise = bag_of_words_baseline(train[0], train[2], test[0], test[2])
    chance = np.bincount(test[2], minlength=3).max() / len(test[2])
    line = (f"chance (majority class) accuracy {chance:.4f}; bag-of-words softmax regression on the hypothesis alone: "
            f"accuracy {hypothesis[0]:.4f} macro-F1 {hypothesis[1]:.4f}, on the premise alone: "
            f"accuracy {premise[0]:.4f} macro-F1 {premise[1]:.4f}")
    print(f"pair task: {len(train[2])} training pairs, {len(test[2])} test pairs, {args.facts} facts a premise")
    print(line)
    return train, test, line


# ---- data files --------------------------------------------------------------------------------

def read_triples(path: str) -> tuple[list[str], list[str], list[Any]]:
    """(premises, hypotheses, labels) of a TSV/CSV file with a header row or a JSONL file."""
    with open(path, encoding="utf-8", newline="") as f:
        if path.endswith((".jsonl", ".json")):
            records = []
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as error:
                        raise SystemExit(f"{path}:{number}: not a JSON line ({error})") from None
        else:
            records = list(csv.DictReader(f, delimiter="," if path.endswith(".csv") else "\t"))
    columns: dict[str, list[Any]] = {"premise": [], "hypothesis": [], "label": []}
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict) or any(record.get(name) is None for name in columns):
            raise SystemExit(f"{path}: record {number} lacks one of the fields premise, hypothesis, label")
        for name in columns:
            columns[name].append(record[name])
    if not records:
        raise SystemExit(f"{path}: no records")
    return columns["premise"], columns["hypothesis"], columns["label"]


def label_ids(labels: list[Any], names: list[str] | None, path: str) -> tuple[np.ndarray, list[str]]:
    """Labels as ids and the label names: integers as given; names in NLI_LABELS' order where they
    are among them, else sorted. `names` (the training file's) maps an evaluation file's labels."""
    text = [str(label).strip() for label in labels]
    if names is None:
        if all(re.fullmatch(r"\d+", label) for label in text):
            names = [str(i) for i in range(max(int(label) for label in text) + 1)]
        elif set(text) <= set(NLI_LABELS):
            names = list(NLI_LABELS)
        else:
            names = sorted(set(text))
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(text) - set(index))
    if unknown:
        raise SystemExit(f"{path}: labels {unknown[:5]} are not among the training labels {names}")
    return np.array([index[label] for label in text], np.int64), names


# ---- fine-tuning -------------------------------------------------------------------------------

class EpochReport(gt.TrainerCallback):
    """Prints accuracy and macro-F1 after each evaluation."""

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        print(f"epoch {state.epoch:4.2f}: eval loss {metrics['eval_loss']:.4f}  accuracy "
              f"{metrics['eval_accuracy']:.4f}  macro-F1 {metrics['eval_f1_macro']:.4f}", flush=True)


def encode(tokenizer: Any, premises: list[str], hypotheses: list[str], labels: np.ndarray, max_length: int,
           vocab_size: int) -> dict[str, Any]:
    columns = gt.data.tokenize(tokenizer, premises, hypotheses, max_length=max_length)
    largest = int(columns["input_ids"].values.max())
    if largest >= vocab_size:
        raise SystemExit(f"the tokenizer yields id {largest}, but the model's vocabulary has {vocab_size} rows")
    return {**columns, "labels": labels}


def finetune(folder: str, tokenizer: Any, train: tuple, test: tuple, names: list[str],
             args: argparse.Namespace, precision: str, baselines: str = "") -> None:
    model_type = json.load(open(os.path.join(folder, "config.json"), encoding="utf-8")).get("model_type")
    if model_type not in HEADS:
        raise SystemExit(f"{folder}/config.json: model_type {model_type!r} is not one of {sorted(HEADS)}")
    model = HEADS[model_type].from_pretrained(folder, num_labels=len(names))
    longest = model.config.max_position_embeddings - model.config.position_offset
    max_length = min(args.max_length, longest)
    train_set = encode(tokenizer, *train, max_length, model.config.vocab_size)
    test_set = encode(tokenizer, *test, max_length, model.config.vocab_size)
    lengths = np.diff(train_set["input_ids"].offsets)
    print(f"fine-tuning {type(model).__name__} ({len(names)} labels: {', '.join(names)}): {len(train[2])} "
          f"training pairs, {len(test[2])} evaluation pairs, {lengths.min()}-{lengths.max()} tokens "
          f"(mean {lengths.mean():.1f}, at most {max_length}); precision {precision}")
    limit = TimeLimit(args.finetune_seconds)
    training_args = gt.TrainingArguments(
        output_dir=os.path.join(args.output_dir, "nli"), per_device_train_batch_size=args.batch,
        per_device_eval_batch_size=args.eval_batch, gradient_accumulation_steps=args.accumulation,
        num_train_epochs=args.epochs, learning_rate=args.lr, weight_decay=0.01, warmup_ratio=0.06,
        lr_scheduler_type="linear", bf16=precision == "bf16", eval_strategy="epoch", save_strategy="epoch",
        save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="f1_macro", greater_is_better=True,
        logging_strategy="epoch", dataloader_num_workers=args.workers,
        dataloader_prefetch_factor=args.prefetch if args.workers else None, disable_tqdm=True,
        report_to="none", seed=0)
    trainer = gt.Trainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=test_set,
                         compute_metrics=gt.metrics.classification_metrics("macro"),
                         callbacks=[gt.EarlyStoppingCallback(early_stopping_patience=args.patience), EpochReport(),
                                    limit])
    start = time.perf_counter()
    result = trainer.train()
    print(f"fine-tuning: {result.global_step} steps in {time.perf_counter() - start:.0f} s"
          f"{' (time limit)' if limit.stopped else ''}; best macro-F1 at {trainer.state.best_model_checkpoint}")
    predictions = trainer.predict(test_set)
    metrics, predicted = predictions.metrics, predictions.predictions.argmax(-1)
    confusion = np.zeros((len(names), len(names)), np.int64)
    np.add.at(confusion, (test_set["labels"], predicted), 1)
    width = max(8, *map(len, names))
    print("confusion (rows: true, columns: predicted):")
    print(" " * (width + 2) + " ".join(f"{name[:width]:>{width}}" for name in names))
    for name, row in zip(names, confusion):
        print(f"  {name:>{width}} " + " ".join(f"{v:>{width}d}" for v in row))
    chance = np.bincount(test_set["labels"], minlength=len(names)).max() / len(test_set["labels"])
    print(f"evaluation accuracy {metrics['test_accuracy']:.4f}  macro-F1 {metrics['test_f1_macro']:.4f}  "
          f"(majority class: accuracy {chance:.4f})")
    if baselines:
        print(f"  beside: {baselines}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="an encoder folder (default: pre-train a tiny BERT first)")
    parser.add_argument("--train", help="with --model: a TSV/CSV/JSONL of premise, hypothesis, label")
    parser.add_argument("--eval", help="with --model: the evaluation file (default: a tenth of --train)")
    parser.add_argument("--epochs", type=float, default=None, help="default: 3 with --model, 20 without")
    parser.add_argument("--lr", type=float, default=None, help="default: 2e-5 with --model, 3e-4 without")
    parser.add_argument("--batch", type=int, default=48, help="per-device training batch")
    parser.add_argument("--eval-batch", type=int, default=96)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4, help="loader worker processes")
    parser.add_argument("--prefetch", type=int, default=2, help="batches each worker prepares ahead")
    parser.add_argument("--patience", type=int, default=None,
                        help="evaluations without a better macro-F1 (default: 2 with --model, 6 without)")
    parser.add_argument("--max-length", type=int, default=128, help="tokens per pair (longest_first truncation)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="auto: bf16 where this CPU's bf16 GEMMs are native, else fp32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--output-dir", default=None, help="default: a new temporary folder")
    scratch = parser.add_argument_group("without --model")
    scratch.add_argument("--stdlib-files", type=int, default=1000, help="standard-library modules read")
    scratch.add_argument("--vocab", type=int, default=2000, help="WordPiece vocabulary size")
    scratch.add_argument("--seq-len", type=int, default=64, help="masked-LM row length")
    scratch.add_argument("--mlm-copies", type=int, default=4, help="maskings of each row (BERT's dupe_factor)")
    scratch.add_argument("--mlm-seconds", type=float, default=60)
    scratch.add_argument("--mlm-log-steps", type=int, default=20)
    scratch.add_argument("--facts", type=int, default=1, help="facts a premise states")
    scratch.add_argument("--train-pairs", type=int, default=9000)
    scratch.add_argument("--test-pairs", type=int, default=1500)
    parser.add_argument("--finetune-seconds", type=float, default=180, help="stop fine-tuning after this long")
    args = parser.parse_args()
    if args.model is None and (args.train or args.eval):
        parser.error("--train/--eval need --model (without it the example makes its own data)")
    if args.model is not None and not args.train:
        parser.error("--model needs --train FILE")
    if not 1 <= args.facts <= len(ATTRIBUTES):
        parser.error(f"--facts must be 1..{len(ATTRIBUTES)} (each fact takes its own adjective pair)")
    if args.threads:
        gt.set_num_threads(args.threads)
    gt.random.manual_seed(0)
    args.output_dir = args.output_dir or tempfile.mkdtemp(prefix="nli-")
    precision = args.precision
    if precision == "auto":
        precision = "bf16" if "bf16" in gt.info()["cpu_native_gemm"] else "fp32"
    start, baselines = time.perf_counter(), ""
    if args.model is None:
        args.epochs = 20 if args.epochs is None else args.epochs  # the task's plateau at 2/3 lasts ~8 epochs
        args.lr = 3e-4 if args.lr is None else args.lr
        args.patience = 6 if args.patience is None else args.patience
        folder = os.path.join(args.output_dir, "tiny-bert")
        os.makedirs(folder, exist_ok=True)
        modules = stdlib_docstrings(args.stdlib_files)
        paragraphs = [paragraph for _, module in modules for paragraph in module]
        train_wordpiece(paragraphs, args.vocab, folder)
        tokenizer = gt.tokenizer_from_pretrained(folder)
        print(f"WordPiece tokenizer: {tokenizer.vocab_size} tokens from {len(paragraphs)} docstring paragraphs "
              f"of {len(modules)} modules")
        pretrain(folder, tokenizer, paragraphs, args, precision)
        train, test, baselines = generated_task(args)
        names = list(NLI_LABELS)
        print("examples:")
        for premise, hypothesis, label in list(zip(*train))[:3]:
            print(f"  {NLI_LABELS[label]:>13}: {premise!r} / {hypothesis!r}")
    else:
        args.epochs = 3 if args.epochs is None else args.epochs
        args.lr = 2e-5 if args.lr is None else args.lr
        args.patience = 2 if args.patience is None else args.patience
        folder = args.model
        tokenizer = gt.tokenizer_from_pretrained(folder)
        premises, hypotheses, raw = read_triples(args.train)
        labels, names = label_ids(raw, None, args.train)
        if args.eval:
            test_premises, test_hypotheses, test_raw = read_triples(args.eval)
            test = (test_premises, test_hypotheses, label_ids(test_raw, names, args.eval)[0])
            train = (premises, hypotheses, labels)
        else:
            order = np.random.default_rng(0).permutation(len(labels))
            cut = max(1, len(labels) // 10)
            pick = lambda rows: ([premises[i] for i in rows], [hypotheses[i] for i in rows], labels[rows])  # noqa: E731
            test, train = pick(order[:cut]), pick(order[cut:])
    finetune(folder, tokenizer, train, test, names, args, precision, baselines)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
