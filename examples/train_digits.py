"""Train an MLP on scikit-learn's bundled digits (no download) with gputrain's Trainer: bf16,
AdamW with a cosine schedule and warm-up, gradient clipping, gradient accumulation (2 loader
batches per optimizer step, as in Hugging Face), an EMA of the weights for evaluation, and
accuracy / macro-F1 after every epoch. Each optimizer step is one call into C.

    python examples/train_digits.py [--precision fp32|bf16|fp16] [--epochs 30] [--output-dir digits_run]

The start-up block (active optimisations and the memory plan) and the logs go through Python's
logging; the history is written to <output-dir>/history.jsonl (and plotted to history.png when
matplotlib is installed). --save keeps a checkpoint per epoch (resume with --resume).
"""

from __future__ import annotations

import argparse
import json
import logging
import os

import numpy as np
from sklearn.datasets import load_digits

import gputrain as gt


def load() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1500], y[:1500], x[1500:], y[1500:]


def plot(output_dir: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    with open(os.path.join(output_dir, "history.jsonl")) as f:
        history = [json.loads(line) for line in f]
    train = [(e["step"], e["loss"]) for e in history if "loss" in e]
    evals = [(e["step"], e["eval_accuracy"]) for e in history if "eval_accuracy" in e]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(*zip(*train))
    left.set(xlabel="step", ylabel="training loss")
    right.plot(*zip(*evals), marker="o")
    right.set(xlabel="step", ylabel="test accuracy (EMA weights)")
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, "history.png"), dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--epochs", type=float, default=30)
    parser.add_argument("--output-dir", default="digits_run")
    parser.add_argument("--save", action="store_true", help="write a checkpoint after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from the last checkpoint")
    options = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    x_train, y_train, x_test, y_test = load()
    gt.random.manual_seed(0)
    model = gt.nn.Sequential(gt.nn.Linear(64, 256), gt.nn.GELU(), gt.nn.Dropout(0.1), gt.nn.Linear(256, 10))
    args = gt.TrainingArguments(
        output_dir=options.output_dir, num_train_epochs=options.epochs, per_device_train_batch_size=32,
        gradient_accumulation_steps=2, learning_rate=3e-3, weight_decay=0.01, optim="adamw_torch",
        lr_scheduler_type="cosine", warmup_ratio=0.05, max_grad_norm=1.0, label_smoothing_factor=0.05,
        bf16=options.precision == "bf16", fp16=options.precision == "fp16", ema_decay=0.99,
        eval_strategy="epoch", logging_strategy="epoch", save_strategy="epoch" if options.save else "no",
        save_total_limit=2, metric_for_best_model="f1_macro", seed=0)
    trainer = gt.Trainer(model, args, train_dataset=(x_train, y_train), eval_dataset=(x_test, y_test),
                         compute_metrics=gt.metrics.classification_metrics("macro"))
    result = trainer.train(resume_from_checkpoint=True if options.resume else None)
    metrics = trainer.evaluate()
    print(model)
    print(f"test accuracy {metrics['eval_accuracy']:.2%}, macro-F1 {metrics['eval_f1_macro']:.4f} "
          f"(EMA weights); {result.metrics['train_samples_per_second']:,.0f} samples/s on "
          f"{gt.info()['cpu_count']} CPU cores ({options.precision})")
    plot(options.output_dir)


if __name__ == "__main__":
    main()
