"""gputrain.metrics against scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn import metrics as sk

import gputrain as gt

M = gt.metrics


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("average", ["macro", "micro"])
def test_multiclass_against_sklearn(seed, average):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, 200)
    predictions = np.where(rng.random(200) < 0.6, labels, rng.integers(0, 6, 200))  # class 5 is only predicted
    p, r, f, _ = sk.precision_recall_fscore_support(labels, predictions, average=average, zero_division=0)
    assert M.precision_recall_f1(labels, predictions, average) == pytest.approx((p, r, f), abs=1e-12)
    assert M.f1_score(labels, predictions, average) == pytest.approx(f, abs=1e-12)
    assert M.accuracy(labels, predictions) == pytest.approx(sk.accuracy_score(labels, predictions))


def test_binary_against_sklearn():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 100)
    predictions = np.where(rng.random(100) < 0.7, labels, 1 - labels)
    expected = sk.precision_recall_fscore_support(labels, predictions, average="binary", zero_division=0)[:3]
    assert M.precision_recall_f1(labels, predictions, "binary") == pytest.approx(expected, abs=1e-12)
    assert M.precision_recall_f1(labels, np.zeros(100, int), "binary") == (0.0, 0.0, 0.0)  # zero_division=0
    with pytest.raises(ValueError, match="average='binary' needs at most 2 classes"):
        M.precision_recall_f1([0, 1, 2], [0, 1, 2], "binary")


def test_logits_and_ignore_index():
    logits = np.array([[2.0, 1.0], [0.0, 3.0], [5.0, 0.0], [0.0, 1.0]])
    labels = np.array([0, 1, 1, -100])
    assert M.accuracy(labels, logits) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="does not match labels"):
        M.accuracy(labels, logits[:3])
    with pytest.raises(ValueError, match="average must be one of"):
        M.precision_recall_f1(labels, logits, "weighted")


def test_perplexity_and_classification_metrics():
    assert M.perplexity(math.log(7.0)) == pytest.approx(7.0)
    assert M.perplexity(1e6) == math.inf
    compute = M.classification_metrics("macro")
    labels = np.array([0, 1, 2, 2])
    out = compute(M.EvalPrediction(np.eye(3)[[0, 1, 1, 2]], labels))
    assert out["accuracy"] == 0.75
    assert out["f1_macro"] == pytest.approx(sk.f1_score(labels, [0, 1, 1, 2], average="macro"))
