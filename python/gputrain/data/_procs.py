"""Worker processes for Dataset objects.

Each worker has its own task queue (main -> worker: which batch, into which slot) and its own
result pipe (worker -> main: a small skeleton of the batch, or an error, or "end" for an
exhausted iterable). Batch arrays travel through shared-memory slots (gputrain.data._shm), never
through the pipes. The main process waits on the result pipes and the processes' sentinels
together, so a worker that dies is reported at once instead of being waited on.

Task:   (generation, seq, slot id, segment name or None, capacity, indices or None), or None to stop.
Result: ("ok", generation, seq, slot id, skeleton, new segment name or None, capacity)
        ("end", generation, seq, slot id, None, None, 0)
        ("error", generation, seq, slot id, WorkerError, None, 0)
        ("init_error", -1, -1, -1, WorkerError, None, 0)
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing
import multiprocessing.queues
import os
import pickle
import queue
import random
import signal
import threading
import time
import traceback
import weakref
from multiprocessing import connection, resource_tracker, shared_memory
from typing import Any, Callable

import numpy as np

from gputrain._parent_death import signal_when_parent_dies
from gputrain.data import _worker
from gputrain.data._errors import WorkerError
from gputrain.data._fetch import Fetcher
from gputrain.data._shm import Slot, SlotRing, SlotWriter, segment_prefix
from gputrain.data._sigint import sigint_held
from gputrain.data.dataset import ITERABLE

_PARENT_CHECK_S = 1.0  # an idle worker checks this often whether its parent still lives
_JOIN_S = 2.0  # how long shutdown waits for workers to exit before terminating them
_ERROR_JOIN_S = 0.1  # the same after an error (a timeout, Ctrl-C, a dead worker)
_LONGEST_POLL_S = 2_147_483  # epoll's longest timeout: 2**31 - 1 milliseconds


def _picklable_error(where: str) -> WorkerError:
    error = WorkerError.current(where)
    try:
        pickle.dumps(error.exc_type)
    except Exception:  # a local exception class: re-raised as RuntimeError with the same text
        error.exc_type = RuntimeError
    return error


def _send(conn: connection.Connection, message: tuple[Any, ...]) -> bool:
    try:
        conn.send(message)
    except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
        return False  # the main process closed its end: stop
    return True


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def _signal_when_parent_dies() -> bool:
    """Linux: asks the kernel for SIGTERM when the parent dies, so that a worker blocked
    anywhere (a full result pipe, a dataset that hangs) ends with it; False elsewhere. (No
    watchdog thread: a thread started in a forked child crashes qemu-user, which CI runs.)"""
    return signal_when_parent_dies(signal.SIGTERM)


def worker_loop(fetcher: Fetcher, worker_id: int, num_workers: int, seed: int,
                worker_init_fn: Callable[[int], Any] | None, tasks: Any, results: connection.Connection,
                main: int, death_signal: bool) -> None:
    """The body of a worker process (a module-level function, so that spawn can start it).
    `main`: the loader's process; `death_signal`: whether the worker's parent is the thread
    that will live as long as the loader (then its death signals the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked by the parent around the fork
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # shutdown: clean up (below), then exit
    parent = os.getppid()  # the main process, or a forkserver
    if death_signal and _signal_when_parent_dies() and os.getppid() != main:
        return  # the main process died before the request took effect
    where = f"in DataLoader worker process {worker_id}"
    _worker._local.info = _worker.WorkerInfo(worker_id, num_workers, seed, fetcher.dataset)
    random.seed(seed)
    try:
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except BaseException:
        _send(results, ("init_error", -1, -1, -1, _picklable_error(where), None, 0))
        return
    writer = SlotWriter(main)
    generation = None
    try:
        while True:
            try:
                task = tasks.get(timeout=_PARENT_CHECK_S)
            except queue.Empty:
                if os.getppid() != parent:  # orphaned (where no death signal was asked for)
                    return
                continue
            if task is None:
                return
            gen, seq, slot, name, capacity, indices = task
            if gen != generation:  # a new epoch: an iterable dataset starts over
                generation = gen
                if fetcher.kind == ITERABLE:
                    fetcher.restart()
            if not _send(results, _run_task(fetcher, writer, where, task)):
                return
            writer.sent()
    finally:
        writer.close()


def _run_task(fetcher: Fetcher, writer: SlotWriter, where: str, task: tuple[Any, ...]) -> tuple[Any, ...]:
    gen, seq, slot, name, capacity, indices = task
    try:
        samples = fetcher.samples(None if indices is None else np.frombuffer(indices, np.int64))
        if samples is None:
            return ("end", gen, seq, slot, None, None, 0)
        form, value = fetcher.collate(samples)
        skeleton, created, capacity = writer.write(slot, name, capacity, form, value)
        return ("ok", gen, seq, slot, skeleton, created, capacity)
    except Exception:
        return ("error", gen, seq, slot, _picklable_error(where), None, 0)


class WorkerDied(RuntimeError):
    """A worker process exited while the main process still expected batches from it."""


def _describe_exit(process: Any) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class WorkerPool:
    """The worker processes of one loader (for one epoch, or for good with persistent_workers)."""

    def __init__(self, fetcher: Fetcher, num_workers: int, seed: int, worker_init_fn: Any, context: Any) -> None:
        with sigint_held():
            resource_tracker.ensure_running()  # one tracker for all: workers' segments outlive workers
        ctx = resolve_context(context)
        # A worker's death signal follows the thread that forked it: only the main thread
        # lives as long as the loader may; forkserver workers are the forkserver's children.
        death_signal = (threading.current_thread() is threading.main_thread()
                        and ctx.get_start_method() in ("fork", "spawn"))
        self.ring = SlotRing()
        self.processes: list[Any] = []
        self.tasks: list[Any] = []
        self.results: list[connection.Connection] = []
        self.closed = False
        _LIVE_POOLS.add(self)  # from the first fork on: stopped at exit whatever happens below
        try:
            for worker_id in range(num_workers):
                tasks = ctx.Queue()
                reader, writer = ctx.Pipe(duplex=False)
                process = ctx.Process(target=worker_loop, daemon=True, name=f"gputrain-loader-{worker_id}",
                                      args=(fetcher, worker_id, num_workers, (seed + worker_id) % (1 << 64),
                                            worker_init_fn, tasks, writer, os.getpid(), death_signal))
                with sigint_held():  # Ctrl-C lands after the fork (not inside its hooks) and
                    process.start()  # after the worker is recorded (shutdown below stops it)
                    writer.close()
                    self.processes.append(process)
                    self.tasks.append(tasks)
                    self.results.append(reader)
        except BaseException:  # Ctrl-C included: the workers started are stopped, not waited for
            self.shutdown(_ERROR_JOIN_S)
            raise

    def submit(self, worker: int, generation: int, seq: int, slot: Slot, indices: np.ndarray | None) -> None:
        payload = None if indices is None else np.ascontiguousarray(indices, np.int64).tobytes()
        # Ctrl-C held: a KeyboardInterrupt raised inside the queue's Condition.__enter__, after its
        # lock was taken and before the with-block began, would leave that lock held for good,
        # and every later put, close() and feeder stop would wait on it (the Ctrl-C test hung so
        # in shutdown's put in CI's rehearsal)
        with sigint_held():
            self.tasks[worker].put((generation, seq, slot.id, slot.name, slot.capacity, payload))

    def slot(self, slot_id: int) -> Slot:
        return self.ring._slots[slot_id]

    def receive(self, timeout: float | None) -> list[tuple[Any, ...]]:
        """Results that arrived (waiting up to `timeout` seconds, None: forever, for the first);
        raises WorkerDied when a worker process exited and left no result behind."""
        if timeout is not None:
            timeout = min(timeout, _LONGEST_POLL_S)  # a longer wait overflows epoll's int milliseconds
        ready = connection.wait(self.results + [p.sentinel for p in self.processes], timeout)
        messages = []
        for conn in self.results:
            while conn in ready or conn.poll():
                ready = [r for r in ready if r is not conn]
                try:
                    messages.append(conn.recv())
                except (EOFError, OSError):
                    break
        for worker, process in enumerate(self.processes):
            if process.sentinel in ready and not messages:
                process.join(1.0)  # its sentinel fired: it is exiting; reap it for the exit code
                raise WorkerDied(f"DataLoader worker process {worker} (pid {process.pid}) exited unexpectedly "
                                 f"({_describe_exit(process)})")
        return messages

    def shutdown(self, grace: float = _JOIN_S) -> None:
        """Stops the workers (terminating any that do not exit within `grace` seconds, as after
        an error, when one may be stuck in the dataset) and unlinks the slots."""
        if self.closed:
            return
        self.closed = True
        _LIVE_POOLS.discard(self)
        try:
            self._stop(grace)
        except KeyboardInterrupt as interrupt:  # Ctrl-C while waiting: the rest at once, then raised
            traceback.clear_frames(interrupt.__traceback__)  # the stopped frames' workers, queues
            with sigint_held():
                self._stop(0.0)
            self._release()
            raise
        self._release()

    def _release(self) -> None:
        """Drops the pool's pipes, queues and processes and runs their finalizers, Ctrl-C held.

        A KeyboardInterrupt raised inside a __del__ or weakref callback is printed and lost by
        CPython, so a Ctrl-C landing in one would not stop the program. Finalizers run wherever
        the last reference goes: multiprocessing's queues and processes sit in reference cycles
        (the cyclic collector ran them at any allocation of the next epoch), and a loop variable
        of _stop() kept the last worker's Process until that frame returned (its Popen's
        close_fds finalizer then ran outside the hold: seen once in 150 trials in CI). So this
        runs after _stop() has returned, with every reference the pool holds, in one collection."""
        with sigint_held():
            self.results, self.tasks, self.processes = [], [], []
            gc.collect()

    def _stop(self, grace: float) -> None:
        """The body of shutdown(); may run again after a Ctrl-C interrupted it."""
        for tasks in self.tasks:
            try:
                with sigint_held():  # as in submit()
                    tasks.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + grace
        self._drain(deadline)
        for process in self.processes:
            process.join(max(deadline - time.monotonic(), 0))
            if process.is_alive():
                process.terminate()
                process.join(_JOIN_S)
            if process.is_alive():
                process.kill()
                process.join()
        self._drain(time.monotonic())
        for conn in self.results:
            conn.close()
        for tasks in self.tasks:
            tasks.cancel_join_thread()
            tasks.close()
            _stop_feeder(tasks)
            _join_feeder(tasks, _JOIN_S)
        self.ring.close()
        for process in self.processes:
            _sweep(f"{segment_prefix(os.getpid())}{process.pid}_")

    def _drain(self, deadline: float) -> None:
        """Reads what the workers still send until each closes its pipe (it exited) or the
        deadline passes, unlinking the segments that those unread results announced."""
        open_conns = [c for c in self.results if not c.closed]
        while open_conns:
            ready = connection.wait(open_conns, max(deadline - time.monotonic(), 0))
            if not ready:
                return
            for conn in ready:
                try:
                    created = conn.recv()[5]
                except (EOFError, OSError):
                    open_conns.remove(conn)
                    continue
                if created is not None:
                    _unlink(created)


def _stop_feeder(tasks: Any) -> None:
    """Makes sure a closed task queue's feeder thread is told to end: close() tells it only if
    the queue's first put() got as far as registering how, and a Ctrl-C inside that put() can
    land after the feeder started and before (the feeder then waits for good, and joining it
    takes _JOIN_S). A second end marker is harmless: the feeder stops at the first."""
    feeder = getattr(tasks, "_thread", None)  # multiprocessing's internals, as in _join_feeder
    notempty, buffer = getattr(tasks, "_notempty", None), getattr(tasks, "_buffer", None)
    if feeder is None or not feeder.is_alive() or notempty is None or buffer is None:
        return
    with notempty:
        buffer.append(multiprocessing.queues._sentinel)  # type: ignore[attr-defined]
        notempty.notify()


def _join_feeder(tasks: Any, timeout: float) -> None:
    """Waits up to `timeout` seconds for a closed task queue's feeder thread to be gone, so that a
    stopped pool leaves no thread behind. A thread still exiting while the next pool forks can
    leave the child with a locked allocator: ASan's (GCC 12) does not lock itself around fork and
    drains an exiting thread's cache after Python's join returns; a worker forked then hung in
    CI. (The feeder blocks only on a full pipe no worker reads any more: hence the bound.)"""
    feeder = getattr(tasks, "_thread", None)  # multiprocessing's; None until the first put
    if feeder is None or feeder.ident is None:  # never started: a Ctrl-C landed inside that put()
        return                                  # between the thread's creation and its start()
    deadline = time.monotonic() + timeout
    feeder.join(timeout)
    while os.path.exists(f"/proc/self/task/{feeder.native_id}") and time.monotonic() < deadline:
        time.sleep(0.001)  # Linux: the thread's last C-level cleanup after Python's join


def _sweep(prefix: str) -> None:
    """Unlinks the segments named `prefix`* that are still in /dev/shm once their worker has
    stopped: one announced while an interrupt unwound this process (between receiving its name
    and adopting it) is known to no one else. Without /dev/shm (macOS) the resource tracker
    remains the fallback."""
    try:
        names = [name for name in os.listdir("/dev/shm") if name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        _unlink(name)


def _unlink(name: str) -> None:
    with sigint_held():  # opening registers it with the resource tracker, unlink() unregisters it
        try:
            segment = shared_memory.SharedMemory(name=name)
        except FileNotFoundError:
            return
        segment.close()
        segment.unlink()


def resolve_context(context: Any) -> Any:
    """The multiprocessing context named by `context` (None: multiprocessing's default)."""
    if context is None:
        return multiprocessing.get_context()
    if isinstance(context, str):
        return multiprocessing.get_context(context)
    if hasattr(context, "Process") and hasattr(context, "Queue"):
        return context
    raise TypeError("multiprocessing_context must be a start method name ('fork', 'spawn', 'forkserver') or a "
                    f"multiprocessing context, not {type(context).__name__}")


_LIVE_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()


@atexit.register
def _shutdown_all_pools() -> None:
    """Stops every worker process before the interpreter exits (before multiprocessing's own
    exit handler, registered earlier, terminates them without cleanup)."""
    for pool in list(_LIVE_POOLS):
        pool.shutdown()
