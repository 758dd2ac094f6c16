"""The keep-alive bounds: the memory covers (formulations/cuts.py) are valid, leave
the optimum unchanged and never weaken the LP; the Lagrangian's bound never passes
the exhaustive optimum; the Lagrangian keeps its time limit with a verified plan.

Random tiny instances come from tests/keepalive_exhaustive.py (its optimiser is
written apart from the formulations and the verifier)."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from energyopt.backends.highs import mixed_lp, solve_mip
from energyopt.families.keepalive.formulations.cuts import (
    memory_covers,
    packing_sets,
    prefix_covers,
)
from energyopt.families.keepalive.formulations.milp import build_milp
from energyopt.families.keepalive.formulations.model import (
    KeepAliveProblem,
    build_problem,
    load_keepalive,
)
from energyopt.families.keepalive.solvers.lagrangian import solve_lagrangian
from energyopt.families.keepalive.spec import KeepAliveFile
from energyopt.families.keepalive.verify import evaluate_keepalive
from energyopt.solvers.result import FEASIBLE, Termination
from tests.keepalive_exhaustive import MAX_COMBINATIONS, exhaustive, path_count, random_doc

INSTANCES = Path(__file__).resolve().parents[1] / "instances" / "keepalive"
TOL = 1e-6


def _solve(p: KeepAliveProblem, cuts: bool, integer: bool) -> float | None:
    """The energy MILP's (or its LP's) optimum, J; None where it has no solution."""
    m = build_milp(p, cuts=cuts)
    n = len(m)
    run = solve_mip(
        mixed_lp(
            m.cost,
            m.matrix,
            m.row_lo,
            m.row_hi,
            np.zeros(n),
            np.ones(n),
            np.full(n, integer, dtype=np.bool_),
        ),
        time_limit_s=60.0,
        rel_gap=1e-9,
    )
    if not run.optimal:
        return None
    return run.objective if integer else run.dual_bound


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(b))


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.floats(0.01, 100.0), min_size=1, max_size=9),
    capacity=st.floats(1.0, 200.0),
)
def test_each_cover_holds_exactly_the_most_that_fit(weights: list[float], capacity: float) -> None:
    """Every cover's k is the largest number of its members that fit (brute force
    over subsets), so no plan breaks it, and it cuts the memory row's LP."""
    w = sorted(weights, reverse=True)
    for m, k in prefix_covers(np.array(weights), capacity):
        members = w[:m]
        fit = max(
            size
            for size in range(m + 1)
            for subset in itertools.combinations(members, size)
            if sum(subset) <= capacity
        )
        assert fit == k
        # the LP of the memory row alone holds more than k of them
        lightest = sorted(members)
        assert sum(lightest[:k]) <= capacity * (1 + 1e-9) + 1e-9
        assert k < m and sum(lightest[: k + 1]) > capacity


def test_covers_close_the_bundled_lp_gap() -> None:
    """On the bundled two-node instance the covers raise the LP bound to within 0.1 %
    of the optimum and leave the optimum as it is; the packing covers are the two
    sets of both 32B models and one more model (any three warm need three GPUs)."""
    p = load_keepalive(INSTANCES / "azure-llm-2nodes.yaml")
    assert len(p.covers) > 0
    names = [fn.name for fn in p.spec.functions]
    sets = {frozenset(names[int(c) // p.n_states] for c in cols) for cols, _ in packing_sets(p)}
    assert sets == {
        frozenset({"qwen3-32b", "deepseek-r1-distill-32b", "llama-3.1-8b"}),
        frozenset({"qwen3-32b", "deepseek-r1-distill-32b", "opt-6.7b"}),
    }
    before, after = _solve(p, False, False), _solve(p, True, False)
    optimum, strengthened = _solve(p, False, True), _solve(p, True, True)
    assert before is not None and after is not None
    assert optimum is not None and strengthened is not None
    assert _close(strengthened, optimum)
    assert before < 0.9 * optimum  # the arc-flow LP's gap
    assert 0.999 * optimum < after <= optimum * (1 + TOL)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(seed=st.integers(0, 10**9))
def test_strengthened_programme_on_random_instances(seed: int) -> None:
    """With the covers: the same optimum as without them (and as the exhaustive
    search), an LP bound no weaker and no better than the optimum, and the
    Lagrangian's bound never above the optimum nor its plan below it."""
    doc = random_doc(random.Random(seed))
    assume(path_count(doc) <= MAX_COMBINATIONS)
    assume(doc.get("objective", {}).get("kind", "energy") == "energy")
    p = build_problem(KeepAliveFile.model_validate(doc))
    opt = exhaustive(doc).energy_j
    old, new = _solve(p, False, True), _solve(p, True, True)
    if opt is None:
        assert old is None and new is None
        return
    assert old is not None and new is not None
    assert _close(old, opt) and _close(new, opt)
    lp_old, lp_new = _solve(p, False, False), _solve(p, True, False)
    assert lp_old is not None and lp_new is not None
    assert lp_new >= lp_old - TOL * max(1.0, abs(lp_old))
    assert lp_new <= opt + TOL * max(1.0, opt)
    result = solve_lagrangian(p, time_limit_s=30.0)
    if result.bound is not None:
        assert result.bound <= opt + TOL * max(1.0, opt)
    if result.plan is not None:
        ev = evaluate_keepalive(p.spec, result.plan)
        assert not ev.violations
        assert result.objective is not None and result.objective >= opt - TOL * max(1.0, opt)
        covers = memory_covers(p)
        assert np.all(covers.held(p.states_of(result.plan)) <= covers.most[:, None])


def test_lagrangian_keeps_a_tiny_time_limit_with_a_verified_plan() -> None:
    """A limit shorter than any step: one dual point and the first greedy pass, a
    plan the verifier accepts, and the status says the time limit ended it."""
    p = load_keepalive(INSTANCES / "azure-llm-2nodes.yaml")
    result = solve_lagrangian(p, time_limit_s=1e-6)
    assert result.status == FEASIBLE
    assert result.termination == Termination.TIME_LIMIT
    assert result.plan is not None
    ev = evaluate_keepalive(p.spec, result.plan)
    assert not ev.violations
    assert result.objective is not None and _close(result.objective, ev.energy_j)
    assert "1 subgradient iterations" in " ".join(result.log)
    assert result.bound is not None and result.bound <= result.objective


def test_lagrangian_reaches_the_strengthened_bound() -> None:
    """With time to solve the LP for its starting prices, the Lagrangian's bound on
    the bundled instance is the strengthened LP's (within 0.1 % of the optimum), and
    its plan is within 0.2 % of its bound."""
    p = load_keepalive(INSTANCES / "azure-llm-2nodes.yaml")
    after, optimum = _solve(p, True, False), _solve(p, True, True)
    assert after is not None and optimum is not None
    result = solve_lagrangian(p, time_limit_s=60.0)
    assert result.bound is not None and result.objective is not None
    assert after * (1 - TOL) <= result.bound <= optimum * (1 + TOL)
    assert result.objective >= optimum * (1 - TOL)
    assert result.gap is not None and result.gap < 0.002
