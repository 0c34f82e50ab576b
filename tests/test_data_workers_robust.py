"""Worker processes of Dataset loaders: errors carried to the main process with their traceback,
dead workers reported instead of waited on, and no process or shared-memory segment left behind
after break, an error, Ctrl-C or interpreter exit."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import gputrain as gt
from gputrain.data._shm import segment_prefix

if sys.platform != "linux":
    pytest.skip("the process checks read /dev/shm and /proc", allow_module_level=True)


class Faulty:
    """Sample `bad` misbehaves as `how` says; the others are arrays."""

    def __init__(self, how, bad=5, n=40):
        self.how, self.bad, self.n = how, bad, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            if self.how == "raise":
                raise KeyError(f"no sample {i}")
            if self.how == "exit":
                os._exit(3)
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.how == "sleep":
                time.sleep(60)
        return np.full(4, i, np.float32)


def segments(pid=None):
    """The shared-memory segments of the loaders of process `pid` (default: this one)."""
    prefix = segment_prefix(os.getpid() if pid is None else pid)
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


@pytest.fixture(autouse=True)
def no_leftovers():
    yield
    gc.collect()
    deadline = time.monotonic() + 20
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert multiprocessing.active_children() == []
    assert segments() == set()


def test_an_exception_in_a_worker_is_raised_with_its_traceback():
    loader = gt.DataLoader(Faulty("raise"), batch_size=4, num_workers=2)
    with pytest.raises(KeyError) as caught:
        list(loader)
    text = str(caught.value)
    assert "Caught KeyError in DataLoader worker process 1" in text
    assert "no sample 5" in text and "__getitem__" in text
    assert len(list(gt.DataLoader(Faulty("none"), batch_size=4, num_workers=2))) == 10


def test_persistent_workers_survive_an_exception():
    loader = gt.DataLoader(Faulty("raise"), batch_size=4, num_workers=2, persistent_workers=True)
    for _ in range(2):
        with pytest.raises(KeyError):
            list(loader)
    pool = loader._iterator.pool
    assert all(p.is_alive() for p in pool.processes)
    del loader, pool


@pytest.mark.parametrize("how,words", [("exit", "exit code 3"), ("kill", "SIGKILL")])
def test_a_dead_worker_is_reported(how, words):
    loader = gt.DataLoader(Faulty(how), batch_size=4, num_workers=2, persistent_workers=True)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=f"worker process 1 .* exited unexpectedly .*{words}"):
        list(loader)
    assert time.monotonic() - start < 20  # generous for the emulated-CPU CI run
    del loader


def test_a_dead_worker_is_replaced_next_epoch():
    data = Faulty("exit", bad=-1)
    loader = gt.DataLoader(data, batch_size=4, num_workers=2, persistent_workers=True)
    list(loader)
    loader._iterator.pool.processes[0].kill()
    with pytest.raises(RuntimeError, match="exited unexpectedly"):
        list(loader)
    assert len(list(loader)) == 10
    del loader


def test_timeout():
    loader = gt.DataLoader(Faulty("sleep", bad=0), batch_size=4, num_workers=1, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 0.3 seconds"):
        next(iter(loader))
    assert time.monotonic() - start < 20  # generous for the emulated-CPU CI run


def test_worker_init_fn_error():
    def init(worker_id):
        raise ValueError(f"bad init {worker_id}")

    with pytest.raises(ValueError, match="bad init"):
        list(gt.DataLoader(Faulty("none"), batch_size=4, num_workers=2, worker_init_fn=init))


@pytest.mark.parametrize("persistent", [False, True])
def test_break_leaves_nothing_running(persistent):
    loader = gt.DataLoader(Faulty("none"), batch_size=2, num_workers=2, persistent_workers=persistent)
    for _ in range(2):
        for i, batch in enumerate(loader):
            if i == 3:
                break
    kept = batch
    del loader, batch
    gc.collect()
    assert np.array_equal(kept, [[6] * 4, [7] * 4])  # a batch outlives its loader


def run_script(body, **kwargs):
    script = textwrap.dedent("""
        import os, sys, time, signal, faulthandler
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # finish() asks a hung child for its stacks
        import numpy as np
        import gputrain as gt

        class Slow:
            def __len__(self):
                return 10000
            def __getitem__(self, i):
                time.sleep(0.01)
                return np.full(4, i, np.float32)
    """) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kwargs)


def finish(child, timeout=20):
    """The child's (stdout, stderr) once it exits; a child still running after `timeout` seconds
    fails the test with every thread's stack, and is killed."""
    try:
        return child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGUSR1)
        time.sleep(2)
        child.kill()
        _, err = child.communicate()
        pytest.fail(f"the child did not exit within {timeout} s; its stacks:\n{err[-12000:]}")


