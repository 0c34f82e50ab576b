"""examples/train_digits.ipynb runs from top to bottom in a fresh kernel (nbclient), as a notebook
user would run it: CI's notebook stage installs nbclient and ipykernel for this test only (.ci/run)
and sets GPUTRAIN_CI_NOTEBOOK=1, so there a missing package fails it; elsewhere it is skipped."""

from __future__ import annotations

import importlib
import os
from typing import Any

import pytest

NOTEBOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        "train_digits.ipynb")


def required(name: str) -> Any:
    if os.environ.get("GPUTRAIN_CI_NOTEBOOK"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


def test_the_digits_notebook_runs_and_reaches_its_accuracy(tmp_path):
    nbformat = required("nbformat")
    nbclient = required("nbclient")
    required("ipykernel")
    required("sklearn")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    # The kernel (this Python, in tmp_path) imports what the test does: PYTHONPATH made absolute,
    # for an in-place build's PYTHONPATH=python.
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    client.execute(env=env)  # raises CellExecutionError, with the cell and its traceback, when a cell fails
    printed = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for output in cell.outputs if output.output_type == "stream")
    assert "test accuracy" in printed and "the copy's accuracy" in printed
    assert (tmp_path / "digits_run" / "history.jsonl").exists()  # the Trainer ran in the notebook's folder
