"""Save benchmark results as JSON with the facts needed to compare them later.

    from _record import record
    record("cast_f32_to_bf16", gbps=41.2, memcpy_gbps=45.0, ratio=0.92)

writes ``benchmarks/results/cast_f32_to_bf16.json`` (gitignored) holding the metrics, the date,
and the machine: CPU model, logical CPUs usable, load average, gputrain.info(), NumPy and
Python versions. Inside a benchmark, the ``record`` fixture of benchmarks/conftest.py does the
same. Metrics must be JSON-serialisable (numbers, strings, lists, dicts).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from pathlib import Path
from typing import Any

import numpy as np

import gputrain

RESULTS_DIR = Path(__file__).resolve().parent / "results"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, or platform.processor() elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """What a result depends on besides the code: hardware, load, library versions."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "gputrain": gputrain.info(),
    }


def record(name: str, **metrics: Any) -> Path:
    """Write ``metrics`` with the date and machine_info() to results/<name>.json; returns the path."""
    if not _NAME.match(name):
        raise ValueError(f"name must be letters, digits, '_', '.' or '-', got {name!r}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    document = {
        "name": name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "metrics": metrics,
        "machine": machine_info(),
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", encoding="utf-8")
    return path
