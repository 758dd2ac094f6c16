"""The clock-pool bound: a Lagrangian bound above the unit bound for fleets with few units.

Relaxation. The GPUs of class c that run at clock f form a pool k = (c, f) of g_k
GPUs (integer, sum_f g_(c,f) <= size_c). Every unit covers its rate with whole uses
n_i of its placements i (as in the unit bound), each use serving r_i <= cap_i
request/s; the uses placed in pool k must fit its GPUs in aggregate:

    sum_i share_i n_i        <= C_k g_k          (SM share per GPU)
    sum_i thr(share_i) n_i   <= g_k              (thr = 1 above half a GPU, 1/2 at half)
    sum_i mem_i n_i          <= M_k g_k          (memory at capacity, GB)
    sum_i peak_i n_i         <= (cap_k - on_k) g_k   (each GPU's power cap, W)
    sum_(i of unit u) n_i    <= g_k              (a unit appears once per GPU)

where a tensor-parallel use of k GPUs counts k whole GPUs. Objective: sum_k
on_cost_k g_k + sum_i (op_fixed_i n_i + op_cost_i r_i). A plan gives a point:
n_i its placements of op i in pool k that carry a rate > 0 (a TP group counts
once), r_i their rates, g_k its GPUs on in the pool. Its objective is exactly the
plan's: each such placement pays its power line, op_fixed plus op_cost per req/s,
and a placement without rate pays nothing (it is left out of n, which only frees
room). The power cap holds on the worst-case draw, each placement at its steady
power at capacity (peak_i, W, whole TP group: a constant per placement whatever
its rate), so each GPU's on-power plus its placements' peaks (TP: / k each of k
GPUs) is within its cap, and so is the sum over a pool. Every plan of the
configuration formulation satisfies these rows (each GPU satisfies them, so
their sums do); dropped are which GPU holds which use (the bin packing), node
power budgets, TP groups within one node, MIG layouts and migration costs (this
bound is only used without them: ``applies``). A unit's rate comes in whole uses
(r_i <= cap_i n_i, n integer in every cover), so every unit pays at least the
fixed parts of the fewest placements that can carry its rate.

Bound. Dualise the pool rows with y >= 0: the problem splits into one covering
problem per unit (``formulations.serving.unit_bound.UnitCover``; a use's fixed
cost is op_fixed plus its pool's prices times its share, threshold, memory, peak
power and unit row, its cost per request/s op_cost) plus the pools' GPUs, whose reduced
on-cost times their count is taken at 0 or at the class size, whichever is lower.
For every y >= 0 that sum, less the count prices times the class sizes, is a
valid lower bound on the integer optimum (each cover bounded from below by HiGHS'
proven bound). The unit bound is much like this at one share charge (alpha) for
all pools (with the configuration LP's count and budget prices);
here y is improved by Dantzig-Wolfe column generation over per-unit covers, with
the master LP's duals smoothed towards the best y so far (Wentges), so every
pool gets its own prices. On fleet-64 (16 units, 16 pools) it gives 7,739.4 W
(converged in 39 rounds) against the unit bound's 7,736.1 W; the relaxation's
integer optimum (``pool_milp``) is 7,746.8 W, and packed GPU by GPU it is a plan
of that value: the problem's optimum.
Values in the instance's objective units (W for power).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linprog
from scipy.sparse import csc_matrix

from energyopt.backends.highs import solve_mip
from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.costs import Costs
from energyopt.families.serving.formulations.unit_bound import (
    UnitCover,
    cover_lp,
    threshold_charge,
    undominated_index,
)
from energyopt.perf.oppoints import OpTable

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

MAX_UNITS = 32
"""Above this many units the bound is not tried (one row per unit and pool)."""
MAX_ROUNDS = 60
"""Column generation rounds (the effort limit; fleet-64 converges in 39)."""
SMOOTHING = 0.6
"""Weight of the best prices so far in the prices each round is priced at."""
COVER_REL_GAP = 1e-7
"""Relative gap HiGHS closes on a unit's covering problem."""
COVER_TIME_S = 5.0
"""Time limit of one covering problem (s); its proven bound stays valid when hit."""
CONVERGED = 1e-7
"""Relative distance between the master LP and the best bound that ends the search."""
START_MIXES = (0.0, 0.25, 0.5, 0.75, 1.0)
"""Share-charge mixes (``unit_bound.share_weight``) whose prices seed the search."""


