"""The alternative objectives change the plan the way their definitions say."""

from __future__ import annotations

import pytest

from energyopt.catalog import resolve
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan, verify_plan
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import OPTIMAL

from .serving_helpers import tiny_instance

H100 = "H100-SXM5-80GB"
CLOCKS = {H100: [1200, 1980]}


def with_objective(problem, objective: str):
    options = problem.instance.options.model_copy(update={"objective": objective})
    return resolve(problem.instance.model_copy(update={"options": options}), "tiny")


@pytest.fixture(scope="module")
def base():
    return tiny_instance(
        [H100, H100, H100],
        [("Llama-3.1-8B", 4.0, 800.0, 80.0), ("Mistral-7B", 3.0, 800.0, 80.0)],
        clocks=CLOCKS,
    )


@pytest.mark.parametrize("name", ["highs-exact", "highs-per-gpu"])
def test_gpus_on_never_uses_more_gpus_and_power_never_draws_more(base, name: str) -> None:
    results = {}
    for objective in ("power", "gpus_on"):
        problem = with_objective(base, objective)
        res = solve(problem, load_preset(name))
        assert res.status == OPTIMAL and res.plan is not None
        assert verify_plan(problem, res.plan) == []
        results[objective] = evaluate_plan(problem, res.plan)
    assert results["gpus_on"].gpus_on <= results["power"].gpus_on
    assert results["power"].total_power_w <= results["gpus_on"].total_power_w * (1 + 1e-6)


def test_edp_objective_prefers_faster_operating_points(base) -> None:
    plans = {}
    for objective in ("power", "edp"):
        problem = with_objective(base, objective)
        res = solve(problem, load_preset("highs-exact"))
        assert res.status == OPTIMAL and res.plan is not None
        assert verify_plan(problem, res.plan) == []
        plans[objective] = res.plan

    def mean_clock(plan) -> float:
        clocks = [g.clock_mhz for g in plan.gpus if g.on and g.clock_mhz]
        return sum(clocks) / len(clocks)

    assert mean_clock(plans["edp"]) >= mean_clock(plans["power"])
