"""The unit-decomposition bound's pieces against definitions written apart: the
dominance filter, the grid DP against the covering problem's exact optimum, the
vectorised relaxation against a placement-by-placement listing, and the deadline
(what it returns is still a valid bound)."""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.catalog.problem import load_problem
from energyopt.families.serving.formulations.classes import gpu_classes
from energyopt.families.serving.formulations.columns import Duals
from energyopt.families.serving.formulations.costs import objective_costs
from energyopt.families.serving.formulations.unit_bound import (
    UnitCover,
    undominated,
    unit_relaxation,
)
from energyopt.families.serving.solvers.unit_bound import (
    best_unit_bound,
    cover_bound,
    grid_cover_bound,
    unit_decomposition_bound,
)
from energyopt.perf.oppoints import build_op_table

from .serving_exhaustive import shared_random_problems

ROOT = Path(__file__).resolve().parents[1]
RANDOM = shared_random_problems(5, 40)
"""The random tiny instances of test_packing_bound (21 feasible)."""

values = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5])
placements = st.lists(st.tuples(values, values, st.sampled_from([0.5, 1.0, 2.0])), max_size=12)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(placements)
def test_undominated_keeps_exactly_the_placements_nothing_beats(
    rows: list[tuple[float, ...]],
) -> None:
    fixed, per_rps, cap = (np.asarray([r[i] for r in rows], dtype=float) for i in range(3))
    expect = []
    for i, (f, r, c) in enumerate(rows):
        beaten = any(
            k != i and fk <= f and rk <= r and ck >= c and ((fk, rk, ck) != (f, r, c) or k < i)
            for k, (fk, rk, ck) in enumerate(rows)
        )
        if not beaten:
            expect.append((f, r, c))
    got = undominated(fixed, per_rps, cap)
    assert list(zip(*(a.tolist() for a in got), strict=True)) == expect


def cover_optimum(cover: UnitCover) -> float:
    """min fixed.n + per_rps.r, sum r = rate, r <= cap n: every count vector up to
    ceil(rate / cap) + 1, the rate filled cheapest per request/s first."""
    best = math.inf
    ranges = [range(math.ceil(cover.rate / c) + 2) for c in cover.cap]
    for n in itertools.product(*ranges):
        room = [c * k for c, k in zip(cover.cap, n, strict=True)]
        if sum(room) < cover.rate - 1e-12:
            continue
        cost = float(np.dot(cover.fixed, n))
        left = cover.rate
        for i in np.argsort(cover.per_rps, kind="stable"):
            take = min(left, room[i])
            cost += take * cover.per_rps[i]
            left -= take
        best = min(best, cost)
    return best


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    st.floats(0.05, 6.0),
    st.lists(
        st.tuples(st.floats(0.0, 5.0), st.floats(0.0, 2.0), st.floats(0.3, 4.0)),
        min_size=1,
        max_size=3,
    ),
)
def test_cover_bounds_never_exceed_the_exact_optimum(
    rate: float, rows: list[tuple[float, float, float]]
) -> None:
    cover = UnitCover(rate, *(np.asarray([r[i] for r in rows]) for i in range(3)))
    opt = cover_optimum(cover)
    assert grid_cover_bound(cover) <= opt * (1 + 1e-9) + 1e-9
    assert cover_bound(cover, 5.0) <= opt * (1 + 1e-6) + 1e-6
    assert cover_bound(cover, 5.0) >= opt * (1 - 1e-5) - 1e-6  # HiGHS solves it


def listed_relaxation(table, costs, classes, duals, alpha):  # type: ignore[no-untyped-def]
    """Every (op, class) placement one by one, as the relaxation defines them."""
    mu_count = np.maximum(0.0, -np.asarray(duals.count))
    mu_power = np.maximum(0.0, -np.asarray(duals.power))
    out = []
    for unit in table.units:
        rows = []
        for o in np.flatnonzero(table.unit == unit.index):
            type_name = table.type_names[int(table.gpu_type[o])]
            clock, k = int(table.clock_mhz[o]), int(table.tp[o])
            share = int(table.share[o]) / table.share_capacity[type_name]
            step = 1.0 if share > 0.5 + 1e-12 else (0.5 if abs(share - 0.5) <= 1e-12 else 0.0)
            frac = k if k > 1 else alpha * share + (1 - alpha) * step
            for cls in classes:
                if cls.type_name != type_name or (k > 1 and cls.size < k):
                    continue
                on = table.on_power[(type_name, clock)]
                # a placement pays its share of the GPU, its fixed part (decode
                # loop) and, at the budget's price, its worst-case draw, per use
                rows.append(
                    (
                        frac
                        * (
                            costs.on_cost[(type_name, clock)]
                            + mu_count[cls.index]
                            + mu_power[cls.index] * on
                        )
                        + costs.op_fixed[o]
                        + mu_power[cls.index] * table.peak_power_w[o],
                        costs.op_cost[o],
                        table.capacity_rps[o],
                    )
                )
        f, r, c = undominated(*(np.asarray([x[i] for x in rows], dtype=float) for i in range(3)))
        out.append((unit.rate_rps, f, r, c))
    return out


