"""Shared test configuration: `cuda`-marked tests skip without a usable GPU."""

from __future__ import annotations

import pytest

import gputrain


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if gputrain._C.cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none usable here)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
