"""Ctrl-C held back around what must not be cut in two (a fork, a segment's unlink)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """Holds Ctrl-C back while worker processes are forked or spawned (or while a shared-memory
    segment is unlinked: shm_unlink and the resource tracker's unregister are two steps, and a
    KeyboardInterrupt between them leaves the tracker warning of a "leaked" segment that is gone),
    then delivers it.

    A KeyboardInterrupt raised inside CPython's at-fork hooks is swallowed there (printed as
    unraisable), and one raised in logging's hook leaves its module lock held, so that any later
    logging.getLogger() blocks for good. SIGINT is blocked in this thread (signal.pthread_sigmask)
    so it stays pending; on the main thread, where Python runs signal handlers, a SIGINT that
    another thread received meanwhile is recorded by a stand-in handler instead of raising. Both
    are delivered when the block ends, through the handler that was installed before."""
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if on_main else None
    deferred: list[int] = []
    swap = callable(previous)  # a Python-level handler (Python's default one included)
    if swap:
        signal.signal(signal.SIGINT, lambda signum, frame: deferred.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if swap:
            signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending SIGINT is delivered here
        if deferred:
            signal.raise_signal(signal.SIGINT)
