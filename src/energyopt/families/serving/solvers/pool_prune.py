"""Lagrangian pruning of the clock-pool MILP's placements below a threshold.

The clock-pool relaxation (``packing_bound``) dualised at prices y >= 0 on its pool
and count rows gives, for every point x of the relaxation,

    value(x) >= L(y) + sum_u (c_u(x) - b_u),

where c_u(x) is what unit u's uses and rates in x cost at y (each use its op's
fixed part plus its pool rows' prices times what it takes of them,
``packing_bound.use_cost``, each req/s its op's cost), b_u a proven lower bound on
the cheapest cover of unit u at y (``cover_bound``) and L(y) the
Lagrangian bound built from them (``packing_bound.lagrangian_value``); every term
of the sum is >= 0. So a point below a threshold T has, for every unit, uses that
cost less than b_u + (T - L(y)) as a cover. A placement that appears in no such
cover appears in no point below T, and the MILP over the other placements
(``pool_milp.pool_milp_bound`` with ``keep``) proves the same bound up to T:
min(T, its optimum) is min(T, the relaxation's optimum).

Covers within the threshold. ``cover_members`` lists, by depth-first search, every
multiset of uses of one unit whose cost as a cover is below the threshold: the
uses in the order of their least cost per req/s (fixed cost / capacity + cost per
req/s), each branch bounded by its uses' fixed costs plus the cheapest way to route
the rate over its uses and further uses at the least cost per req/s left (a lower
bound on the cost of every multiset the branch extends to). A placement is kept
when some multiset holding it covers the rate at a cost below the threshold (its
uses then carry the rate cheapest first). On fleet-64 at the prices of share-charge
mix 0 (``packing_bound.seed_prices``; L = 7,734.0 W with HiGHS' cover bounds) and
T = 7,750 W, 111 of the 1,219 placements are kept (the same 111 that HiGHS finds
with a use forced on each placement), after 26,000 search steps; the MILP over
them proves the relaxation's optimum, 7,746.85 W, in about 3 CPU-s where the whole
MILP took 14-21.

Values in the instance's objective units (W for power); rates in req/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from energyopt.families.serving.formulations.unit_bound import UnitCover, undominated_index
from energyopt.families.serving.solvers.packing_bound import (
    Cover,
    FloatArray,
    IntArray,
    Pools,
    lagrangian_value,
    seed_prices,
    use_cost,
)
from energyopt.families.serving.solvers.unit_bound import grid_cover_bound, grid_steps

SEED_MIXES = (0.0, 1.0)
"""Share-charge mixes (``packing_bound.seed_prices``) tried for the prices; the best
bound's are kept (fleet-64: 7,734.0 W at mix 0, 7,617.4 W at mix 1; fleet-16:
1,878.4 W and 1,787.0 W; quickstart: 799.2 W and 879.7 W)."""
SEARCH_STEPS = 30_000
"""Branches of ``cover_members`` per unit at most (the effort limit; past it the
unit keeps every placement)."""
MAX_USES = 200
"""Uses in one branch of ``cover_members`` at most (past it the unit keeps every
placement)."""
KEEP_TOL = 1e-6
"""Allowance, relative to the threshold, added to each unit's limit: bounds and
HiGHS' points carry rounding and its tolerances (on a random tiny instance HiGHS'
cover bound lay 1.6e-8 above the cover the relaxation's optimum used), so rounding
keeps a placement rather than prunes it."""


@dataclass(frozen=True)
class Prices:
    """Prices over the relaxation's master rows, each unit's proven cover bound there
    and the Lagrangian bound they give (objective units)."""

    y: FloatArray
    covers: list[Cover]
    bound: float


def cover_bound(p: Pools, y: FloatArray, u: int, members: IntArray) -> Cover:
    """A proven lower bound on unit ``u``'s cheapest cover at prices ``y``
    (``members``: its placements) by the grid dynamic program
    (``unit_bound.grid_cover_bound``, over its undominated placements). On fleet-64 at
    mix 0 the bounds add up to 0.14 W under HiGHS' (``packing_bound.price_unit``), in
    0.3 CPU-s against 1.2; on fleet-256's 32 units HiGHS took 8.4 CPU-s for two
    mixes."""
    if p.rate[u] <= 0:
        return Cover(0.0, None, None)
    fixed = use_cost(p, y, u, members)
    per_rps = p.op_cost[members]
    cap = p.cap[members]
    keep = undominated_index(fixed, per_rps, cap)
    cover = UnitCover(float(p.rate[u]), fixed[keep], per_rps[keep], cap[keep])
    return Cover(grid_cover_bound(cover, grid_steps(p.units)), None, None)


def best_prices(p: Pools, mixes: tuple[float, ...] = SEED_MIXES) -> Prices:
    """The prices of ``mixes`` whose Lagrangian bound (``cover_bound``) is highest."""
    best: Prices | None = None
    members = [np.flatnonzero(p.unit == u) for u in range(p.units)]
    for alpha in mixes:
        y = seed_prices(p, alpha)
        covers = [cover_bound(p, y, u, members[u]) for u in range(p.units)]
        found = Prices(y, covers, lagrangian_value(p, y, covers))
        if best is None or found.bound > best.bound:
            best = found
    if best is None:
        raise ValueError("best_prices: mixes is empty")
    return best


def cover_members(
    rate: float,
    fixed: FloatArray,
    per_rps: FloatArray,
    cap: FloatArray,
    threshold: float,
    *,
    max_steps: int = SEARCH_STEPS,
) -> NDArray[np.bool_] | None:
    """Per placement, whether some multiset of uses holding it covers ``rate``
    (req/s) at a cost below ``threshold`` (module docstring); ``fixed`` per use,
    ``per_rps`` per req/s (objective units), ``cap`` req/s per use. None where the
    search cannot decide (a negative cost or capacity, more than ``max_steps``
    branches or MAX_USES uses in one): every placement may then be needed."""
    m = len(cap)
    if m == 0:
        return np.zeros(0, dtype=bool)
    if np.any(fixed < 0) or np.any(per_rps < 0) or np.any(cap < 0):
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        unit_cost = np.where(cap > 0, fixed / np.where(cap > 0, cap, 1.0) + per_rps, math.inf)
    order = np.argsort(unit_cost, kind="stable")
    f = fixed[order].tolist()
    c = per_rps[order].tolist()
    w = cap[order].tolist()
    rho = [*unit_cost[order].tolist(), math.inf]
    limit = threshold + 1e-9 * max(1.0, abs(threshold))
    seen = [False] * m
    chosen: list[int] = []
    steps = 0

    def lower(spent: float, start: int) -> float:
        """Cost of the chosen uses' fixed parts plus the cheapest routing of the
        rate over them and further uses at rho[start] per req/s."""
        left = rate
        cost = spent
        for j in sorted(chosen, key=lambda j: c[j]):
            if left <= 0 or c[j] >= rho[start]:
                break
            take = min(w[j], left)
            cost += c[j] * take
            left -= take
        if left > 1e-12 * max(1.0, rate):
            if not math.isfinite(rho[start]):
                return math.inf
            cost += rho[start] * left
        return cost

    class _Undecided(Exception):
        pass

    def search(start: int, spent: float) -> None:
        nonlocal steps
        if len(chosen) >= MAX_USES:
            raise _Undecided
        for j in range(start, m):
            steps += 1
            if steps > max_steps:
                raise _Undecided
            chosen.append(j)
            total = spent + f[j]
            if lower(total, j) < limit:
                if lower(total, m) < limit:  # the chosen uses alone cover the rate
                    for i in chosen:
                        seen[i] = True
                search(j, total)
            chosen.pop()

    if rate <= 0:
        # The empty multiset covers a zero rate; uses only add their fixed costs.
        return np.asarray(fixed < limit, dtype=bool)
    try:
        search(0, 0.0)
    except _Undecided:
        return None
    out = np.zeros(m, dtype=bool)
    out[order] = seen
    return out


def kept_placements(p: Pools, prices: Prices, threshold: float) -> NDArray[np.bool_]:
    """Per placement of ``p``, whether it may appear in a point of the relaxation
    whose value is below ``threshold`` (objective units; module docstring): all
    are kept where the prices give no finite bound or a unit's search is undecided."""
    keep = np.ones(len(p.unit), dtype=bool)
    if not math.isfinite(prices.bound) or not math.isfinite(threshold):
        return keep
    slack = threshold - prices.bound
    for u in range(p.units):
        members = np.flatnonzero(p.unit == u)
        bound = prices.covers[u].bound
        if len(members) == 0 or not math.isfinite(bound):
            continue
        found = cover_members(
            float(p.rate[u]),
            use_cost(p, prices.y, u, members),
            p.op_cost[members],
            p.cap[members],
            bound + slack + KEEP_TOL * max(1.0, abs(threshold)),
        )
        if found is not None:
            keep[members] = found
    return keep