@dataclass(frozen=True)
class Pools:
    """The relaxation's data: placements (an op in a class) and pools (class, clock)."""

    units: int
    rate: FloatArray  # per unit, req/s
    op: IntArray  # per placement: its op in the table
    unit: IntArray  # per placement
    pool: IntArray  # per placement
    share: FloatArray  # share units (TP: tp * capacity)
    thr: FloatArray
    mem: FloatArray  # GB at capacity
    once: FloatArray  # 1 where the unit-once-per-GPU row counts the use
    cap: FloatArray  # req/s per use
    peak: FloatArray  # W per use: worst-case draw (steady power at capacity), whole TP group
    op_fixed: FloatArray  # objective units per use carrying rate (its decode loop's power)
    op_cost: FloatArray  # objective units per req/s
    pool_class: IntArray  # per pool
    pool_share: FloatArray  # share units per GPU
    pool_mem: FloatArray  # usable GB per GPU
    pool_room_w: FloatArray  # power cap - on-power per GPU, W
    pool_on_cost: FloatArray
    class_size: IntArray

    @property
    def n_pools(self) -> int:
        return int(self.pool_class.shape[0])

    @property
    def n_rows(self) -> int:
        """Master rows: convexity per unit, 4 per pool, unit-once per (unit, pool),
        count per class."""
        return self.units + 4 * self.n_pools + self.units * self.n_pools + len(self.class_size)


def applies(problem: Problem, table: OpTable, costs: Costs) -> bool:
    """Whether the bound is valid and affordable here: no migration cost in the
    objective, no GPU with a current state, at most MAX_UNITS units."""
    return (
        costs.migration_penalty == 0
        and all(g.state is None for g in problem.gpus)
        and 0 < len(table.units) <= MAX_UNITS
    )


def build_pools(problem: Problem, table: OpTable, costs: Costs, classes: list[GpuClass]) -> Pools:
    """Placements and pools of the relaxation (module docstring)."""
    opts = problem.instance.options
    mig = opts.sharing.mode == "mig"
    keys: dict[tuple[int, int], int] = {}
    rows: list[tuple[int, int, int]] = []  # (op, class, pool)
    for o in range(len(table)):
        type_name = table.type_names[int(table.gpu_type[o])]
        for cls in classes:
            if cls.type_name != type_name or int(table.tp[o]) > cls.size:
                continue
            key = (cls.index, int(table.clock_mhz[o]))
            rows.append((o, cls.index, keys.setdefault(key, len(keys))))
    ops = np.asarray([r[0] for r in rows], dtype=np.int64)
    pool = np.asarray([r[2] for r in rows], dtype=np.int64)
    cls_of = [classes[r[1]] for r in rows]
    capacity = np.asarray(
        [table.share_capacity[c.type_name] for c in cls_of], dtype=np.float64
    ).reshape(-1)
    tp = table.tp[ops].astype(np.float64)
    frac = table.share[ops] / np.maximum(capacity, 1.0)
    thr = threshold_charge(frac)
    whole = tp > 1
    pool_keys = sorted(keys, key=keys.__getitem__)
    pool_class = np.asarray([c for c, _ in pool_keys], dtype=np.int64)
    pool_type = [classes[c].type_name for c, _ in pool_keys]
    return Pools(
        units=len(table.units),
        rate=np.asarray([u.rate_rps for u in table.units], dtype=np.float64),
        op=ops,
        unit=table.unit[ops].astype(np.int64),
        pool=pool,
        share=np.where(whole, tp * capacity, table.share[ops].astype(np.float64)),
        thr=np.where(whole, tp, thr),
        mem=np.where(whole | mig, 0.0, table.memory_gb[ops]),
        once=np.where(whole, 0.0, 1.0),
        cap=np.asarray(table.capacity_rps[ops], dtype=np.float64),
        peak=np.asarray(table.peak_power_w[ops], dtype=np.float64),
        op_fixed=np.asarray(costs.op_fixed[ops], dtype=np.float64),
        op_cost=np.asarray(costs.op_cost[ops], dtype=np.float64),
        pool_class=pool_class,
        pool_share=np.asarray([table.share_capacity[t] for t in pool_type], dtype=np.float64),
        pool_mem=np.asarray(
            [
                problem.gpu_type(t).memory_gb * (1.0 - opts.memory_reserve_fraction)
                for t in pool_type
            ],
            dtype=np.float64,
        ),
        pool_room_w=np.asarray(
            [
                classes[c].power_cap_w - table.on_power[(classes[c].type_name, f)]
                for c, f in pool_keys
            ],
            dtype=np.float64,
        ),
        pool_on_cost=np.asarray(
            [costs.on_cost[(classes[c].type_name, f)] for c, f in pool_keys], dtype=np.float64
        ),
        class_size=np.asarray([c.size for c in classes], dtype=np.int64),
    )


