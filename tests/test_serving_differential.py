"""Every serving preset against an exhaustive optimiser on random tiny instances.

The instances (tests/serving_exhaustive.py) mix GPU types and per-GPU power caps,
tensor-parallel groups, clock-dependent on-power, node and cluster budgets, MIG, a
current state with migration costs, and every objective. For each preset:

- the reported objective is the plan's own cost (recomputed by the verifier);
- bound <= exhaustive optimum <= objective;
- an exact preset finds a plan whenever one exists, and no preset calls a feasible
  instance infeasible or returns a plan for an infeasible one.
"""

from __future__ import annotations

from typing import Any

import pytest

from energyopt.families import Stated, check_stated, family
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan
from energyopt.solvers.presets import available_presets, load_preset
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from tests.serving_exhaustive import random_problems

SEED = 20
INSTANCES = 12
EXACT = {"highs-exact", "highs-pattern", "highs-per-gpu", "highs-plain", "cpsat"}
"""Presets that must find a plan whenever one exists (the decompositions may stop
without one and say so with 'no_solution')."""
PROVES_INFEASIBILITY = EXACT
"""CP-SAT too: its relaxed discretization proven infeasible proves the exact model
infeasible (see backends/cpsat.py)."""
TOL = 1e-6

CASES = list(random_problems(SEED, INSTANCES))


def test_the_random_instances_cover_every_feature() -> None:
    datas = [data for data, _, _ in CASES]
    objectives = {d["options"]["objective"] for d in datas}
    assert objectives == {"power", "gpus_on", "edp", "power_migration"}
    assert any(d["options"]["sharing"]["mode"] == "mig" for d in datas)
    assert any("tensor_parallel" in w for d in datas for w in d["workloads"])
    caps = [
        {g.get("power_cap_w") for g in d["cluster"]["nodes"][0]["gpus"]}
        for d in datas
        if any("tensor_parallel" in w for w in d["workloads"])
    ]
    assert any(len(c) > 1 for c in caps), "a TP instance whose GPUs have different caps"
    assert any("power_budget_w" in d["cluster"]["nodes"][0] for d in datas)
    feasible = [opt.value is not None for _, _, opt in CASES]
    assert any(feasible) and not all(feasible)


@pytest.mark.parametrize("preset_name", sorted(available_presets()))
def test_preset_agrees_with_the_exhaustive_optimum(preset_name: str) -> None:
    preset = load_preset(preset_name)
    failures: list[str] = []
    for k, (data, problem, opt) in enumerate(CASES):
        res = solve(problem, preset, time_limit_s=20)
        where = f"instance {k} ({data['options']['objective']}, optimum {opt.value})"
        if opt.value is None:
            if res.plan is not None:
                failures.append(f"{where}: plan for an infeasible instance")
            elif preset_name in PROVES_INFEASIBILITY and res.status != INFEASIBLE:
                failures.append(f"{where}: status {res.status}, not infeasible")
            continue
        if res.status == INFEASIBLE:
            failures.append(f"{where}: called infeasible: {res.diagnosis}")
            continue
        if res.plan is None:
            if preset_name in EXACT:
                failures.append(f"{where}: no plan ({res.status})")
            continue
        ev = evaluate_plan(problem, res.plan)
        assert res.objective is not None
        if abs(res.objective - ev.objective) > TOL * max(1.0, ev.objective):
            failures.append(f"{where}: objective {res.objective} but the plan costs {ev.objective}")
        stated_wrong = reported(problem, res.plan, ev.objective)
        if stated_wrong:
            failures.append(f"{where}: plan file states {stated_wrong}")
        if res.objective < opt.value * (1 - TOL) - TOL:
            failures.append(f"{where}: objective {res.objective} below the optimum")
        if res.bound is not None and res.bound > opt.value * (1 + TOL) + TOL:
            failures.append(f"{where}: bound {res.bound} above the optimum")
        if res.status == OPTIMAL and res.objective > opt.value * (1 + preset.rel_gap) + TOL:
            failures.append(f"{where}: 'optimal' at {res.objective}, {preset.rel_gap:%} off")
    assert not failures, "\n".join(failures)


def reported(problem: Any, plan: Any, cost: float) -> list[Any]:
    """What ``energyopt verify`` finds wrong with the figures a serving plan states
    (``cost``: the plan's cost, by the verifier)."""
    stated = Stated(plan.objective, plan.bound, plan.gap)
    return check_stated(family("serving"), problem, plan, stated, "min", cost)
