"""Evaluation metrics in NumPy (scikit-learn's definitions) and the Trainer's EvalPrediction.

    trainer = gt.Trainer(model, args, ..., compute_metrics=gt.metrics.classification_metrics("macro"))
    gt.metrics.f1_score(labels, predictions, average="macro")

Predictions may be class ids or logits (argmax over the last axis is taken for a float array
with one more dimension than the labels). Labels equal to `ignore_index` (-100) are left out,
as in Hugging Face's token classification.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "EvalPrediction",
    "PredictionOutput",
    "accuracy",
    "classification_metrics",
    "f1_score",
    "perplexity",
    "precision_recall_f1",
]

AVERAGES = ("binary", "macro", "micro")


class EvalPrediction(NamedTuple):
    """What compute_metrics receives (Hugging Face's shape): the model outputs and the labels."""

    predictions: np.ndarray
    label_ids: np.ndarray | None


class PredictionOutput(NamedTuple):
    """What Trainer.predict returns: outputs, labels, and the metrics prefixed with "test_"."""

    predictions: np.ndarray
    label_ids: np.ndarray | None
    metrics: dict[str, float]


def _classes(labels: Any, predictions: Any, ignore_index: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat integer (labels, predicted classes), rows with ignore_index left out."""
    labels = np.asarray(labels)
    predictions = np.asarray(predictions)
    if predictions.ndim == labels.ndim + 1:
        predictions = predictions.argmax(-1)
    if predictions.shape != labels.shape:
        raise ValueError(f"predictions: shape {predictions.shape} does not match labels {labels.shape} "
                         "(give class ids of the same shape, or logits with one more axis)")
    labels, predictions = labels.reshape(-1), predictions.reshape(-1)
    keep = labels != ignore_index
    return labels[keep].astype(np.int64), predictions[keep].astype(np.int64)


def accuracy(labels: Any, predictions: Any, ignore_index: int = -100) -> float:
    """The share of rows whose predicted class is the label (0.0 for no rows)."""
    y, p = _classes(labels, predictions, ignore_index)
    return float((y == p).mean()) if y.size else 0.0


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator with 0 where the denominator is 0 (sklearn's zero_division=0)."""
    out = np.zeros(np.shape(numerator), np.float64)
    np.divide(numerator, denominator, out=out, where=np.asarray(denominator) != 0)
    return out


def precision_recall_f1(labels: Any, predictions: Any, average: str = "macro", pos_label: int = 1,
                        ignore_index: int = -100) -> tuple[float, float, float]:
    """(precision, recall, F1) as sklearn's precision_recall_fscore_support with zero_division=0.

    average: "binary" (the class pos_label only), "macro" (unweighted mean over the classes that
    occur in labels or predictions) or "micro" (from the global true/false positive counts).
    """
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {list(AVERAGES)}, got {average!r}")
    y, p = _classes(labels, predictions, ignore_index)
    classes = np.union1d(y, p)
    if average == "binary":
        if classes.size > 2:
            raise ValueError(f"average='binary' needs at most 2 classes, found {classes.size}; use 'macro' or 'micro'")
        classes = np.array([pos_label])
    true_positive = np.array([np.sum((p == c) & (y == c)) for c in classes], np.float64)
    predicted = np.array([np.sum(p == c) for c in classes], np.float64)
    actual = np.array([np.sum(y == c) for c in classes], np.float64)
    if average == "micro":
        true_positive, predicted, actual = true_positive.sum(), predicted.sum(), actual.sum()
    precision = _ratio(true_positive, predicted)
    recall = _ratio(true_positive, actual)
    f1 = _ratio(2 * true_positive, predicted + actual)
    return float(np.mean(precision)), float(np.mean(recall)), float(np.mean(f1))


def f1_score(labels: Any, predictions: Any, average: str = "macro", pos_label: int = 1,
             ignore_index: int = -100) -> float:
    """F1 as sklearn.metrics.f1_score (zero_division=0)."""
    return precision_recall_f1(labels, predictions, average, pos_label, ignore_index)[2]


def perplexity(mean_loss: float) -> float:
    """exp(mean cross-entropy in nats); inf when it overflows."""
    with np.errstate(over="ignore"):
        return float(np.exp(np.float64(mean_loss)))


def classification_metrics(average: str = "macro") -> Callable[[EvalPrediction], dict[str, float]]:
    """A compute_metrics for classifiers: accuracy, precision, recall and F1 with `average`."""
    if average not in AVERAGES:
        raise ValueError(f"average must be one of {list(AVERAGES)}, got {average!r}")

    def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
        precision, recall, f1 = precision_recall_f1(prediction.label_ids, prediction.predictions, average)
        return {"accuracy": accuracy(prediction.label_ids, prediction.predictions),
                f"precision_{average}": precision, f"recall_{average}": recall, f"f1_{average}": f1}

    return compute_metrics
