"""The exact configuration solve (``highs-exact``) stops when its reduced-cost filter
would add more columns than it may hold: that is an effort limit, and the result must
say so, not blame a time limit it never reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from energyopt.catalog.problem import load_problem
from energyopt.families.serving.solvers import configurations
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import Termination

INSTANCE = Path(__file__).resolve().parents[1] / "instances" / "fleet-16.yaml"


def test_filter_over_its_column_limit_is_an_effort_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(configurations, "MAX_FILTERED_COLUMNS", 1)
    lines: list[str] = []
    problem = load_problem(INSTANCE)
    res = solve(problem, load_preset("highs-exact"), time_limit_s=120, progress=lines.append)
    skipped = [ln for ln in lines if "reduced-cost filter" in ln and "skipped" in ln]
    assert skipped, "fleet-16's first plan should leave a gap for the filter to close"
    assert res.termination == Termination.EFFORT_LIMIT
    assert res.plan is not None and res.objective is not None and res.bound is not None
    assert not evaluate_plan(problem, res.plan).violations
    assert res.bound <= res.objective
