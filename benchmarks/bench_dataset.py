"""gputrain.DataLoader over a map-style Dataset object whose __getitem__ does ~50 µs of Python
work and returns (256 float32, an int label): batches/s of one shuffled epoch (4096 samples,
batch 32) at num_workers 0 and 2 (worker processes, persistent, prefetch_factor 2).

Baseline in the same run: PyTorch's DataLoader over the same dataset class (same work, same
batch size, shuffle, workers, persistent workers and prefetch factor), run from /work/venv-torch
in a subprocess right after ours, when that venv exists. The Python work per sample is
calibrated once here and handed to PyTorch's run, so both do the same loop.

    PYTHONPATH=<build>/lib.linux-x86_64-cpython-311 python -m pytest -p no:cacheprovider \\
        benchmarks/bench_dataset.py --benchmark-only
"""

from __future__ import annotations

import pytest

import gputrain as gt
from _loader_bench import TIMED_EPOCHS, epoch_of, torch_epochs
from _timing import Timed, pedantic

ROUNDS = 3
SAMPLES = 4096
BATCH = 32

DATASET = '''
import numpy as np

class BusyDataset:
    """Each sample costs `loops` iterations of Python arithmetic (about 50 µs), then an array."""

    def __init__(self, n, loops):
        self.n, self.loops = n, loops
        self.base = np.random.default_rng(0).standard_normal((n, 256), dtype=np.float32)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        acc = 0
        for k in range(self.loops):
            acc += (k * i) % 7
        return self.base[i] + np.float32(acc % 3), i % 10
'''
namespace: dict = {}
exec(DATASET, namespace)
BusyDataset = namespace["BusyDataset"]


def calibrate(target_s: float = 50e-6) -> int:
    """Loop iterations that take `target_s` in this interpreter (median of repeats)."""
    probe = Timed(lambda: BusyDataset(1, 2000)[0])
    for _ in range(20):
        probe()
    return max(int(2000 * target_s / probe.median()), 1)


TORCH_SCRIPT = DATASET + '''
import json, sys, time
import torch
from torch.utils.data import DataLoader
samples, batch, loops, workers, rounds = map(int, sys.argv[1:6])
loader = DataLoader(BusyDataset(samples, loops), batch_size=batch, shuffle=True, num_workers=workers,
                    persistent_workers=workers > 0, prefetch_factor=2 if workers else None)
''' + TIMED_EPOCHS + '''
print(json.dumps({"seconds": times[1:], "torch": torch.__version__}))
'''


@pytest.fixture(scope="module")
def loops():
    return calibrate()


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_epoch(benchmark, gputrain_benchmark, loops, workers):
    loader = gt.DataLoader(BusyDataset(SAMPLES, loops), batch_size=BATCH, shuffle=True, seed=0,
                           num_workers=workers, persistent_workers=workers > 0,
                           prefetch_factor=2 if workers else None)

    epoch = epoch_of(loader)
    epoch()  # warm-up: workers started, slots sized
    seconds = pedantic(benchmark, epoch, rounds=ROUNDS, warmup_rounds=0).median
    batches = -(-SAMPLES // BATCH)
    torch = torch_epochs(TORCH_SCRIPT, [SAMPLES, BATCH, loops, workers, ROUNDS])
    gputrain_benchmark.record(
        samples=SAMPLES, batch_size=BATCH, num_workers=workers, python_loops_per_sample=loops,
        epoch_seconds_median=seconds, batches_per_s=batches / seconds, us_per_sample=seconds / SAMPLES * 1e6,
        torch_batches_per_s=batches / torch["median"] if torch else None,
        ratio_torch=torch["median"] / seconds if torch else None,
        torch_version=torch["torch"] if torch else None,
    )
