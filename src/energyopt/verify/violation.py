"""The one violation type every family's verifier reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """One broken constraint: its kind, where, and a sentence a user can act on."""

    kind: str
    where: str
    message: str

    def __str__(self) -> str:
        return (
            f"[{self.kind}] {self.where}: {self.message}"
            if self.where
            else (f"[{self.kind}] {self.message}")
        )
