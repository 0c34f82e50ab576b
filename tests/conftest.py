"""Shared test configuration: gputrain's pytest plugin (the `cuda` and `sim` markers and their
skips, gputrain_seed, gputrain_benchmark) also for an in-place build."""

from __future__ import annotations

import os
import sys

import pytest

# Test helpers (NumPy references) live beside the tests; importlib mode does not add this folder.
sys.path.insert(0, os.path.dirname(__file__))

import _gputrain_pytest as pytest_plugin


def pytest_configure(config: pytest.Config) -> None:
    # An installed gputrain registers the plugin through its pytest11 entry point; an in-place
    # build (PYTHONPATH=python) has no entry point, so it is registered here under the same name.
    if not config.pluginmanager.has_plugin("gputrain"):
        config.pluginmanager.register(pytest_plugin, "gputrain")