@dataclass(frozen=True)
class Cover:
    """One unit's cover at some prices: its proven lower bound and a solution (uses
    and rates per placement of the unit), or no solution."""

    bound: float
    uses: FloatArray | None
    rates: FloatArray | None


class _Prices:
    """Views of a dual vector y over the master rows (the pool and count parts,
    >= 0; the convexity part, free, is not needed to evaluate a bound)."""

    def __init__(self, p: Pools, y: FloatArray) -> None:
        u, k = p.units, p.n_pools
        self.share = y[u : u + k]
        self.thr = y[u + k : u + 2 * k]
        self.mem = y[u + 2 * k : u + 3 * k]
        self.power = y[u + 3 * k : u + 4 * k]
        self.once = y[u + 4 * k : u + 4 * k + u * k].reshape(u, k)
        self.count = y[u + 4 * k + u * k :]


def use_cost(p: Pools, y: FloatArray, u: int, members: IntArray) -> FloatArray:
    """Fixed cost per use of unit ``u``'s placements ``members`` at prices ``y``
    (objective units): its op's fixed part plus its pool rows' prices times what the
    use takes of them."""
    q = _Prices(p, y)
    k = p.pool[members]
    return np.asarray(
        p.op_fixed[members]
        + q.share[k] * p.share[members]
        + q.thr[k] * p.thr[members]
        + q.mem[k] * p.mem[members]
        + q.power[k] * p.peak[members]
        + q.once[u, k] * p.once[members],
        dtype=np.float64,
    )


def price_unit(p: Pools, y: FloatArray, u: int, members: IntArray) -> Cover:
    """Unit ``u``'s covering problem at prices ``y`` (``members``: its placements)."""
    fixed = use_cost(p, y, u, members)
    per_rps = p.op_cost[members]
    cap = p.cap[members]
    if p.rate[u] <= 0:
        zero = np.zeros(len(members))
        return Cover(0.0, zero, zero)
    keep = undominated_index(fixed, per_rps, cap)
    run = solve_mip(
        cover_lp(UnitCover(float(p.rate[u]), fixed[keep], per_rps[keep], cap[keep])),
        time_limit_s=COVER_TIME_S,
        rel_gap=COVER_REL_GAP,
    )
    bound = min(run.objective, run.dual_bound) if run.optimal else run.dual_bound
    if not math.isfinite(bound):
        bound = -math.inf
    if run.col_value is None:
        return Cover(bound, None, None)
    m = len(keep)
    uses = np.zeros(len(members))
    rates = np.zeros(len(members))
    uses[keep] = np.round(run.col_value[:m])
    rates[keep] = np.maximum(0.0, run.col_value[m : 2 * m])
    return Cover(bound, uses, rates)


