"""Where gputrain builds (_build/gputrain_platform.py): Linux x86-64 and aarch64; native Windows and
macOS stop at once with that message, before the build looks for or compiles anything."""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "_build" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("system, machine", [
    ("Linux", "x86_64"), ("Linux", "aarch64"), ("Linux", "AMD64"), ("Linux", "arm64"),
])
def test_linux_x86_64_and_aarch64_build(system, machine):
    platform_check = load("gputrain_platform")
    assert platform_check.unsupported_reason(system, machine) is None
    platform_check.check(system, machine)


@pytest.mark.parametrize("system, machine, named", [
    ("Windows", "AMD64", "native Windows"),
    ("Darwin", "arm64", "Darwin arm64"),
    ("Darwin", "x86_64", "Darwin x86_64"),
    ("Linux", "ppc64le", "Linux ppc64le"),
    ("FreeBSD", "amd64", "FreeBSD amd64"),
])
def test_other_platforms_stop_with_where_it_runs(system, machine, named):
    platform_check = load("gputrain_platform")
    with pytest.raises(RuntimeError) as raised:
        platform_check.check(system, machine)
    message = str(raised.value)
    assert "Linux x86-64 and aarch64" in message and "WSL2" in message and named in message


def test_setup_py_stops_before_anything_else_on_macos(tmp_path):
    # setup.py run with platform.system() faked to "Darwin" (a faked "Windows" makes setuptools
    # itself import winreg): the check raises before setup.py looks for the GEMM library or the
    # CUDA toolkit (it would fail differently if it got there).
    code = (f"import platform, runpy, sys\n"
            f"platform.system = lambda: 'Darwin'\n"
            f"platform.machine = lambda: 'x86_64'\n"
            f"sys.argv = ['setup.py', '--version']\n"
            f"runpy.run_path({str(ROOT / 'setup.py')!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "RuntimeError: gputrain runs on Linux x86-64 and aarch64" in done.stderr, done.stderr
    assert "this is Darwin x86_64" in done.stderr
    assert "setup.py\", line" in done.stderr and "find_blas" not in done.stderr


def test_build_backend_stops_in_its_first_hook(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "_build"))
    pytest.importorskip("setuptools")
    for name in ("backend", "gputrain_platform", "gputrain_cuda"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    backend = importlib.import_module("backend")
    monkeypatch.setattr("platform.system", lambda: "Darwin")
    monkeypatch.setattr("platform.machine", lambda: "arm64")
    for hook in (backend.get_requires_for_build_wheel, backend.get_requires_for_build_editable):
        with pytest.raises(RuntimeError, match="this is Darwin arm64"):
            hook()
