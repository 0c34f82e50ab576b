"""Two builds of gputrain timed against each other on BERT-base (bench_encoder_step.py's model,
batch and step) or on the LoRA step (bench_lora_step.py's), alternating processes: on a VM whose
speed swings 2-3x within minutes, only runs that take turns compare. Each build lives in its own
virtual environment; the first is "old":

    python benchmarks/compare_builds.py /venvs/old/bin/python /venvs/new/bin/python \\
        --what eval --precision bf16 --processes 3 --calls 5

Each process builds the model, runs one warm-up call and times `--calls` calls: the eval-mode
forward ("eval"), TrainStep with AdamW ("step"), or the LoRA step on a frozen Llama-shaped base
("lora"). The processes alternate old, new, old, new...; the table gives each process's median
and the new build's speed over the old, process pair by pair. Environment: bench_encoder_step.py's
knobs (ENCODER_BENCH_THREADS, _LAYERS, _T, _BATCH) or bench_lora_step.py's (LORA_BENCH_THREADS,
_LAYERS, _T, _VOCAB), passed to both builds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


def time_calls(what: str, precision: str, calls: int) -> list[float]:
    """Milliseconds of `calls` calls after one warm-up, in this process's gputrain."""
    sys.path.insert(0, HERE)
    if what == "lora":
        from bench_lora_step import gputrain_lora_call
        call = gputrain_lora_call(precision)
    else:
        call = encoder_call(what, precision)
    call()
    milliseconds = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        milliseconds.append((time.perf_counter() - start) * 1e3)
    return milliseconds


def encoder_call(what: str, precision: str) -> Callable[[], Any]:
    """BERT-base's evaluation forward or training step (bench_encoder_step.py)."""
    from _model_bench import gputrain_adamw_step
    from bench_encoder_step import LR, WEIGHT_DECAY, gputrain_model
    from gputrain._vocab import c_dtype

    model, x, y = gputrain_model(training=what == "step")
    if what == "step":
        call = gputrain_adamw_step(model, x, y, LR, WEIGHT_DECAY, precision)
    else:
        model.compiled.precision = c_dtype(precision)
        model.compiled.refresh_half_parameters()

        def call():
            return model(x)
    return call


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def run_child(python: str, args: argparse.Namespace) -> float:
    """The median milliseconds of one process of `python`'s build."""
    command = [python, os.path.abspath(__file__), "--child", "--what", args.what,
               "--precision", args.precision, "--calls", str(args.calls)]
    done = subprocess.run(command, capture_output=True, text=True, cwd="/tmp", check=False)
    if done.returncode != 0:
        raise SystemExit(f"{python} failed:\n{done.stderr[-4000:]}")
    return median(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pythons", nargs="*", help="the old build's python, then the new one's")
    parser.add_argument("--what", choices=("eval", "step", "lora"), default="eval")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--processes", type=int, default=3, help="processes of each build")
    parser.add_argument("--calls", type=int, default=5, help="timed calls in each process")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(time_calls(args.what, args.precision, args.calls)))
        return
    if len(args.pythons) != 2:
        parser.error("give two interpreters: the old build's, then the new build's")
    knob = "LORA_BENCH_THREADS" if args.what == "lora" else "ENCODER_BENCH_THREADS"
    threads = os.environ.get(knob, "gputrain's default")
    print(f"{args.what}, {args.precision}, threads: {threads}")
    print("| pair | old build (ms) | new build (ms) | new / old speed |")
    print("|---:|---:|---:|---:|")
    for pair in range(1, args.processes + 1):
        old, new = (run_child(python, args) for python in args.pythons)
        print(f"| {pair} | {old:.0f} | {new:.0f} | {old / new:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
