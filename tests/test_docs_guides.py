"""The guides' code runs (docs/index.md and docs/guides/*.md), so the pages cannot rot.

Each page's ```python blocks run in order, as one script, in a fresh interpreter in a temporary
directory. Two HTML comments just before a block change that:

    <!-- not run: the reason -->                   the block is shown but not run (a GPU, mpiexec)
    <!-- ci: "text" -> "replacement"; ... -->      run with small sizes or the committed fixtures:
                                                   each text must occur in the block (\" is a
                                                   quote); {fixtures} in a replacement is
                                                   tests/fixtures/hf

A page must run at least one block. The whole file stays well under a minute.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "hf"
PAGES = [ROOT / "docs" / "index.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]
_BLOCK = re.compile(r"(?:<!--(?P<note>[^\n]*?)-->\s*\n)?```python[^\n]*\n(?P<code>.*?)^```", re.S | re.M)
_SWAP = re.compile(r'"((?:[^"\\]|\\.)*)"\s*->\s*"((?:[^"\\]|\\.)*)"')


def blocks(page: pathlib.Path) -> list[tuple[int, str]]:
    """(line, code to run) of each block of `page` that runs, its ci replacements applied."""
    text = page.read_text()
    found = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code")) + 1
        note, code = (match.group("note") or "").strip(), match.group("code")
        if note.startswith("not run:"):
            assert note[len("not run:"):].strip(), f"{page.name}:{line}: say why the block is not run"
            continue
        if note.startswith("ci:"):
            for old, new in _SWAP.findall(note):
                old, new = old.replace('\\"', '"'), new.replace('\\"', '"')
                assert old in code, f"{page.name}:{line}: the ci replacement {old!r} is not in the block"
                code = code.replace(old, new.replace("{fixtures}", str(FIXTURES)))
        elif note:
            raise AssertionError(f"{page.name}:{line}: unknown note before a block: {note!r}")
        found.append((line, code))
    return found


@pytest.mark.native_only  # a fresh interpreter per page: minutes under qemu, for code the suite covers there
@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_the_pages_code_runs(page, tmp_path):
    runnable = blocks(page)
    assert runnable, f"{page.name} has no block that runs"
    script = "".join(f"# --- {page.name}, line {line}\n{code}\n" for line, code in runnable)
    (tmp_path / "guide.py").write_text(script)
    env = dict(os.environ, PYTHONUNBUFFERED="1", GPUTRAIN_GUIDE_TEST="1")
    done = subprocess.run([sys.executable, "guide.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, f"{page.name}'s code failed:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"


def test_notes_are_checked(tmp_path):
    """A replacement that no longer matches, or a note of an unknown kind, fails the page."""
    bad = [('<!-- ci: "absent" -> "x" -->\n```python\nprint(1)\n```\n', "not in the block"),
           ('<!-- run later -->\n```python\nprint(1)\n```\n', "unknown note"),
           ('<!-- not run: -->\n```python\nprint(1)\n```\n', "say why")]
    page = tmp_path / "page.md"
    for text, message in bad:
        page.write_text(text)
        with pytest.raises(AssertionError, match=message):
            blocks(page)
    page.write_text('<!-- ci: "n = 24" -> "n = 2" -->\n```python\nn = 24\n```\n<!-- not run: a GPU -->\n'
                    '```python\nimport cupy\n```\n')
    assert [code for _, code in blocks(page)] == ["n = 2\n"]
