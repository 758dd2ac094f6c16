"""Small co-location problems for the tests."""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from energyopt.families.colocation.formulations.problem import ColocationProblem, resolve_colocation
from energyopt.families.colocation.spec import ColocationInstance
from energyopt.spec.io import parse

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "tests" / "data" / "colocation-small.yaml"


@lru_cache(maxsize=1)
def _small_text() -> str:
    return SMALL.read_text(encoding="utf-8")


def small_data() -> dict[str, Any]:
    """The small test instance as plain data (a fresh copy)."""
    data: dict[str, Any] = yaml.safe_load(_small_text())
    return copy.deepcopy(data)


def problem_of(data: dict[str, Any]) -> ColocationProblem:
    """Validate and resolve instance data."""
    return resolve_colocation(parse(ColocationInstance, data, "<test>"), "<test>")
