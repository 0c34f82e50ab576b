"""Linux's parent-death signal (prctl PR_SET_PDEATHSIG), shared by the DataLoader's worker
processes (gputrain.data._procs) and the ranks of gputrain.distributed.run: a child asks the
kernel for a signal when its parent dies, so that it cannot outlive a parent that was killed
(kill -9) before it could stop its children."""
from __future__ import annotations

import ctypes
import functools
import os
import signal
import sys
from typing import Any, Callable

_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)


@functools.lru_cache(maxsize=None)
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, or None off Linux (looked up once: a child between fork and exec only calls it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def signal_when_parent_dies(signum: int = signal.SIGTERM) -> bool:
    """Linux: asks the kernel to send `signum` to this process when the thread that forked it
    exits; False elsewhere (or when prctl failed). On its own the request races with the
    parent's death (it may have died already), so callers compare os.getppid() with the parent
    they expect afterwards, as die_with_parent does."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0


def die_with_parent(parent: int, signum: int = signal.SIGKILL) -> Callable[[], Any]:
    """A subprocess.Popen preexec_fn: in the child (between fork and exec; the setting survives
    exec) it sets the parent-death signal, then exits at once when `parent` died before the
    request took effect (the child was already re-parented). Does nothing where unsupported.
    The parent should be single-threaded: the signal follows the thread that forked."""
    _prctl()  # resolved here, in the parent, not in the forked child

    def preexec() -> None:
        if signal_when_parent_dies(signum) and os.getppid() != parent:
            os._exit(1)

    return preexec