def gone(pids, within=20.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read()
                   for pid in pids):
            return True
        time.sleep(0.05)
    return False


def test_an_interrupt_while_a_segment_is_adopted_leaks_nothing():
    # Ctrl-C can land between receiving a worker's new segment and adopting it (seen under qemu):
    # that segment is then known to no one, and the resource tracker used to clean it at exit
    # with a "leaked shared_memory objects" warning. Shutdown sweeps the stopped workers' names.
    child = run_script("""
        from multiprocessing import shared_memory
        from gputrain.data import _shm

        def interrupted_adopt(self, slot, name, capacity):
            shared_memory.SharedMemory(name=name)  # attached (and tracked), then the interrupt
            raise KeyboardInterrupt

        loader = gt.DataLoader(Slow(), batch_size=4, num_workers=2)
        it = iter(loader)
        print(" ".join(str(p.pid) for p in it.pool.processes), flush=True)
        _shm.SlotRing.adopt = interrupted_adopt
        next(it)
    """)
    pids = [int(p) for p in child.stdout.readline().split()]
    _, err = finish(child)
    assert "KeyboardInterrupt" in err and child.returncode != 0
    assert gone(pids)
    assert segments(child.pid) == set()
    assert "leaked" not in err, err


def test_ctrl_c_stops_the_workers():
    child = run_script("""
        loader = gt.DataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers=True)
        it = iter(loader)
        next(it)
        print(" ".join(str(p.pid) for p in it.pool.processes), flush=True)
        for batch in it:
            pass
    """)
    pids = [int(p) for p in child.stdout.readline().split()]
    assert len(pids) == 2
    child.send_signal(signal.SIGINT)
    _, err = finish(child)
    assert "KeyboardInterrupt" in err and child.returncode != 0
    assert gone(pids)
    assert segments(child.pid) == set()
    assert "leaked" not in err


@pytest.mark.parametrize("persistent", [False, True])
def test_interpreter_exit_mid_epoch(persistent):
    child = run_script(f"""
        loader = gt.DataLoader(Slow(), batch_size=4, num_workers=2, persistent_workers={persistent})
        it = iter(loader)
        kept = next(it)
        print(" ".join(str(p.pid) for p in it.pool.processes), flush=True)
    """)
    out, err = finish(child)
    assert child.returncode == 0, err
    assert gone([int(p) for p in out.split()])
    assert segments(child.pid) == set()
    assert err == ""


@pytest.mark.parametrize("stuck", [False, True])
def test_workers_exit_when_the_main_process_is_killed(stuck):
    """Idle workers, and workers stuck in __getitem__, exit within seconds of their parent."""
    child = run_script(f"""
        class Stuck(Slow):
            def __getitem__(self, i):
                if i >= 8 and {stuck}:
                    time.sleep(120)
                return super().__getitem__(i)

        loader = gt.DataLoader(Stuck(), batch_size=4, num_workers=2, persistent_workers=True)
        it = iter(loader)
        next(it)
        print(" ".join(str(p.pid) for p in it.pool.processes), flush=True)
        time.sleep(60)
    """)
    pids = [int(p) for p in child.stdout.readline().split()]
    child.kill()
    finish(child)
    assert gone(pids)
