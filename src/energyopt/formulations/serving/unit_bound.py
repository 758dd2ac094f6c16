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
comes in whole placements. The covers are bounded in ``solvers/unit_bound.py``,
by HiGHS (its proven bound) or by a grid dynamic program.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np
from numpy.typing import NDArray

from energyopt.formulations.serving.classes import GpuClass
from energyopt.formulations.serving.columns import Duals
from energyopt.formulations.serving.costs import Costs
from energyopt.perf.oppoints import OpTable


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
) -> UnitRelaxation:
    """The per-unit covering problems (see module docstring) at the master LP's
    prices; ``alpha`` picks the share charge (see ``share_weight``). Dominated
    placements are left out (``undominated``)."""
    mu_count = np.maximum(0.0, -np.asarray(duals.count))
    mu_power = np.maximum(0.0, -np.asarray(duals.power))
    total = -float(np.dot(mu_count, [c.size for c in classes]))
    total -= float(sum(max(0.0, -y) * b for y, b in zip(budget_duals, budgets_w, strict=True)))
    covers: list[UnitCover] = []
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
            return UnitRelaxation(total, None)
        f, r, c = undominated(np.asarray(fixed), np.asarray(per_rps), np.asarray(cap))
        covers.append(UnitCover(unit.rate_rps, f, r, c))
    return UnitRelaxation(total, covers)


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
