"""gputrain's LoRA step on a frozen Llama-shaped base (bench_lora_step.py's model, adapter, batch
and step), repeated, to profile with perf as profile_decoder_step.py does (its run_profiled: one
warm-up, "ready <pid>", then STEPS timed calls). The cross-entropy's 3.9% of the bf16 step at 1
thread was found so (benchmarks/README.md, the LoRA section):

    ONEDNN_JIT_PROFILE=2 LORA_BENCH_THREADS=1 PRECISION=bf16 \\
        python benchmarks/profile_lora_step.py 8 > log &
    # after "ready" appears in log:
    perf record -p <pid> -o lora.perf.data     # ends when the script does
    perf report -i lora.perf.data --no-children --sort dso,symbol

Argument: STEPS. Environment: PRECISION (bf16) and bench_lora_step.py's knobs
(LORA_BENCH_THREADS, _LAYERS, _T, _VOCAB).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_lora_step import gputrain_lora_call  # noqa: E402
from profile_decoder_step import run_profiled  # noqa: E402


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    run_profiled(gputrain_lora_call(os.environ.get("PRECISION", "bf16")), steps)


if __name__ == "__main__":
    main()
