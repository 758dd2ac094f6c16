"""Every keep-alive solver against an exhaustive optimiser on random tiny instances,
and metamorphic properties of the exact solver.

The instances (tests/keepalive_exhaustive.py) mix one to three nodes and functions,
permitted nodes, functions with and without a tepid state, moves too slow for the
window, per-function and file SLOs, forecasts as counts and as inter-arrival
histograms, cold-start caps and both objectives. For each solver:

- every plan passes the verifier and the reported objective is the plan's own;
- an exact solver's objective is the exhaustive optimum and it proves infeasibility;
- every other solver's objective is no better than the optimum, every bound no
  better than the optimum, and no solver returns a plan for an infeasible instance.

Metamorphic: relaxing a constraint (larger budgets, no cap, a looser SLO, more
permitted nodes, a duplicate node, a tepid state offered) never makes the optimum
worse; listing the functions, the nodes or a function's permitted nodes in another
order never changes it; every power and energy times k makes the least energy k
times as large.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from energyopt.families import certify, family
from energyopt.families.keepalive.formulations.model import build_problem
from energyopt.families.keepalive.solvers.milp import solve_milp
from energyopt.families.keepalive.spec import KeepAliveFile
from energyopt.families.keepalive.verify import evaluate_keepalive
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from energyopt.spec.errors import SpecError
from tests.keepalive_exhaustive import Optimum, exhaustive, random_docs

SEED = 17
INSTANCES = 40
TOL = 1e-6

CASES = random_docs(SEED, INSTANCES)
FAMILY = family("keepalive")
SOLVERS = [entry.name for entry in FAMILY.solvers()]


def _throughput(doc: dict[str, Any]) -> bool:
    return bool(doc.get("objective", {}).get("kind") == "throughput")


def test_the_random_instances_cover_every_feature() -> None:
    docs = [doc for doc, _ in CASES]
    assert any(opt.energy_j is None for _, opt in CASES)
    assert sum(opt.energy_j is not None for _, opt in CASES) >= INSTANCES // 2
    assert any(_throughput(d) for d in docs) and not all(_throughput(d) for d in docs)
    assert any("max_cold_start_rate" in d.get("objective", {}) for d in docs)
    fns = [fn for d in docs for fn in d["functions"]]
    assert any("inter_arrivals" in fn for fn in fns) and any("arrivals" in fn for fn in fns)
    assert any("nodes" in fn for fn in fns) and any("slo" in fn for fn in fns)
    assert any("tepid" in fn for fn in fns) and not all("tepid" in fn for fn in fns)
    assert {len(d["nodes"]) for d in docs} == {1, 2, 3}
    # moves that do not fit in a window: a cold start longer than the window
    assert any(fn["cold_start"]["time_s"] > d["window_s"] for d in docs for fn in d["functions"])


def _better(a: float, b: float, sense: str) -> bool:
    """``a`` strictly better than ``b`` beyond the tolerance."""
    slack = TOL * max(1.0, abs(b))
    return a < b - slack if sense == "min" else a > b + slack


@pytest.mark.parametrize("solver", SOLVERS)
def test_solver_agrees_with_the_exhaustive_optimum(solver: str) -> None:
    guarantee = {e.name: e.guarantee for e in FAMILY.solvers()}[solver]
    failures: list[str] = []
    for k, (doc, opt) in enumerate(CASES):
        where = f"instance {k} (optimum {opt.energy_j} J, {opt.throughput_rps} req/s)"
        p = build_problem(KeepAliveFile.model_validate(doc))
        sense = FAMILY.sense(p)
        try:
            res = FAMILY.solve(p, solver, time_limit_s=20, rel_gap=1e-9, progress=lambda _: None)
        except SpecError as exc:  # lagrangian and rolling refuse the throughput objective
            if not (_throughput(doc) and solver in ("lagrangian", "rolling")):
                failures.append(f"{where}: refused: {exc}")
            continue
        if _throughput(doc) and solver in ("lagrangian", "rolling"):
            failures.append(f"{where}: solved a throughput file")
            continue
        best = opt.throughput_rps if _throughput(doc) else opt.energy_j
        if opt.energy_j is None or best is None:
            if res.plan is not None:
                failures.append(f"{where}: plan for an infeasible instance")
            elif guarantee == "exact" and res.status != INFEASIBLE:
                failures.append(f"{where}: status {res.status}, not infeasible")
            continue
        if res.status == INFEASIBLE:
            failures.append(f"{where}: called infeasible")
            continue
        if res.bound is not None and _better(res.bound, best, "max" if sense == "min" else "min"):
            failures.append(f"{where}: bound {res.bound} beyond the optimum")
        if res.plan is None:
            if guarantee == "exact":
                failures.append(f"{where}: no plan ({res.status})")
            continue
        ev = evaluate_keepalive(p.spec, res.plan)
        if ev.violations:
            failures.append(f"{where}: plan breaks {[str(v) for v in ev.violations]}")
            continue
        own = ev.throughput_rps if _throughput(doc) else ev.energy_j
        assert res.objective is not None
        if abs(res.objective - own) > TOL * max(1.0, abs(own)):
            failures.append(f"{where}: objective {res.objective} but the plan's is {own}")
        certify(FAMILY, p, res, 1e-9, lambda _: None)
        if _better(own, best, sense):
            failures.append(f"{where}: plan {own} better than the optimum {best}")
        exact = guarantee == "exact" or res.status == OPTIMAL
        if exact and _better(best, own, sense):
            failures.append(f"{where}: exact ({res.status}) at {own}, optimum {best}")
        if _throughput(doc) and exact and abs(ev.energy_j - opt.energy_j) > TOL * opt.energy_j:
            failures.append(
                f"{where}: energy {ev.energy_j} at the most throughput, least is {opt.energy_j}"
            )
    assert not failures, "\n".join(failures)


def _optimum(doc: dict[str, Any]) -> float | None:
    """The exact solver's objective (None: infeasible), checked against its verifier."""
    p = build_problem(KeepAliveFile.model_validate(doc))
    res = solve_milp(p, rel_gap=1e-9)
    if res.status == INFEASIBLE:
        return None
    assert res.status == OPTIMAL and res.plan is not None
    assert evaluate_keepalive(p.spec, res.plan).violations == []
    return res.objective