@pytest.mark.parametrize("name", ["hetero-migration", "fleet-16", "tensor-parallel"])
def test_relaxation_lists_the_same_covers_as_placement_by_placement(name: str) -> None:
    problem = load_problem(ROOT / "instances" / f"{name}.yaml")
    table = build_op_table(problem)
    classes, costs = gpu_classes(problem, table), objective_costs(problem, table)
    rng = np.random.default_rng(3)
    for trial in range(3):
        # zero prices, then prices that differ by class (some classes then dominate)
        scale = 0.0 if trial == 0 else 1.0
        duals = Duals(
            np.zeros(len(table.units)),
            -scale * rng.choice([0.0, 20.0, 50.0], len(classes)),
            -scale * rng.choice([0.0, 0.1, 0.3], len(classes)),
        )
        for alpha in (1.0, 0.4):
            got = unit_relaxation(table, costs, classes, duals, [], [], alpha=alpha)
            assert got.covers is not None
            want = listed_relaxation(table, costs, classes, duals, alpha)
            assert len(got.covers) == len(want)
            for cover, (rate, f, r, c) in zip(got.covers, want, strict=True):
                assert cover.rate == rate
                for a, b in ((cover.fixed, f), (cover.per_rps, r), (cover.cap, c)):
                    np.testing.assert_allclose(np.sort(a), np.sort(b), rtol=1e-12, atol=1e-12)


def test_a_past_deadline_still_gives_a_valid_bound() -> None:
    problem = load_problem(ROOT / "instances" / "fleet-16.yaml")
    table = build_op_table(problem)
    classes, costs = gpu_classes(problem, table), objective_costs(problem, table)
    duals = Duals(np.zeros(len(table.units)), np.zeros(len(classes)), np.zeros(len(classes)))
    full, _ = best_unit_bound(table, costs, classes, duals, [], [], exact=False)
    late, alpha = best_unit_bound(
        table, costs, classes, duals, [], [], exact=False, deadline=time.perf_counter()
    )
    assert alpha == 1.0 and late <= full + 1e-9
    assert late > 0.0


@pytest.mark.parametrize("k", range(len(RANDOM)))
def test_the_unit_bound_never_exceeds_the_exhaustive_optimum(k: int) -> None:
    """At zero prices and at random ones (GPU counts, node and cluster budgets on
    the worst-case draw), with HiGHS' covers and with the grid DP: every placement
    that carries rate pays its op's fixed part in the plans the brute force prices,
    and so in every cover; the bound stays at or below the optimum."""
    data, problem, opt = RANDOM[k]
    if opt.value is None:
        return  # infeasible: any bound is valid
    table = build_op_table(problem)
    classes, costs = gpu_classes(problem, table), objective_costs(problem, table)
    cluster = problem.instance.cluster
    rng = np.random.default_rng(k)
    for trial in range(3):
        scale = 0.0 if trial == 0 else float(trial)
        count = -scale * rng.uniform(0.0, 30.0, len(classes))
        budgets_w: list[float] = []
        budget_duals: list[float] = []
        power = np.zeros(len(classes))
        for node in cluster.nodes:
            if node.power_budget_w is not None:
                y = -scale * float(rng.uniform(0.0, 0.3))
                budgets_w.append(node.power_budget_w)
                budget_duals.append(y)
                power += np.asarray([y if c.node == node.name else 0.0 for c in classes])
        if cluster.power_budget_w is not None:
            y = -scale * float(rng.uniform(0.0, 0.3))
            budgets_w.append(cluster.power_budget_w)
            budget_duals.append(y)
            power += y
        duals = Duals(np.zeros(len(table.units)), count, power)
        args = (table, costs, classes, duals, budgets_w, budget_duals)
        for alpha in (1.0, 0.0):
            exact = unit_decomposition_bound(*args, alpha=alpha)
            grid = unit_decomposition_bound(*args, alpha=alpha, exact=False)
            assert exact <= opt.value * (1 + 1e-6) + 1e-6, (data, trial, alpha)
            assert grid <= opt.value * (1 + 1e-6) + 1e-6, (data, trial, alpha)
    zero = Duals(np.zeros(len(table.units)), np.zeros(len(classes)), np.zeros(len(classes)))
    best, _ = best_unit_bound(table, costs, classes, zero, [], [])
    assert best <= opt.value * (1 + 1e-6) + 1e-6, data
    assert best > 0.0  # every instance serves some rate: GPUs on, placements paid


def test_a_share_charge_searched_on_a_sample_gives_the_whole_bound_at_that_charge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Above SEARCH_SAMPLE_UNITS units the search runs on every k-th unit and the
    bound returned is the full evaluation at the charge it picked (so as valid as
    any charge's); the sample's own sums only rank charges."""
    from energyopt.families.serving.solvers import unit_bound as ub

    problem = load_problem(ROOT / "instances" / "fleet-64.yaml")
    table = build_op_table(problem)
    classes, costs = gpu_classes(problem, table), objective_costs(problem, table)
    duals = Duals(np.zeros(len(table.units)), -np.full(len(classes), 20.0), np.zeros(len(classes)))
    args = (table, costs, classes, duals, [], [])
    monkeypatch.setattr(ub, "SEARCH_SAMPLE_UNITS", 3)
    sampled_units: list[list[int] | None] = []
    relaxation = ub.unit_relaxation

    def spy(*a: object, **k: object) -> object:
        sampled_units.append(k.get("units"))  # type: ignore[arg-type]
        return relaxation(*a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(ub, "unit_relaxation", spy)
    bound, alpha = best_unit_bound(*args, exact=False)
    step = -(-len(table.units) // 3)
    assert list(range(0, len(table.units), step)) in sampled_units
    assert bound == unit_decomposition_bound(*args, alpha=alpha, exact=False)
    assert bound > 0.0
