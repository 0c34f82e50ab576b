"""The parent side of the fuzz suite: a pool of worker processes (_fuzz_worker.py) that run
batches of cases. A worker that dies (a signal, an abort, a sanitizer report) or hangs is
replaced, and its batch is re-run one case per worker call to find the case that crashes; that
case is reported as a failure with a one-line reproduction command."""

from __future__ import annotations

import base64
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_fuzz_worker.py")
BATCH_TIMEOUT = float(os.environ.get("GPUTRAIN_FUZZ_BATCH_TIMEOUT", "120"))  # seconds
CASE_TIMEOUT = 30.0  # seconds for one case while a crashed or hung batch is re-run
READY = b"R"  # a worker's first byte: imported, so its start-up is not timed as a case
START_TIMEOUT = 300.0  # seconds for a worker to import numpy and gputrain (a loaded CI machine, qemu)


class WorkerDied(Exception):
    def __init__(self, why: str, stderr: str) -> None:
        super().__init__(why)
        self.why = why
        self.stderr = stderr


def repro_command(case: tuple[int, str, dict[str, Any]]) -> str:
    encoded = base64.b64encode(pickle.dumps(case)).decode()
    return f"PYTHONPATH=python python {os.path.relpath(WORKER)} --repro {encoded}"


class Worker:
    """One worker process; started on first use and again after it died."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.stderr = tempfile.TemporaryFile()

    def start(self) -> subprocess.Popen[bytes]:
        self.stderr.seek(0)
        self.stderr.truncate()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + sys.path))
        self.process = subprocess.Popen([sys.executable, WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.stderr, env=env)
        try:  # the batch and case timeouts time the cases, not the imports
            if self._read(self.process, 1, START_TIMEOUT) != READY:
                raise WorkerDied("the worker's first byte was not its ready byte", "")
        except WorkerDied as died:
            raise WorkerDied(f"while starting: {died.why}", self._stop()) from None
        return self.process

    def run(self, batch: list[Any], timeout: float) -> list[dict[str, Any]]:
        process = self.process if self.process and self.process.poll() is None else self.start()
        assert process.stdin and process.stdout
        payload = pickle.dumps(batch)
        try:
            process.stdin.write(struct.pack(">I", len(payload)) + payload)
            process.stdin.flush()
            header = self._read(process, 4, timeout)
            return pickle.loads(self._read(process, struct.unpack(">I", header)[0], timeout))
        except (BrokenPipeError, WorkerDied) as error:
            why = error.why if isinstance(error, WorkerDied) else "worker closed its input"
            raise WorkerDied(why, self._stop()) from None

    def _read(self, process: subprocess.Popen[bytes], size: int, timeout: float) -> bytes:
        assert process.stdout
        fd = process.stdout.fileno()
        chunks, left = [], size
        while left:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise WorkerDied(f"no answer within {timeout:g} s (a hang)", "")
            chunk = os.read(fd, left)
            if not chunk:
                process.wait()
                code = process.returncode
                name = signal.Signals(-code).name if code < 0 else f"exit status {code}"
                raise WorkerDied(f"worker died: {name}", "")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _stop(self) -> str:
        """Kills the worker; returns the end of what it wrote to stderr."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            self.process = None
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-4000:]

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.stderr.close()


@dataclass
class Report:
    cases: int = 0
    raised: int = 0  # cases rejected with an allowed exception
    returned: int = 0  # cases that returned normally
    failures: list[dict[str, Any]] = field(default_factory=list)
    per_target: dict[str, int] = field(default_factory=dict)


class Pool:
    """Runs batches on `workers` worker processes; `submit` returns at once while a worker is
    free, so hypothesis generates the next batch while the last ones run."""

    def __init__(self, workers: int, batch_timeout: float = BATCH_TIMEOUT, case_timeout: float = CASE_TIMEOUT) -> None:
        self.idle = [Worker() for _ in range(workers)]
        self.batch_timeout = batch_timeout
        self.case_timeout = case_timeout
        self.lock = threading.Lock()
        self.free = threading.Semaphore(workers)
        self.executor = ThreadPoolExecutor(workers)
        self.futures: list[Future[None]] = []
        self.report = Report()

    def submit(self, batch: list[tuple[int, str, dict[str, Any]]]) -> None:
        self.free.acquire()
        self.futures.append(self.executor.submit(self._run, batch))

    def _run(self, batch: list[tuple[int, str, dict[str, Any]]]) -> None:
        with self.lock:
            worker = self.idle.pop()
        try:
            try:
                results = worker.run(batch, self.batch_timeout)
            except WorkerDied as died:
                results = [self._alone(worker, case) for case in batch]
                if not any(r.get("crashed") for r in results):  # only together: report the batch
                    results[-1] = {**results[-1], "crashed": True, "problems": results[-1]["problems"] + [
                        f"the batch crashed ({died.why}), no case alone; run the batch's cases in order\n"
                        f"{died.stderr}"] + [repro_command(case) for case in batch]}
            self._record(batch, results)
        finally:
            with self.lock:
                self.idle.append(worker)
            self.free.release()

    def _alone(self, worker: Worker, case: tuple[int, str, dict[str, Any]]) -> dict[str, Any]:
        """The result of one case of a batch that crashed, run on its own."""
        try:
            return worker.run([case], self.case_timeout)[0]
        except WorkerDied as died:
            return {"id": case[0], "target": case[1], "raised": None, "message": "", "crashed": True,
                    "problems": [f"{died.why}\n{died.stderr}"]}

    def _record(self, batch: list[tuple[int, str, dict[str, Any]]], results: list[dict[str, Any]]) -> None:
        with self.lock:
            report = self.report
            for case, result in zip(batch, results):
                report.cases += 1
                report.per_target[case[1]] = report.per_target.get(case[1], 0) + 1
                if result["problems"]:
                    report.failures.append({**result, "args": case[2], "repro": repro_command(case)})
                elif result["raised"]:
                    report.raised += 1
                else:
                    report.returned += 1

    def close(self) -> Report:
        for future in self.futures:
            future.result()
        self.executor.shutdown()
        for worker in self.idle:
            worker.close()
        return self.report
