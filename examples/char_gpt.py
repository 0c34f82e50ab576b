"""A character-level GPT trained on text every Python install has: the standard library's own
sources. It prints the unigram entropy of the characters (the loss of a model that ignores
context), the training loss and tokens/s as it goes, the validation loss at the end, and a
sample generated with the key/value cache. Runs in a few minutes on a 2-core CPU.

    python examples/char_gpt.py [--steps 600] [--precision fp32|bf16] [--threads N]
    mpiexec -n 2 python examples/char_gpt.py --distributed    # data parallel: 2 ranks share each batch
    python -m gputrain.distributed.run --nproc-per-node 2 examples/char_gpt.py --distributed  # the same, no MPI

Each optimizer step (forward, backward, AdamW, all in C) is one call. On a machine whose cores
are busy with other work, --threads 1 can be much faster than more threads waiting for each other.
"""

from __future__ import annotations

import argparse
import builtins
import os
import sysconfig
import time

import numpy as np

import gputrain as gt
from gputrain.models import GPT

FILES = ("textwrap.py", "string.py", "shlex.py", "fractions.py", "calendar.py", "heapq.py",
         "bisect.py", "dataclasses.py", "functools.py", "argparse.py")


def load_text() -> str:
    stdlib = sysconfig.get_paths()["stdlib"]
    parts = []
    for name in FILES:
        path = os.path.join(stdlib, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                parts.append(f.read())
    if not parts:
        raise SystemExit(f"none of {FILES} found under {stdlib}")
    return "\n".join(parts)


def unigram_entropy(ids: np.ndarray, vocab: int) -> float:
    """Entropy in nats of the characters' frequencies: the loss of the best context-free model."""
    p = np.bincount(ids, minlength=vocab) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def batches(ids: np.ndarray, block: int, batch: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(ids) - block - 1, batch)
        window = ids[starts[:, None] + np.arange(block + 1)]
        yield window[:, :-1], window[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embd", type=int, default=128)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--distributed", action="store_true",
                        help="data parallelism over the ranks of mpiexec/srun (mpi4py + mpich) or of a "
                        "torchrun-style launcher such as gputrain.distributed.run (TCP, no MPI)")
    args = parser.parse_args()
    if args.threads:
        gt.set_num_threads(args.threads)
    if args.distributed:
        gt.distributed.init()
    rank, world = gt.distributed.get_rank(), gt.distributed.get_world_size()
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split into {world} equal shares")
    share = args.batch // world  # every rank draws the same global batch and trains on its rows
    print = builtins.print if rank == 0 else (lambda *a, **k: None)  # rank 0 reports

    text = load_text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in text], dtype=np.int64)
    split = int(0.9 * len(ids))
    train, val = ids[:split], ids[split:]
    entropy = unigram_entropy(train, len(chars))
    print(f"{len(text):,} characters from {len(FILES)} stdlib files, vocabulary {len(chars)}")
    print(f"unigram entropy: {entropy:.3f} nats/char ({entropy / np.log(2):.3f} bits)")

    gt.random.manual_seed(0)
    model = GPT(vocab_size=len(chars), block_size=args.block, n_layer=args.layers, n_head=4,
                n_embd=args.embd, dropout=0.0)
    print(f"GPT: {model.num_parameters():,} parameters, {args.layers} layers, n_embd {args.embd}, "
          f"block {args.block}, batch {args.batch}, {args.precision}, {gt.get_num_threads()} threads"
          + (f" x {world} ranks" if world > 1 else ""))
    optimizer = gt.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.99), weight_decay=0.0)
    # linear warm-up over 50 steps, then cosine decay to a tenth
    schedule = gt.optim.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 50) * (
        0.1 + 0.45 * (1 + np.cos(np.pi * min(s, args.steps) / args.steps))))
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=args.precision, max_grad_norm=1.0)
    data = batches(train, args.block, args.batch, np.random.default_rng(0))

    start, tokens, recent = time.perf_counter(), 0, []
    for i in range(1, args.steps + 1):
        x, y = next(data)
        recent.append(step(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]).loss)
        schedule.step()
        tokens += x.size
        if i % 50 == 0 or i == 1:
            elapsed = time.perf_counter() - start
            print(f"step {i:4d}  loss {np.mean(recent):.3f}  {tokens / elapsed:,.0f} tokens/s  {elapsed:.0f} s")
            recent = []
    elapsed = time.perf_counter() - start
    if rank != 0:  # the ranks hold the same weights: rank 0 evaluates and samples
        return

    model.eval()
    starts = np.arange(0, len(val) - args.block - 1, args.block)[:256]
    val_losses = []
    for chunk in np.array_split(starts, max(1, len(starts) // 32)):
        window = val[chunk[:, None] + np.arange(args.block + 1)]
        logits = model(window[:, :-1]).astype(np.float64)
        z = logits - logits.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        val_losses.append(-np.take_along_axis(logp, window[:, 1:, None], -1).mean())
    val_loss = float(np.mean(val_losses))
    print(f"trained {args.steps} steps in {elapsed:.0f} s ({tokens / elapsed:,.0f} tokens/s)")
    print(f"validation loss {val_loss:.3f} nats/char vs unigram entropy {entropy:.3f} "
          f"({val_loss / entropy:.0%} of it)")

    prompt = np.array([index[c] for c in "def "], dtype=np.int64)
    t0 = time.perf_counter()
    sample = model.generate(prompt, 400, temperature=0.8, top_k=20, seed=0, do_sample=True)
    rate = 400 / (time.perf_counter() - t0)
    print(f"--- sample (temperature 0.8, top_k 20, KV cache, {rate:,.0f} tokens/s) ---")
    print("".join(chars[i] for i in sample))


if __name__ == "__main__":
    main()
