"""The per-GPU presets on fleets where HiGHS may not finish its root LP in time: a
plan from the configuration formulation comes first, so a time limit returns the
better of the two plans, verified, never nothing on a feasible instance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from energyopt.backends.pyomo_highs import MilpOutcome
from energyopt.catalog import load_problem
from energyopt.families.serving.solvers import solve as serving
from energyopt.families.serving.verify import evaluate_plan
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import FEASIBLE, NO_SOLUTION, OPTIMAL

INSTANCES = Path(__file__).resolve().parents[1] / "instances"


def _no_plan(*_: Any, **__: Any) -> MilpOutcome:
    """HiGHS ending its time limit before a first plan (the root LP unsolved)."""
    return MilpOutcome("no_solution", None, None, 1.0, time_limited=True)


@pytest.mark.parametrize("preset", ["highs-per-gpu", "highs-plain"])
def test_a_per_gpu_milp_without_a_plan_returns_the_configuration_incumbent(
    monkeypatch: pytest.MonkeyPatch, preset: str
) -> None:
    problem = load_problem(INSTANCES / "quickstart.yaml")
    exact = serving.solve(problem, load_preset("highs-exact"))
    monkeypatch.setattr(serving, "PER_GPU_INCUMBENT_GPUS", 0)
    monkeypatch.setattr(serving, "run_backend", _no_plan)
    result = serving.solve(problem, load_preset(preset))
    assert result.plan is not None and result.objective is not None
    assert not evaluate_plan(problem, result.plan).violations
    assert result.fallback is not None and "no plan" in result.fallback
    assert result.status in (OPTIMAL, FEASIBLE) and result.bound is not None
    assert result.bound <= result.objective + 1e-6
    assert exact.objective is not None
    assert result.objective == pytest.approx(exact.objective, rel=1e-3)


def test_without_the_incumbent_the_same_failure_leaves_no_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the incumbent guards against (quickstart is below the GPU threshold)."""
    problem = load_problem(INSTANCES / "quickstart.yaml")
    assert len(problem.gpus) <= serving.PER_GPU_INCUMBENT_GPUS
    monkeypatch.setattr(serving, "run_backend", _no_plan)
    assert serving.solve(problem, load_preset("highs-per-gpu")).status == NO_SOLUTION


def test_the_per_gpu_milp_keeps_its_own_plan_when_it_is_no_worse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = load_problem(INSTANCES / "quickstart.yaml")
    monkeypatch.setattr(serving, "PER_GPU_INCUMBENT_GPUS", 0)
    result = serving.solve(problem, load_preset("highs-per-gpu"))
    assert result.fallback is None and result.status == OPTIMAL
    assert result.plan is not None and not evaluate_plan(problem, result.plan).violations
