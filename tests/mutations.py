"""Edits of instance data (nested dicts and lists) for bad-input tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Mutation = Callable[[dict[str, Any]], None]


def set_at(*keys: str | int, value: Any) -> Mutation:
    """A mutation that sets ``data[k0][k1]...[kn] = value``."""

    def mutate(data: dict[str, Any]) -> None:
        node: Any = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return mutate


def delete_at(*keys: str | int) -> Mutation:
    """A mutation that deletes ``data[k0][k1]...[kn]``."""

    def mutate(data: dict[str, Any]) -> None:
        node: Any = data
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return mutate
