"""Shared test configuration: `cuda`-marked tests skip without a usable GPU."""

from __future__ import annotations

import os
import sys

import pytest

# Test helpers (NumPy references) live beside the tests; importlib mode does not add this folder.
sys.path.insert(0, os.path.dirname(__file__))

import gputrain


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gputrain._C.cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none usable here)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
