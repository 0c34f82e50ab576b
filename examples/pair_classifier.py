"""Train a TransformerClassifier on a synthetic sentence-pair (NLI-like) task with gputrain's
Trainer, and report accuracy and macro-F1 on held-out pairs. Runs in a few minutes on 2 CPU cores.

The task: content words come in antonym pairs (w, w ^ 1). A premise is 3-12 words drawn (with
repeats, in any order) from a few pairs, one word of each; the hypothesis is 1-3 premise words, and
  entailment:    all of them occur in the premise,
  contradiction: one of them is the antonym of a premise word, the others occur in the premise,
  neutral:       one of them is unrelated to the premise, the others occur in it.
Telling them apart needs each hypothesis word compared with every premise word (attention across
the [SEP]); lengths vary, so every batch is padded and the attention mask does real work.

    python examples/pair_classifier.py [--epochs 6] [--train 8000] [--pooling cls|mean] [--precision fp32|bf16]
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

import gputrain as gt

PAD, CLS, SEP, FIRST_WORD = 0, 1, 2, 4
LABELS = ("entailment", "contradiction", "neutral")


def make_pairs(n: int, vocab: int, rng: np.random.Generator) -> tuple[list[list[int]], list[list[int]], np.ndarray]:
    """n (premise, hypothesis, label) triples over the words [FIRST_WORD, vocab)."""
    num_pairs = (vocab - FIRST_WORD) // 2
    premises, hypotheses = [], []
    labels = rng.integers(0, 3, n)
    for label in labels:
        pairs = rng.choice(num_pairs, size=rng.integers(2, num_pairs // 2 + 1), replace=False)
        words = FIRST_WORD + 2 * pairs + rng.integers(0, 2, len(pairs))  # never both words of a pair
        premise = rng.permutation(np.concatenate([words, rng.choice(words, rng.integers(1, 9))]))
        hypothesis = rng.choice(words, size=rng.integers(1, 4))
        i = rng.integers(len(hypothesis))
        if label == 1:
            hypothesis[i] ^= 1
        elif label == 2:
            unrelated = np.setdiff1d(np.arange(num_pairs), pairs)
            hypothesis[i] = FIRST_WORD + 2 * rng.choice(unrelated) + rng.integers(0, 2)
        premises.append(premise.tolist())
        hypotheses.append(hypothesis.tolist())
    return premises, hypotheses, labels.astype(np.int64)


def dataset(n: int, vocab: int, max_len: int, seed: int) -> dict[str, np.ndarray]:
    premises, hypotheses, labels = make_pairs(n, vocab, np.random.default_rng(seed))
    return {**gt.models.encode_pairs(premises, hypotheses, max_len, CLS, SEP, PAD), "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=float, default=6)
    parser.add_argument("--train", type=int, default=8000, help="training pairs")
    parser.add_argument("--pooling", default="mean", choices=["cls", "mean"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--output-dir", default="pair_classifier_run")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    vocab, max_len = 20, 24
    train, test = dataset(options.train, vocab, max_len, 0), dataset(2000, vocab, max_len, 1)
    lengths = train["attention_mask"].sum(1)
    print(f"{options.train} training pairs, 2000 test pairs; tokens per pair {lengths.min()}-{lengths.max()} "
          f"(mean {lengths.mean():.1f}) padded to {max_len}")
    gt.random.manual_seed(0)
    model = gt.models.TransformerClassifier(vocab, 3, max_len=max_len, d_model=64, num_layers=2, num_heads=4,
                                            dropout=0.0, pooling=options.pooling)
    args = gt.TrainingArguments(
        output_dir=options.output_dir, num_train_epochs=options.epochs, per_device_train_batch_size=32,
        learning_rate=3e-3, weight_decay=0.01, lr_scheduler_type="cosine", warmup_ratio=0.05, max_grad_norm=1.0,
        bf16=options.precision == "bf16", eval_strategy="epoch", logging_strategy="steps", logging_steps=100,
        save_strategy="no", per_device_eval_batch_size=250, seed=0, disable_tqdm=True)
    trainer = gt.Trainer(model, args, train_dataset=train, eval_dataset=test,
                         compute_metrics=gt.metrics.classification_metrics("macro"))
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    metrics = trainer.evaluate()
    predictions = trainer.predict(test).predictions.argmax(-1)
    confusion = np.zeros((3, 3), np.int64)
    np.add.at(confusion, (test["labels"], predictions), 1)
    print(f"\ntrained {options.epochs:g} epochs in {seconds:.0f} s")
    print("confusion (rows: true, columns: predicted):", *LABELS)
    for name, row in zip(LABELS, confusion):
        print(f"  {name:>13}", *(f"{v:5d}" for v in row))
    print(f"test accuracy {metrics['eval_accuracy']:.4f}  macro-F1 {metrics['eval_f1_macro']:.4f} "
          f"(chance: 0.33)")


if __name__ == "__main__":
    main()
