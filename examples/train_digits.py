"""Train an MLP on scikit-learn's bundled digits (no download) with gputrain: AdamW with a
cosine schedule and warm-up, gradient clipping, gradient accumulation, and a prefetching
DataLoader; each training step is one call into C.

    python examples/train_digits.py [--precision fp32|bf16|fp16] [--epochs 30]
"""

from __future__ import annotations

import argparse
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--epochs", type=int, default=30)
    args = parser.parse_args()

    x_train, y_train, x_test, y_test = load()
    gt.random.manual_seed(0)
    model = gt.nn.Sequential(gt.nn.Linear(64, 256), gt.nn.GELU(), gt.nn.Dropout(0.1), gt.nn.Linear(256, 10))
    loader = gt.DataLoader((x_train, y_train), batch_size=64, shuffle=True, drop_last=True, seed=0)
    optimizer = gt.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    total_steps = args.epochs * len(loader)
    scheduler = gt.optim.get_scheduler("cosine", optimizer, num_warmup_steps=total_steps // 20,
                                       num_training_steps=total_steps)
    scaler = gt.amp.GradScaler() if args.precision == "fp16" else None
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(label_smoothing=0.05), optimizer, scheduler=scheduler,
                        gradient_accumulation_steps=2, max_grad_norm=1.0, precision=args.precision,
                        scaler=scaler)

    print(model)
    print(model.summary((32, 64), precision={"fp32": "f32", "bf16": "bf16", "fp16": "f16"}[args.precision]))
    start = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        losses = [step(x, y).loss for x, y in loader]
        if epoch % 5 == 4 or epoch == args.epochs - 1:
            accuracy = (model.eval()(x_test).argmax(1) == y_test).mean()
            print(f"epoch {epoch + 1:3d}  loss {np.mean(losses):.4f}  test accuracy {accuracy:.2%}")
    seconds = time.perf_counter() - start
    samples = args.epochs * len(loader) * 64
    print(f"{samples / seconds:,.0f} samples/s on {gt.info()['cpu_count']} CPU cores ({args.precision})")


if __name__ == "__main__":
    main()
