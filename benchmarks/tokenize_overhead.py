"""gt.data.tokenize against the `tokenizers` call it makes: 100k short sentence pairs through a
BERT WordPiece tokenizer (tests/fixtures/tok/bert), truncation to 128, no padding. The baseline
is `backend.encode_batch(pairs)` alone (the Rust work, Encodings returned); gputrain's call adds
copying the ids and type ids into flat int64 columns and the offsets. Rounds alternate the two so
both see the same machine load; medians of the rounds, same thread settings (tokenizers' Rayon
pool, RAYON_NUM_THREADS if set). gt.data.tokenize encodes in chunks, copying one chunk's ids
while tokenizers encodes the next (gputrain/data/_tokenize.py).

    python benchmarks/tokenize_overhead.py [--pairs 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import gputrain as gt

WORDS = ("the a fox dog cat runs jumps sleeps over under quick lazy brown warm sun committee budget meeting "
         "model premise hypothesis entails contradicts neutral sentence pair encoder token label").split()


def pairs(count: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    first = [" ".join(rng.choices(WORDS, k=rng.randint(6, 20))) + "." for _ in range(count)]
    second = [" ".join(rng.choices(WORDS, k=rng.randint(3, 10))) + "." for _ in range(count)]
    return first, second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    folder = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tok" / "bert"
    tok = gt.tokenizer_from_pretrained(folder)
    backend = tok.backend_tokenizer
    first, second = pairs(args.pairs)

    def baseline() -> float:
        backend.enable_truncation(128)
        backend.no_padding()
        start = time.perf_counter()
        backend.encode_batch(list(zip(first, second)))
        return time.perf_counter() - start

    def ours() -> float:
        start = time.perf_counter()
        gt.data.tokenize(tok, first, second, max_length=128)
        return time.perf_counter() - start

    baseline(), ours()  # warm up (Rayon's pool, caches)
    base_times, our_times = [], []
    for _ in range(args.rounds):
        base_times.append(baseline())
        our_times.append(ours())
    base, mine = statistics.median(base_times), statistics.median(our_times)
    pairwise = statistics.median(o / b for o, b in zip(our_times, base_times))
    per_pair = gt.data.tokenize(tok, first[:1000], second[:1000])["input_ids"].lengths.mean()
    print(f"{args.pairs} pairs ({per_pair:.0f} tokens a pair), {args.rounds} alternating rounds, medians:")
    for name, median, times in (("tokenizers encode_batch", base, base_times), ("gt.data.tokenize", mine, our_times)):
        rounds = ", ".join(f"{t * 1e3:.0f}" for t in times)
        print(f"  {name + ':':26} {median * 1e3:8.1f} ms   (rounds: {rounds})")
    print(f"  overhead: {100 * (mine / base - 1):+.1f}% (ratio of the medians), {100 * (pairwise - 1):+.1f}% "
          "(median of each round's ratio)")

if __name__ == "__main__":
    main()
