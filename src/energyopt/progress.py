"""The progress callback every long-running function takes: one line of text per call
(the CLI prints it on stderr with the elapsed time; ``-q`` drops it)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """A progress callback that drops every line."""
    return None
