"""Lagrangian pruning of the clock-pool MILP (``solvers.pool_prune``): the search for
covers below a threshold finds exactly the placements brute force finds, pruning
never removes a placement of the relaxation's optimum below the threshold, and the
MILP over the kept placements proves min(threshold, the relaxation's optimum) on
the random tiny instances (checked against the whole MILP, itself checked against
the exhaustive optimum in test_pool_milp)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from energyopt.families.serving.solvers import pool_prune as pp
from energyopt.families.serving.solvers.pool_milp import pool_milp_bound

from .serving_exhaustive import shared_random_problems
from .test_pool_milp import pools_of

TOL = 1e-6
RANDOM = shared_random_problems(5, 40)


def brute_members(
    rate: float, fixed: np.ndarray, per_rps: np.ndarray, cap: np.ndarray, threshold: float
) -> np.ndarray:
    """Every multiset of uses (at most threshold / fixed of each) whose cost as a
    cover of ``rate`` (rates routed cheapest per req/s first) is below ``threshold``:
    which placements some of them hold."""
    seen = np.zeros(len(cap), dtype=bool)
    most = [int(threshold // f) for f in fixed]
    for uses in itertools.product(*(range(k + 1) for k in most)):
        n = np.asarray(uses)
        if float(cap @ n) < rate - 1e-12:
            continue
        cost = float(fixed @ n)
        left = rate
        for i in np.argsort(per_rps, kind="stable"):
            take = min(left, float(cap[i] * n[i]))
            cost += float(per_rps[i]) * take
            left -= take
        if cost < threshold:
            seen |= n > 0
    return seen


@pytest.mark.parametrize("seed", range(40))
def test_the_cover_search_finds_what_brute_force_finds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 4))
    cap = rng.uniform(1.5, 6.0, m)
    fixed = rng.uniform(2.0, 6.0, m)
    per_rps = rng.uniform(0.0, 2.0, m)
    rate = float(rng.uniform(1.0, 8.0))
    # the cheapest fixed cost of a cover scales the threshold (0 to 80 % above it)
    least = min(
        float(fixed @ np.asarray(n))
        for n in itertools.product(range(7), repeat=m)
        if float(cap @ np.asarray(n)) >= rate
    )
    threshold = least * (1.0 + float(rng.uniform(0.0, 0.8)))
    found = pp.cover_members(rate, fixed, per_rps, cap, threshold)
    assert found is not None
    np.testing.assert_array_equal(found, brute_members(rate, fixed, per_rps, cap, threshold))


def test_the_cover_search_gives_up_rather_than_guess() -> None:
    """A negative cost or a search past its step limit keeps every placement (None)."""
    cap = np.asarray([1.0, 2.0])
    per = np.asarray([0.1, 0.2])
    assert pp.cover_members(3.0, np.asarray([-1.0, 1.0]), per, cap, 10.0) is None
    assert pp.cover_members(30.0, np.asarray([0.01, 0.01]), per, cap, 1e6, max_steps=50) is None


def test_pruning_keeps_the_optimum_and_proves_the_same_bound() -> None:
    """For thresholds below, at and above the relaxation's optimum: every placement
    the whole MILP's optimum uses is kept where that optimum lies below the
    threshold, and the MILP over the kept placements proves min(threshold, optimum)."""
    checked = pruned = 0
    for data, problem, _ in RANDOM:
        pools = pools_of(problem)
        if pools is None or len(pools.unit) == 0:
            continue
        full = pool_milp_bound(pools, math.inf, time_limit_s=60)
        assert full.finished, data
        if full.bound == math.inf:
            continue  # the relaxation is infeasible: any bound is valid
        assert full.point is not None, data
        optimum = full.point.objective
        prices = pp.best_prices(pools)
        assert prices.bound <= optimum * (1 + TOL) + TOL, data
        spread = max(1.0, optimum - prices.bound)
        for threshold in (
            prices.bound + 0.5 * (optimum - prices.bound),
            optimum + 0.01 * spread,
            optimum + 0.5 * spread,
        ):
            keep = pp.kept_placements(pools, prices, threshold)
            if optimum < threshold:
                assert np.all(keep[full.point.uses > 0.5]), (data, threshold)
            cut = pool_milp_bound(pools, threshold, time_limit_s=60, keep=keep)
            assert cut.finished, data
            want = min(threshold, optimum)
            assert cut.bound <= want * (1 + TOL) + TOL, (data, threshold)
            assert cut.bound == pytest.approx(want, rel=1e-5, abs=1e-4), (data, threshold)
            checked += 1
            pruned += int(not keep.all())
    assert checked >= 45
    assert pruned >= 10
