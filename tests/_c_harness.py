"""Builds a host harness of CUDA kernel math (tests/_*_harness.c, C11 over the GT_HD headers of
csrc/ops/) into a shared library with the system C compiler, flags as the extension's
(-ffp-contract=off: every operation rounded once, as nvcc --fmad=false). The tests run from a
source checkout, whose build already needed a C compiler, so a missing compiler or source tree is
a failure, not a skip."""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(source: str, directory: Path) -> ctypes.CDLL:
    """The harness tests/<source> compiled into `directory` and loaded."""
    assert (ROOT / "csrc" / "ops").is_dir(), "the C sources (csrc/) are not next to the tests"
    command = shlex.split(os.environ.get("CC") or "cc")
    assert shutil.which(command[0]), f"no C compiler ({command[0]}) to build {source}"
    lib = directory / (Path(source).stem.lstrip("_") + ".so")
    cmd = [*command, "-std=c11", "-O2", "-ffp-contract=off", "-fPIC", "-shared", f"-I{ROOT / 'csrc'}",
           str(ROOT / "tests" / source), "-o", str(lib), "-lm"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stderr}"
    return ctypes.CDLL(str(lib))
