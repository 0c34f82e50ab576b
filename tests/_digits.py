"""scikit-learn's bundled digits for the end-to-end tests: features scaled to [0, 1], shuffled
with seed 0, the first 1500 samples for training and the other 297 for testing."""

from __future__ import annotations

import numpy as np


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): float32 (n, 64) features and int64 labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    y = data.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    return x[:1500], y[:1500], x[1500:], y[1500:]
