"""gputrain.info(), threads, the SIMD level and `python -m gputrain`."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

import gputrain
from gputrain import _C


# The CPU GEMM library gputrain is built with on this architecture (setup.py).
EXPECTED_BLAS = "onednn" if platform.machine() == "x86_64" else "openblas"


def test_info_reports_build_and_machine():
    facts = gputrain.info()
    assert facts["version"] == gputrain.__version__
    assert facts["blas"] == EXPECTED_BLAS and facts["blas_config"] and facts["blas_kernel"]
    assert facts["simd"] in ("scalar", "avx2", "avx512")
    assert isinstance(facts["cuda_compiled"], bool)
    assert facts["cuda_available"] == (facts["cuda_device_count"] > 0)
    assert "-ffp-contract=off" in facts["compile_flags"]
    assert facts["cpu_count"] >= 1


def test_python_m_gputrain_prints_info():
    out = subprocess.run([sys.executable, "-m", "gputrain"], capture_output=True, text=True, check=True)
    assert "blas" in out.stdout and "cuda_compiled" in out.stdout


def test_num_threads_round_trip():
    original = gputrain.get_num_threads()
    try:
        gputrain.set_num_threads(1)
        assert gputrain.get_num_threads() == 1
    finally:
        gputrain.set_num_threads(original)
    assert gputrain.get_num_threads() == original


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-3, ValueError), (1.5, TypeError), ("2", TypeError), (True, TypeError), (10**30, ValueError)])
def test_set_num_threads_rejects_bad_values(bad, error):
    with pytest.raises(error, match="num_threads"):
        gputrain.set_num_threads(bad)


def test_simd_level_can_be_lowered_and_restored():
    best = gputrain.info()["simd_supported"]
    try:
        _C.set_simd_level("scalar")
        assert gputrain.info()["simd"] == "scalar"
    finally:
        _C.set_simd_level(best)
    assert gputrain.info()["simd"] == best
    with pytest.raises(ValueError, match="level"):
        _C.set_simd_level("sse9")
    with pytest.raises(TypeError, match="level"):
        _C.set_simd_level(2)


def test_import_needs_no_environment_variables():
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/")}
    if "PYTHONPATH" in os.environ:  # an uninstalled build under test; no library path is passed
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    code = "import gputrain; print(gputrain.info()['blas'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == EXPECTED_BLAS
