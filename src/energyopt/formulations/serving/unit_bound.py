"""A second lower bound: relax the fleet into one small integer problem per unit.

Charge every placement a part of its GPU's on-power given by a dual-feasible
function of its share (the parts of placements that fit one GPU add up to at
most 1, so this never exceeds the true on-power), drop memory, per-GPU
caps and migration costs, and move GPU counts and power budgets into the
objective with the master LP's prices (Lagrangian multipliers >= 0). What is left
splits by unit: cover the unit's rate with whole placements, each with a fixed
cost per use and a cost per request/s. Each small covering problem is bounded
either by HiGHS (its proven bound) or by a grid dynamic program
(``grid_cover_bound``); the sum of the per-unit bounds, less the multipliers'
constant, is a valid lower bound. It sees what the LP cannot: a unit's rate
comes in whole placements.
"""

from __future__ import annotations

import highspy
import numpy as np

from energyopt.backends.highs import quiet_highs
from energyopt.formulations.serving.classes import GpuClass
from energyopt.formulations.serving.columns import Duals
from energyopt.formulations.serving.costs import Costs
from energyopt.perf.oppoints import OpTable

SEARCH_STEPS = 5
GRID_STEPS = 1000
BIG_STEPS = 10
"""Rate grid of ``grid_cover_bound`` (its capacities round up to rate / GRID_STEPS)."""


def share_weight(share: int, capacity: int, alpha: float) -> float:
    """Part of a GPU's on-power charged to a placement of ``share`` units (of ``capacity``).

    A dual-feasible function: the weights of shares that fit one GPU add up to at
    most 1. It mixes the proportional charge share/capacity (weight ``alpha``)
    with the threshold charge (1 above half the GPU, 1/2 at exactly half, 0
    below), which is also dual-feasible since at most one share exceeds half.
    """
    frac = share / capacity
    threshold = 1.0 if frac > 0.5 + 1e-12 else (0.5 if abs(frac - 0.5) <= 1e-12 else 0.0)
    return alpha * frac + (1.0 - alpha) * threshold


def best_unit_bound(
    table: OpTable,
    costs: Costs,
    classes: list[GpuClass],
    duals: Duals,
    budgets_w: list[float],
    budget_duals: list[float],
    exact: bool = True,
) -> tuple[float, float]:
    """(bound, alpha): the unit bound maximised over the mixing weight alpha in [0, 1].

    Every alpha gives a valid bound; the bound is concave in alpha, so a golden
    section search over a few evaluations finds (close to) the best one.
    """

    def at(alpha: float) -> float:
        return unit_decomposition_bound(
            table, costs, classes, duals, budgets_w, budget_duals, alpha=alpha, exact=exact
        )

    lo, hi = 0.0, 1.0
    ratio = (5**0.5 - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = at(a), at(b)
    best = max((at(1.0), 1.0), (fa, a), (fb, b))
    for _ in range(SEARCH_STEPS):
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
) -> float:
    """Lower bound on the integer optimum (see module docstring); ``alpha`` picks the
    share charge (see ``share_weight``). ``exact=False`` bounds each unit's cover
    problem by a grid DP (``grid_cover_bound``) instead of solving it with HiGHS."""
    mu_count = np.maximum(0.0, -np.asarray(duals.count))
    mu_power = np.maximum(0.0, -np.asarray(duals.power))
    total = -float(np.dot(mu_count, [c.size for c in classes]))
    total -= float(sum(max(0.0, -y) * b for y, b in zip(budget_duals, budgets_w, strict=True)))
    for unit in table.units:
        fixed: list[float] = []
        per_rps: list[float] = []
        cap: list[float] = []
        for o in table.ops_of(unit.index):
            type_name = table.type_names[int(table.gpu_type[o])]
            clock = int(table.clock_mhz[o])
            k = int(table.tp[o])
            cap_units = table.share_capacity[type_name]
            frac = k if k > 1 else share_weight(int(table.share[o]), cap_units, alpha)
            for cls in classes:
                if cls.type_name != type_name or (k > 1 and cls.size < k):
                    continue
                on = table.on_power[(type_name, clock)]
                fixed.append(
                    frac
                    * (
                        costs.on_cost[(type_name, clock)]
                        + mu_count[cls.index]
                        + mu_power[cls.index] * on
                    )
                )
                per_rps.append(float(costs.op_cost[o] + mu_power[cls.index] * table.energy_j[o]))
                cap.append(float(table.capacity_rps[o]))
        if not cap:
            return float("-inf")
        args = undominated(np.asarray(fixed), np.asarray(per_rps), np.asarray(cap))
        total += (
            _cover_bound(unit.rate_rps, *args, time_limit_s)
            if exact
            else grid_cover_bound(unit.rate_rps, *args)
        )
    return total


def undominated(
    fixed: np.ndarray, per_rps: np.ndarray, cap: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop placements another one beats on every count (fixed cost, cost per
    request/s, capacity); the cover problem's optimum is unchanged."""
    n = len(cap)
    no_worse = (
        (fixed[:, None] <= fixed[None, :])
        & (per_rps[:, None] <= per_rps[None, :])
        & (cap[:, None] >= cap[None, :])
    )  # [k, i]: k is at least as good as i on every count
    same = (
        (fixed[:, None] == fixed[None, :])
        & (per_rps[:, None] == per_rps[None, :])
        & (cap[:, None] == cap[None, :])
    )
    earlier = np.arange(n)[:, None] < np.arange(n)[None, :]
    beaten = (no_worse & (~same | earlier)).any(axis=0)
    keep = np.flatnonzero(~beaten)
    return fixed[keep], per_rps[keep], cap[keep]


def grid_cover_bound(
    rate: float,
    fixed: np.ndarray,
    per_rps: np.ndarray,
    cap: np.ndarray,
    steps: int = GRID_STEPS,
) -> float:
    """Lower bound of the cover problem of ``_cover_bound`` by dynamic programming.

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


def _cover_bound(
    rate: float, fixed: np.ndarray, per_rps: np.ndarray, cap: np.ndarray, time_limit_s: float
) -> float:
    """min fixed.n + per_rps.r  s.t. sum r = rate, r <= cap n, n integer (HiGHS bound)."""
    m = len(cap)
    h: highspy.Highs = quiet_highs()
    h.setOptionValue("time_limit", time_limit_s)
    h.setOptionValue("mip_rel_gap", 1e-6)
    inf = highspy.kHighsInf
    uses = np.ceil(rate / cap) + 1
    # columns: n_0..n_{m-1}, r_0..r_{m-1}
    h.addVars(2 * m, np.zeros(2 * m), np.concatenate([uses, np.full(m, inf)]))
    h.changeColsCost(2 * m, np.arange(2 * m, dtype=np.int32), np.concatenate([fixed, per_rps]))
    h.changeColsIntegrality(
        m, np.arange(m, dtype=np.int32), np.full(m, highspy.HighsVarType.kInteger)
    )
    h.addRow(rate, rate, m, np.arange(m, 2 * m, dtype=np.int32), np.ones(m))
    for i in range(m):
        h.addRow(-inf, 0.0, 2, np.asarray([m + i, i], dtype=np.int32), np.asarray([1.0, -cap[i]]))
    h.run()
    info = h.getInfo()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kOptimal:
        return float(min(info.objective_function_value, info.mip_dual_bound))
    bound = float(info.mip_dual_bound)
    return bound if np.isfinite(bound) else float("-inf")
