"""Fuzzing: every public function, constructor and method of gputrain called with generated bad
input must raise an exception of its allow-list (never crash, hang or raise something else), leave
the objects it was called on exactly as they were, and leave its array inputs unchanged.

hypothesis draws the cases (tests/fuzz/_fuzz_targets.py), worker processes run them in batches
(_fuzz_worker.py) so a crash fails one case instead of the test session, and a crashed batch is
re-run case by case to name the case (_fuzz_runner.py). See tests/fuzz/README.md:

    GPUTRAIN_FUZZ_CASES=200000 python -m pytest -q tests/fuzz      # a longer run
"""

from __future__ import annotations

import itertools
import json
import os
import random
import sys
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_runner import Pool, Report  # noqa: E402
from _fuzz_targets import Target, all_targets  # noqa: E402

CASES = int(os.environ.get("GPUTRAIN_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("GPUTRAIN_FUZZ_SEED", str(random.randrange(2**32))))
WORKERS = int(os.environ.get("GPUTRAIN_FUZZ_WORKERS", str(min(4, len(os.sched_getaffinity(0))))))
BATCH = 25  # cases per hypothesis example and per worker call
TARGETS = all_targets()


def run_fuzz() -> tuple[Report, float]:
    pool = Pool(WORKERS)
    ids = itertools.count()
    # Each target gets CASES / len(TARGETS) cases (one one_of over all targets drew some 2 and
    # others 150 times in 2,000 cases); hypothesis generates each case's arguments.
    per_target = max(1, -(-CASES // len(TARGETS)))  # at least CASES in all
    batch = min(BATCH, per_target)

    def generate_for(target: Target) -> None:
        @seed(SEED)
        @settings(max_examples=-(-per_target // batch), database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(st.lists(target.strategy(), min_size=batch, max_size=batch))
        def generate(cases: list[tuple[str, dict[str, Any]]]) -> None:
            pool.submit([(next(ids), name, args) for name, args in cases])

        generate()

    started = time.monotonic()
    try:
        for target in TARGETS:
            generate_for(target)
    finally:
        report = pool.close()
    return report, time.monotonic() - started


@pytest.fixture(scope="module")
def fuzz_report() -> Report:
    report, seconds = run_fuzz()
    print(f"\nfuzz: {report.cases} cases in {seconds:.0f} s (seed {SEED}, {WORKERS} workers): "
          f"{report.raised} rejected with an allowed exception, {report.returned} returned, "
          f"{len(report.failures)} failed")
    path = os.environ.get("GPUTRAIN_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"seed": SEED, "cases": report.cases, "raised": report.raised, "returned": report.returned,
                       "per_target": report.per_target, "failures": report.failures}, f, indent=1, default=repr)
    return report


def describe(failures: list[dict[str, Any]], limit: int = 8) -> str:
    lines = []
    seen: set[tuple[str, str]] = set()
    for f in failures:
        key = (f["target"], f["problems"][0][:60])
        if key in seen:
            continue
        seen.add(key)
        lines.append(f"- {f['target']}({f['args']!r}):\n    " + "\n    ".join(f["problems"])[:1500]
                     + f"\n    repro: {f['repro']}")
        if len(lines) == limit:
            break
    return f"{len(failures)} failing cases (seed {SEED}); distinct ones:\n" + "\n".join(lines)


def test_every_target_ran(fuzz_report: Report) -> None:
    if CASES < len(TARGETS):
        pytest.skip("fewer cases than targets")
    assert not [t.name for t in TARGETS if t.name not in fuzz_report.per_target]


def test_bad_input_never_crashes_and_raises_an_allowed_exception(fuzz_report: Report) -> None:
    assert not fuzz_report.failures, describe(fuzz_report.failures)
