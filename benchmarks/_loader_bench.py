"""What the DataLoader benchmarks (bench_loader.py, bench_dataset.py, bench_imagefolder.py) share:
an epoch over a loader, and PyTorch's DataLoader timed by a script in a separate venv."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

TORCH_PYTHON = Path(os.environ.get("GPUTRAIN_TORCH_VENV", "/work/venv-torch")) / "bin" / "python"

# The end of each PyTorch script: `rounds` timed epochs of its `loader` after a warm-up epoch.
TIMED_EPOCHS = '''
times = []
for r in range(rounds + 1):
    start = time.perf_counter()
    for xb, yb in loader:
        pass
    times.append(time.perf_counter() - start)
'''


def epoch_of(loader: Iterable[Any]) -> Callable[[], None]:
    """One pass over loader's batches."""
    def epoch() -> None:
        for _ in loader:
            pass

    return epoch


def torch_epochs(script: str, args: list[Any], check: bool = True) -> dict[str, Any] | None:
    """Runs script (which prints a JSON line with the epochs' "seconds") with TORCH_PYTHON and args;
    that line with "median" (of the seconds) added, or None without that venv, or when the script
    fails and not `check` (its stderr's end printed)."""
    if not TORCH_PYTHON.exists():
        return None
    done = subprocess.run([str(TORCH_PYTHON), "-c", script, *map(str, args)], capture_output=True, text=True,
                          timeout=1800, check=check)
    if done.returncode != 0:
        print(done.stderr[-2000:])
        return None
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "median": float(np.median(result["seconds"]))}
