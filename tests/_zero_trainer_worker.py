"""The Trainer with TrainingArguments(zero_stage=1) against zero_stage=0, as one rank of
`mpiexec -n N` or as one process: test_distributed.py runs it 2 ranks -> 3 ranks -> 1 process,
each run resuming the checkpoint the run before wrote. Both settings train in the same process
(outputs <out>-zero0-out and <out>-zero1-out); it prints "identical" when the weights, the
logged losses and gradient norms and the checkpoint's files are the same bit for bit."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

import gputrain as gt
from gputrain import checkpoint as ckpt
from gputrain import distributed as dist
from gputrain.optim.zero import shard_range

nn = gt.nn
ROWS = 24  # the dataset's rows: 3 batches of 4 per rank on 2 ranks, 2 on 3, 6 on one process


def run(out: str, zero_stage: int, max_steps: int, resume_step: int | None, fp16: bool, device: str) -> gt.Trainer:
    """A Trainer of an MLP of 581 parameters (uneven shards over 2 and 3 ranks) to max_steps,
    checkpointing every 2 steps, resuming checkpoint-<resume_step> when given."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((ROWS, 12)).astype(np.float32)
    y = rng.integers(0, 5, ROWS)
    gt.random.manual_seed(2)
    model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 5))
    args = gt.TrainingArguments(output_dir=f"{out}-zero{zero_stage}-out", per_device_train_batch_size=4,
                                max_steps=max_steps, save_steps=2, logging_steps=1, learning_rate=0.05,
                                max_grad_norm=0.5, fp16=fp16, device=device, zero_stage=zero_stage,
                                disable_tqdm=True)
    trainer = gt.Trainer(model, args, train_dataset=(x, y))
    trainer.train(resume_from_checkpoint=f"{args.output_dir}/checkpoint-{resume_step}" if resume_step else None)
    return trainer


def checkpoint_files(directory: str) -> dict[str, object]:
    """What a checkpoint holds that must not depend on zero_stage."""
    with open(os.path.join(directory, "optimizer.json"), encoding="utf-8") as f:
        meta = json.load(f)
    with open(os.path.join(directory, "trainer_state.json"), encoding="utf-8") as f:
        history = steps_logged(json.load(f)["log_history"])
    scaler = os.path.join(directory, "scaler.json")
    return {"optimizer": ckpt.load_arrays(os.path.join(directory, "optimizer.safetensors")), "meta": meta,
            "scaler": ckpt.load_json(scaler) if os.path.exists(scaler) else None,
            "model": ckpt.load_arrays(os.path.join(directory, "model.safetensors")), "history": history}


def steps_logged(history: list[dict[str, object]]) -> list[dict[str, object]]:
    """The per-step logs of a log_history (not the run's timings)."""
    return [entry for entry in history if "train_runtime" not in entry]


def assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), (where, a, b)
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b), where
    else:
        assert json.dumps(a) == json.dumps(b), (where, a, b)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("max_steps", type=int)
    parser.add_argument("--resume", type=int, default=None, metavar="STEP", help="resume checkpoint-STEP")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    dist.init(timeout=60.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    plain = run(args.out, 0, args.max_steps, args.resume, args.fp16, args.device)
    sharded = run(args.out, 1, args.max_steps, args.resume, args.fp16, args.device)
    assert (sharded.optimizer._shard is not None) == (world > 1), "zero_stage=1 shards over the ranks only"
    first, end = shard_range(581, world, rank)
    note = f"this rank keeps elements [{first}, {end}) of 581's state" if world > 1 else "one process: the whole"
    assert note in sharded._startup_block() and "zero_stage" not in plain._startup_block(), note
    plans = [t.memory_plan().settings.get("optimizer_shards", 1) for t in (plain, sharded)]
    assert plans == [1, world if world > 1 else 1], plans
    assert_same(sharded.model.state_dict(), plain.model.state_dict(), "weights")
    assert_same(steps_logged(sharded.state.log_history), steps_logged(plain.state.log_history), "log_history")
    saved = [sorted(os.listdir(f"{args.out}-zero{stage}-out")) for stage in (0, 1)]
    assert saved[0] == saved[1], saved
    newest = max((name for name in saved[1] if name.startswith("checkpoint-")), key=lambda n: int(n.split("-")[1]))
    assert_same(checkpoint_files(f"{args.out}-zero1-out/{newest}"),
                checkpoint_files(f"{args.out}-zero0-out/{newest}"), newest)
    print(f"rank {rank} of {world} identical at step {sharded.state.global_step}, {newest}", flush=True)
    dist.destroy()


if __name__ == "__main__":
    sys.exit(main())
