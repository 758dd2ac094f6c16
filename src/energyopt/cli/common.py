"""What every command module shares: exit codes, error lines, progress."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

EXIT_OK = 0
EXIT_VIOLATION = 1
EXIT_BAD_INPUT = 2
EXIT_INFEASIBLE = 3
EXIT_INTERNAL = 4
EXIT_DEVICE = 5
EXIT_SIGNAL = 130


def err(line: str) -> None:
    """One line on stderr."""
    print(line, file=sys.stderr, flush=True)


def progress(quiet: bool) -> Callable[[str], None]:
    """Progress lines on the terminal's stderr, even while a solver captures output."""
    start = time.perf_counter()
    stream = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1) if not quiet else None

    def say(line: str) -> None:
        if stream is not None:
            stream.write(f"[{time.perf_counter() - start:6.1f}s] {line}\n")

    return say
