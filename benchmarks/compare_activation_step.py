"""The MLP training step with GELU vs ReLU, against PyTorch on the CPU: same model (784 -> 1024 ->
1024 -> 10, batch 256), same SGD-momentum step, same threads. PyTorch's step and ours alternate
round by round, so both see the same machine load; medians of ROUNDS. Needs PyTorch: run it from
a separate venv that has torch, with gputrain's build on PYTHONPATH (never install torch into
the test venv).

    PYTHONPATH=<build>/lib.linux-x86_64-cpython-311 /path/to/venv-with-torch/bin/python benchmarks/compare_activation_step.py
"""

from __future__ import annotations

import numpy as np
import torch

import gputrain as gt
from _timing import Timed

ROUNDS = 30
SIZES = (784, 1024, 1024, 10)


def gputrain_step(activation: str, x: np.ndarray, y: np.ndarray):
    gt.random.manual_seed(0)
    act = gt.nn.GELU if activation == "gelu" else gt.nn.ReLU
    model = gt.nn.Sequential(gt.nn.Linear(SIZES[0], SIZES[1]), act(),
                             gt.nn.Linear(SIZES[1], SIZES[2]), act(),
                             gt.nn.Linear(SIZES[2], SIZES[3]))
    step = gt.TrainStep(model, gt.nn.CrossEntropyLoss(),
                        gt.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    return lambda: step(x, y)


def torch_step(activation: str, x: np.ndarray, y: np.ndarray):
    torch.manual_seed(0)
    act = torch.nn.GELU if activation == "gelu" else torch.nn.ReLU
    model = torch.nn.Sequential(torch.nn.Linear(SIZES[0], SIZES[1]), act(),
                                torch.nn.Linear(SIZES[1], SIZES[2]), act(),
                                torch.nn.Linear(SIZES[2], SIZES[3]))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(tx), ty).backward()
        optimizer.step()

    return step


def main() -> None:
    torch.set_num_threads(gt.get_num_threads())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], 256)
    for activation in ("gelu", "relu"):
        ours, theirs = Timed(gputrain_step(activation, x, y)), Timed(torch_step(activation, x, y))
        ours.fn(), theirs.fn()
        for _ in range(ROUNDS):
            theirs()
            ours()
        ours_ms, theirs_ms = ours.median() * 1e3, theirs.median() * 1e3
        print(f"{activation}: gputrain {ours_ms:.2f} ms, torch {theirs_ms:.2f} ms, "
              f"speed-up {theirs_ms / ours_ms:.2f}x ({gt.get_num_threads()} thread(s))")


if __name__ == "__main__":
    main()
