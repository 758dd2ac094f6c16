"""The ``energyopt`` command: one module per group of verbs, each family reached
through the registry in ``energyopt.families``."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Sequence

from energyopt import __version__
from energyopt.cli import agent as agent_verbs
from energyopt.cli import calibrate, evaluate, executor, problems, profile, tables
from energyopt.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_DEVICE,
    EXIT_INFEASIBLE,
    EXIT_INTERNAL,
    EXIT_NO_PLAN,
    EXIT_OK,
    EXIT_SIGNAL,
    EXIT_VIOLATION,
    err,
)
from energyopt.spec.errors import SpecError

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_DEVICE",
    "EXIT_INFEASIBLE",
    "EXIT_INTERNAL",
    "EXIT_NO_PLAN",
    "EXIT_OK",
    "EXIT_SIGNAL",
    "EXIT_VIOLATION",
    "build_parser",
    "main",
]


OUTPUT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}
)
"""Errors of writing output (a full disk or quota, a read-only or failing device):
reported as what they are, not as an internal error."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every verb."""
    parser = argparse.ArgumentParser(
        prog="energyopt",
        description="Energy-optimal placement, SM partitioning and clocks for GPU fleets.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version=f"energyopt {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    problems.configure(sub)
    executor.configure(sub)
    tables.configure(sub)
    calibrate.configure(sub)
    profile.configure(sub)
    agent_verbs.configure(sub)
    p = sub.add_parser("evaluate", help="simulate planners on a trace or synthetic load")
    evaluate.configure(p)
    for name in ("validate", "show", "solve", "verify", "export", "compile", "evaluate"):
        sub.choices[name].add_argument(
            "--limit",
            action="append",
            default=[],
            metavar="NAME=N",
            help="raise a size limit a file is held to (names and defaults: docs/limits.md)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from energyopt.spec.limits import Limits, parse_limit_options, using

    args = build_parser().parse_args(argv)
    try:
        limits = parse_limit_options(getattr(args, "limit", []), Limits())
        with using(limits):
            return int(args.func(args))
    except SpecError as exc:
        for line in exc.problems:
            err(line)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        err("interrupted")
        return EXIT_SIGNAL
    except BrokenPipeError:  # output piped into e.g. `head`, which closed early
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno in OUTPUT_ERRNOS:
            # e.g. stdout redirected to a full disk: the output is lost, not a bug
            where = exc.filename or "standard output"
            err(f"energyopt: {where}: cannot write: {exc.strerror or exc}")
            return EXIT_BAD_INPUT
        err(f"energyopt: internal error: {type(exc).__name__}: {exc}")
        err("please report it with the input file")
        return EXIT_INTERNAL


if __name__ == "__main__":
    raise SystemExit(main())
