"""``energyopt validate`` / ``solve`` of a compile spec (``kind: plans`` or ``oppoints``).

A compile spec describes a lookup table for ``energyopt compile``; validating it
checks the spec, its base instance and the names it uses; solving it is a mistake
this module explains.
"""

from __future__ import annotations

import argparse

from energyopt.solvers.presets import load_preset
from energyopt.spec.errors import SpecError
from energyopt.tables.spec import load_checked


def validate_file(path: str, catalogs: list[str]) -> str:
    """One-line summary of a valid compile spec; SpecError naming the file and field.

    ``catalogs`` is accepted for the family interface; the base instance's own
    catalog entries are what a compile uses, so extra catalogs are rejected."""
    if catalogs:
        raise SpecError([f"{path}: --catalog: a compile spec's base instance names its catalog"])
    spec, base, problem = load_checked(path)
    if spec.kind == "oppoints":
        types = len(spec.gpu_types) or len(problem.gpu_types_used())
        return (
            f"oppoints compile spec: base {base.name}, {len(problem.instance.workloads)} "
            f"workloads, {types} GPU types, {max(len(spec.slo_tiers), 1)} SLO tiers, "
            f"{spec.load_points} load points"
        )
    try:
        load_preset(spec.solver)
    except SpecError as exc:
        raise SpecError(
            [f"{path}: solver: {line.removeprefix('--solver: ')}" for line in exc.problems]
        ) from None
    return f"plans compile spec: base {base.name}, {spec.cells()} cells, solver {spec.solver}"


def solve_file(args: argparse.Namespace) -> int:
    """A compile spec is not solved directly: SpecError that says what to run."""
    validate_file(args.file, list(args.catalog))
    raise SpecError(
        [
            f"{args.file}: kind: this is a compile spec; build its table with "
            f"`energyopt compile {args.file} -o TABLE.eot` (--workers N for parallel cells)"
        ]
    )
