"""Ctrl-C at random moments, in forked children (tests/test_loader_interrupt.py).

    python _sigint_trials.py SCENARIO TRIALS SEED

This process imports gputrain once, becomes the subreaper of its descendants, then for each
trial forks a child that runs SCENARIO and writes a byte to a pipe at the scenario's moment of
interest; 0-50 ms later the child gets SIGINT. A trial's child must catch KeyboardInterrupt, pass
its own checks, and exit through the interpreter's normal shutdown (atexit, finalization); the
child and every process it started must be gone within LIMIT_S of the signal, and no shared-
memory segment of the child may be left in /dev/shm. One JSON line per trial on stdout.

Scenarios:
  fork   map-style Dataset, 2 worker processes forked at each epoch, another thread calling
         logging.getLogger(); the signal lands while workers are being forked or fetching.
         Checks that logging's module lock is free afterwards.
  stuck  arrays, transform_in_workers=True with a transform that never returns (sleeping or
         spinning, persistent workers or not); the signal lands while it is stuck.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import json
import os
import random
import select
import signal
import sys
import tempfile
import time

import numpy as np

import gputrain as gt

LIMIT_S = 2.0  # the signal to the last process of the trial gone
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
NO_INTERRUPT, LOGGING_LOCK_HELD = 3, 4  # the child's exit codes for a failed check


class Rows:
    """A map-style dataset of 64 rows."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(4, i, np.float32)


def fork_scenario(ready: int, rng: random.Random) -> int:
    import logging
    import threading

    loader = gt.DataLoader(Rows(), batch_size=8, num_workers=2)  # new worker processes every epoch
    stop = threading.Event()

    def use_logging() -> None:
        while not stop.is_set():
            logging.getLogger("gputrain.sigint-trial")
            time.sleep(0.001)

    thread = threading.Thread(target=use_logging, daemon=True)
    thread.start()
    code = NO_INTERRUPT
    deadline = time.monotonic() + 1.0
    try:
        os.write(ready, b"r")  # inside the try: the signal may land on the very next bytecode
        while time.monotonic() < deadline:
            for _ in loader:
                pass
    except KeyboardInterrupt:
        code = 0
    stop.set()
    thread.join(1.0)
    if thread.is_alive() or not logging._lock.acquire(timeout=1.0):  # type: ignore[attr-defined]
        return LOGGING_LOCK_HELD
    logging._lock.release()  # type: ignore[attr-defined]
    return code


def stuck_scenario(ready: int, rng: random.Random) -> int:
    spin, persistent = rng.random() < 0.5, rng.random() < 0.5
    told = []

    def stuck(batch):
        if not told:
            told.append(True)
            os.write(ready, b"r")
        while True:
            if not spin:
                time.sleep(0.001)

    loader = gt.DataLoader(np.arange(256), batch_size=4, num_workers=2, transform=stuck, transform_in_workers=True,
                           persistent_workers=persistent)
    try:
        for _ in loader:
            pass
    except KeyboardInterrupt:
        return 0
    return NO_INTERRUPT


SCENARIOS = {"fork": fork_scenario, "stuck": stuck_scenario}


def children() -> set[int]:
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return pids


def run_child(scenario: str, ready: int, log: str, seed: int) -> None:
    """The forked child: runs the scenario, then leaves through the interpreter's shutdown."""
    fd = os.open(log, os.O_WRONLY)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # a run past LIMIT_S shows where it is
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a program started from a shell
    # (a helper started in the background of a shell without job control inherits SIGINT ignored)
    code = 5
    try:
        code = SCENARIOS[scenario](ready, random.Random(seed))
    except BaseException as error:  # noqa: BLE001 - reported through the exit code and stderr
        print(f"scenario raised {error!r}", file=sys.stderr, flush=True)
    raise SystemExit(code)  # unwinds to the top: atexit handlers, then finalization


def trial(scenario: str, index: int, rng: random.Random) -> dict:
    read, write = os.pipe()
    log = tempfile.NamedTemporaryFile(prefix="gt-sigint-", delete=False)
    log.close()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        run_child(scenario, write, log.name, rng.randrange(2**32))
    os.close(write)
    delay = rng.uniform(0.0, 0.05)
    result = {"trial": index, "delay": round(delay, 4), "pid": pid}
    got = os.read(read, 1) if select.select([read], [], [], 10.0)[0] else b""
    os.close(read)
    time.sleep(delay if got else 0.0)
    sent = time.monotonic()
    os.kill(pid, signal.SIGINT)
    status = None
    while time.monotonic() - sent < LIMIT_S:
        done, code = os.waitpid(-1, os.WNOHANG)
        if done == pid:
            status = code
        if status is not None and not children():
            break
        if done == 0:
            time.sleep(0.002)
    result["elapsed"] = round(time.monotonic() - sent, 3)
    if status is None:  # still running: its threads' stacks go to its stderr
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.2)
    left = sorted(children())
    for other in left:
        os.kill(other, signal.SIGKILL)
    for other in left:
        os.waitpid(other, 0)
    prefix = f"gtld{pid}_"
    shm = sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix)) if os.path.isdir("/dev/shm") else []
    for name in shm:
        os.unlink(f"/dev/shm/{name}")
    with open(log.name, errors="replace") as f:
        stderr = f.read()
    os.unlink(log.name)
    result.update(ready=bool(got), exit=None if status is None else os.waitstatus_to_exitcode(status),
                  left=[p for p in left if p != pid], shm=shm, stderr=stderr[-2000:])
    return result


def main() -> None:
    scenario, trials, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    rng = random.Random(seed)
    gc.freeze()  # the children's collections leave this process's objects alone (no copy-on-write)
    for index in range(trials):
        print(json.dumps(trial(scenario, index, rng)), flush=True)


if __name__ == "__main__":
    main()
