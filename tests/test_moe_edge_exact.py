"""The moe-edge exact solver closes on tiny instances: property tests against the
exhaustive optimiser of tests/moe_edge_exhaustive.py (written apart from the
formulations), on random tiny instances drawn by hypothesis.

- The default (``auto``, which runs ``milp`` on these sizes, which enumerates
  configurations of at most ``ENUMERATE_PLANS`` placements) returns the exhaustive
  optimum with its bound equal to its objective, status optimal and 'converged',
  at every requested gap; it proves infeasibility exactly where the exhaustive
  optimiser finds no plan.
- The HiGHS refinement (``enumerate_up_to=0``) keeps a bound at or below the
  optimum and a plan within the requested gap of it, and never says optimal or
  'converged' with a gap above the one requested.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.families import family
from energyopt.families.moe_edge.formulations.figures import figures
from energyopt.families.moe_edge.formulations.milp import allowed
from energyopt.families.moe_edge.formulations.model import MoeEdgeProblem, build_problem
from energyopt.families.moe_edge.solvers.enumeration import (
    enumerate_config,
    placement_count,
)
from energyopt.families.moe_edge.solvers.milp import ENUMERATE_PLANS, solve_milp
from energyopt.families.moe_edge.spec import MoeEdgeFile
from energyopt.families.moe_edge.verify import evaluate_moe_edge
from energyopt.solvers.result import INFEASIBLE, OPTIMAL, Termination, relative_gap
from tests.moe_edge_exhaustive import Optimum, exhaustive_optimum, random_doc, tiny_catalog

CATALOG = tiny_catalog()
SEEDS = st.integers(min_value=0, max_value=10**6)
GAPS = st.sampled_from([1e-2, 1e-4, 1e-6, 0.0])
REL = 1e-9


def _instance(seed: int) -> tuple[MoeEdgeFile, MoeEdgeProblem, Optimum]:
    doc: dict[str, Any] = random_doc(seed, CATALOG)
    spec = MoeEdgeFile.model_validate(doc)
    p = build_problem(MoeEdgeFile.model_validate(doc), "<test>", CATALOG)
    return spec, p, exhaustive_optimum(spec, CATALOG)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=SEEDS, gap=GAPS)
def test_the_default_reaches_the_exhaustive_optimum_with_its_bound(seed: int, gap: float) -> None:
    spec, p, opt = _instance(seed)
    assert p.n_canonical_configs() * p.n_items * p.n_options < 20_000  # auto runs milp
    res = family("moe-edge").solve(p, "auto", time_limit_s=60, rel_gap=gap, progress=lambda _: None)
    assert res.termination in (Termination.CONVERGED, Termination.INFEASIBLE), res.log
    if opt.value is None:
        assert res.status == INFEASIBLE and res.plan is None, (res.status, res.log)
        return
    assert res.status == OPTIMAL and res.termination == Termination.CONVERGED, res.log
    assert res.plan is not None and res.objective is not None and res.bound is not None
    assert res.objective == pytest.approx(opt.value, rel=REL)
    # the bound is the optimum itself, not the optimum less the requested gap
    assert res.bound == pytest.approx(res.objective, rel=REL)
    assert res.bound <= opt.value * (1 + REL)
    ev = evaluate_moe_edge(spec, CATALOG, res.plan)
    assert not ev.violations
    assert res.objective == pytest.approx(ev.cost, rel=REL)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=SEEDS, gap=st.sampled_from([1e-2, 1e-4, 1e-6]))
def test_the_highs_refinement_is_honest_about_its_gap(seed: int, gap: float) -> None:
    spec, p, opt = _instance(seed)
    res = solve_milp(p, time_limit_s=60, rel_gap=gap, enumerate_up_to=0)
    if res.status == OPTIMAL or res.termination == Termination.CONVERGED:
        assert res.objective is not None and res.bound is not None
        assert relative_gap(res.objective, res.bound) <= gap + 1e-12
    if opt.value is None:
        assert res.status == INFEASIBLE and res.plan is None, (res.status, res.log)
        return
    assert res.status == OPTIMAL, (res.status, res.log)
    assert res.objective is not None and res.bound is not None and res.plan is not None
    assert res.bound <= opt.value * (1 + REL)
    assert opt.value * (1 - REL) <= res.objective <= opt.value * (1 + gap) + 1e-12
    assert not evaluate_moe_edge(spec, CATALOG, res.plan).violations


def _feasible_seed(gpus: int) -> tuple[MoeEdgeProblem, Optimum]:
    """The first feasible instance from seed 100 on with ``gpus`` GPUs and a
    co-activated pair."""
    for seed in range(100, 300):
        _, p, opt = _instance(seed)
        if opt.value is not None and len(p.pair_q) and p.n_gpus == gpus:
            return p, opt
    raise AssertionError(f"no feasible {gpus}-GPU instance with a co-activated pair")


def test_enumeration_matches_figures_over_every_placement() -> None:
    """Per configuration, the enumerated optimum is the least objective ``figures``
    gives over every placement, listed one at a time."""
    p, opt = _feasible_seed(1)  # 3^8 placements per configuration
    values = []
    for config in p.configs():
        c = p.costs(config)
        ok = allowed(p, c)
        options = [np.flatnonzero(ok[i]) for i in range(p.n_items)]
        assert placement_count(p, c) == int(np.prod([len(o) for o in options]))
        best = np.inf
        for combo in itertools.product(*options):
            f = figures(p, c, np.asarray(combo, dtype=np.int64))
            if f.feasible:
                best = min(best, f.objective)
        listed = enumerate_config(p, c, time.perf_counter() + 60)
        assert listed.complete and listed.placements == placement_count(p, c)
        if np.isfinite(best):
            assert listed.plan is not None
            assert listed.plan[0] == pytest.approx(best, rel=1e-12)
            assert figures(p, c, listed.plan[1]).feasible
        else:
            assert listed.plan is None
        values.append(best)
    assert opt.value is not None and min(values) == pytest.approx(opt.value, rel=REL)


def test_enumeration_past_its_deadline_says_so_and_the_run_is_not_converged() -> None:
    p, _ = _feasible_seed(2)
    c = p.costs(p.configs()[0])
    assert not enumerate_config(p, c, time.perf_counter() - 1.0).complete
    # below the enumeration limit every configuration goes to HiGHS, whose bound
    # is the optimum less the gap it was given
    counts = [placement_count(p, p.costs(k)) for k in p.configs()]
    assert max(counts) <= ENUMERATE_PLANS
    res = solve_milp(p, rel_gap=1e-4, enumerate_up_to=min(counts) - 1)
    assert "enumerated" not in res.log[0]
    listed = solve_milp(p, rel_gap=1e-4)
    assert "enumerated" in res.log[0] or "enumerated" in listed.log[0]
    assert res.status == listed.status == OPTIMAL
    assert res.bound is not None and listed.bound is not None and listed.objective is not None
    assert res.bound < listed.bound == pytest.approx(listed.objective, rel=REL)
