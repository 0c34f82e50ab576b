"""Trainer overhead: gputrain.Trainer against the hand-written loop it replaces, on the digits MLP.

The recipe of examples/train_digits.py (MLP 64 -> 256 -> 10 with GELU and dropout, bf16, AdamW
with two weight-decay groups, cosine schedule with warm-up, clipping, label smoothing, 2 loader
batches of 32 per optimizer step, an EMA updated after every step), 10 epochs = 240 optimizer
steps per run, no evaluation or checkpoints (logging once per epoch). The hand-written loop does
the same work -- checked: both end with bit-identical weights -- with a DataLoader, TrainStep,
the scheduler and EMA.update(). Each round runs the loop (pytest-benchmark's `setup`, timed by
itself) and then Trainer.train(), so both see the same machine load; "pair overhead" is the
median over rounds of Trainer run / loop run, minus 1 ("overhead": of the medians), and per
step in microseconds. The Trainer's
construction (model compile, optimizer, loader) is outside the timing of both; train()'s own
fixed costs (start-up block with the memory plan, history file, final log) are inside it.

    python -m pytest benchmarks/bench_trainer.py --benchmark-only
    # the progress bar case needs tqdm (pip install tqdm); GPUTRAIN_BENCH_THREADS=1: one thread
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

import gputrain as gt
from _timing import Timed, pedantic

EPOCHS, BATCH, ACCUMULATION = 10, 32, 2
ROUNDS = 21

if os.environ.get("GPUTRAIN_BENCH_THREADS"):  # e.g. 1: steadier on a shared machine
    gt.set_num_threads(int(os.environ["GPUTRAIN_BENCH_THREADS"]))


def digits() -> tuple[np.ndarray, np.ndarray]:
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_digits()
    x = (data.data / 16.0).astype(np.float32)
    order = np.random.default_rng(0).permutation(len(x))
    return x[order][:1500], data.target.astype(np.int64)[order][:1500]


def model() -> gt.nn.Module:
    gt.random.manual_seed(0)
    return gt.nn.Sequential(gt.nn.Linear(64, 256), gt.nn.GELU(), gt.nn.Dropout(0.1), gt.nn.Linear(256, 10))


def arguments(output_dir: str, progress_bar: bool) -> gt.TrainingArguments:
    return gt.TrainingArguments(
        output_dir=output_dir, num_train_epochs=EPOCHS, per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION, learning_rate=3e-3, weight_decay=0.01, lr_scheduler_type="cosine",
        warmup_ratio=0.05, max_grad_norm=1.0, label_smoothing_factor=0.05, bf16=True, ema_decay=0.99,
        eval_strategy="no", logging_strategy="epoch", save_strategy="no", seed=0, disable_tqdm=not progress_bar)


def hand_loop(x: np.ndarray, y: np.ndarray, args: gt.TrainingArguments):
    """The loop a user writes without the Trainer, built now; returns (run, its model)."""
    m = model()
    steps = EPOCHS * -(-len(x) // (BATCH * ACCUMULATION))
    opt = gt.optim.AdamW(gt.optim.param_groups_weight_decay(m, args.weight_decay), lr=args.learning_rate,
                         weight_decay=args.weight_decay)
    sched = gt.optim.get_scheduler("cosine", opt, num_warmup_steps=args.get_warmup_steps(steps),
                                   num_training_steps=steps)
    ema = gt.optim.EMA(m, decay=args.ema_decay)
    step = gt.TrainStep(m, gt.nn.CrossEntropyLoss(label_smoothing=args.label_smoothing_factor), opt,
                        precision="bf16", max_grad_norm=args.max_grad_norm, scheduler=sched, log_grad_norm=True)
    loader = gt.DataLoader((x, y), batch_size=BATCH * ACCUMULATION, shuffle=True, seed=args.seed)

    def run() -> None:
        for _ in range(EPOCHS):
            for xb, yb in loader:
                step.micro_batches = -(-len(xb) // BATCH)  # the last, short group: 1
                if not step(xb, yb).skipped:
                    ema.update()

    return run, m


def make_trainer(x: np.ndarray, y: np.ndarray, output_dir: str, progress_bar: bool) -> gt.Trainer:
    return gt.Trainer(model(), arguments(output_dir, progress_bar), train_dataset=(x, y))


@pytest.mark.parametrize("progress_bar", [False, True], ids=["no-bar", "tqdm-bar"])
def test_trainer_overhead(benchmark, gputrain_benchmark, progress_bar, tmp_path):
    if progress_bar:
        pytest.importorskip("tqdm")
    logging.getLogger("gputrain.trainer").setLevel(logging.WARNING)  # the bar shows at WARNING and below
    x, y = digits()
    args = arguments(str(tmp_path), progress_bar)
    # The same work: the loop and the Trainer end with bit-identical weights.
    run, loop_model = hand_loop(x, y, args)
    run()
    check = make_trainer(x, y, str(tmp_path), progress_bar)
    check.train()
    steps = check.state.global_step
    for (name, a), (_, b) in zip(loop_model.state_dict().items(), check.model.state_dict().items()):
        assert np.array_equal(a, b), f"the loop and the Trainer differ in {name}"

    loop = Timed(run)

    def before_round():
        loop.fn, _ = hand_loop(x, y, args)  # a fresh loop each round, built outside the timing
        loop()
        return (make_trainer(x, y, str(tmp_path), progress_bar),), {}

    rounds = pedantic(benchmark, lambda trainer: trainer.train(), setup=before_round, rounds=ROUNDS,
                      warmup_rounds=1)
    loop_seconds = loop.seconds[-len(rounds.seconds):]  # not the warm-up round's
    trainer_s, loop_s = rounds.median, float(np.median(loop_seconds))
    pair_ratios = np.array(rounds.seconds) / np.array(loop_seconds)
    metrics = {
        "steps_per_run": steps,
        "progress_bar": progress_bar,
        "loop_step_us": loop_s / steps * 1e6,
        "trainer_step_us": trainer_s / steps * 1e6,
        "overhead_per_step_us": (trainer_s - loop_s) / steps * 1e6,
        "overhead_fraction": trainer_s / loop_s - 1.0,
        "pair_overhead_fraction": float(np.median(pair_ratios)) - 1.0,
        "best_overhead_fraction": rounds.min / min(loop_seconds) - 1.0,
        "threads": gt.get_num_threads(),
        "load_average": os.getloadavg()[0],
    }
    gputrain_benchmark.record(**metrics)
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()})
