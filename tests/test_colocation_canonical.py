"""Co-location's canonical set: tiny instances whose optimum is found by exhaustive
enumeration written apart from the solvers (tests/colocation_exhaustive.py). Every
solver the family registers is driven through the registry and must give a plan
that verifies, with bound <= optimum <= plan (>= and <= swapped for throughput)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest

from energyopt.families import family
from energyopt.families.colocation.formulations.interference import default_predictor
from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.verify import evaluate_colocation
from energyopt.solvers.result import INFEASIBLE, NO_SOLUTION, OPTIMAL, Result

from .colocation_exhaustive import H100, H200, Optimum, as_plan, exhaustive_optimum
from .colocation_helpers import problem_of

REL_TOL = 1e-6
TIME_LIMIT_S = 30.0
EXACT_GAP = 1e-7


def _training(name: str, model: str, iterations: int, max_gpus: int = 2) -> dict[str, Any]:
    return {
        "kind": "training",
        "name": name,
        "model": model,
        "tokens_per_iteration": 32768,
        "iterations": iterations,
        "idle_phases": [{"kind": "data_loading", "ms": 250}, {"kind": "communication", "ms": 150}],
        "min_gpus": 1,
        "max_gpus": max_gpus,
    }


def _inference(name: str, model: str, items: int, max_gpus: int = 2) -> dict[str, Any]:
    return {
        "kind": "inference",
        "name": name,
        "model": model,
        "items": items,
        "prompt_tokens": 600,
        "output_tokens": 200,
        "batch": 32,
        "min_gpus": 1,
        "max_gpus": max_gpus,
    }


def _instance(
    pools: list[tuple[str, int]],
    jobs: list[dict[str, Any]],
    *,
    objective: str = "jct",
    slots: int = 4,
    budget_w: float | None = None,
    shares: tuple[int, ...] = (25, 50, 75),
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"pools": [{"type": t, "count": n} for t, n in pools]}
    if budget_w is not None:
        cluster["power_budget_w"] = budget_w
    return {
        "kind": "colocation",
        "name": "canonical",
        "cluster": cluster,
        "jobs": jobs,
        "options": {
            "objective": objective,
            "slot_s": 600,
            "slots": slots,
            "gpu_counts": [1, 2],
            "clocks_mhz": {t: [1200, 1980] for t, _ in pools},
            "share_levels_pct": list(shares),
        },
    }


def _t1(iterations: int = 600, max_gpus: int = 2) -> dict[str, Any]:
    return _training("t-llama2", "Llama-2-7B", iterations, max_gpus)


def _t2(iterations: int = 600, max_gpus: int = 2) -> dict[str, Any]:
    job = _training("t-mistral", "Mistral-7B", iterations, max_gpus)
    job["idle_phases"] = [
        {"kind": "data_loading", "ms": 300},
        {"kind": "pipeline_bubble", "ms": 100},
    ]
    return job


def _i1(items: int = 6000, max_gpus: int = 2) -> dict[str, Any]:
    return _inference("i-llama31", "Llama-3.1-8B", items, max_gpus)


def _i2(items: int = 8000, max_gpus: int = 2) -> dict[str, Any]:
    return _inference("i-llama2", "Llama-2-7B", items, max_gpus)


CASES: dict[str, dict[str, Any]] = {
    # a training job does not fit one H200 beside an inference job: they take turns
    "one-gpu-in-turn": _instance([(H200, 1)], [_t1(), _i1()]),
    # one pair on two GPUs beats running apart
    "pair-on-two-gpus": _instance([(H200, 2)], [_t1(), _i1()]),
    "three-jobs-two-gpus": _instance([(H200, 2)], [_t1(), _t2(), _i1()], slots=5),
    # budgets that bind (without them the optima are 790.7 s and 1,356.3 s)
    "four-jobs-under-a-budget": _instance(
        [(H200, 2)], [_t1(300), _t2(300), _i1(3000), _i2(3000, 1)], budget_w=1000, slots=4
    ),
    "two-gpu-types": _instance([(H200, 2), (H100, 1)], [_t1(), _i1(), _i2()], slots=4),
    "one-share-level-budget": _instance(
        [(H200, 2)], [_t2(600, 1), _i1(), _i2(20000, 1)], budget_w=1100, shares=(50,), slots=5
    ),
    # throughput: the horizon cuts through runs, partial work counts
    "throughput-cut-runs": _instance(
        [(H200, 2)], [_t1(1500), _i1(20000)], objective="throughput", slots=3
    ),
    "throughput-four-jobs": _instance(
        [(H200, 2), (H100, 1)],
        [_t1(1200), _t2(600, 1), _i1(6000, 1), _i2(20000)],
        objective="throughput",
        slots=2,
    ),
    # no job fits the horizon: every exact or bounded solver must say so
    "horizon-too-short": _instance([(H100, 1)], [_i1(300000, 1)], slots=2),
    # no job fits any GPU (a 7B training job needs more than one H100's memory):
    # under throughput the plan that runs nothing is optimal, at 0 jobs per hour
    "throughput-nothing-fits": _instance(
        [(H100, 2)], [_t1(2000, 1), _t2(1200, 1)], objective="throughput"
    ),
}

family_ = family("colocation")
SOLVERS = [entry.name for entry in family_.solvers()]


@cache
def _case(name: str) -> tuple[ColocationProblem, Optimum]:
    problem = problem_of(CASES[name])
    return problem, exhaustive_optimum(problem)


@cache
def _solved(name: str, solver: str) -> Result[Any]:
    problem, _ = _case(name)
    return family_.solve(
        problem, solver, time_limit_s=TIME_LIMIT_S, rel_gap=EXACT_GAP, progress=lambda _: None
    )


def _no_better(sense: str, value: float, than: float) -> bool:
    """``value`` is no better than ``than`` (up to REL_TOL) in the objective's sense."""
    slack = REL_TOL * max(1.0, abs(than))
    return value >= than - slack if sense == "min" else value <= than + slack


