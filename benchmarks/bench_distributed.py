"""Data parallelism on CPU ranks: the GPT step on 2 ranks against 1, and the bytes the step's
all-reduce sends against the ring minimum.

Each rank runs one thread and a micro-batch of BATCH sequences (weak scaling: 2 ranks train
on twice the tokens per step). Scaling efficiency = tokens/s of 2 ranks / (2 x tokens/s of 1
rank); on a machine with fewer free cores than ranks x threads it measures the machine, not the
collectives. Bytes: this rank's bytes_sent per step against 2 (N - 1) / N x 4 x parameters, the
minimum of a ring all-reduce (the loss sum adds 8 (N - 1) bytes).

    python -m pytest benchmarks/bench_distributed.py --benchmark-only     # needs mpi4py + mpich
    mpiexec -n 2 python benchmarks/bench_distributed.py                    # one measurement, JSON

GPUTRAIN_BUCKET_BYTES sets the gradient bucket size (default 25 MiB: this GPT's 3 MiB of
gradients is one bucket, exchanged after the backward; smaller buckets overlap it).
GPUTRAIN_ZERO_STAGE=1 shards AdamW's state (ZeRO-1: reduce-scatter, shard update, all-gather);
optimizer_bytes is one rank's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import gputrain as gt
from gputrain import distributed as dist
from gputrain.models import GPT

LAYERS, EMBD, SEQ, BATCH = 4, 128, 64, 8
STEPS, WARMUP = 20, 3


def measure() -> dict[str, float]:
    """Run as a rank: tokens/s of the whole job and bytes sent per step by this rank."""
    gt.set_num_threads(1)
    dist.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    if dist.communicator() is not None and os.environ.get("GPUTRAIN_BUCKET_BYTES"):
        dist.communicator().bucket_bytes = int(os.environ["GPUTRAIN_BUCKET_BYTES"])
    gt.random.manual_seed(0)
    model = GPT(vocab_size=65, block_size=SEQ, n_layer=LAYERS, n_head=4, n_embd=EMBD, dropout=0.0)
    optimizer = gt.optim.AdamW(model.parameters(), lr=1e-3, zero_stage=int(os.environ.get("GPUTRAIN_ZERO_STAGE", "0")))
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer)
    rng = np.random.default_rng(rank)
    tokens = rng.integers(0, 65, (STEPS + WARMUP, BATCH, SEQ + 1))
    for i in range(WARMUP):
        step(tokens[i, :, :-1], tokens[i, :, 1:])
    dist.barrier()
    sent, start = dist.bytes_sent(), time.perf_counter()
    for i in range(WARMUP, WARMUP + STEPS):
        step(tokens[i, :, :-1], tokens[i, :, 1:])
    elapsed = time.perf_counter() - start
    params = model.num_parameters()
    result = {"rank": rank, "ranks": world, "tokens_per_s": world * STEPS * BATCH * SEQ / elapsed,
              "bytes_per_step": (dist.bytes_sent() - sent) / STEPS,
              "ring_minimum_bytes": 2 * (world - 1) / world * 4 * params, "parameters": params,
              "optimizer_bytes": optimizer.memory()["device_bytes"],
              "buckets_early": dist.communicator().buckets_early if dist.communicator() is not None else 0}
    dist.destroy()
    return result


def run_job(ranks: int) -> dict[str, float]:
    beside = Path(sys.executable).with_name("mpiexec")  # the mpich wheel's, in this environment
    mpiexec = str(beside) if beside.exists() else shutil.which("mpiexec") or "mpiexec"
    done = subprocess.run([mpiexec, "-n", str(ranks), sys.executable, __file__], capture_output=True,
                          text=True, timeout=600, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_ranks_against_one(benchmark, gputrain_benchmark):
    runs = {}
    benchmark.pedantic(lambda: runs.update({n: run_job(n) for n in (1, 2)}), rounds=1, iterations=1)
    one, two = runs[1], runs[2]
    gputrain_benchmark.record(tokens_per_s_1=one["tokens_per_s"], tokens_per_s_2=two["tokens_per_s"],
                              scaling_efficiency=two["tokens_per_s"] / (2 * one["tokens_per_s"]),
                              bytes_per_step=two["bytes_per_step"], ring_minimum_bytes=two["ring_minimum_bytes"],
                              bytes_ratio=two["bytes_per_step"] / two["ring_minimum_bytes"], cores=os.cpu_count())


if __name__ == "__main__":
    out = measure()
    if out["rank"] == 0:
        print(json.dumps(out))
