"""A torchrun-style launcher for one machine, for installs without torch or MPI:

    python -m gputrain.distributed.run --nproc-per-node 2 examples/char_gpt.py --distributed

starts N processes of the script with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set (a free port unless --master-port), so that
``gputrain.distributed.init()`` joins them over TCP. SIGINT, SIGTERM and SIGHUP are forwarded to
every rank; when a rank fails the others are terminated (killed after --grace seconds) and the
launcher exits with the failed rank's status.

The ranks die with the launcher: on Linux each asks for SIGKILL when the launcher dies
(PR_SET_PDEATHSIG), so a launcher killed with SIGKILL leaves no rank training on. Every exit of a
rank (status 0 included) is written to the other ranks' notice pipes (GPUTRAIN_LAUNCHER_NOTICES):
a rank still waiting in ``init()`` for one that exited fails at once, naming it.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from gputrain._parent_death import die_with_parent
from gputrain.distributed._tcp import MAX_WORLD_SIZE, NOTICES_VAR

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def free_port(host: str) -> int:
    """A TCP port free on `host` now (the OS picks it); OSError naming --master-addr when nothing can listen there."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    except OSError as error:  # socket.gaierror included: a name that does not resolve
        raise OSError(error.errno, f"--master-addr {host!r}: cannot listen there: {error.strerror or error}") from None


def parse(argv: list[str]) -> argparse.Namespace:
    """The launcher's command line: --nproc-per-node (1..65536), --master-addr, --master-port, --grace, the
    script and its arguments; argparse exits with a message on a bad value."""
    parser = argparse.ArgumentParser(prog="python -m gputrain.distributed.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc-per-node", type=int, required=True, help="ranks to start (the world size)")
    parser.add_argument("--master-addr", default="127.0.0.1", help="where rank 0's TCP store listens")
    parser.add_argument("--master-port", type=int, default=0, help="its port (default: a free one)")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("script", help="the Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if not 1 <= args.nproc_per_node <= MAX_WORLD_SIZE:
        parser.error(f"--nproc-per-node must be in 1..{MAX_WORLD_SIZE}, got {args.nproc_per_node}")
    if not 0 <= args.master_port <= 65535:
        parser.error(f"--master-port must be in 0..65535, got {args.master_port}")
    return args


class Rank:
    """One rank's process and the write end of its notice pipe (the launcher's news of the
    other ranks' exits)."""

    def __init__(self, proc: subprocess.Popen, notices: int) -> None:
        self.proc, self.notices = proc, notices

    def notify(self, rank: int, status: int) -> None:
        """Tell this rank that `rank` exited with `status` (one line on its notice pipe; a full or
        closed pipe is ignored)."""
        if self.notices < 0:
            return
        try:
            os.write(self.notices, f"{rank} {status}\n".encode())  # one short write: atomic, never blocks
        except OSError:  # BlockingIOError (nobody reads: a full pipe), BrokenPipeError (it exited)
            pass

    def close(self) -> None:
        """Close the write end of this rank's notice pipe (idempotent)."""
        if self.notices >= 0:
            os.close(self.notices)
            self.notices = -1


def start(args: argparse.Namespace) -> list[Rank]:
    """Start every rank of the job on one port (a free one unless --master-port); if one fails to start, those
    started are killed and the error propagates."""
    port = args.master_port or free_port(args.master_addr)
    ranks: list[Rank] = []
    try:
        for rank in range(args.nproc_per_node):
            ranks.append(start_rank(args, rank, port))
    except BaseException:
        for r in ranks:
            r.proc.kill()
            r.proc.wait()
            r.close()
        raise
    return ranks


def start_rank(args: argparse.Namespace, rank: int, port: int) -> Rank:
    """Start rank `rank` of the script with its RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
    MASTER_PORT, its own session, its notice pipe and SIGKILL when the launcher dies."""
    read, write = os.pipe()
    try:
        os.set_blocking(write, False)
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.nproc_per_node), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(args.nproc_per_node), MASTER_ADDR=args.master_addr, MASTER_PORT=str(port))
        env[NOTICES_VAR] = f"{os.getpid()}:{read}"
        # A session of its own: a terminal's Ctrl-C reaches the launcher once, which forwards it once.
        # SIGKILL when the launcher dies (checked against a launcher that died while it started).
        proc = subprocess.Popen([sys.executable, args.script, *args.args], env=env, start_new_session=True,
                                pass_fds=(read,), preexec_fn=die_with_parent(os.getpid()))
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    return Rank(proc, write)


def stop(ranks: list[Rank], grace: float) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those still running `grace` s later."""
    procs = [r.proc for r in ranks]
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def exit_status(code: int) -> int:
    """A process's exit status as a shell reports it: a rank killed by signal s gives 128 + s."""
    return 128 - code if code < 0 else code  # killed by signal s: 128 + s, as a shell reports it


def supervise(ranks: list[Rank], grace: float) -> int:
    """Waits for every rank, telling the others of each exit; the first failure stops the
    others. The job's exit status."""
    seen: set[int] = set()
    while True:
        codes = [r.proc.poll() for r in ranks]
        for rank, code in enumerate(codes):
            if code is not None and rank not in seen:
                seen.add(rank)
                for other in ranks:
                    if other is not ranks[rank]:
                        other.notify(rank, exit_status(code))
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            print(f"gputrain.distributed.run: rank {rank} exited with status {exit_status(code)}; stopping the "
                  "other ranks", file=sys.stderr, flush=True)
            stop(ranks, grace)
            return exit_status(code)
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    """Run the launcher (python -m gputrain.distributed.run ...): start the ranks, forward
    SIGINT/SIGTERM/SIGHUP to them, supervise them, and return the job's exit status (the first failed
    rank's, 0 when all succeed)."""
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        ranks = start(args)
    except OSError as error:
        print(f"gputrain.distributed.run: {error.strerror or error}", file=sys.stderr, flush=True)
        return 1
    previous = {s: signal.getsignal(s) for s in FORWARDED}

    def forward(signum: int, frame: object) -> None:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.send_signal(signum)

    for s in FORWARDED:
        signal.signal(s, forward)
    try:
        return supervise(ranks, args.grace)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        stop(ranks, args.grace)
        for r in ranks:
            r.close()


if __name__ == "__main__":
    sys.exit(main())
