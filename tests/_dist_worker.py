"""A few training steps of a small MLP or GPT, as one rank of `mpiexec -n N` (the batch's rows
of this rank) or as one process accumulating the N ranks' micro-batches in rank order (the
reference). test_distributed.py runs it; it writes the weights and the step results."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

import gputrain as gt
from gputrain import distributed as dist

nn = gt.nn
ROWS = 4  # rows of a rank's micro-batch


def model_and_batches(kind: str, world: int, steps: int):
    gt.random.manual_seed(3)
    rng = np.random.default_rng(7)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Dropout(0.1), nn.Linear(32, 5))
        batches = [(rng.standard_normal((world * ROWS, 12)).astype(np.float32), rng.integers(0, 5, world * ROWS))
                   for _ in range(steps)]
    else:
        model = gt.models.GPT(vocab_size=23, block_size=8, n_layer=2, n_head=2, n_embd=16, dropout=0.1)
        tokens = [rng.integers(0, 23, (world * ROWS, 9)) for _ in range(steps)]
        batches = [(t[:, :-1], t[:, 1:]) for t in tokens]
    return model, batches


def train(kind: str, world: int, rank: int | None, steps: int, precision: str, clip: float | None,
          device: str = "cpu"):
    """rank None: the one-process reference (world micro-batches per step); else rank's rows."""
    model, batches = model_and_batches(kind, world, steps)
    model.to(device)
    scaler = gt.amp.GradScaler(init_scale=2.0**12) if precision == "fp16" else None
    step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters(), lr=1e-2),
                        micro_batches=world if rank is None else 1, precision=precision,
                        max_grad_norm=clip, scaler=scaler, log_grad_norm=True)
    results = []
    for x, y in batches:
        rows = slice(None) if rank is None else slice(rank * ROWS, (rank + 1) * ROWS)
        gt.memory.device_counters(device, reset=True) if device != "cpu" else None
        out = step(x[rows], y[rows])
        if device != "cpu":  # the collectives run on the device: only the record's head comes back, one wait
            grads = 4 * sum(int(np.prod(p.shape)) for p in model.parameters())
            counts = gt.memory.device_counters(device)  # h2d: the batch and the record's zeros
            assert counts["d2h_bytes"] == 32 and counts["h2d_bytes"] < grads and counts["syncs"] == 1, counts
        results.append((out.loss, out.grad_norm, float(out.skipped), out.scale))
    return model.state_dict(), np.array(results)


def trainer_run(out: str, rank: int, resume: bool) -> None:
    """Trainer over 16 rows (each rank's loader: its 8) with a checkpoint at step 2 of 2; with
    `resume`, one process continues that checkpoint: epoch 1, its 4 batches, to step 6."""
    x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3) / 48
    y = np.arange(16) % 2
    loader = gt.DataLoader((np.arange(16), y), batch_size=4, shuffle=True, seed=1)
    rows = np.concatenate([batch[0] for batch in loader])
    gt.random.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 2))
    args = gt.TrainingArguments(output_dir=f"{out}-out", per_device_train_batch_size=4, max_steps=6 if resume else 2,
                                save_steps=2, logging_steps=1, learning_rate=0.1, disable_tqdm=True)
    trainer = gt.Trainer(model, args, train_dataset=(x, y))
    trainer.train(resume_from_checkpoint=f"{out}-out/checkpoint-2" if resume else None)
    if resume:
        print(f"resumed at step 2, trained to step {trainer.state.global_step}")
    else:
        np.savez(f"{out}.rank{rank}.npz", rows=rows, weight=model.state_dict()["0.weight"])


