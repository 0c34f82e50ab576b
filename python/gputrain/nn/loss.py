"""Losses: configuration for the fused training step, and callable on NumPy arrays."""

from __future__ import annotations

import numpy as np


class CrossEntropyLoss:
    """Softmax + negative log-likelihood over the last dimension, mean over counted rows, with
    PyTorch's `label_smoothing` and `ignore_index`. Called on arrays, a batch whose targets are
    all ignored gives NaN (PyTorch's answer); in a TrainStep, 0.0 and no gradient (gputrain.step
    says why)."""

    def __init__(self, label_smoothing: float = 0.0, ignore_index: int = -100) -> None:
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)):
            raise TypeError(f"label_smoothing must be a float, not {type(label_smoothing).__name__}")
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise TypeError(f"ignore_index must be an int, not {type(ignore_index).__name__}")
        if not -2**63 <= ignore_index < 2**63:
            raise ValueError(f"ignore_index must fit in int64 (targets' type), got {ignore_index}")
        self.label_smoothing = float(label_smoothing)
        self.ignore_index = ignore_index

    def _spec(self) -> tuple:
        return ("cross_entropy", self.label_smoothing, self.ignore_index)

    def __call__(self, logits: np.ndarray, targets: np.ndarray) -> float:
        from gputrain import functional

        loss, _ = functional.cross_entropy(logits, targets, label_smoothing=self.label_smoothing,
                                           ignore_index=self.ignore_index)
        return float(loss)

    def __repr__(self) -> str:
        return f"CrossEntropyLoss(label_smoothing={self.label_smoothing}, ignore_index={self.ignore_index})"


class MSELoss:
    """Mean squared error over all elements."""

    def _spec(self) -> tuple:
        return ("mse", 0.0, 0)

    def __call__(self, prediction: np.ndarray, target: np.ndarray) -> float:
        from gputrain import functional

        loss, _ = functional.mse_loss(prediction, target)
        return float(loss)

    def __repr__(self) -> str:
        return "MSELoss()"