def _budgets(doc: dict[str, Any]) -> None:
    for node in doc["nodes"]:
        for key in ("gpu_memory_gb", "host_memory_gb", "power_budget_w"):
            node[key] *= 1.7


def _no_cap(doc: dict[str, Any]) -> None:
    doc.get("objective", {}).pop("max_cold_start_rate", None)


def _looser_slo(doc: dict[str, Any]) -> None:
    for slo in [doc.get("slo")] + [fn.get("slo") for fn in doc["functions"]]:
        if slo is not None:
            slo["start_latency_s"] += 10
            slo["percentile"] = max(1.0, slo["percentile"] - 20)


def _every_node(doc: dict[str, Any]) -> None:
    for fn in doc["functions"]:
        fn.pop("nodes", None)


def _duplicate_node(doc: dict[str, Any]) -> None:
    doc["nodes"].append(dict(doc["nodes"][0], name="copy"))


def _tepid_offered(doc: dict[str, Any]) -> None:
    for fn in doc["functions"]:
        fn.setdefault(
            "tepid",
            {
                "gpu_memory_gb": 0.5,
                "host_memory_gb": fn["warm"]["gpu_memory_gb"],
                "power_w": 3.0,
                "enter_s": 1.0,
                "enter_j": 50.0,
                "resume_s": 2.0,
                "resume_j": 200.0,
            },
        )


RELAXATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "budgets": _budgets,
    "no cap": _no_cap,
    "looser SLO": _looser_slo,
    "every node permitted": _every_node,
    "duplicate node": _duplicate_node,
    "tepid offered": _tepid_offered,
}

METAMORPHIC = [doc for doc, _ in CASES[:24]]


@pytest.mark.parametrize("relax", sorted(RELAXATIONS))
def test_relaxing_a_constraint_never_worsens_the_optimum(relax: str) -> None:
    failures = []
    changed = 0
    for k, doc in enumerate(METAMORPHIC):
        relaxed = copy.deepcopy(doc)
        RELAXATIONS[relax](relaxed)
        if relaxed == doc:
            continue
        changed += 1
        before, after = _optimum(doc), _optimum(relaxed)
        if before is None:
            continue
        if after is None:
            failures.append(f"instance {k}: feasible, infeasible once relaxed")
        elif _better(before, after, "max" if _throughput(doc) else "min"):
            failures.append(f"instance {k}: {before} -> {after} once relaxed")
    assert changed > 0 and not failures, "\n".join(failures)


def test_the_relaxations_agree_with_the_exhaustive_optimum() -> None:
    """The metamorphic pairs' optima are the true ones (the exhaustive search on the
    relaxed file), so a relaxation that should help but does not is caught too."""
    rng = random.Random(3)
    for doc in METAMORPHIC[:12]:
        relaxed = copy.deepcopy(doc)
        RELAXATIONS[rng.choice(sorted(RELAXATIONS))](relaxed)
        opt: Optimum = exhaustive(relaxed)
        best = opt.throughput_rps if _throughput(relaxed) else opt.energy_j
        got = _optimum(relaxed)
        if best is None:
            assert got is None
        else:
            assert got == pytest.approx(best, rel=1e-7)


def _scaled_energy(doc: dict[str, Any], k: float) -> dict[str, Any]:
    """``doc`` with every power and energy (and the nodes' power budgets) times k."""
    out = copy.deepcopy(doc)
    for node in out["nodes"]:
        node["power_budget_w"] *= k
    for fn in out["functions"]:
        fn["warm"]["power_w"] *= k
        fn["service"]["power_w"] *= k
        fn["cold_start"]["energy_j"] *= k
        for key in ("power_w", "enter_j", "resume_j"):
            if "tepid" in fn:
                fn["tepid"][key] *= k
    return out


def test_scaling_every_power_and_energy_scales_the_optimum() -> None:
    """Watts and joules times 3: the least energy is 3 times as large (the same plans
    are feasible); the most throughput is unchanged."""
    for k, doc in enumerate(METAMORPHIC):
        before, after = _optimum(doc), _optimum(_scaled_energy(doc, 3.0))
        if before is None:
            assert after is None, f"instance {k}"
        elif _throughput(doc):
            assert after == pytest.approx(before, rel=1e-7), f"instance {k}"
        else:
            assert after == pytest.approx(3.0 * before, rel=1e-7), f"instance {k}"


@pytest.mark.parametrize("seed", range(3))
def test_listing_the_input_in_another_order_never_changes_the_optimum(seed: int) -> None:
    rng = random.Random(seed)
    for k, doc in enumerate(METAMORPHIC):
        shuffled = copy.deepcopy(doc)
        rng.shuffle(shuffled["functions"])
        rng.shuffle(shuffled["nodes"])
        for fn in shuffled["functions"]:
            if "nodes" in fn:
                rng.shuffle(fn["nodes"])
        before, after = _optimum(doc), _optimum(shuffled)
        if before is None:
            assert after is None, f"instance {k}"
        else:
            assert after == pytest.approx(before, rel=1e-7), f"instance {k}"
