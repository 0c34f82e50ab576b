"""Memory-mapped data through the array path: np.load(mmap_mode="r") arrays and np.memmap token
files are gathered row by row, without reading (or mapping in) the whole file: the loader maps
in no more of the file than NumPy's own indexing of the same rows (the kernel maps a few
hundred KiB around each touched page, so that is the yardstick, not the rows' bytes)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import gputrain as gt

if sys.platform != "linux":
    pytest.skip("reads /proc/self/smaps", allow_module_level=True)

MIB = 1 << 20


def resident_bytes(array):
    """Bytes of the file mapping that holds `array` present in this process's page tables."""
    address, inside, total = array.ctypes.data, False, 0
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and ":" not in fields[0]:  # a mapping's header: start-end perms ...
                start, end = (int(a, 16) for a in fields[0].split("-"))
                inside = start <= address < end
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


@pytest.mark.parametrize("num_workers", [0, 2])
def test_np_load_mmap_gathers_only_the_batches(tmp_path, num_workers):
    path = str(tmp_path / "x.npy")
    rows = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(16384, 1024))  # 64 MiB
    rows[:, 0] = np.arange(16384)
    rows.flush()
    del rows
    x = np.load(path, mmap_mode="r")
    assert resident_bytes(x) < MIB
    loader = gt.DataLoader((x, np.arange(16384)), batch_size=8, shuffle=True, seed=0, num_workers=num_workers)
    seen = []
    for xb, yb in loader:
        assert np.array_equal(xb[:, 0], yb) and xb.flags.c_contiguous
        seen.extend(yb.tolist())
        if len(seen) == 16:
            break
    gathered = loader.sampler.rows(0)[:8 * (2 + 2 * num_workers + 1)]  # at most: these, and the prefetched
    assert set(seen) <= set(gathered.tolist())
    numpy_view = np.load(path, mmap_mode="r")
    numpy_view[gathered].sum()
    assert resident_bytes(x) <= 1.5 * resident_bytes(numpy_view) + MIB
    assert resident_bytes(x) < 32 * MIB


def test_token_file_windows(tmp_path):
    path = str(tmp_path / "train.bin")
    np.arange(1 << 25, dtype=np.uint32).astype(np.uint16).tofile(path)  # 64 MiB of uint16 tokens
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    data = gt.data.TokenDataset(tokens, block_size=64, stride=1)
    sampler = gt.data.RandomSampler(data, replacement=True, num_samples=16, seed=1)
    for x, y in gt.DataLoader(data, batch_size=8, sampler=sampler, num_workers=2):
        assert x.dtype == np.uint16 and x.shape == (8, 64)
        assert np.array_equal((x.astype(np.int64) + 1) % 65536, y)
        assert np.array_equal(np.diff(x.astype(np.int64), axis=1) % 65536, np.ones((8, 63)))
    reference = np.memmap(path, dtype=np.uint16, mode="r")
    for start in sampler.rows(0).tolist():
        reference[start:start + 65].sum()
    assert resident_bytes(tokens) <= 1.5 * resident_bytes(reference) + MIB
    assert resident_bytes(tokens) < 32 * MIB
