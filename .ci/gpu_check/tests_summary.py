"""One page from a pytest JUnit XML (.ci/gpu_check.sh tests): counts, then each failure's and
error's first lines, then the skip reasons with their counts.

    python .ci/gpu_check/tests_summary.py tests.xml pytest.log EXIT_STATUS > tests.txt
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET

FIRST_LINES = 3      # of each failure's message
MOST_FAILURES = 40   # listed one by one; the rest counted


def outcomes(xml_path: str) -> list[tuple[str, str, str]]:
    """(outcome, test id, message) of every test case in the JUnit XML."""
    cases = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = child.get("message") or (child.text or "")
                break
        cases.append((outcome, name, message))
    return cases


def first_lines(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()][:FIRST_LINES]
    return "\n      ".join(lines)


def summary(xml_path: str, log_path: str, status: str) -> str:
    try:
        cases = outcomes(xml_path)
    except (OSError, ET.ParseError) as error:
        with open(log_path, errors="replace") as log:
            tail = log.read()[-4000:]
        return f"pytest exit {status}; no readable JUnit XML ({error}). The log's end:\n{tail}"
    counts = collections.Counter(outcome for outcome, _, _ in cases)
    stopped = {"124": " (stopped at the phase's limit: the tests after it did not run)",
               "137": " (killed after the phase's limit: the XML may lack the last tests)"}.get(status, "")
    lines = [f"cuda tests: {len(cases)} ({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}); "
             f"pytest exit {status}{stopped}"]
    bad = [c for c in cases if c[0] in ("failed", "error")]
    for outcome, name, message in bad[:MOST_FAILURES]:
        lines.append(f"  {outcome.upper()} {name}\n      {first_lines(message)}")
    if len(bad) > MOST_FAILURES:
        lines.append(f"  ... and {len(bad) - MOST_FAILURES} more (tests.xml)")
    skips = collections.Counter(first_lines(m).splitlines()[0] if m else "" for o, _, m in cases if o == "skipped")
    for reason, n in skips.most_common(10):
        lines.append(f"  skipped x{n}: {reason}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(*sys.argv[1:4]))
