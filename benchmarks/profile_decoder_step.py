"""gputrain's decoder training step (bench_decoder_step.py's model and step), repeated, to profile
with perf: builds the model cut to 4 layers, runs one warm-up step, prints "ready <pid>", then
runs STEPS steps and prints their times. Attach perf after "ready" (the profile in
benchmarks/README.md, "Decoder training step"):

    ONEDNN_JIT_PROFILE=2 THREADS=2 python benchmarks/profile_decoder_step.py qwen3 4 > log &
    # after "ready" appears in log:
    perf record -g -p <pid> -o decoder.perf.data     # ends when the script does
    perf report -i decoder.perf.data --no-children --sort dso,symbol

ONEDNN_JIT_PROFILE=2 makes oneDNN write /tmp/perf-<pid>.map, so its JIT kernels get names.
Environment: THREADS (2), PRECISION (bf16), VOCAB (the model's), LAYERS (4), T (256).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import gputrain as gt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decoder_memory_plan import CLASSES, CONFIGS  # noqa: E402


def main() -> None:
    family, steps = sys.argv[1], int(sys.argv[2])
    gt.set_num_threads(int(os.environ.get("THREADS", "2")))
    config = dict(CONFIGS[family], num_hidden_layers=int(os.environ.get("LAYERS", "4")))
    if os.environ.get("VOCAB"):
        config["vocab_size"] = int(os.environ["VOCAB"])
    seq = int(os.environ.get("T", "256"))
    model = getattr(gt.models, CLASSES[family])(config)
    model.train()
    tokens = np.random.default_rng(0).integers(0, config["vocab_size"], (1, seq + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    optimizer = gt.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(), optimizer, precision=os.environ.get("PRECISION", "bf16"))
    run_profiled(lambda: step(x, y), steps)


def run_profiled(call: Callable[[], Any], steps: int) -> None:
    """One warm-up call, "ready <pid>", 2 s to attach perf, then `steps` timed calls and their
    milliseconds (profile_encoder_step.py uses it too)."""
    call()
    print("ready", os.getpid(), flush=True)
    time.sleep(2)  # time to attach perf
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    print("step ms", [round(s * 1e3) for s in seconds], "median", round(float(np.median(seconds)) * 1e3), flush=True)


if __name__ == "__main__":
    main()
