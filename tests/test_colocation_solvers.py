"""Co-location solvers: bounds against the exact optimum, plans verify, model = checker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.families import certify, family
from energyopt.families.colocation.formulations.interference import default_predictor
from energyopt.families.colocation.formulations.model import build_model
from energyopt.families.colocation.formulations.relaxation import build_relaxation
from energyopt.families.colocation.solvers.exact import solve_exact
from energyopt.families.colocation.solvers.isolated import solve_isolated
from energyopt.families.colocation.solvers.result import ColocationResult
from energyopt.families.colocation.solvers.shadow import solve_shadow
from energyopt.families.colocation.solvers.solve import (
    EXACT_MAX_COLUMNS,
    PORTFOLIO_MAX_COLUMNS,
    exact_columns,
)
from energyopt.families.colocation.verify import evaluate_colocation
from energyopt.solvers.result import INFEASIBLE, NO_SOLUTION, OPTIMAL

from .colocation_helpers import problem_of, small_data

TOL = 1e-6


def worse_or_equal(result: ColocationResult, value: float, bound: float) -> bool:
    """Whether ``value`` is no better than ``bound`` in the result's sense."""
    if result.sense == "min":
        return value >= bound - TOL * max(1.0, abs(bound))
    return value <= bound + TOL * max(1.0, abs(bound))


@pytest.fixture(scope="module", params=["jct", "throughput"])
def solved(request: pytest.FixtureRequest) -> dict[str, Any]:
    data = small_data()
    data["options"]["objective"] = request.param
    problem = problem_of(data)
    model = build_model(problem)
    return {
        "problem": problem,
        "model": model,
        "exact": solve_exact(model, time_limit_s=60),
        "shadow": solve_shadow(model, time_limit_s=30),
        "isolated": solve_isolated(model),
    }


def test_exact_is_optimal_and_shadow_bound_is_below_it(solved: dict[str, Any]) -> None:
    exact, shadow = solved["exact"], solved["shadow"]
    assert exact.status == OPTIMAL and exact.objective is not None
    assert shadow.bound is not None and shadow.objective is not None
    # the certified bound never passes the optimum, and no heuristic plan beats it
    assert worse_or_equal(shadow, exact.objective, shadow.bound)
    assert worse_or_equal(shadow, shadow.objective, exact.objective)
    assert worse_or_equal(exact, shadow.objective, exact.bound or exact.objective)
    assert shadow.gap is not None and shadow.gap >= 0.0


def test_every_plan_verifies(solved: dict[str, Any]) -> None:
    for key in ("exact", "shadow", "isolated"):
        result = solved[key]
        assert result.plan is not None, key
        ev = evaluate_colocation(solved["problem"], result.plan)
        assert ev.violations == [], (key, ev.violations)
        assert not ev.not_run or solved["model"].objective == "throughput"


def test_checker_with_the_predictor_reproduces_the_model_objective(solved: dict[str, Any]) -> None:
    """The checker's timeline is computed independently; with the planning model's
    interference it must give the solver's objective exactly."""
    for key in ("exact", "shadow", "isolated"):
        result = solved[key]
        ev = evaluate_colocation(solved["problem"], result.plan, default_predictor())
        assert ev.objective == pytest.approx(result.objective, rel=1e-9), key


def test_colocation_beats_the_isolated_baseline_on_the_small_case(solved: dict[str, Any]) -> None:
    exact, isolated = solved["exact"], solved["isolated"]
    assert isolated.bound is None  # a heuristic reports no bound
    assert worse_or_equal(exact, isolated.objective, exact.objective)


def test_lagrangian_bound_is_below_the_relaxation_lp() -> None:
    """The subgradient's best dual value never exceeds the relaxation's LP optimum."""
    from .test_colocation_prices import relaxation_lp

    model = build_model(problem_of(small_data()))
    lp_value, _ = relaxation_lp(build_relaxation(model))
    shadow = solve_shadow(model, time_limit_s=30)
    assert shadow.bound is not None
    assert shadow.bound <= lp_value + 1e-6 * abs(lp_value)
    assert shadow.bound >= 0.95 * lp_value  # and gets close to it


