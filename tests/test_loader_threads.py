"""One epoch at a time: a DataLoader refuses iter() from a second thread while an epoch that
another thread started is in progress (RuntimeError "the DataLoader is in use by another
thread"), whatever num_workers and persistent_workers are. Before, two threads iterating one
persistent loader each restarted the shared epoch under the other and silently lost and
duplicated rows. Threads that share one iterator still take turns (tests/test_threads.py).
Also: a worker detached while stuck in a hook frees the loader itself once the hook returns.
Run under ThreadSanitizer (and ASan) by .ci/sanitizers.sh (tests/test_loader*.py)."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import gputrain as gt

ROWS = 512
BATCH = 8

CONFIGS = [
    pytest.param(dict(num_workers=0), id="no-workers"),
    pytest.param(dict(num_workers=2), id="workers"),
    pytest.param(dict(num_workers=2, persistent_workers=True), id="persistent"),
]


class Rows:
    """A map-style Dataset of ROWS rows (fetched in the calling thread with num_workers=0)."""

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, i: int) -> np.int64:
        return np.int64(i)


def rows_of(batches: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(batches)) if batches else np.zeros(0, np.int64)


def full_epoch(rows: np.ndarray) -> bool:
    return np.array_equal(rows, np.arange(ROWS))


def run_in_thread(target):
    """target() in a new thread; returns (result, exception)."""
    out: dict = {}

    def body():
        try:
            out["result"] = target()
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            out["error"] = error

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    return out.get("result"), out.get("error")


@pytest.mark.parametrize("config", CONFIGS)
def test_a_second_thread_is_refused_while_an_epoch_runs(config):
    loader = gt.DataLoader(np.arange(ROWS), batch_size=BATCH, shuffle=True, seed=1, **config)
    it = iter(loader)
    first = next(it).copy()
    _, error = run_in_thread(lambda: iter(loader))
    assert isinstance(error, RuntimeError) and "DataLoader is in use by another thread" in str(error), error
    assert "MainThread" in str(error)
    rest = [b.copy() for b in it]  # the refusal changed nothing: this epoch goes on whole
    assert full_epoch(rows_of([first] + rest))
    # the epoch ended: another thread may iterate now, and gets a whole epoch of its own
    result, error = run_in_thread(lambda: rows_of([b.copy() for b in loader]))
    assert error is None and full_epoch(result)


def test_a_dataset_object_loader_refuses_a_second_thread_too():
    loader = gt.DataLoader(Rows(), batch_size=BATCH, shuffle=True, seed=2)
    it = iter(loader)
    first = next(it)
    _, error = run_in_thread(lambda: iter(loader))
    assert isinstance(error, RuntimeError) and "in use by another thread" in str(error), error
    assert full_epoch(rows_of([first] + list(it)))


@pytest.mark.parametrize("config", CONFIGS)
def test_two_threads_iterating_one_loader_never_lose_or_duplicate_rows(config):
    """The outside harness's case: two threads each running `for batch in loader`, several
    times. Each iteration either is refused at iter() or sees every row exactly once."""
    loader = gt.DataLoader(np.arange(ROWS), batch_size=BATCH, shuffle=True, seed=3, **config)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []
    lock = threading.Lock()

    def consume():
        for _ in range(3):
            barrier.wait()
            try:
                rows = rows_of([b.copy() for b in loader])
            except RuntimeError as error:
                assert "in use by another thread" in str(error)
                outcome = "refused"
            else:
                outcome = "whole" if full_epoch(rows) else f"broken: {len(rows)} rows, {len(set(rows))} distinct"
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=consume) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 6 and all(o in ("whole", "refused") for o in outcomes), outcomes
    assert outcomes.count("whole") >= 3  # at least one of each pair ran


def test_the_same_thread_may_restart_an_unfinished_epoch():
    loader = gt.DataLoader(np.arange(ROWS), batch_size=BATCH, num_workers=2, persistent_workers=True)
    next(iter(loader))  # left unfinished
    assert full_epoch(rows_of([b.copy() for b in loader]))


@pytest.mark.parametrize("persistent", [False, True])
def test_an_epoch_ends_with_its_thread(persistent):
    """A thread that left an epoch unfinished and ended does not hold the loader."""
    loader = gt.DataLoader(np.arange(ROWS), batch_size=BATCH, num_workers=2, persistent_workers=persistent)
    holder: list = []
    _, error = run_in_thread(lambda: holder.append(next(iter(loader)).copy()))  # the iterator outlives it
    assert error is None
    assert full_epoch(rows_of([b.copy() for b in loader]))


def test_a_dropped_iterator_frees_the_loader_for_other_threads():
    loader = gt.DataLoader(np.arange(ROWS), batch_size=BATCH, num_workers=2)
    it = iter(loader)
    next(it)
    del it  # not persistent: the epoch goes with its iterator
    result, error = run_in_thread(lambda: rows_of([b.copy() for b in loader]))
    assert error is None and full_epoch(result)


def test_threads_sharing_one_iterator_are_not_refused():
    loader = gt.DataLoader(np.arange(ROWS), batch_size=BATCH, num_workers=2, persistent_workers=True)
    it = iter(loader)
    taken: list[np.ndarray] = []
    lock = threading.Lock()

    def take():
        for batch in it:
            with lock:
                taken.append(batch.copy())

    threads = [threading.Thread(target=take) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert full_epoch(rows_of(taken))


def test_a_worker_detached_in_a_hook_frees_the_loader_when_the_hook_returns():
    """Dropping the iterator waits 0.25 s, then detaches the workers still in the transform; the
    loader's memory (slots, index buffers, the hooks' objects) stays alive for them and goes
    when the last one returns and exits."""
    entered, release = threading.Event(), threading.Event()

    def slow(batch):
        entered.set()
        release.wait(20)
        return batch

    loader = gt.DataLoader(np.arange(ROWS), batch_size=BATCH, num_workers=2, transform=slow,
                           transform_in_workers=True)
    gc.collect()
    before = gt.memory_stats("cpu")["allocated_bytes"]
    it = iter(loader)
    assert entered.wait(20)
    started = time.monotonic()
    del it
    gc.collect()
    assert time.monotonic() - started < 5  # not joined: the hook has not returned
    assert gt.memory_stats("cpu")["allocated_bytes"] > before  # still the workers'
    release.set()
    deadline = time.monotonic() + 20
    while gt.memory_stats("cpu")["allocated_bytes"] != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gt.memory_stats("cpu")["allocated_bytes"] == before
