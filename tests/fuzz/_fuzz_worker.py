"""The fuzz worker: a child process that runs batches of cases and reports each one's outcome.

Protocol (stdin/stdout, binary): once imported, the worker writes one READY byte; then the parent
writes a 4-byte big-endian length and a pickled list of cases (case_id, target name,
{argument: spec}); the worker answers the same way with a list of result dicts. Anything the
library or a case prints goes to stderr. A crash ends the process with a signal; the parent then
re-runs the batch case by case (tests/fuzz/_fuzz_runner.py).

    python tests/fuzz/_fuzz_worker.py --repro BASE64   # one case, in the foreground, with traceback
"""

from __future__ import annotations

import base64
import os
import pickle
import resource
import struct
import sys
import traceback
import warnings
from typing import Any, BinaryIO

import numpy as np

import gputrain as gt
from _fuzz_runner import READY
from _fuzz_targets import TARGETS, Target, snapshot
from _fuzz_values import make

MEMORY_LIMIT = 512 << 20  # gputrain's allocator limit during a case (bytes)
ADDRESS_SPACE = 6 << 30  # RLIMIT_AS of a worker without sanitizers: a huge allocation fails at once


def limit_address_space() -> None:
    """A case that makes NumPy or the library allocate gigabytes fails instead of swapping the
    machine. Sanitizers reserve terabytes of shadow memory, so they get no limit (their own
    allocator_may_return_null / max_allocation_size_mb options bound them instead)."""
    if "san" not in os.environ.get("LD_PRELOAD", ""):
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def reset_process_state() -> None:
    gt.set_memory_limit(MEMORY_LIMIT)
    gt.set_num_threads(1)
    gt.set_debug(False)


def _arrays(value: Any) -> Any:
    """The writable arrays inside an argument (to check that a call did not write into them)."""
    if isinstance(value, np.ndarray):
        return snapshot(value) if value.flags.writeable and value.dtype != object else None
    if isinstance(value, (list, tuple)) and any(isinstance(v, np.ndarray) for v in value):
        return [_arrays(v) for v in value]
    return None


def run_case(case_id: int, name: str, specs: dict[str, Any]) -> dict[str, Any]:
    """The outcome of one case; an error of the suite itself (a fixture that fails) is reported
    as a problem of the case rather than ending the worker."""
    try:
        return _run_case(case_id, name, specs)
    except Exception as error:  # noqa: BLE001
        return {"id": case_id, "target": name, "raised": None, "message": "",
                "problems": ["fuzz suite error: " + "".join(traceback.format_exception(error))[-1500:]]}


def _run_case(case_id: int, name: str, specs: dict[str, Any]) -> dict[str, Any]:
    target: Target = TARGETS[name]
    result: dict[str, Any] = {"id": case_id, "target": name, "raised": None, "message": "", "problems": []}
    problems = result["problems"]
    reset_process_state()
    fixture = target.setup() if target.setup else None
    before = snapshot(target.state(fixture)) if target.state else None
    args = {k: make(spec, case_id * 131 + i) for i, (k, spec) in enumerate(specs.items())}
    inputs = {k: _arrays(v) for k, v in args.items() if k not in target.mutates}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            target.call(fixture, **args)
    except BaseException as error:  # noqa: BLE001 - every exception is classified
        result["raised"] = type(error).__name__
        result["message"] = str(error)[:300]
        if isinstance(error, KeyboardInterrupt):
            raise
        if not isinstance(error, target.allowed):
            problems.append(f"raised {type(error).__module__}.{type(error).__name__} (allowed: "
                            f"{', '.join(e.__name__ for e in target.allowed)}): {str(error)[:300]}\n"
                            + "".join(traceback.format_exception(error)[-4:]))
        elif target.state:
            try:
                after = snapshot(target.state(fixture))
            except BaseException as state_error:  # noqa: BLE001
                problems.append(f"state unreadable after a rejected call: {state_error!r}")
            else:
                if after != before:
                    problems.append(f"state changed by a rejected call ({type(error).__name__}: {error})")
    for k, was in inputs.items():
        if was is not None and _arrays(args[k]) != was:
            problems.append(f"argument {k!r} was modified")
    return result


def read_message(stream: BinaryIO) -> Any:
    header = stream.read(4)
    if len(header) < 4:
        return None
    (size,) = struct.unpack(">I", header)
    return pickle.loads(stream.read(size))


def write_message(stream: BinaryIO, value: Any) -> None:
    payload = pickle.dumps(value)
    stream.write(struct.pack(">I", len(payload)) + payload)
    stream.flush()


def serve() -> None:
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # prints of the library or of a case never reach the protocol
    sys.stdout = sys.stderr
    replies.write(READY)  # imported: the parent's timeouts count from here
    replies.flush()
    while (batch := read_message(requests)) is not None:
        write_message(replies, [run_case(*case) for case in batch])


def repro(encoded: str) -> None:
    case_id, name, specs = pickle.loads(base64.b64decode(encoded))
    print(f"target {name}, arguments {specs!r}", flush=True)
    target = TARGETS[name]
    reset_process_state()
    fixture = target.setup() if target.setup else None
    args = {k: make(spec, case_id * 131 + i) for i, (k, spec) in enumerate(specs.items())}
    print(run_case(case_id, name, specs))
    target.call(fixture, **args)  # once more, with its traceback


if __name__ == "__main__":
    limit_address_space()
    if len(sys.argv) == 3 and sys.argv[1] == "--repro":
        repro(sys.argv[2])
    else:
        serve()
