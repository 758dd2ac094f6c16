"""The clock-pool relaxation solved as a MILP: a bound above its Lagrangian dual.

``packing_bound`` states the relaxation (GPUs of a class at a clock as one pool,
every unit covering its rate with whole uses of its placements, the uses of a pool
fitting its GPUs in aggregate) and bounds it by Lagrangian relaxation of the pool
rows. That bound is at most the relaxation's Lagrangian dual: on fleet-64,
7,739.4 W, against an optimum of 7,746.85 W (below). The same relaxation with its integer
variables kept (uses n_i and pool GPU counts g_k integer) is a small MILP: 2P + K
columns for P placements and K pools. Every plan of the configuration formulation
gives one of its points (n_i its uses of placement i that carry a rate, r_i their
rates, g_k its GPUs on in pool k) of the same objective, so its optimum, and
HiGHS' dual bound on it at any time, is a valid lower bound on the plan's
objective.

Columns: n_i (integer, at most the class size), r_i >= 0 (req/s), g_k (integer).
Rows, as in ``packing_bound``: the rate of each unit (sum of its r_i >= its rate),
r_i <= cap_i n_i, the pools' share, threshold, memory and power rows (the power
row on the worst-case draw: peak_i per use, whatever its rate), a unit at most
once per GPU, and the GPUs of a class. Objective: sum_k on_cost_k g_k +
sum_i (op_fixed_i n_i + op_cost_i r_i), in the instance's objective units (W for
power): n_i counts the placements that carry a rate, each paying its decode
loop's fixed part, so a unit pays the fixed parts of at least as many
placements as its rate needs.

Cover rows. Its LP relaxation is weak (6,779 W on fleet-64: fractional uses, each
paying a fraction of its fixed part), so
each unit's cover also gets the Chvatal-Gomory rounding of sum_i cap_i n_i >= rate
with multiplier 1/c for each capacity c < rate of its placements:
sum_i min(ceil(cap_i / c), ceil(rate / c)) n_i >= ceil(rate / c), valid for
integer n >= 0. On fleet-64 they raise the root LP to 7,586 W; the relaxation's
optimum is 7,746.8 W (proved in 41 s to 150 s, two cores shared with other work).

Target. The bound is needed only up to the value that closes the gap, so HiGHS
gets that value as its objective cut-off: nodes whose bound reaches it are pruned,
and a finished search proves that no point of the relaxation lies below it. Where
the relaxation's optimum lies below the target, as on fleet-64 (7,746.8 W against
a target 0.1 % under bnp's plan of 7,887.6 W), the cut-off prunes nothing and the
bound is HiGHS' dual bound when the time is up (7,741.1 W after 65 s in bnp).

Plans. The relaxation drops which GPU of a pool holds which use (and node
budgets and TP groups within one node), so the best point HiGHS finds is often a
plan: ``pack_point`` places its uses GPU by GPU (TP groups inside a node, then
first-fit decreasing by share with each GPU's share, memory, worst-case draw
within its cap and a unit once per GPU), and the caller verifies the plan. On
fleet-64 the relaxation's optimum packs into a plan of 7,746.85 W that the
verifier accepts, so it is the optimum, 1.7 % under the best plan any preset
found (pop 7,879.1 W, bnp 7,893.3 W); on 17 of the 19 feasible random tiny
instances the packed point is the brute-force optimum.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csc_matrix

from energyopt.backends.highs import MipStatus, mixed_lp, solve_mip
from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.assemble import GpuDecision, power_cap_w
from energyopt.families.serving.formulations.classes import GpuClass, split_tp_groups
from energyopt.families.serving.solvers.packing_bound import FloatArray, IntArray, Pools
from energyopt.perf.oppoints import OpTable

NODES = 50_000
"""HiGHS branch-and-bound nodes at most (the effort limit)."""
REL_GAP = 1e-7
"""Relative gap at which HiGHS stops; the bound it reports is lowered by it."""
ABS_TOL = 1e-6
"""Absolute tolerance taken off the bound (HiGHS' feasibility and gap tolerances)."""


@dataclass(frozen=True)
class PoolPoint:
    """A point of the relaxation: uses n and rates r (req/s) per placement, GPUs on
    per pool, and its objective (objective units)."""

    uses: FloatArray
    rates: FloatArray
    gpus: FloatArray
    objective: float


@dataclass(frozen=True)
class PoolMilpBound:
    """A valid lower bound (objective units), whether the search ran to its end (it
    then proved no point of the relaxation below the bound or the target, whichever
    is lower), whether the time limit cut it, HiGHS' status in its words, and the
    best point HiGHS found (below the target when one was given; None without one):
    ``pack_point`` makes it a plan where its pools' uses fit their GPUs one by one."""

    bound: float
    finished: bool
    time_cut: bool
    status: str
    point: PoolPoint | None = None


def _cover_rows(p: Pools) -> Iterator[tuple[IntArray, FloatArray, float]]:
    """Each unit's cover rows (module docstring): columns (its placements' uses),
    coefficients and right-hand side."""
    for u in range(p.units):
        rate = float(p.rate[u])
        if rate <= 0:
            continue
        members = np.flatnonzero(p.unit == u)
        cap = p.cap[members]
        seen: set[tuple[float, ...]] = set()
        for c in np.unique(cap):
            if c <= 0 or c >= rate:
                continue
            right = math.ceil(rate / c - 1e-9)
            coef = np.minimum(np.ceil(cap / c - 1e-9), right)
            key = (*coef.tolist(), float(right))
            if key in seen:
                continue
            seen.add(key)
            used = coef > 0
            yield members[used], coef[used], float(right)


def build_model(p: Pools) -> tuple[csc_matrix, FloatArray, FloatArray, FloatArray]:
    """The MILP's matrix (columns n, then r, then g), row bounds and costs."""
    n_p, n_k = len(p.unit), p.n_pools
    n_of = np.arange(n_p)
    r_of = n_p + np.arange(n_p)
    g_of = 2 * n_p + np.arange(n_k)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(cs: IntArray, vs: FloatArray, low: float, high: float) -> None:
        rows.extend([len(lo)] * len(cs))
        cols.extend(cs.tolist())
        vals.extend(vs.tolist())
        lo.append(low)
        hi.append(high)

    for u in range(p.units):
        members = np.flatnonzero(p.unit == u)
        add(r_of[members], np.ones(len(members)), float(p.rate[u]), math.inf)
    for i in range(n_p):
        add(np.asarray([r_of[i], n_of[i]]), np.asarray([1.0, -float(p.cap[i])]), -math.inf, 0.0)
    for k in range(n_k):
        members = np.flatnonzero(p.pool == k)
        g = np.asarray([g_of[k]])
        for per_use, per_gpu in (
            (p.share, p.pool_share[k]),
            (p.thr, 1.0),
            (p.mem, p.pool_mem[k]),
        ):
            add(
                np.concatenate([n_of[members], g]),
                np.append(per_use[members], -per_gpu),
                -math.inf,
                0.0,
            )
        add(
            np.concatenate([n_of[members], g]),
            np.append(p.peak[members], -float(p.pool_room_w[k])),
            -math.inf,
            0.0,
        )
        for u in np.unique(p.unit[members]):
            once = members[(p.unit[members] == u) & (p.once[members] > 0)]
            if len(once):
                add(
                    np.concatenate([n_of[once], g]),
                    np.append(np.ones(len(once)), -1.0),
                    -math.inf,
                    0.0,
                )
    for c, size in enumerate(p.class_size):
        pools = np.flatnonzero(p.pool_class == c)
        add(g_of[pools], np.ones(len(pools)), -math.inf, float(size))
    for members, coef, right in _cover_rows(p):
        add(n_of[members], coef, right, math.inf)
    matrix = csc_matrix((vals, (rows, cols)), shape=(len(lo), 2 * n_p + n_k))
    cost = np.concatenate([p.op_fixed, p.op_cost, p.pool_on_cost])
    return matrix, np.asarray(lo), np.asarray(hi), cost


def pool_milp_bound(
    p: Pools,
    target: float,
    *,
    time_limit_s: float,
    nodes: int = NODES,
    keep: NDArray[np.bool_] | None = None,
) -> PoolMilpBound:
    """Solve the relaxation's MILP with ``target`` (objective units; ``math.inf``
    for none) as the cut-off, for at most ``time_limit_s`` seconds and ``nodes``
    nodes. The bound is the lower of the target and HiGHS' dual bound, less the
    tolerances: valid however the search ended.

    ``keep`` (per placement; with a finite target only): the placements the MILP
    may use, the others held at zero uses. Valid where no point of the relaxation
    below ``target`` uses a placement left out (``pool_prune.kept_placements``):
    the bound then holds for the whole relaxation."""
    served = np.zeros(p.units, dtype=bool)
    served[p.unit] = True
    if np.any((p.rate > 0) & ~served):  # a unit with a rate and no placement
        return PoolMilpBound(math.inf, True, False, "no placement for a unit with a rate")
    matrix, lo, hi, cost = build_model(p)
    n_p, n_k = len(p.unit), p.n_pools
    size = p.class_size[p.pool_class[p.pool]].astype(np.float64)
    col_hi = np.concatenate([size, np.full(n_p, math.inf), p.class_size[p.pool_class]])
    if keep is not None:
        if not math.isfinite(target):
            raise ValueError("pool_milp_bound: keep needs a finite target")
        col_hi[:n_p][~keep] = 0.0
        col_hi[n_p : 2 * n_p][~keep] = 0.0
    integer = np.concatenate([np.ones(n_p, bool), np.zeros(n_p, bool), np.ones(n_k, bool)])
    lp = mixed_lp(cost, matrix, lo, hi, np.zeros(2 * n_p + n_k), col_hi, integer)
    cutoff = target if math.isfinite(target) else None
    run = solve_mip(
        lp,
        time_limit_s=max(0.05, time_limit_s),
        rel_gap=REL_GAP,
        objective_bound=cutoff,
        node_limit=nodes,
    )
    if run.status in (MipStatus.CUT_OFF, MipStatus.INFEASIBLE):
        # nothing below the cut-off (the relaxation of a problem with a plan is
        # feasible, so an infeasible verdict here is the cut-off's)
        found = target
    else:
        found = min(target, run.dual_bound)
    finished = run.status in (MipStatus.CUT_OFF, MipStatus.INFEASIBLE, MipStatus.OPTIMAL)
    point = None
    if run.col_value is not None and math.isfinite(run.objective):
        x = run.col_value
        point = PoolPoint(
            np.round(x[:n_p]), np.maximum(x[n_p : 2 * n_p], 0.0), np.round(x[2 * n_p :]),
            float(run.objective),
        )
    if found == math.inf:  # the relaxation is infeasible: so is the problem
        return PoolMilpBound(math.inf, True, False, run.highs_status)
    if not math.isfinite(found):
        return PoolMilpBound(-math.inf, finished, run.time_limited, run.highs_status, point)
    bound = found - REL_GAP * abs(found) - ABS_TOL
    return PoolMilpBound(bound, finished, run.time_limited, run.highs_status, point)


@dataclass
class _Slot:
    """One GPU being filled by ``pack_point``: share units, memory (GB) and
    worst-case draw (W) used, its power cap (W), its units and (op, req/s) uses."""

    share: float
    memory_gb: float
    power_w: float
    cap_w: float
    units: set[int] = field(default_factory=set)
    ops: list[tuple[int, float]] = field(default_factory=list)

    def fits(self, table: OpTable, op: int, capacity: int, usable_gb: float) -> bool:
        """Whether a use of ``op`` fits: share, memory, worst-case draw, unit once."""
        return (
            int(table.unit[op]) not in self.units
            and self.share + float(table.share[op]) <= capacity
            and self.memory_gb + float(table.memory_gb[op]) <= usable_gb + 1e-9
            and self.power_w + float(table.peak_power_w[op]) <= self.cap_w + 1e-9
        )


def pack_point(
    problem: Problem, table: OpTable, p: Pools, classes: list[GpuClass], point: PoolPoint
) -> dict[str, GpuDecision] | None:
    """Per-GPU decisions placing a point's uses, or None where they do not fit.

    The relaxation drops only which GPU holds which use, so its optimum is often a
    plan: per pool, the TP uses take whole GPUs of one node of its class, then the
    single-GPU uses are packed first-fit decreasing by share into the class's other
    free GPUs at the pool's clock (share, usable memory, each GPU's cap on the
    worst-case draw, a unit once per GPU). Each placement's rate is split evenly
    over its uses. None when a class runs out of GPUs, a TP group finds no node,
    or under MIG. The decisions are a candidate: the caller verifies the plan."""
    if problem.instance.options.sharing.mode == "mig":
        return None
    out: dict[str, GpuDecision] = {}
    reserve = problem.instance.options.memory_reserve_fraction
    for cls in classes:
        pools = [k for k in range(p.n_pools) if p.pool_class[k] == cls.index]
        tp_uses: list[tuple[int, float]] = []
        singles: dict[int, list[tuple[int, float]]] = {}
        for i in np.flatnonzero(np.isin(p.pool, pools) & (point.uses > 0.5)).tolist():
            n = int(point.uses[i])
            o = int(p.op[i])
            use = (o, float(point.rates[i]) / n)
            if int(table.tp[o]) > 1:
                tp_uses.extend([use] * n)
            else:
                singles.setdefault(int(p.pool[i]), []).extend([use] * n)
        try:
            groups, free = split_tp_groups(cls, [int(table.tp[o]) for o, _ in tp_uses])
        except ValueError:
            return None
        for j, ((o, rate), members) in enumerate(zip(tp_uses, groups, strict=True)):
            gid = f"{members[0].node}:tp{o}.{j}"
            for gpu in members:
                out[gpu.id] = GpuDecision(int(table.clock_mhz[o]), [], [(o, rate, gid)])
        usable = problem.gpu_type(cls.type_name).memory_gb * (1.0 - reserve)
        capacity = table.share_capacity[cls.type_name]
        for _, uses in sorted(singles.items()):
            clock = int(table.clock_mhz[uses[0][0]])
            on_w = table.on_power[(cls.type_name, clock)]
            slots: list[_Slot] = []
            for o, rate in sorted(uses, key=lambda it: (-int(table.share[it[0]]), it[0])):
                slot = next((b for b in slots if b.fits(table, o, capacity, usable)), None)
                if slot is None:
                    if not free:
                        return None
                    gpu = free.pop(0)
                    slot = _Slot(0.0, 0.0, on_w, power_cap_w(problem, gpu))
                    if not slot.fits(table, o, capacity, usable):
                        return None
                    slots.append(slot)
                    out[gpu.id] = GpuDecision(clock, slot.ops, [])
                slot.share += float(table.share[o])
                slot.memory_gb += float(table.memory_gb[o])
                slot.power_w += float(table.peak_power_w[o])
                slot.units.add(int(table.unit[o]))
                slot.ops.append((o, rate))
    return out
