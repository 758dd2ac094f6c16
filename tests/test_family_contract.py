"""One contract suite for every registered family, on its bundled instances.

Each family declares its bundled problem files (``instances``: globs relative to
the repository root). On every one of them the family loads the file, summarises
and shows it; on its smallest one every solver of the family runs at a short time
limit and its result is certified, verified, reported and written to a plan file
that reads back to the same plan and figures; the family's program exports (or
is refused as ``NotExportable``) through ``energyopt export``. A family registered
without bundled instances fails the suite."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK
from energyopt.families import _REGISTRY as REGISTRY
from energyopt.families import (
    NotExportable,
    certify,
    check_stated,
    family,
    kinds,
    register,
)
from energyopt.progress import quiet
from energyopt.solvers.result import FEASIBLE, OPTIMAL
from energyopt.spec.io import dump, file_kind, read_data

from .cli_helpers import read_exported, run
from .test_families import ClockChoiceFamily

ROOT = Path(__file__).resolve().parents[1]
TIME_LIMIT_S = 5.0
"""Seconds each solver gets on a family's smallest bundled instance."""
CERTIFY_GAP = 1e-4


def declared(kind: str) -> list[Path]:
    """The files the family of ``kind`` declares as bundled, smallest first (by file
    size, then name); empty where it declares none or its globs match nothing."""
    globs: tuple[str, ...] = getattr(family(kind), "instances", ())
    found = {path for pattern in globs for path in ROOT.glob(pattern) if path.is_file()}
    return sorted(found, key=lambda p: (p.stat().st_size, p.name))


def check_bundled_instances() -> None:
    """Fail unless every registered family declares bundled instances and each of
    its globs matches at least one file."""
    for kind in kinds():
        globs: tuple[str, ...] = getattr(family(kind), "instances", ())
        if not globs:
            pytest.fail(f"family {kind!r} declares no bundled instances (its `instances`)")
        for pattern in globs:
            if not any(p.is_file() for p in ROOT.glob(pattern)):
                pytest.fail(f"family {kind!r}: instances glob {pattern!r} matches no file")


def smallest(kind: str) -> Path:
    """The family's smallest bundled instance (the guard test fails where it has none)."""
    files = declared(kind)
    assert files, f"family {kind!r} has no bundled instances"
    return files[0]


INSTANCES = [(kind, path) for kind in kinds() for path in declared(kind)]
SOLVERS = [(kind, entry.name) for kind in kinds() for entry in family(kind).solvers()]


def test_every_registered_family_declares_bundled_instances() -> None:
    check_bundled_instances()
    assert {kind for kind, _ in INSTANCES} == set(kinds())


def test_a_family_registered_without_instances_fails_the_guard() -> None:
    fake = ClockChoiceFamily()
    assert not hasattr(fake, "instances")
    register(fake)
    try:
        with pytest.raises(pytest.fail.Exception, match="'clock-choice' declares no bundled"):
            check_bundled_instances()
    finally:
        del REGISTRY[fake.kind]
    check_bundled_instances()


@pytest.mark.parametrize(("kind", "path"), INSTANCES, ids=[f"{k}-{p.name}" for k, p in INSTANCES])
def test_every_bundled_instance_loads_and_shows(kind: str, path: Path) -> None:
    assert file_kind(path) == kind
    fam = family(kind)
    problem = fam.load(str(path), [])
    summary = fam.summary(problem)
    assert isinstance(summary, str) and summary.strip()
    shown = fam.show(problem)
    assert shown and all(isinstance(line, str) for line in shown)
    assert fam.sense(problem) in ("min", "max")
    assert fam.objective_unit(problem).strip()


@pytest.mark.parametrize(("kind", "solver"), SOLVERS, ids=[f"{k}-{s}" for k, s in SOLVERS])
def test_every_solver_plans_verifies_reports_and_round_trips(
    kind: str, solver: str, tmp_path: Path
) -> None:
    fam = family(kind)
    path = smallest(kind)
    problem = fam.load(str(path), [])
    entry = next(e for e in fam.solvers() if e.name == solver)
    result = fam.solve(problem, solver, time_limit_s=TIME_LIMIT_S, rel_gap=None, progress=quiet)
    certify(fam, problem, result, CERTIFY_GAP, quiet)
    assert result.plan is not None, (path.name, result.status, result.log)
    assert result.status in (OPTIMAL, FEASIBLE)
    assert result.sense == fam.sense(problem)
    assert fam.verify(problem, result.plan) == []
    cost = fam.cost(problem, result.plan)
    assert result.objective == pytest.approx(cost, rel=1e-9)
    if entry.guarantee != "heuristic":
        assert result.bound is not None, (solver, result.log)
        slack = 1e-6 * max(1.0, abs(cost))
        if result.sense == "min":
            assert result.bound <= cost + slack
        else:
            assert result.bound >= cost - slack
    report = fam.report(problem, result)
    assert report and all(isinstance(line, str) for line in report)

    written = fam.to_file(problem, result)
    plan_file = tmp_path / "plan.json"
    dump(written, str(plan_file))
    plan, stated = fam.from_file(problem, read_data(plan_file), str(plan_file))
    assert fam.to_file(problem, replace(result, plan=plan)) == written
    assert fam.cost(problem, plan) == pytest.approx(cost, rel=1e-12)
    for got, want in ((stated.objective, result.objective), (stated.bound, result.bound)):
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)
    assert fam.verify(problem, plan) == []
    assert check_stated(fam, problem, plan, stated, fam.sense(problem)) == []


@pytest.mark.parametrize("kind", kinds())
def test_the_program_exports_or_is_refused_as_not_exportable(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fam = family(kind)
    path = smallest(kind)
    problem = fam.load(str(path), [])
    offered = [e.name for e in fam.solvers() if "export" in e.features]
    out = tmp_path / "program.mps"
    program: Any = None
    try:
        program = fam.program(problem)
    except NotExportable as exc:
        assert str(exc).strip()
        assert not offered, f"{offered} claim an export, but {path.name} has none: {exc}"
        code, _, err = run(capsys, "export", str(path), "-o", str(out))
        assert code == EXIT_BAD_INPUT and str(exc) in err
        assert not out.exists()
    if program is not None:
        code, _, err = run(capsys, "export", str(path), "-o", str(out))
        assert code == EXIT_OK, err
        assert read_exported(out).getLp().num_col_ > 0
    for suffix in fam.exports(problem):
        other = tmp_path / f"export.{suffix}"
        code, _, err = run(capsys, "export", str(path), "-o", str(other))
        assert code == EXIT_OK, err
        assert other.stat().st_size > 0