def test_power_budget_below_idle_is_infeasible_with_a_reason() -> None:
    data = small_data()
    data["cluster"]["power_budget_w"] = 200  # four H100s idle at 300 W
    model = build_model(problem_of(data))
    for result in (solve_exact(model), solve_shadow(model)):
        assert result.status == INFEASIBLE and result.plan is None
        assert any("idle power" in line for line in result.diagnosis), result.diagnosis


@st.composite
def small_instances(draw: st.DrawFn) -> dict[str, Any]:
    data = small_data()
    jobs = data["jobs"]
    keep = draw(st.lists(st.sampled_from(range(len(jobs))), min_size=2, max_size=4, unique=True))
    data["jobs"] = [jobs[i] for i in sorted(keep)]
    for job in data["jobs"]:
        key = "iterations" if job["kind"] == "training" else "items"
        job[key] = max(1, int(job[key] * draw(st.floats(0.3, 1.0))))
    data["cluster"]["power_budget_w"] = draw(st.sampled_from([1400, 2000, 3000]))
    data["options"]["objective"] = draw(st.sampled_from(["jct", "throughput"]))
    data["options"]["slots"] = draw(st.integers(6, 10))
    return data


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances())
def test_bounds_and_plans_on_random_small_instances(data: dict[str, Any]) -> None:
    problem = problem_of(data)
    model = build_model(problem)
    exact = solve_exact(model, time_limit_s=30)
    shadow = solve_shadow(model, time_limit_s=10, max_iterations=80)
    if exact.status in (INFEASIBLE, NO_SOLUTION):  # none on the grid (or none at all)
        assert shadow.plan is None
        return
    assert exact.status == OPTIMAL and exact.objective is not None
    if shadow.bound is not None:
        assert worse_or_equal(shadow, exact.objective, shadow.bound)
    for result in (exact, shadow):
        if result.plan is None:
            continue
        assert result.objective is not None
        assert worse_or_equal(exact, result.objective, exact.objective)
        assert evaluate_colocation(problem, result.plan).violations == []
        ev = evaluate_colocation(problem, result.plan, default_predictor())
        assert ev.objective == pytest.approx(result.objective, rel=1e-9)


def test_auto_runs_the_exact_milp_after_shadow_prices_in_the_time_left() -> None:
    """The bundled 64-job instance (28,880 MILP columns, above the exact-alone limit):
    ``auto`` returns a plan no worse than shadow prices' with a bound no weaker, and
    here the MILP's proven optimum; with no time left after shadow prices it returns
    their plan and says the MILP was not run."""
    root = Path(__file__).resolve().parents[1]
    fam = family("colocation")
    problem = fam.load(str(root / "instances" / "colocation" / "colocation-64.yaml"), [])
    assert EXACT_MAX_COLUMNS < exact_columns(build_model(problem)) <= PORTFOLIO_MAX_COLUMNS
    quiet = lambda _line: None  # noqa: E731
    # the limit is a safety net, not the subject: on a loaded 2-core machine the
    # MILP needed more than the 60 s left after shadow prices to prove the optimum
    shadow = fam.solve(problem, "shadow-price", time_limit_s=600, rel_gap=None, progress=quiet)
    auto = fam.solve(problem, "auto", time_limit_s=600, rel_gap=None, progress=quiet)
    for r in (shadow, auto):
        certify(fam, problem, r, 1e-4, quiet)
    assert shadow.objective is not None and shadow.bound is not None
    assert auto.objective is not None and auto.bound is not None
    assert auto.objective <= shadow.objective and auto.bound >= shadow.bound
    assert auto.status == OPTIMAL and auto.algorithm == "exact MILP after shadow prices"
    assert auto.objective < shadow.objective * 0.99  # shadow prices stop 4.7 % above
    hurried = fam.solve(problem, "auto", time_limit_s=0.5, rel_gap=None, progress=quiet)
    assert hurried.plan is not None and hurried.algorithm.startswith("shadow prices")
    assert any("exact MILP not run" in line for line in hurried.log)
