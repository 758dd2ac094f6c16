"""A second lower bound: relax the fleet into one small integer problem per unit.

Charge every placement a part of its GPU's on-power given by a dual-feasible
function of its share (the parts of placements that fit one GPU add up to at
most 1, so this never exceeds the true on-power), drop memory, per-GPU
caps and migration costs, and move GPU counts and power budgets into the
objective with the master LP's prices (Lagrangian multipliers >= 0). What is left
splits by unit: cover the unit's rate with whole placements, each with a fixed
cost per use and a cost per request/s (``UnitCover``; ``cover_lp`` is its HiGHS
model). The sum of lower bounds on the covering problems, less the multipliers'
constant, is a valid lower bound. It sees what the LP cannot: a unit's rate
comes in whole placements. The covers are bounded in ``families/serving/solvers/unit_bound.py``,
by HiGHS (its proven bound) or by a grid dynamic program.

Why it is valid. Take any feasible plan and keep, per unit, its placements that
carry a rate > 0 (a TP group is one placement). Each of them pays, in the plan's
objective, exactly its op's ``op_fixed`` plus ``op_cost`` per req/s (the power
line of ``perf.energy.power_line``); placements without rate pay nothing and are
dropped (they only use room). Their shares on one GPU add up to at most 1, so
their on-cost charges add up to at most the GPU's on-cost. A budget row (node or
cluster) holds on the worst-case draw: each GPU's on-power plus each placement's
``peak_power_w``, a constant per placement whatever its rate; with multiplier
mu >= 0 it adds mu (charged on-power + peak) per placement less mu x budget,
never more than the plan's mu (draw - budget) <= 0. So each unit's kept
placements are a cover (whole uses, rate <= capacity per use) whose cost at
``fixed`` = charge x (on-cost + count and power prices x on-power) + op_fixed +
power price x peak_power_w and ``per_rps`` = op_cost is at most what the plan
pays for them; the sum of the covers' optima plus the constant is at most the
plan's objective. A unit served at rate r on ops of capacity at most c thus
takes at least ceil(r / c) uses here, each paying its op's fixed part, as in
every plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np
from numpy.typing import NDArray

from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import Duals
from energyopt.families.serving.formulations.costs import Costs
from energyopt.perf.oppoints import OpTable


def share_weight(share: int, capacity: int, alpha: float) -> float:
    """Part of a GPU's on-power charged to a placement of ``share`` units (of ``capacity``).

    A dual-feasible function: the weights of shares that fit one GPU add up to at
    most 1. It mixes the proportional charge share/capacity (weight ``alpha``)
    with the threshold charge (1 above half the GPU, 1/2 at exactly half, 0
    below), which is also dual-feasible since at most one share exceeds half.
    """
    frac = share / capacity
    return alpha * frac + (1.0 - alpha) * float(threshold_charge(np.asarray(frac)))


def threshold_charge(frac: NDArray[np.float64]) -> NDArray[np.float64]:
    """The threshold part of ``share_weight`` for GPU fractions ``frac``: 1 above
    half a GPU, 1/2 at exactly half, 0 below (at most one share per GPU exceeds
    half, so these add up to at most 1 on any GPU)."""
    return np.where(frac > 0.5 + 1e-12, 1.0, np.where(np.abs(frac - 0.5) <= 1e-12, 0.5, 0.0))


@dataclass(frozen=True)
class UnitCover:
    """One unit's covering problem: serve ``rate`` req/s with whole uses of
    placements i, each with a fixed cost per use ``fixed[i]``, a cost per req/s
    ``per_rps[i]`` and a capacity per use ``cap[i]`` (req/s); costs in the
    instance's objective units (W for power)::

        min fixed.n + per_rps.r  s.t.  sum r = rate,  r <= cap n,  n >= 0 integer
    """

    rate: float
    fixed: NDArray[np.float64]
    per_rps: NDArray[np.float64]
    cap: NDArray[np.float64]


UNDOMINATED_BLOCK = 512
"""Placements compared at once in ``undominated`` (memory: candidates x this)."""


@dataclass(frozen=True)
class UnitRelaxation:
    """The relaxation at one set of multipliers and one share charge: the sum of the
    covers' optima plus ``constant`` (the multipliers' part, <= 0) bounds the
    integer optimum from below. ``covers`` is None when some unit has no placement
    at all (the bound is then -inf)."""

    constant: float
    covers: list[UnitCover] | None


def unit_relaxation(
    table: OpTable,
    costs: Costs,
    classes: list[GpuClass],
    duals: Duals,
    budgets_w: list[float],
    budget_duals: list[float],
    alpha: float = 1.0,
    units: Sequence[int] | None = None,
) -> UnitRelaxation:
    """The per-unit covering problems (see module docstring) at the master LP's
    prices; ``alpha`` picks the share charge (see ``share_weight``). Dominated
    placements are left out (``undominated``). ``units``: the covers of these units
    only (by index, in this order; every unit when None), with the same constant:
    a sum over part of the units is no bound, but compares share charges."""
    mu_count = np.maximum(0.0, -np.asarray(duals.count, dtype=np.float64))
    mu_power = np.maximum(0.0, -np.asarray(duals.power, dtype=np.float64))
    total = -float(np.dot(mu_count, [c.size for c in classes]))
    total -= float(sum(max(0.0, -y) * b for y, b in zip(budget_duals, budgets_w, strict=True)))
    # Per op (vectorised over the whole table): the share charged, the on-cost and
    # on-power of its (type, clock); per class: its type and size. A placement is an
    # (op, class) pair of one type, TP groups only in classes large enough.
    n_ops = len(table.unit)
    type_idx = np.asarray(table.gpu_type, dtype=np.int64)
    tp = np.asarray(table.tp, dtype=np.int64)
    on_cost = np.empty(n_ops)
    on_w = np.empty(n_ops)
    frac = np.empty(n_ops)
    for t, type_name in enumerate(table.type_names):
        of_type = type_idx == t
        clocks = np.asarray(table.clock_mhz)[of_type].astype(np.int64)
        on_cost[of_type] = [costs.on_cost[(type_name, int(c))] for c in clocks]
        on_w[of_type] = [table.on_power[(type_name, int(c))] for c in clocks]
        share = np.asarray(table.share)[of_type] / table.share_capacity[type_name]
        frac[of_type] = alpha * share + (1.0 - alpha) * threshold_charge(share)
    frac = np.where(tp > 1, tp.astype(np.float64), frac)
    op_fixed = np.asarray(costs.op_fixed, dtype=np.float64)  # per placement
    op_cost = np.asarray(costs.op_cost, dtype=np.float64)  # per req/s
    peak_w = np.asarray(table.peak_power_w, dtype=np.float64)  # worst-case draw, W
    class_type = np.asarray([table.type_names.index(c.type_name) for c in classes], dtype=np.int64)
    class_size = np.asarray([c.size for c in classes], dtype=np.int64)
    # A class of the same type priced no higher on GPUs and power, and at least as
    # large, gives every op a placement at least as good (charges, on-power and
    # peak power are >= 0): only the others need be listed.
    useful = np.ones(len(classes), dtype=bool)
    for k in range(len(classes)):
        better = (
            (class_type == class_type[k])
            & (mu_count <= mu_count[k])
            & (mu_power <= mu_power[k])
            & (class_size >= class_size[k])
        )
        better[k] = False
        ties = (mu_count == mu_count[k]) & (mu_power == mu_power[k]) & (class_size == class_size[k])
        better &= ~ties | (np.arange(len(classes)) < k)
        useful[k] = not better.any()
    order = np.argsort(np.asarray(table.unit), kind="stable")
    bounds = np.searchsorted(np.asarray(table.unit)[order], np.arange(len(table.units) + 1))
    covers: list[UnitCover] = []
    for unit in table.units if units is None else [table.units[u] for u in units]:
        ops = order[bounds[unit.index] : bounds[unit.index + 1]]
        # [op, class] in op-major order, as the placements are listed
        fits = (
            (type_idx[ops][:, None] == class_type[None, :])
            & ((tp[ops][:, None] <= 1) | (class_size[None, :] >= tp[ops][:, None]))
            & useful[None, :]
        )
        o_at, c_at = np.nonzero(fits)
        if len(o_at) == 0:
            return UnitRelaxation(total, None)
        op = ops[o_at]
        fixed = (
            frac[op] * (on_cost[op] + mu_count[c_at] + mu_power[c_at] * on_w[op])
            + op_fixed[op]
            + mu_power[c_at] * peak_w[op]
        )
        per_rps = op_cost[op]
        cap = np.asarray(table.capacity_rps, dtype=np.float64)[op]
        f, r, c = undominated(fixed, per_rps, cap)
        covers.append(UnitCover(unit.rate_rps, f, r, c))
    return UnitRelaxation(total, covers)


def undominated(
    fixed: np.ndarray, per_rps: np.ndarray, cap: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Drop placements another one beats on every count (fixed cost, cost per
    request/s, capacity), and repeats of an earlier one; the cover problem's
    optimum is unchanged. The survivors keep their order."""
    keep = undominated_index(fixed, per_rps, cap)
    return fixed[keep], per_rps[keep], cap[keep]


