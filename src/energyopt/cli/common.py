"""What every command module shares: exit codes, error lines, progress."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from energyopt.spec.errors import SpecError

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


def positive_seconds(text: str) -> float:
    """``--time-limit``: a finite number of seconds above 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} s: give a finite number of seconds above 0")
    return value


def relative_gap(text: str) -> float:
    """``--gap``: a finite fraction in [0, 1) (argparse type), e.g. 0.005 for 0.5 %."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value < 1:  # also refuses nan
        raise argparse.ArgumentTypeError(
            f"{text}: give a relative gap from 0 up to (not including) 1, e.g. 0.005 for 0.5 %"
        )
    return value


def output_path(path: str, option: str = "-o") -> Path:
    """An output file named on the command line; SpecError naming ``option`` when it is
    empty or names a folder (the operating system's own message for those misleads, e.g.
    "Device or resource busy" for ``-o ''``)."""
    if not path.strip():
        raise SpecError([f"{option}: empty file name; give the file to write"])
    target = Path(path)
    if path.endswith(("/", os.sep)) or target.is_dir():
        raise SpecError([f"{path}: {option}: is a folder; give the file to write"])
    return target
