"""Bytes an install of gputrain puts in site-packages: gputrain's own files (the extension, the
Python package, the bundled oneDNN in gputrain/lib/, a repaired wheel's gputrain.libs/) plus its
CPU GEMM dependency where that is a wheel of its own (scipy-openblas32 off x86-64). NumPy,
safetensors and NVIDIA's CUDA wheels are not counted: they are shared with PyTorch and others.
gputrain._C_testing, the test-only bindings (which the package never imports; it links its own
copy of the core), is printed apart and not counted.

    python .ci/installed_size.py --max-mb 80     # fails above 80 MB (10^6 bytes)

Run it with the interpreter of the environment to measure (docs/building.md, "A wheel": the sizes).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import sys

CPU_GEMM_DISTRIBUTIONS = ("onednn-cpu-gomp", "scipy-openblas32")


TEST_ONLY = re.compile(r"gputrain/_C_testing[.].*so$")  # the test-only bindings' extension, counted apart


def distribution_bytes(name: str, test_only: bool = False) -> int:
    """Bytes of the files `name` installed (by its RECORD), 0 when it is not installed: those
    of its test-only extension if `test_only`, else all others."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return 0
    total = 0
    for file in dist.files or []:
        path = dist.locate_file(file)
        if os.path.isfile(path) and bool(TEST_ONLY.search(str(file))) == test_only:
            total += os.path.getsize(path)
    return total


def required(name: str) -> bool:
    """Whether the installed gputrain names distribution `name` among its requirements (whatever
    the marker: one for another machine is not installed here, so it counts 0 bytes)."""
    for text in importlib.metadata.requires("gputrain") or []:
        if re.match(rf"{re.escape(name)}\b(?!-)", text):
            return True
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mb", type=float, required=True, help="the ceiling, in 10^6 bytes")
    args = parser.parse_args()
    parts = {"gputrain": distribution_bytes("gputrain")}
    if parts["gputrain"] == 0:
        print("gputrain is not installed in this environment", file=sys.stderr)
        return 1
    for name in CPU_GEMM_DISTRIBUTIONS:
        if required(name) and distribution_bytes(name):
            parts[name] = distribution_bytes(name)
    total = sum(parts.values())
    described = ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in parts.items())
    print(f"installed size: {total / 1e6:.1f} MB ({described}); ceiling {args.max_mb:g} MB; besides, the "
          f"test-only gputrain._C_testing {distribution_bytes('gputrain', test_only=True) / 1e6:.1f} MB")
    if total > args.max_mb * 1e6:
        print("over the ceiling: something large joined the install (a second copy of a library?)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
