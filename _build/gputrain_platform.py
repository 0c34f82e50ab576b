"""Where gputrain builds: Linux on x86-64 and aarch64 (on Windows inside WSL2, which is Linux).

setup.py and the build backend call check() before anything is located or compiled, so an
unsupported platform stops with this message instead of a compiler error deep in the build.
"""

from __future__ import annotations

import platform

SUPPORTED_MACHINES = {"x86_64": "x86-64", "amd64": "x86-64", "aarch64": "aarch64", "arm64": "aarch64"}

SUPPORTED = ("gputrain runs on Linux x86-64 and aarch64; on Windows, install it inside WSL2 "
             "(Windows Subsystem for Linux 2, whose CUDA passthrough serves the GPU path)")


def unsupported_reason(system: str, machine: str) -> str | None:
    """Why gputrain cannot be built on this `platform.system()` and `platform.machine()`, or None."""
    if system == "Linux" and machine.lower() in SUPPORTED_MACHINES:
        return None
    here = "native Windows" if system == "Windows" else f"{system or 'an unknown system'} {machine or ''}".strip()
    return f"{SUPPORTED}; this is {here}, where it cannot be built."


def check(system: str | None = None, machine: str | None = None) -> None:
    """Raises RuntimeError with unsupported_reason() on a platform gputrain does not build on."""
    reason = unsupported_reason(platform.system() if system is None else system,
                                platform.machine() if machine is None else machine)
    if reason is not None:
        raise RuntimeError(reason)