def seed_prices(p: Pools, alpha: float) -> FloatArray:
    """Prices over the master rows that charge each pool's on-cost to its uses as
    the unit bound does at share-charge mix ``alpha`` (``unit_bound.share_weight``):
    ``alpha`` of it by SM share, the rest by the threshold charge; every other price
    zero, so each pool GPU's reduced on-cost is zero."""
    u_n, k_n = p.units, p.n_pools
    y = np.zeros(p.n_rows)
    y[u_n : u_n + k_n] = alpha * p.pool_on_cost / p.pool_share
    y[u_n + k_n : u_n + 2 * k_n] = (1.0 - alpha) * p.pool_on_cost
    return y


def lagrangian_value(p: Pools, y: FloatArray, covers: list[Cover]) -> float:
    """The bound at prices ``y`` given each unit's cover bound there (module docstring)."""
    q = _Prices(p, y)
    reduced = (
        p.pool_on_cost
        - q.share * p.pool_share
        - q.thr
        - q.mem * p.pool_mem
        - q.power * p.pool_room_w
        - q.once.sum(axis=0)
        + q.count[p.pool_class]
    )
    pools = float(np.sum(np.minimum(0.0, reduced) * p.class_size[p.pool_class]))
    return sum(c.bound for c in covers) + pools - float(q.count @ p.class_size)


@dataclass(frozen=True)
class PoolBound:
    """The best bound found, the master LP's last value, the rounds it took, and
    whether it converged (no cover prices out at the master's duals; the bound then
    equals the LP unless a unit has no placement, whose cover the LP leaves to an
    artificial column)."""

    bound: float
    lp: float
    rounds: int
    converged: bool


