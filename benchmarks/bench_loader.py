"""gputrain.DataLoader throughput: samples/s and GB/s of one shuffled epoch, for
(a) MNIST-shaped rows (784 float32 + an int64 label, 60000 rows, batch 256) and
(b) 150 KB rows (38400 float32 + an int64 label, 2048 rows, batch 64), num_workers 0, 1, 2.

Baselines measured in the same run:
- a single-threaded memcpy of the same bytes (np.copyto of the dataset arrays), timed before
  every epoch round (pedantic `setup`): ratio_memcpy = loader GB/s / memcpy GB/s (medians);
- PyTorch's DataLoader(TensorDataset(...)) with the same batch size, shuffle and workers, when
  /work/venv-torch exists (run there in a subprocess, since torch is not a gputrain dependency);
- NumPy fancy indexing X[idx], y[idx] per batch in a Python loop (one thread, allocating).

The consumer loop only receives the batches (zero-copy views of the slots), as a training loop
would before its step. Persistent workers for num_workers > 0, and one warm-up epoch.

    PYTHONPATH=<build>/lib.linux-x86_64-cpython-311 python -m pytest -p no:cacheprovider \\
        benchmarks/bench_loader.py --benchmark-only
"""

from __future__ import annotations


import numpy as np
import pytest

import gputrain as gt
from _loader_bench import TIMED_EPOCHS, epoch_of, torch_epochs
from _timing import Timed, pedantic

ROUNDS = 5
CASES = {
    "mnist": dict(rows=60000, features=784, batch_size=256),
    "wide150k": dict(rows=2048, features=38400, batch_size=64),
}


def make_data(rows: int, features: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((rows, features), dtype=np.float32), rng.integers(0, 10, rows).astype(np.int64)


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    spec = CASES[request.param]
    x, y = make_data(spec["rows"], spec["features"])
    return request.param, spec, x, y


def epoch_bytes(x: np.ndarray, y: np.ndarray) -> int:
    return x.nbytes + y.nbytes


def memcpy_timer(x: np.ndarray, y: np.ndarray) -> Timed:
    """A setup function timing one single-threaded copy of the dataset's bytes per call."""
    x_out, y_out = np.empty_like(x), np.empty_like(y)

    def copy_once() -> None:
        np.copyto(x_out, x)
        np.copyto(y_out, y)

    return Timed(copy_once)


TORCH_SCRIPT = """
import json, sys, time
import numpy as np, torch
from torch.utils.data import DataLoader, TensorDataset
rows, features, batch_size, workers, rounds = map(int, sys.argv[1:6])
rng = np.random.default_rng(0)
x = torch.from_numpy(rng.standard_normal((rows, features), dtype=np.float32))
y = torch.from_numpy(rng.integers(0, 10, rows).astype(np.int64))
loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, num_workers=workers,
                    persistent_workers=workers > 0)
""" + TIMED_EPOCHS + """
print(json.dumps({"seconds": times[1:], "torch": torch.__version__}))
"""


def torch_epoch_seconds(spec: dict, workers: int) -> dict | None:
    """Median epoch seconds of PyTorch's loader with the same settings, or None without torch."""
    return torch_epochs(TORCH_SCRIPT, [spec["rows"], spec["features"], spec["batch_size"], workers, 3])


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_loader_epoch(benchmark, gputrain_benchmark, case, workers):
    name, spec, x, y = case
    loader = gt.DataLoader((x, y), batch_size=spec["batch_size"], shuffle=True, seed=0, num_workers=workers,
                           persistent_workers=workers > 0)

    epoch = epoch_of(loader)
    epoch()  # warm-up: threads started, slots touched
    memcpy = memcpy_timer(x, y)
    rounds = pedantic(benchmark, epoch, setup=memcpy, rounds=ROUNDS, warmup_rounds=0)
    seconds = rounds.median
    nbytes = epoch_bytes(x, y)
    memcpy_median = memcpy.median()
    torch = torch_epoch_seconds(spec, workers)
    metrics = {
        "case": name, "rows": spec["rows"], "row_bytes": spec["features"] * 4 + 8,
        "batch_size": spec["batch_size"], "num_workers": workers,
        "epoch_seconds_median": seconds, "epoch_seconds_min": rounds.min,
        "samples_per_s": spec["rows"] / seconds, "gb_per_s": nbytes / seconds / 1e9,
        "memcpy_gb_per_s": nbytes / memcpy_median / 1e9, "ratio_memcpy": memcpy_median / seconds,
        "torch_samples_per_s": spec["rows"] / torch["median"] if torch else None,
        "ratio_torch": torch["median"] / seconds if torch else None,
        "torch_version": torch["torch"] if torch else None,
    }
    gputrain_benchmark.record(**metrics)


def test_numpy_fancy_index_peer(benchmark, gputrain_benchmark, case):
    """What slicing the arrays by hand in Python costs, for scale."""
    name, spec, x, y = case
    order = gt.data.RandomSampler(spec["rows"], seed=0).rows(0)
    starts = range(0, spec["rows"], spec["batch_size"])

    def epoch() -> None:
        for start in starts:
            idx = order[start:start + spec["batch_size"]]
            x[idx], y[idx]

    seconds = pedantic(benchmark, epoch, rounds=ROUNDS, warmup_rounds=1).median
    gputrain_benchmark.record(case=name, samples_per_s=spec["rows"] / seconds,
                              gb_per_s=epoch_bytes(x, y) / seconds / 1e9, epoch_seconds_median=seconds)
