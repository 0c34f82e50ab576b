"""A device batch's wait() on one thread while the loader's iterator submits the next copies on
another (sim): the waiter hands a batch's host slot back with the GIL held, as submit does, so a
slot is never handed back twice (which would drop the loader's reference count early: a use after
free later). The interleaving that did so cannot be forced from Python; this runs the two threads
against each other for a few epochs, and every batch must arrive with its own rows."""

from __future__ import annotations

import threading

import numpy as np

import gputrain as gt

ROWS, WIDTH, BATCH, EPOCHS = 2048, 8, 16, 4


def test_waits_on_another_thread_while_batches_are_submitted():
    x = np.arange(ROWS * WIDTH, dtype=np.float32).reshape(ROWS, WIDTH)
    loader = gt.DataLoader(x, batch_size=BATCH, device="sim")
    recent: list = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def wait_on_recent_batches() -> None:
        while not stop.is_set():
            for batch in list(recent):
                try:
                    batch.wait()
                except BaseException as error:  # noqa: BLE001 - reported by the assertion below
                    errors.append(error)
                    return

    waiter = threading.Thread(target=wait_on_recent_batches)
    waiter.start()
    try:
        for _ in range(EPOCHS):
            for i, batch in enumerate(loader):
                recent.append(batch)
                del recent[:-4]
                np.testing.assert_array_equal(batch.numpy(), x[i * BATCH:(i + 1) * BATCH])
    finally:
        stop.set()
        waiter.join()
    assert not errors
