"""The fuzz runner itself: a case that kills its worker or hangs is named, with a reproduction
command, and the other cases of its batch still count."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _fuzz_runner import Pool  # noqa: E402
from _fuzz_values import lit  # noqa: E402


def run(hows: list[str]) -> dict:
    pool = Pool(1, batch_timeout=5.0, case_timeout=3.0)
    pool.submit([(i, "selftest.crash", {"how": lit(how)}) for i, how in enumerate(hows)])
    report = pool.close()
    return {"cases": report.cases, "returned": report.returned,
            "failures": {f["id"]: f for f in report.failures}}


@pytest.mark.skipif("san" in os.environ.get("LD_PRELOAD", ""),
                    reason="under a sanitizer the deliberate crash is a sanitizer report (.ci/sanitizers.sh)")
def test_a_crashing_case_is_named_and_its_batch_neighbours_still_run():
    report = run(["none", "segfault", "none", "wrong"])
    assert report["cases"] == 4 and report["returned"] == 2
    assert set(report["failures"]) == {1, 3}
    crash, wrong = report["failures"][1], report["failures"][3]
    assert "SIGSEGV" in crash["problems"][0] and crash["crashed"]
    assert "--repro" in crash["repro"]
    assert "AttributeError" in wrong["problems"][0]


def test_a_hanging_case_is_named():
    report = run(["none", "hang"])
    assert set(report["failures"]) == {1}
    assert "a hang" in report["failures"][1]["problems"][0]
