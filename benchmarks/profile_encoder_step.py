"""gputrain's BERT-base training step or evaluation forward (bench_encoder_step.py's model, batch
and step), repeated, to profile with perf as profile_decoder_step.py does (its run_profiled: one
warm-up, "ready <pid>", then STEPS timed calls):

    ONEDNN_JIT_PROFILE=2 ENCODER_BENCH_THREADS=2 PRECISION=fp32 \\
        python benchmarks/profile_encoder_step.py step 6 > log &
    # after "ready" appears in log:
    perf record -g -p <pid> -o encoder.perf.data     # ends when the script does
    perf report -i encoder.perf.data --no-children --sort dso,symbol

First argument: "step" (TrainStep with AdamW) or "eval" (the eval-mode forward). Environment:
PRECISION (fp32) and bench_encoder_step.py's knobs (ENCODER_BENCH_THREADS, _LAYERS, _T, _BATCH).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _model_bench import gputrain_adamw_step  # noqa: E402
from bench_encoder_step import LR, WEIGHT_DECAY, gputrain_model  # noqa: E402
from gputrain._vocab import c_dtype  # noqa: E402
from profile_decoder_step import run_profiled  # noqa: E402


def main() -> None:
    what, steps = sys.argv[1], int(sys.argv[2])
    precision = os.environ.get("PRECISION", "fp32")
    model, x, y = gputrain_model(training=what == "step")
    if what == "step":
        run_profiled(gputrain_adamw_step(model, x, y, LR, WEIGHT_DECAY, precision), steps)
    else:
        model.compiled.precision = c_dtype(precision)
        model.compiled.refresh_half_parameters()
        run_profiled(lambda: model(x), steps)


if __name__ == "__main__":
    main()
