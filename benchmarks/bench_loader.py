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

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import gputrain as gt

ROUNDS = 5
TORCH_PYTHON = Path(os.environ.get("GPUTRAIN_TORCH_VENV", "/work/venv-torch")) / "bin" / "python"
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


def memcpy_timer(x: np.ndarray, y: np.ndarray) -> tuple[list[float], callable]:
    """A setup function timing one single-threaded copy of the dataset's bytes per call."""
    x_out, y_out = np.empty_like(x), np.empty_like(y)
    seconds: list[float] = []

    def copy_once() -> None:
        start = time.perf_counter()
        np.copyto(x_out, x)
        np.copyto(y_out, y)
        seconds.append(time.perf_counter() - start)

    return seconds, copy_once


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
times = []
for r in range(rounds + 1):
    start = time.perf_counter()
    for xb, yb in loader:
        pass
    times.append(time.perf_counter() - start)
print(json.dumps({"seconds": times[1:], "torch": torch.__version__}))
"""


def torch_epoch_seconds(spec: dict, workers: int) -> dict | None:
    """Median epoch seconds of PyTorch's loader with the same settings, or None without torch."""
    if not TORCH_PYTHON.exists():
        return None
    args = [str(spec["rows"]), str(spec["features"]), str(spec["batch_size"]), str(workers), "3"]
    done = subprocess.run([str(TORCH_PYTHON), "-c", TORCH_SCRIPT, *args], capture_output=True, text=True,
                          timeout=1800, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {"median": float(np.median(result["seconds"])), "version": result["torch"]}


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_loader_epoch(benchmark, gputrain_benchmark, case, workers):
    name, spec, x, y = case
    loader = gt.DataLoader((x, y), batch_size=spec["batch_size"], shuffle=True, seed=0, num_workers=workers,
                           persistent_workers=workers > 0)

    def epoch() -> None:
        for xb, yb in loader:
            pass

    epoch()  # warm-up: threads started, slots touched
    copy_seconds, copy_once = memcpy_timer(x, y)
    benchmark.pedantic(epoch, setup=copy_once, rounds=ROUNDS, warmup_rounds=0)
    seconds = benchmark.stats.stats.median
    nbytes = epoch_bytes(x, y)
    memcpy_median = float(np.median(copy_seconds))
    torch = torch_epoch_seconds(spec, workers)
    metrics = {
        "case": name, "rows": spec["rows"], "row_bytes": spec["features"] * 4 + 8,
        "batch_size": spec["batch_size"], "num_workers": workers,
        "epoch_seconds_median": seconds, "epoch_seconds_min": benchmark.stats.stats.min,
        "samples_per_s": spec["rows"] / seconds, "gb_per_s": nbytes / seconds / 1e9,
        "memcpy_gb_per_s": nbytes / memcpy_median / 1e9, "ratio_memcpy": memcpy_median / seconds,
        "torch_samples_per_s": spec["rows"] / torch["median"] if torch else None,
        "ratio_torch": torch["median"] / seconds if torch else None,
        "torch_version": torch["version"] if torch else None,
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

    benchmark.pedantic(epoch, rounds=ROUNDS, warmup_rounds=1)
    seconds = benchmark.stats.stats.median
    gputrain_benchmark.record(case=name, samples_per_s=spec["rows"] / seconds,
                              gb_per_s=epoch_bytes(x, y) / seconds / 1e9, epoch_seconds_median=seconds)
