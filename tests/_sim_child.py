"""Test code run in a child process with the simulated device's random stream delays: the sim
reads GPUTRAIN_SIM_DELAY_US once per process, so a test that wants the delays starts a child."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

TESTS = os.path.dirname(os.path.abspath(__file__))


def run_with_sim_delays(code: str, delay_us: str = "300") -> None:
    """Runs `code` (dedented) in a child whose sim delays each stream operation by up to
    `delay_us` microseconds at random, with this directory importable; fails on its failure."""
    env = dict(os.environ, GPUTRAIN_SIM_DELAY_US=delay_us)
    env["PYTHONPATH"] = os.pathsep.join([TESTS, *sys.path])
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
