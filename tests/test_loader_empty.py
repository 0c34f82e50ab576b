"""A loader over arrays with no rows gives empty epochs (NumPy gives such arrays zero strides)."""

import numpy as np
import pytest

import gputrain as gt


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("shape", [(0, 3), (0, 2, 5), (0,)])
def test_empty_array_gives_empty_epochs(shape, num_workers):
    data = (np.zeros(shape, np.float32), np.zeros((0,), np.int64))
    loader = gt.DataLoader(data, batch_size=2, shuffle=True, num_workers=num_workers, seed=0)
    assert len(loader) == 0
    assert list(loader) == [] and list(loader) == []
    assert loader.state_dict()["epoch"] == 2


def test_zero_width_rows_are_gathered():
    data = np.zeros((5, 0), np.float32)
    batches = list(gt.DataLoader(data, batch_size=2))
    assert [b.shape for b in batches] == [(2, 0), (2, 0), (1, 0)]
