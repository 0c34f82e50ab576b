"""`python -m gputrain` prints what was built and what this machine offers."""

from __future__ import annotations

import gputrain


def main() -> None:
    for key, value in sorted(gputrain.info().items()):
        print(f"{key:>24}: {value}")


if __name__ == "__main__":
    main()
