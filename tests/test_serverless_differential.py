"""Every serverless solver against an exhaustive optimiser on random tiny instances
(tests/serverless_exhaustive.py: one or two nodes, 1-3 epochs, lulls without
demand, MPS shares and TP groups, one or two clocks, NIC and power caps that bind,
slow cold starts, every objective). For each solver:

- every plan it returns passes the verifier, and its objective is the plan's cost
  as the verifier recomputes it;
- bound <= exhaustive optimum <= objective; an exact solver's objective is the
  optimum, and it finds a plan whenever one exists and proves infeasibility
  otherwise; no solver returns a plan for an infeasible instance.
"""

from __future__ import annotations

import pytest

from energyopt.families import family
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from tests.serverless_exhaustive import random_problems

SEED = 7
INSTANCES = 18
TOL = 1e-6
GAP = 1e-9
QUIET = lambda _msg: None  # noqa: E731

CASES = list(random_problems(SEED, INSTANCES))
SOLVERS = [entry.name for entry in family("serverless").solvers()]


def test_the_random_instances_cover_every_feature() -> None:
    docs = [doc for doc, _, _ in CASES]
    assert {d["objective"]["kind"] for d in docs} == {"gpu_seconds", "energy", "weighted"}
    assert any(len(d["nodes"]) == 2 for d in docs)
    assert any(2 in d["options"]["tp"] for d in docs)
    assert any("power_cap_w" in n for d in docs for n in d["nodes"])
    assert any("nic_gbps" in n for d in docs for n in d["nodes"])
    assert any(len(d["options"]["clocks_mhz"]) > 1 for d in docs)
    assert any(d["cold_start"]["fixed_s"] > 0 for d in docs)
    lulls = [
        p
        for doc, p, opt in CASES
        if len(doc["models"][0]["demand_rps"]) == 3
        and doc["models"][0]["demand_rps"][1] == 0
        and opt.value is not None
    ]
    fam = family("serverless")
    plans = [fam.solve(p, "milp", time_limit_s=30, rel_gap=GAP, progress=QUIET) for p in lulls]
    held = [r.plan.epochs[1].pools for r in plans if r.plan is not None]
    assert any(held), "an instance whose optimum holds an instance through a lull"
    feasible = [opt.value is not None for _, _, opt in CASES]
    assert any(feasible) and not all(feasible)


@pytest.mark.parametrize("solver", SOLVERS)
def test_solver_agrees_with_the_exhaustive_optimum(solver: str) -> None:
    fam = family("serverless")
    entry = next(e for e in fam.solvers() if e.name == solver)
    failures: list[str] = []
    for k, (doc, p, opt) in enumerate(CASES):
        res = fam.solve(p, solver, time_limit_s=30, rel_gap=GAP, progress=QUIET)
        where = f"instance {k} ({doc['objective']['kind']}, optimum {opt.value})"
        if res.plan is not None:
            broken = fam.verify(p, res.plan)
            if broken:
                failures.append(f"{where}: plan fails the verifier: {broken[0]}")
                continue
        if opt.value is None:
            if res.plan is not None:
                failures.append(f"{where}: plan for an infeasible instance")
            elif entry.guarantee == "exact" and res.status != INFEASIBLE:
                failures.append(f"{where}: status {res.status}, not infeasible")
            continue
        if res.status == INFEASIBLE:
            failures.append(f"{where}: called infeasible: {res.diagnosis} {res.log}")
            continue
        if res.bound is not None and res.bound > opt.value * (1 + TOL) + TOL:
            failures.append(f"{where}: bound {res.bound} above the optimum")
        if res.plan is None:
            if entry.guarantee == "exact":
                failures.append(f"{where}: no plan ({res.status})")
            continue
        cost = fam.cost(p, res.plan)
        assert res.objective is not None
        if abs(res.objective - cost) > TOL * max(1.0, cost):
            failures.append(f"{where}: objective {res.objective} but the plan costs {cost}")
        if cost < opt.value * (1 - TOL) - TOL:
            failures.append(f"{where}: a plan costing {cost}, below the optimum")
        if entry.guarantee == "exact" and cost > opt.value * (1 + TOL) + TOL:
            failures.append(f"{where}: exact solver's plan costs {cost}")
        if res.status == OPTIMAL and cost > opt.value * (1 + GAP) + TOL:
            failures.append(f"{where}: 'optimal' at {cost}")
    assert not failures, "\n".join(failures)
