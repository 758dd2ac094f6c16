"""The unit-decomposition bound: bound each unit's covering problem
(``formulations.serving.unit_bound``) with HiGHS or a grid dynamic program, sum
them, and pick the share charge that gives the best bound. Bounds are in the
instance's objective units (W for power)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from energyopt.backends.highs import solve_mip
from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import Duals
from energyopt.families.serving.formulations.costs import Costs
from energyopt.families.serving.formulations.unit_bound import UnitCover, cover_lp, unit_relaxation
from energyopt.perf.oppoints import OpTable

SEARCH_STEPS = 5
GRID_STEPS = 1000
BIG_STEPS = 10
"""Rate grid of ``grid_cover_bound`` (its capacities round up to rate / GRID_STEPS)."""
GRID_WORK = 256_000
"""Grid steps summed over the units of one bound evaluation: a fleet with few units
gets a finer grid (up to 16 times GRID_STEPS), so a tighter bound, at the cost of
16 units at 1,000 steps (fleet-64 at the root LP's prices: 7,734.3 W at 1,000 steps,
7,736.1 W at 16,000; HiGHS' exact covers give 7,736.2 W, at about 4 times the
16,000-step grid's time)."""


SEARCH_SAMPLE_UNITS = 1000
"""Above this many units the share charge is searched on every k-th unit only (k the
least that leaves at most this many), and the bound is then evaluated over every
unit once, at the best charge found: each evaluation is a grid DP per unit (eight
of them took 18 s at 10,240 GPUs and 1,000 units, about 180 s at 102,400 GPUs and
10,000 units). Every charge gives a valid bound; the sample only picks one."""


def grid_steps(units: int) -> int:
    """Steps of the rate grid for a bound over ``units`` covering problems."""
    return int(min(16 * GRID_STEPS, max(GRID_STEPS, GRID_WORK // max(1, units))))


COVER_REL_GAP = 1e-6
"""Relative gap HiGHS closes on a unit's covering problem."""


def best_unit_bound(
    table: OpTable,
    costs: Costs,
    classes: list[GpuClass],
    duals: Duals,
    budgets_w: list[float],
    budget_duals: list[float],
    exact: bool = True,
    deadline: float | None = None,
) -> tuple[float, float]:
    """(bound, alpha): the unit bound maximised over the mixing weight alpha in [0, 1].

    Every alpha gives a valid bound; the bound is concave in alpha, so a golden
    section search over a few evaluations finds (close to) the best one. Past
    ``deadline`` (``time.perf_counter()`` seconds) the search stops with the best
    alpha evaluated so far (alpha = 1 is always evaluated), and what is left of an
    evaluation uses the grid DP. Above SEARCH_SAMPLE_UNITS units the search runs on
    a sample of the units and the bound returned is the one evaluation over all of
    them at the alpha it picked.
    """
    n_units = len(table.units)
    sample = (
        list(range(0, n_units, -(-n_units // SEARCH_SAMPLE_UNITS)))
        if n_units > SEARCH_SAMPLE_UNITS
        else None
    )

    def full(alpha: float) -> float:
        return unit_decomposition_bound(
            table,
            costs,
            classes,
            duals,
            budgets_w,
            budget_duals,
            alpha=alpha,
            exact=exact,
            deadline=deadline,
        )

    def sampled(alpha: float) -> float:
        """The sampled units' covers at ``alpha`` (grid DP at the whole fleet's
        steps): compares charges, bounds nothing."""
        relaxation = unit_relaxation(
            table, costs, classes, duals, budgets_w, budget_duals, alpha=alpha, units=sample
        )
        if relaxation.covers is None:
            return float("-inf")
        steps = grid_steps(n_units)
        return float(sum(grid_cover_bound(cover, steps) for cover in relaxation.covers))

    if sample is not None:
        # Search on the sample, then one evaluation over every unit.
        _, alpha = _golden_search(sampled, deadline)
        return full(alpha), alpha
    return _golden_search(full, deadline)


def _golden_search(at: Callable[[float], float], deadline: float | None) -> tuple[float, float]:
    """(best value, its alpha) of ``at`` over alpha in [0, 1] by golden-section search
    (``at`` concave), alpha = 1 first; past ``deadline`` with the best seen so far."""

    def late() -> bool:
        return deadline is not None and time.perf_counter() >= deadline

    best = (at(1.0), 1.0)
    if late():
        return best
    lo, hi = 0.0, 1.0
    ratio = (5**0.5 - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = at(a), at(b)
    best = max(best, (fa, a), (fb, b))
    for _ in range(SEARCH_STEPS):
        if late():
            break
        if fa >= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = at(a)
            best = max(best, (fa, a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = at(b)
            best = max(best, (fb, b))
    return best


def unit_decomposition_bound(
    table: OpTable,
    costs: Costs,
    classes: list[GpuClass],
    duals: Duals,
    budgets_w: list[float],
    budget_duals: list[float],
    time_limit_s: float = 5.0,
    alpha: float = 1.0,
    exact: bool = True,
    deadline: float | None = None,
) -> float:
    """Lower bound on the integer optimum from the per-unit covering problems at the
    master LP's prices; ``alpha`` picks the share charge (``share_weight``).
    ``exact=False`` bounds each covering problem by a grid DP (``grid_cover_bound``)
    instead of solving it with HiGHS (at most ``time_limit_s`` s per unit, and no
    later than ``deadline``, after which the remaining units use the grid DP; both
    are valid bounds of the same covering problem)."""
    relaxation = unit_relaxation(table, costs, classes, duals, budgets_w, budget_duals, alpha=alpha)
    if relaxation.covers is None:
        return float("-inf")
    total = relaxation.constant
    covers = relaxation.covers
    for i, cover in enumerate(covers):
        limit = time_limit_s
        if deadline is not None:
            limit = min(limit, (deadline - time.perf_counter()) / (len(covers) - i))
        total += (
            cover_bound(cover, limit)
            if exact and limit > 0
            else grid_cover_bound(cover, grid_steps(len(covers)))
        )
    return total


def cover_bound(cover: UnitCover, time_limit_s: float) -> float:
    """HiGHS' proven lower bound on the covering problem (its optimum when solved)."""
    run = solve_mip(cover_lp(cover), time_limit_s=time_limit_s, rel_gap=COVER_REL_GAP)
    if run.optimal:
        return float(min(run.objective, run.dual_bound))
    return run.dual_bound if np.isfinite(run.dual_bound) else float("-inf")


def grid_cover_bound(cover: UnitCover, steps: int = GRID_STEPS) -> float:
    """Lower bound of the covering problem by dynamic programming.

    With fixed costs >= 0 an optimal cover uses every placement at full capacity
    but one (rates fill the cheapest placements first, and a placement with room
    for another copy's whole capacity would be dropped): full uses U and one
    partial use j serving a in (0, cap_j], with sum_U cap_i + a = rate. Relax:

    * "big" placements (cap >= BIG_STEPS * delta, delta = rate / ``steps``) get
      their capacity rounded up to a multiple of delta (about rate / ``steps``,
      chosen to divide the capacity of the placement with the lowest full cost per
      request/s), so their total G_big is
      on the grid and at most rate * (1 + 1 / BIG_STEPS);
    * "small" placements become a fluid that covers any amount at the cheapest
      small cost per request/s rho_s, counted in whole grid steps rounded down.

    D(G) is the cheapest grid total G of full uses (an unbounded knapsack), and
    a >= rate - G - delta. The bound is the least of min_{G >= rate - delta} D(G)
    (no partial use) and min_j min_{G >= rate - cap_j - delta} D(G) + fixed_j +
    per_rps_j max(0, rate - G - delta).
    """
    rate, fixed, per_rps, cap = cover.rate, cover.fixed, cover.per_rps, cover.cap
    if rate <= 0:
        return 0.0
    # The grid step divides the capacity of the placement with the lowest full
    # cost per request/s exactly: the covers that matter most are not rounded.
    star = float(cap[int(np.argmin(fixed / cap + per_rps))])
    delta = star / max(1, int(np.ceil(star * steps / rate)))
    steps = int(np.ceil(rate / delta))
    big = cap >= BIG_STEPS * delta
    w = np.ceil(cap[big] / delta - 1e-9).astype(np.int64)
    full_cost = fixed[big] + per_rps[big] * cap[big]
    small = ~big
    if small.any():
        rho_small = float(np.min(fixed[small] / cap[small] + per_rps[small]))
        w = np.concatenate([w, [1]])
        full_cost = np.concatenate([full_cost, [rho_small * delta]])
    top = int(np.ceil(steps * (1.0 + 1.0 / BIG_STEPS))) + 2
    d = np.full(top + 1, np.inf)
    d[0] = 0.0
    for wi, ci in zip(w.tolist(), full_cost.tolist(), strict=True):
        if wi > top:
            continue  # a full copy lies past the grid: only a partial use (below)
        # Copies of one placement: along each residue class mod wi,
        # d[r + m wi] = min_j d[r + j wi] + (m - j) ci, a running minimum.
        rows = -(-(top + 1) // wi)
        padded = np.full(rows * wi, np.inf)
        padded[: top + 1] = d
        shift = np.arange(rows, dtype=np.float64)[:, None] * ci
        table = padded.reshape(rows, wi) - shift
        np.minimum.accumulate(table, axis=0, out=table)
        d = np.minimum(d, (table + shift).reshape(-1)[: top + 1])
    grid = np.arange(top + 1) * delta
    best = float(np.min(d[grid >= rate - delta - 1e-12]))
    inside = grid[None, :] >= (rate - cap - delta)[:, None] - 1e-12
    short = np.maximum(0.0, rate - grid - delta)
    value = d[None, :] + fixed[:, None] + per_rps[:, None] * short[None, :]
    return min(best, float(np.min(np.where(inside, value, np.inf))))
