"""`python -m gputrain` prints what was built, what this machine offers, and what cannot work."""

from __future__ import annotations

import gputrain
from gputrain._info import version_text


def main() -> None:
    facts = gputrain.info()
    libraries = facts.pop("libraries")
    warnings = facts.pop("warnings")
    for key in ("cuda_runtime_version", "cuda_driver_version"):
        facts[key] = f"{version_text(facts[key])} ({facts[key]})"
    for key, value in sorted(facts.items()):
        print(f"{key:>24}: {value}")
    for name, path in libraries.items():
        print(f"{'loaded ' + name:>24}: {path}")
    for warning in warnings:
        print(f"WARNING: {warning}")


if __name__ == "__main__":
    main()