def _on_grid(problem: ColocationProblem, start_s: float) -> bool:
    slot = problem.instance.options.slot_s
    return abs(start_s / slot - round(start_s / slot)) <= 1e-9


def test_the_set_has_pairs_budgets_types_and_both_objectives() -> None:
    """The canonical set covers what the solvers decide: optima with and without a
    pair, a binding budget, two GPU types, both objectives, and no plan at all."""
    units = {n: [u for u, _ in _case(n)[1].best or ()] for n in CASES}
    paired = [n for n, us in units.items() if any(len(u.jobs) == 2 for u in us)]
    alone = [n for n, us in units.items() if us and all(len(u.jobs) == 1 for u in us)]
    assert paired and alone
    assert {CASES[n]["options"]["objective"] for n in CASES} == {"jct", "throughput"}
    assert _case("horizon-too-short")[1].value is None
    assert _case("throughput-nothing-fits")[1].value == 0.0
    trivial = {"horizon-too-short", "throughput-nothing-fits"}
    assert all(_case(n)[1].plans > 1 for n in CASES if n not in trivial)


@pytest.mark.parametrize("name", [n for n in CASES if n != "horizon-too-short"])
def test_the_exhaustive_optimum_is_a_plan_the_checker_scores_the_same(name: str) -> None:
    """The enumeration's own arithmetic agrees with the independent checker: its best
    plan, written as a plan file, verifies and scores the same under the predictor."""
    problem, optimum = _case(name)
    assert optimum.best is not None and optimum.value is not None
    plan = as_plan(problem, optimum.best)
    assert family_.verify(problem, plan) == []
    ev = evaluate_colocation(problem, plan, default_predictor())
    assert ev.objective == pytest.approx(optimum.value, rel=1e-9)


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("name", list(CASES))
def test_bound_and_plan_sandwich_the_exhaustive_optimum(name: str, solver: str) -> None:
    problem, optimum = _case(name)
    entry = next(e for e in family_.solvers() if e.name == solver)
    result = _solved(name, solver)
    sense = family_.sense(problem)
    assert result.sense == sense
    if optimum.value is None:
        if entry.guarantee != "heuristic":
            assert result.status in (INFEASIBLE, NO_SOLUTION), result.status
            assert result.plan is None
        return
    # a plan exists: no solver may claim there is none, only a heuristic may miss it
    assert result.status != INFEASIBLE, (result.status, result.diagnosis)
    if result.plan is None:
        assert entry.guarantee == "heuristic", (result.status, result.log)
        return
    assert family_.verify(problem, result.plan) == []
    assert result.objective is not None
    assert result.objective == pytest.approx(family_.cost(problem, result.plan), rel=1e-9)
    on_grid = all(_on_grid(problem, u.start_s) for u in result.plan.units)
    # no plan of the slotted model beats the optimum; the isolated baseline starts
    # units when GPUs free up (off the slot grid), outside that model
    assert on_grid or entry.guarantee == "heuristic"
    if on_grid:
        assert _no_better(sense, result.objective, optimum.value), (result.objective, optimum.value)
    if entry.guarantee == "heuristic":
        return
    assert result.bound is not None, solver
    assert _no_better(sense, optimum.value, result.bound), (result.bound, optimum.value)
    if entry.guarantee == "exact" and result.status == OPTIMAL:
        assert result.objective == pytest.approx(optimum.value, rel=10 * EXACT_GAP)
