"""A torchrun-style launcher for one machine, for installs without torch or MPI:

    python -m gputrain.distributed.run --nproc-per-node 2 examples/char_gpt.py --distributed

starts N processes of the script with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set (a free port unless --master-port), so that
``gputrain.distributed.init()`` joins them over TCP. SIGINT, SIGTERM and SIGHUP are forwarded to
every rank; when a rank fails the others are terminated (killed after --grace seconds) and the
launcher exits with the failed rank's status.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gputrain.distributed.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc-per-node", type=int, required=True, help="ranks to start (the world size)")
    parser.add_argument("--master-addr", default="127.0.0.1", help="where rank 0's TCP store listens")
    parser.add_argument("--master-port", type=int, default=0, help="its port (default: a free one)")
    parser.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("script", help="the Python script every rank runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    if args.nproc_per_node < 1:
        parser.error(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    if not 0 <= args.master_port <= 65535:
        parser.error(f"--master-port must be in 0..65535, got {args.master_port}")
    return args


def start(args: argparse.Namespace) -> list[subprocess.Popen]:
    port = args.master_port or free_port(args.master_addr)
    procs = []
    for rank in range(args.nproc_per_node):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.nproc_per_node), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(args.nproc_per_node), MASTER_ADDR=args.master_addr, MASTER_PORT=str(port))
        # A session of its own: a terminal's Ctrl-C reaches the launcher once, which forwards it once.
        procs.append(subprocess.Popen([sys.executable, args.script, *args.args], env=env, start_new_session=True))
    return procs


def stop(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM to the ranks still running, SIGKILL to those still running `grace` s later."""
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
    return 128 - code if code < 0 else code  # killed by signal s: 128 + s, as a shell reports it


def supervise(procs: list[subprocess.Popen], grace: float) -> int:
    """Waits for every rank; the first failure stops the others. The job's exit status."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            rank, code = failed[0]
            print(f"gputrain.distributed.run: rank {rank} exited with status {exit_status(code)}; stopping the "
                  "other ranks", file=sys.stderr, flush=True)
            stop(procs, grace)
            return exit_status(code)
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    procs = start(args)
    previous = {s: signal.getsignal(s) for s in FORWARDED}

    def forward(signum: int, frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for s in FORWARDED:
        signal.signal(s, forward)
    try:
        return supervise(procs, args.grace)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        stop(procs, args.grace)


if __name__ == "__main__":
    sys.exit(main())
