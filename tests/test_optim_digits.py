"""End to end: an MLP on scikit-learn's bundled digits trained by the one-call TrainStep with
AdamW (no decay on biases), cosine warm-up, clipping and an EMA of the weights reaches 97%, with
bit-identical weights for every cpu_offload_fraction."""

from __future__ import annotations

import numpy as np

import gputrain as gt
from _digits import digits
from gputrain import nn

FRACTIONS = [0.0, 0.25, 0.5, 1.0]
EPOCHS = 20
BATCH = 32


def _train(fraction: float) -> tuple[np.ndarray, float, float]:
    x_train, y_train, x_test, y_test = digits()
    gt.random.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    groups = gt.optim.param_groups_weight_decay(model, weight_decay=0.01)
    optimizer = gt.optim.AdamW(groups, lr=3e-3, cpu_offload_fraction=fraction, offload_chunk_numel=1000)
    steps_per_epoch = len(x_train) // BATCH
    scheduler = gt.optim.get_scheduler("cosine", optimizer, num_warmup_steps=steps_per_epoch,
                                       num_training_steps=EPOCHS * steps_per_epoch)
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), optimizer, max_grad_norm=1.0, scheduler=scheduler)
    ema = gt.optim.EMA(model, decay=0.99, use_warmup=True)
    rng = np.random.default_rng(1)
    for _ in range(EPOCHS):
        order = rng.permutation(len(x_train))
        for i in range(steps_per_epoch):
            idx = order[i * BATCH:(i + 1) * BATCH]
            if not step(x_train[idx], y_train[idx]).skipped:
                ema.update()
    model.eval()
    accuracy = float((model(x_test).argmax(1) == y_test).mean())
    with ema.average_parameters():
        ema_accuracy = float((model(x_test).argmax(1) == y_test).mean())
    weights = np.concatenate([p.data.ravel() for p in model.parameters()])
    return weights, accuracy, ema_accuracy


def test_digits_mlp_with_adamw_schedule_clipping_ema_for_every_offload_fraction():
    reference, accuracy, ema_accuracy = _train(0.0)
    assert accuracy >= 0.97 and ema_accuracy >= 0.97, (accuracy, ema_accuracy)
    for fraction in FRACTIONS[1:]:
        weights, acc, ema_acc = _train(fraction)
        np.testing.assert_array_equal(weights, reference)
        assert (acc, ema_acc) == (accuracy, ema_accuracy)
