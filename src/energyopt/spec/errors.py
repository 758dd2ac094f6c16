"""Errors raised for bad input files."""

from __future__ import annotations


class SpecError(ValueError):
    """Bad input. ``problems`` lists 'file: field: message' lines."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems
