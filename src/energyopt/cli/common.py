"""What every command module shares: exit codes, error lines, progress."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

EXIT_OK = 0
EXIT_VIOLATION = 1
"""verify: the plan breaks a constraint or states a figure that is not its own."""
EXIT_BAD_INPUT = 2
"""A file or argument is wrong (the message names the file and the field)."""
EXIT_INFEASIBLE = 3
"""solve: proven infeasible (no plan exists), with a diagnosis."""
EXIT_INTERNAL = 4
EXIT_DEVICE = 5
EXIT_NO_PLAN = 6
"""solve: no plan found within the solver's limits, and none proven not to exist
(a longer --time-limit or another solver may find one)."""
EXIT_SIGNAL = 130

EXIT_CODES = (
    "exit status: 0 ok; 1 a plan breaks a constraint (verify); 2 bad input; "
    "3 proven infeasible (solve); 4 internal error; 5 GPU/NVML error; "
    "6 no plan found within the limits, feasibility not decided (solve); 130 interrupted"
)
"""The exit statuses of every command, as ``energyopt --help`` lists them."""


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