def undominated_index(fixed: np.ndarray, per_rps: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the placements ``undominated`` keeps."""
    # Exact repeats first (the earliest stays): classes with the same prices give
    # the same placement once per class.
    _, first = np.unique(np.stack([fixed, per_rps, cap], axis=1), axis=0, return_index=True)
    cand = np.sort(first)
    f, r, c = fixed[cand], per_rps[cand], cap[cand]
    n = len(cand)
    beaten = np.zeros(n, dtype=bool)
    for lo in range(0, n, UNDOMINATED_BLOCK):
        i = slice(lo, min(n, lo + UNDOMINATED_BLOCK))
        no_worse = (
            (f[:, None] <= f[None, i]) & (r[:, None] <= r[None, i]) & (c[:, None] >= c[None, i])
        )  # [k, i]: k is at least as good as i on every count
        same = (f[:, None] == f[None, i]) & (r[:, None] == r[None, i]) & (c[:, None] == c[None, i])
        earlier = np.arange(n)[:, None] < np.arange(n)[None, i]
        beaten[i] = (no_worse & (~same | earlier)).any(axis=0)
    return np.asarray(cand[~beaten], dtype=np.int64)


def cover_lp(cover: UnitCover) -> highspy.HighsLp:
    """The covering problem as a HiGHS model: columns n_0..n_{m-1} (integer, at most
    ceil(rate / cap) + 1 uses) then r_0..r_{m-1}; row 0 is the rate, rows 1..m the
    links r_i - cap_i n_i <= 0."""
    m = len(cover.cap)
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = 2 * m
    lp.num_row_ = 1 + m
    lp.col_cost_ = np.concatenate([cover.fixed, cover.per_rps]).astype(np.float64)
    lp.col_lower_ = np.zeros(2 * m)
    lp.col_upper_ = np.concatenate([np.ceil(cover.rate / cover.cap) + 1, np.full(m, inf)])
    lp.row_lower_ = np.concatenate([[cover.rate], np.full(m, -inf)])
    lp.row_upper_ = np.concatenate([[cover.rate], np.zeros(m)])
    # column-wise: n_i has -cap_i in link row 1+i; r_i has 1 in row 0 and in row 1+i
    starts = np.concatenate([np.arange(m), m + 2 * np.arange(m + 1)]).astype(np.int32)
    index = np.concatenate(
        [1 + np.arange(m), np.stack([np.zeros(m), 1 + np.arange(m)], axis=1).reshape(-1)]
    ).astype(np.int32)
    value = np.concatenate([-cover.cap, np.ones(2 * m)]).astype(np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = starts
    lp.a_matrix_.index_ = index
    lp.a_matrix_.value_ = value
    lp.integrality_ = [highspy.HighsVarType.kInteger] * m + [highspy.HighsVarType.kContinuous] * m
    return lp