def check_collectives(rank: int, world: int) -> None:
    """Every collective against NumPy, for sizes below, at and above the rank count and the bucket;
    the all-reduce's bytes against the ring minimum 2 (N - 1) / N x 4n."""
    comm = dist.communicator()
    for n in (0, 1, world - 1, world + 1, 1000, (1 << 20) + 3):
        values = [np.random.default_rng(r * 7 + n).standard_normal(n).astype(np.float32) for r in range(world)]
        expected = values[0].copy()
        for v in values[1:]:
            expected += v  # rank order
        got, before = values[rank].copy(), comm.bytes_sent
        dist.all_reduce(got)
        assert np.array_equal(got, expected), ("allreduce", n)
        chunks = [n * r // world for r in range(world + 1)]  # the chunk layout of comm.h, up to rounding
        sent = sum(4 * (c1 - c0) for c0, c1 in zip(chunks, chunks[1:]) for _ in range(world - 1))
        assert abs((comm.bytes_sent - before) - sent * 2 / world) <= 8 * world, (n, comm.bytes_sent - before, sent)
        gathered = np.zeros(n, np.float32)
        bounds = [n // world * r + n % world * r // world for r in range(world + 1)]
        gathered[bounds[rank]:bounds[rank + 1]] = rank + 1
        comm.allgather(gathered)
        assert np.array_equal(gathered, np.repeat(np.arange(1, world + 1, dtype=np.float32), np.diff(bounds)))
    table = np.full((3, 5), rank, np.int32)
    dist.broadcast(table, root=world - 1)
    assert (table == world - 1).all()
    dist.barrier()
    print(f"rank {rank} collectives OK", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=["mlp", "gpt"])
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--die-at-step", type=int, default=None, help="rank 1 exits before this step")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--bucket-bytes", type=int, default=None, help="gradient bucket size of the overlap")
    parser.add_argument("--die-how", choices=["exit", "hang"], default="exit")
    parser.add_argument("--trainer", action="store_true", help="the Trainer and DataLoader run")
    parser.add_argument("--collectives", action="store_true", help="check every collective against NumPy")
    parser.add_argument("--device-model", action="store_true", help="a sync=False step of a model on sim:0 is refused")
    parser.add_argument("--device", default="cpu",
                        help="the ranks' models run there (the reference's on the cpu); cuda-per-rank: cuda:<rank>")
    parser.add_argument("--broadcast-params", action="store_true",
                        help="ranks seeded differently: their weights before and after broadcast_parameters")
    parser.add_argument("--raise-on-rank-1", action="store_true", help="rank 1 raises before its first step")
    parser.add_argument("--resume", action="store_true", help="with --trainer: one process resumes")
    parser.add_argument("--reference", type=int, default=None, metavar="N",
                        help="one process, N micro-batches per step: the reference of N ranks")
    args = parser.parse_args()
    if args.reference is not None:
        weights, results = train(args.kind, args.reference, None, args.steps, args.precision, args.clip)
        np.savez(f"{args.out}.reference.npz", results=results, **weights)
        return
    dist.init(timeout=args.timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.bucket_bytes is not None:
        default = dist.communicator().bucket_bytes
        try:
            dist.communicator().bucket_bytes = 6  # not whole float32s: refused, nothing changed
        except ValueError as error:
            assert "bucket_bytes" in str(error) and dist.communicator().bucket_bytes == default == 25 << 20
        else:
            raise AssertionError("bucket_bytes = 6 was accepted")
        dist.communicator().bucket_bytes = args.bucket_bytes
    if args.raise_on_rank_1 and rank == 1:
        raise ValueError("rank 1 fails on purpose")
    if args.device_model:
        model = nn.Sequential(nn.Linear(3, 2)).to("sim")
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters()), sync=False)
        loader = gt.DataLoader((np.ones((2, 3), np.float32), np.zeros(2, np.int64)), batch_size=2, device="sim")
        try:
            step(*next(iter(loader)))
        except ValueError as error:
            print(f"rank {rank} ValueError: {error}", flush=True)
        return
    if args.collectives:
        check_collectives(rank, world)
        return
    if args.broadcast_params:
        gt.random.manual_seed(10 + rank)
        model = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.Linear(32, 5)).to(args.device)
        before = model.state_dict()
        gt.memory.device_counters(args.device, reset=True) if args.device != "cpu" else None
        dist.broadcast_parameters(model, root=world - 1)
        if args.device != "cpu":  # sent by the device: no parameter byte crossed to the host; one wait
            counts = gt.memory.device_counters(args.device)
            assert counts["d2h_bytes"] == 0 and counts["syncs"] == 1, counts
        np.savez(f"{args.out}.rank{rank}.npz", **{f"before.{k}": v for k, v in before.items()},
                 **{f"after.{k}": v for k, v in model.state_dict().items()})
        return
    if args.trainer:
        trainer_run(args.out, rank, args.resume)
        return
    if args.die_at_step is not None:
        model, batches = model_and_batches(args.kind, world, args.steps)
        model.to(args.device)
        step = gt.TrainStep(model, nn.CrossEntropyLoss(), gt.optim.AdamW(model.parameters()))
        for i, (x, y) in enumerate(batches):
            if i == args.die_at_step and rank == 1:
                os._exit(0) if args.die_how == "exit" else time.sleep(3 * args.timeout)
            started = time.monotonic()
            try:
                step(x[rank * ROWS:(rank + 1) * ROWS], y[rank * ROWS:(rank + 1) * ROWS])
                print(f"rank {rank} step {i} done", flush=True)
            except OSError as error:  # TimeoutError, or a closed connection (the TCP transport)
                print(f"rank {rank} {type(error).__name__} after {time.monotonic() - started:.1f} s: {error}",
                      flush=True)
                os._exit(3)
        return
    device = f"cuda:{rank}" if args.device == "cuda-per-rank" else args.device
    weights, results = train(args.kind, world, rank, args.steps, args.precision, args.clip, device)
    np.savez(f"{args.out}.rank{rank}.npz", results=results, buckets_early=dist.communicator().buckets_early,
             **weights)
    dist.destroy()


if __name__ == "__main__":
    sys.exit(main())
