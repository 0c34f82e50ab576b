"""The MLP training step with GELU vs ReLU, against PyTorch on the CPU: bench_step's model (784 ->
1024 -> 1024 -> 10, batch 256) and SGD-momentum step, same threads. PyTorch's step and ours
alternate round by round, so both see the same machine load; medians of ROUNDS. Needs PyTorch: run it from
a separate venv that has torch, with gputrain's build on PYTHONPATH (never install torch into
the test venv).

    PYTHONPATH=<build>/lib.linux-x86_64-cpython-311 /path/to/venv-with-torch/bin/python benchmarks/compare_activation_step.py
"""

from __future__ import annotations

import gputrain as gt
from _timing import Timed
from bench_step import gputrain_step, torch_step

ROUNDS = 30


def main() -> None:
    for activation in ("gelu", "relu"):
        ours = Timed(gputrain_step("fp32", activation))
        theirs = Timed(torch_step(activation=activation))  # with gputrain's thread count
        ours.fn(), theirs.fn()
        for _ in range(ROUNDS):
            theirs()
            ours()
        ours_ms, theirs_ms = ours.median() * 1e3, theirs.median() * 1e3
        print(f"{activation}: gputrain {ours_ms:.2f} ms, torch {theirs_ms:.2f} ms, "
              f"speed-up {theirs_ms / ours_ms:.2f}x ({gt.get_num_threads()} thread(s))")


if __name__ == "__main__":
    main()
