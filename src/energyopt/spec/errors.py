"""The exception hierarchy of energyopt, and the error raised for bad input files.

Every error energyopt raises on purpose derives from ``EnergyoptError``:

- ``InputError`` (also a ``ValueError``): bad input; ``problems`` lists
  'source: field: message' lines, the source being a file or ``<dict>``.
  ``SpecError``, what the loaders raise, is one.
- ``MissingFileError`` (also a ``FileNotFoundError``): a named input file does not exist.
- ``SolverError`` (also a ``RuntimeError``): a solver or backend failed, or a
  solver's plan failed its independent verification (a bug).
- ``NvmlError``: applying settings to GPUs failed (``energyopt.nvml.errors``).

This module imports only the standard library: ``except energyopt.EnergyoptError``
imports no solver.
"""

from __future__ import annotations

import errno
import os


class EnergyoptError(Exception):
    """Base of every error energyopt raises on purpose."""


class InputError(EnergyoptError, ValueError):
    """Bad input. ``problems`` lists 'source: field: message' lines (the source is the
    file, or ``<dict>`` for a document given as a mapping)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class SpecError(InputError):
    """Bad input file or argument, as the loaders and the command line report it.
    ``problems`` lists 'file: field: message' lines."""


class MissingFileError(EnergyoptError, FileNotFoundError):
    """A named input file does not exist. ``filename`` is the path as given;
    ``problems`` holds the one 'path: no such file' line, as ``InputError``'s do."""

    def __init__(self, path: str | os.PathLike[str], what: str = "file") -> None:
        super().__init__(errno.ENOENT, f"no such {what}", os.fspath(path))
        self.problems = [f"{os.fspath(path)}: no such {what}"]

    def __str__(self) -> str:
        return self.problems[0]


class SolverError(EnergyoptError, RuntimeError):
    """A solver or its backend failed, or a solver's plan failed verification."""


class NvmlError(EnergyoptError):
    """Reading or changing GPU settings through NVML failed (``energyopt.nvml.errors``
    holds the specific errors; each message says what the user can do)."""