def pool_bound(
    p: Pools,
    *,
    deadline: float,
    max_rounds: int = MAX_ROUNDS,
    trace: Callable[[int, float, float], None] | None = None,
) -> PoolBound:
    """Maximise the Lagrangian bound by column generation over per-unit covers
    (module docstring); stops on convergence, after ``max_rounds`` rounds, or
    before a seed or round that would end past ``deadline`` (``time.perf_counter``
    seconds, judged by the last one's time) or once ``deadline`` passes while units
    are priced (that pricing is dropped), with the best bound evaluated (-inf when
    the deadline leaves no time for a seed).
    The first prices are the unit bound's share charges (START_MIXES). ``trace``
    hears (round, best bound, master LP value) after every round."""
    u_n, k_n = p.units, p.n_pools
    members = [np.flatnonzero(p.unit == u) for u in range(u_n)]
    col_cost: list[float] = []
    col_rows: list[IntArray] = []
    col_vals: list[FloatArray] = []

    def add(u: int, cover: Cover) -> None:
        assert cover.uses is not None and cover.rates is not None
        idx = members[u]
        k = p.pool[idx]
        n, r = cover.uses, cover.rates
        rows = [np.asarray([u])]
        vals = [np.asarray([1.0])]
        for offset, coef in (
            (u_n, p.share[idx] * n),
            (u_n + k_n, p.thr[idx] * n),
            (u_n + 2 * k_n, p.mem[idx] * n),
            (u_n + 3 * k_n, p.peak[idx] * n),
            (u_n + 4 * k_n + u * k_n, p.once[idx] * n),
        ):
            rows.append(offset + k)
            vals.append(coef)
        col_cost.append(float(p.op_fixed[idx] @ n + p.op_cost[idx] @ r))
        col_rows.append(np.concatenate(rows).astype(np.int64))
        col_vals.append(np.concatenate(vals))

    def evaluate(y: FloatArray) -> tuple[float, list[Cover]] | None:
        """The Lagrangian value at ``y`` and its covers; None when ``deadline`` passes
        before every unit is priced (a partial pricing bounds nothing)."""
        covers: list[Cover] = []
        for u in range(u_n):
            if time.perf_counter() >= deadline:
                return None
            covers.append(price_unit(p, y, u, members[u]))
        return lagrangian_value(p, y, covers), covers

    # Seed with the unit bound's share charges: every mix in START_MIXES gives a
    # bound and its covers as columns. The smoothing centre starts at the master's
    # own duals (centred on a seed, the first rounds only repeat its covers).
    best = -math.inf
    seed_s = 0.0
    for alpha in START_MIXES:
        if time.perf_counter() + seed_s >= deadline:
            break
        started = time.perf_counter()
        seeded = evaluate(seed_prices(p, alpha))
        if seeded is None:
            break
        value, covers = seeded
        best = max(best, value)
        for u, c in enumerate(covers):
            if c.uses is not None:
                add(u, c)
        seed_s = time.perf_counter() - started
    if not math.isfinite(best):
        return PoolBound(best, math.inf, 0, False)
    # Pool GPU columns and their fixed rows; an artificial per unit keeps the master
    # feasible whatever the columns (its cost exceeds any plan's).
    pool_rows: list[IntArray] = []
    pool_vals: list[FloatArray] = []
    for k in range(k_n):
        at = [u_n + k, u_n + k_n + k, u_n + 2 * k_n + k, u_n + 3 * k_n + k]
        coef = [-p.pool_share[k], -1.0, -p.pool_mem[k], -p.pool_room_w[k]]
        at += [u_n + 4 * k_n + u * k_n + k for u in range(u_n)]
        coef += [-1.0] * u_n
        at.append(u_n + 4 * k_n + u_n * k_n + int(p.pool_class[k]))
        coef.append(1.0)
        pool_rows.append(np.asarray(at, dtype=np.int64))
        pool_vals.append(np.asarray(coef, dtype=np.float64))
    big = 10.0 * (
        float(p.pool_on_cost.max(initial=0.0) * p.class_size.sum())
        + float(p.op_cost.max(initial=0.0) * p.rate.sum())
        + float(p.op_fixed.max(initial=0.0) * p.class_size.sum() * max(1, u_n))
        + 1.0
    )
    b_ub = np.concatenate([np.zeros(4 * k_n + u_n * k_n), p.class_size.astype(np.float64)])
    lp_value = math.inf
    rounds = 0
    centre: FloatArray | None = None
    centre_value = -math.inf
    converged = False
    last_round_s = 0.0
    while rounds < max_rounds and time.perf_counter() + last_round_s < deadline:
        started = time.perf_counter()
        rounds += 1
        n_cols = len(col_cost)
        cost = np.concatenate([col_cost, p.pool_on_cost, np.full(u_n, big)])
        col_at = col_rows + pool_rows + [np.asarray([u], dtype=np.int64) for u in range(u_n)]
        col_coef = col_vals + pool_vals + [np.ones(1) for _ in range(u_n)]
        ptr = np.cumsum([0] + [len(r) for r in col_at])
        a = csc_matrix(
            (np.concatenate(col_coef), np.concatenate(col_at), ptr),
            shape=(p.n_rows, n_cols + k_n + u_n),
        ).tocsr()
        res = linprog(
            cost,
            A_ub=a[u_n:],
            b_ub=b_ub,
            A_eq=a[:u_n],
            b_eq=np.ones(u_n),
            bounds=(0, None),
            method="highs",
        )
        if res.status != 0:
            break
        lp_value = float(res.fun)
        y_lp = np.concatenate([res.eqlin.marginals, -res.ineqlin.marginals])
        if lp_value - best <= CONVERGED * max(1.0, abs(lp_value)):
            converged = True
            break
        added = 0
        # Priced at the smoothed prices first; at the master's own duals only when
        # those give no column (pricing there alone stalls on degenerate duals).
        tries = [y_lp] if centre is None else [SMOOTHING * centre + (1.0 - SMOOTHING) * y_lp, y_lp]
        cut = False
        for y in tries:
            priced = evaluate(y)
            if priced is None:
                cut = True
                break
            value, covers = priced
            best = max(best, value)
            if value > centre_value:
                centre, centre_value = y, value
            for u, c in enumerate(covers):
                if c.uses is not None and c.bound - y[u] < -1e-9 * max(1.0, abs(c.bound)):
                    add(u, c)
                    added += 1
            if added:
                break
        if cut:
            break
        if trace is not None:
            trace(rounds, best, lp_value)
        last_round_s = time.perf_counter() - started
        if not added:
            converged = True
            break
    return PoolBound(best, lp_value, rounds, converged)
