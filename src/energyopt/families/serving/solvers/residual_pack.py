"""Residual packing: an integer plan from the configuration master's LP without one
LP re-solve per rounded count (the LP dive's cost at fleet scale).

Rounding the LP's fractional counts up (what the dive ends with) gives each unit a
nearly idle GPU of its own: on fleet-4096 that plan is 11 % above the bound.
Here instead:

1. the LP's tensor-parallel counts are rounded up (a TP group cannot share its
   GPUs), serving at the LP's rates, except that a fractional part of at most
   ``tp_round_up_above`` (TP_ROUND_UP_ABOVE in the configuration solve) is
   rounded down; every other unit's rate, and what the
   groups rounded down no longer serve, is left to cover;
2. each such unit (largest rate first) gets its own cheapest cover by
   single-GPU operating points: n equal uses of one point, or m full uses of one
   and one use of another for the rest. A use is charged w(share) x (the GPU's
   on-cost at its clock + a price per GPU of its type), w(s) = s / capacity up
   to half the GPU and 1 above (a use of more than half a GPU leaves room only
   for uses of under half, which pack among themselves anyway), plus the op's
   fixed cost per placement (its decode loop's power, paid whatever the rate)
   and its cost per req/s: a unit is covered by as few, as full uses as pay
   off; only GPU types with GPUs free are offered;
3. the uses are packed first-fit decreasing, per (GPU type, clock), into shared
   configurations (share, memory and the GPU power cap on the worst-case draw
   respected: on-power plus each use's steady power at capacity; one op per
   unit) placed on the classes with GPUs free; a type whose configurations
   overflow it keeps that many GPUs back on the next try;
4. the least-filled bins are emptied into bins of other clocks where that saves
   more on-cost than the moved pieces cost more (``_consolidate``: first fit packs
   each clock apart, so the partial use of a cover at a clock of its own would
   keep a GPU on alone; on fleet-64 this takes the plan from 4.8 % to 3.9 % above
   the bound, on fleet-256 from 3.4 % to 3.2 %);
5. steps 2-4 run with GPU prices times each of PRICE_SCALES, and the cheapest
   packing is kept; the prices are the LP's, raised for a type the covers would
   overrun to where they fit its free GPUs, and then tried at CLEARED_SCALES
   only (``_clearing_prices``: on fleet-4096 the LP prices every type at 0,
   the covers wanted 1,264 of the 1,212 H100s left free by the TP groups, and
   the plan went from 10.8 % to 2.8 % above the bound);
6. one LP over the columns in use, every count fixed, routes the demand (so
   rates and budgets hold exactly) and gives the plan's objective.

Pricing each placement's fixed part in the covers matters: without it the covers
split units into many light placements, each paying its decode loop's power in
the plan (fleet-64: 11.4 % above the bound instead of 3.9 %; fleet-256: 11.9 %
instead of 3.2 %).

It returns None when no packing fits or that LP cannot serve every rate (a
budget the packing broke); the caller keeps its other heuristics. Objective
values are the instance's objective units (W for power), rates req/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.formulations.columns import (
    Column,
    ColumnKey,
    kept_units,
    shared_column,
)
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.families.serving.solvers.restricted_master import column_offsets
from energyopt.formulations.errors import BackendFailure
from energyopt.perf.oppoints import OpTable

RESIDUAL_TOL = 1e-6
"""Residual demand below this (req/s) counts as served."""


@dataclass
class Bin:
    """One shared configuration being filled: share units and memory (GB) used,
    worst-case draw (W: on-power plus each op's steady power at capacity), and
    its ops."""

    share: int
    memory_gb: float
    power_w: float
    ops: list[int] = field(default_factory=list)
    units: set[int] = field(default_factory=set)
    rates: list[float] = field(default_factory=list)  # req/s per op, as ``ops``

    def add(self, table: OpTable, op: int, rate: float) -> None:
        """Place op ``op`` at ``rate`` req/s (its worst-case draw counted)."""
        self.share += int(table.share[op])
        self.memory_gb += float(table.memory_gb[op])
        self.power_w += float(table.peak_power_w[op])
        self.ops.append(op)
        self.units.add(int(table.unit[op]))
        self.rates.append(rate)

    def fits(
        self, table: OpTable, op: int, share_capacity: int, memory_gb: float, power_cap_w: float
    ) -> bool:
        """Whether op ``op`` fits: share, memory (GB), worst-case draw within the power
        cap (W), and its unit not here yet."""
        return (
            int(table.unit[op]) not in self.units
            and self.share + int(table.share[op]) <= share_capacity
            and self.memory_gb + float(table.memory_gb[op]) <= memory_gb + 1e-9
            and self.power_w + float(table.peak_power_w[op]) <= power_cap_w + 1e-9
        )


PRICE_SCALES = (1.0, 1.1, 1.25, 1.5, 2.0)
"""Multiples of the LP's GPU prices the covers are tried at (the cheapest packing
is kept). At the LP's own price a scarce type ties with the next one for many
units and runs out early: on fleet-4096 the packing cost 2.3 % above the bound
at the LP's price of an H100 (37 W) and 1.1 % at 1.25 times it; on fleet-10240
4.1 % and 1.2 % at 1.1 times it (measured when power was priced per request
only)."""
CLEARED_SCALES = (1.0, 1.1)
"""The scales tried where ``_clearing_prices`` raised a price: the type then just
fits, and dearer prices only push more units off it. Packing costs at the
clearing prices times 1 / 1.1 / 1.25 / 1.5 / 2: fleet-4096 409,685 / 408,161 /
409,406 / 413,457 / 455,253 W; fleet-10240 1,004,141 / 1,003,975 / 1,003,970 /
1,004,085 / 1,004,871 W, where the five packings took 3.5 / 6.2 / 17.8 / 1.6 /
1.7 s (the run overran its 60-s limit by 22 s with all five)."""
MAX_TRIES = 12
"""Packings at most: when a GPU type runs out of free GPUs, the next try keeps that
many more of its GPUs back from the residual choice."""


def residual_pack(
    session: LpSession,
    prog: pat.PatternProgram,
    *,
    tp_round_up_above: float = 0.0,
    deadline: float | None = None,
) -> tuple[float, NDArray[np.float64]] | None:
    """(objective, integer-master values) of a residual-packing plan from the
    session's current LP solution, or None (see the module docstring). The packed
    configurations join ``prog`` as columns (a session that holds a prefix of
    ``prog.columns`` takes them at its next ``add``); the session itself is not
    changed. ``tp_round_up_above``: an LP TP count whose fractional part is at most
    this is rounded down (0: every one up; TP_ROUND_UP_ABOVE is what the
    configuration solve passes). Past ``deadline`` (a ``time.perf_counter`` value)
    no further price scale is tried once one packing is found."""
    base = _kept_counts(session, prog, tp_round_up_above)
    if base is None:
        return None
    counts, residual, free = base
    assert prog.lp is not None
    lp_price = dict.fromkeys(prog.table.type_names, np.inf)
    for c in prog.classes:
        lp_price[c.type_name] = min(lp_price[c.type_name], -float(prog.lp.duals.count[c.index]))
    # A type whose free GPUs the covers would overrun at the LP's prices is priced
    # up to where they fit (``_clearing_prices``); the scales then run from there.
    price = _clearing_prices(prog, residual, free, lp_price)
    raised = any(price[n] > max(0.0, lp_price[n]) for n in price)
    scales = CLEARED_SCALES if raised else PRICE_SCALES
    best: tuple[float, list[Column]] | None = None
    for scale in scales if any(v > 0 for v in price.values()) else (1.0,):
        if best is not None and deadline is not None and time.perf_counter() >= deadline:
            break
        packed = _pack_at({n: scale * v for n, v in price.items()}, prog, residual, free)
        if packed is not None and (best is None or packed[0] < best[0] - 1e-9):
            best = packed
    if best is None:
        return None
    return _route(prog, counts, best[1])


def _pack_at(
    count_price: dict[str, float],
    prog: pat.PatternProgram,
    residual: NDArray[np.float64],
    free: dict[int, int],
) -> tuple[float, list[Column]] | None:
    """(cost, configurations) of covering and packing the residuals with GPUs of each
    type priced at ``count_price`` (objective units per GPU); the cost is the
    configurations' on-cost plus each piece's fixed cost and cost at its rate."""
    # GPUs of each type kept back from the choice: none at first; a type whose
    # bins overflow it keeps back what it was short the next time.
    reserve = dict.fromkeys(prog.table.type_names, 0)
    for _ in range(MAX_TRIES):
        chosen = _choose(prog, residual, free, reserve, count_price)
        if chosen is None:
            return None
        packed = _pack(prog, chosen, dict(free))
        if isinstance(packed[0], list):
            columns, pieces = packed
            costs, table = prog.costs, prog.table
            cost = sum(
                costs.on_cost[(prog.classes[col.cls].type_name, col.clock_mhz)]
                - costs.migration_penalty * kept_units(prog.classes[col.cls], table, col.ops)
                for col in columns
            )
            cost += float(sum(costs.op_fixed[op] + costs.op_cost[op] * rate for op, rate in pieces))
            return cost, columns
        type_name, short = packed
        reserve[type_name] += short
    return None


CLEARING_STEPS = 8
"""Bisection steps of ``_clearing_prices`` per scarce GPU type."""
CLEARING_ROUNDS = 2
"""Passes of ``_clearing_prices`` over the GPU types (pricing one type up moves
covers onto the others)."""


def _type_demand(
    prog: pat.PatternProgram, residual: NDArray[np.float64], count_price: dict[str, float]
) -> dict[str, float]:
    """GPUs of each type (sum of the cover pieces' shares, in whole GPUs) that the
    covers of ``_choose`` take at ``count_price`` when no type runs out."""
    table = prog.table
    unlimited = {c.index: len(table.units) * 10**6 for c in prog.classes}
    chosen = _choose(prog, residual, unlimited, dict.fromkeys(table.type_names, 0), count_price)
    demand = dict.fromkeys(table.type_names, 0.0)
    for op, _ in chosen or []:
        name = table.type_names[int(table.gpu_type[op])]
        demand[name] += float(table.share[op]) / table.share_capacity[name]
    return demand


def _clearing_prices(
    prog: pat.PatternProgram,
    residual: NDArray[np.float64],
    free: dict[int, int],
    start: dict[str, float],
) -> dict[str, float]:
    """Prices per GPU of each type (objective units per GPU), at least ``start``,
    at which the residual covers take no more GPUs of a type than it has free.

    Covers go largest rate first within each type's free GPUs, so at prices that
    leave a type scarce (the LP's, when its count rows do not bind) the last units
    find it full and fall back to another type whatever that costs them. On
    fleet-4096 the LP prices every type at 0 while the covers want 1,264 H100s of
    the 1,212 its TP groups leave free; the small qwen2.5 units came last and were
    served by 14 to 22 A100s each at 630 MHz (up to 3.5 times their cheapest
    cover), and the plan was 10.8 % above the bound. Priced so that the H100s
    just suffice, the units that lose least by leaving them do (the plan: 2.8 %
    above the bound).

    Per scarce type: a bisection (CLEARING_STEPS) between its price and an upper
    end, doubled from the dearest on-cost until the covers fit; CLEARING_ROUNDS
    passes over the types, since pricing one type up moves covers onto the
    others. A type that no price tried clears (every unit needs it) keeps the
    last upper end: the packing's reserve handles the rest."""
    table, costs = prog.table, prog.costs
    room = dict.fromkeys(table.type_names, 0.0)
    for c in prog.classes:
        room[c.type_name] += free[c.index]
    price = {n: max(0.0, v) for n, v in start.items()}
    top = max(costs.on_cost.values())
    for _ in range(CLEARING_ROUNDS):
        changed = False
        for name in table.type_names:
            if _type_demand(prog, residual, price)[name] <= room[name] + 1e-9:
                continue
            lo, hi = price[name], max(price[name], top)
            for _ in range(CLEARING_STEPS):
                if _type_demand(prog, residual, {**price, name: hi})[name] <= room[name] + 1e-9:
                    break
                lo, hi = hi, 2.0 * hi
            for _ in range(CLEARING_STEPS):
                mid = 0.5 * (lo + hi)
                if _type_demand(prog, residual, {**price, name: mid})[name] <= room[name] + 1e-9:
                    hi = mid
                else:
                    lo = mid
            price[name] = hi
            changed = True
        if not changed:
            break
    return price


TP_ROUND_UP_ABOVE = 0.3
"""In the configuration solve (``configurations.solve_configurations``) a TP count
of the LP is rounded up only where its fractional part exceeds this; at or below
it the count is rounded down and the rest of the unit's rate joins the covers
(where the unit has a single-GPU operating point). An extra group for a fraction
of 0.3 leaves 70 % of its GPUs idle. Plans from the root (residual packing alone;
rounded up always / at 0.3 / at 0.5): fleet-64 8,053.4 / 7,896.4 / 7,896.4 W,
fleet-256 29,262.0 / 28,987.2 / 29,154.9 W, fleet-1024 113,088.1 / 112,890.8 /
113,254.1 W, fleet-4096 454,230.5 / 451,040.8 / 452,549.3 W. Branch-and-price
keeps rounding every count up (the default of ``residual_pack``): on fleet-64
its better root plan gave its clock-pool MILP a tighter cut-off (7,839.3 W
instead of 7,972.7 W), which HiGHS did not finish in the 30 s left, where it
proved 7,746.8 W optimal in 16 s before; the run ended 0.90 % above its bound
instead of optimal."""


def _kept_counts(
    session: LpSession, prog: pat.PatternProgram, round_up_above: float = 0.0
) -> tuple[NDArray[np.float64], NDArray[np.float64], dict[int, int]] | None:
    """(kept count per column, residual req/s per unit, free GPUs per class): the
    LP's tensor-parallel columns rounded up (down where the fractional part is at
    most ``round_up_above`` and the unit has a single-GPU operating point), each
    serving at most the LP's rate (a TP group cannot share its GPUs); every
    shared column at 0. None when that overfills a class."""
    table, mp = prog.table, session.mp
    lp = session.solve()
    z_idx = np.asarray(mp.z_var, dtype=np.int64)
    z = lp.x[z_idx]
    counts = np.zeros(z.size)
    residual = np.array([u.rate_rps for u in table.units], dtype=np.float64)
    used = np.zeros(len(prog.classes), dtype=np.int64)
    single = np.zeros(len(table.units), dtype=bool)
    single[np.asarray(table.unit)[np.asarray(table.tp) == 1]] = True
    for j, col in enumerate(prog.columns[: len(z_idx)]):
        if z[j] <= 1e-9 or col.gpus_per_use == 1:
            continue
        whole = np.floor(z[j] + 1e-9)
        splits = all(single[int(table.unit[op])] for op in col.ops)
        if splits and z[j] - whole <= round_up_above:
            counts[j] = whole
        else:
            counts[j] = np.ceil(z[j] - 1e-9)
        used[col.cls] += int(counts[j]) * col.gpus_per_use
        for op, r, cap in zip(col.ops, mp.r_vars[j], col.capacity, strict=True):
            residual[int(table.unit[op])] -= min(float(lp.x[r]), counts[j] * cap)
    free = {c.index: c.size - int(used[c.index]) for c in prog.classes}
    if any(v < 0 for v in free.values()):
        return None
    return counts, np.maximum(residual, 0.0), free


PAIR_KEY = 1 << 24
"""Key of a (GPU type index, clock MHz) pair in ``_choose``: type x PAIR_KEY + clock
(clocks are far below it)."""


def _choose(
    prog: pat.PatternProgram,
    residual: NDArray[np.float64],
    free: dict[int, int],
    reserve: dict[str, int],
    count_price: dict[str, float],
) -> list[tuple[int, float]] | None:
    """(op, req/s) pieces that cover each unit's residual: per unit (largest rate
    first) the cheapest cover of the form m full uses of one single-GPU point plus
    one partial use of another (or n equal uses of one), each use charged its share
    of the GPU's on-cost and of ``count_price`` (the LP's price of a GPU of the
    type, objective units per GPU) plus its op's fixed cost per placement, within
    each type's free GPUs less ``reserve``."""
    table, costs = prog.table, prog.costs
    room: dict[str, float] = dict.fromkeys(table.type_names, 0.0)
    for c in prog.classes:
        room[c.type_name] += free[c.index]
    for name in room:
        room[name] = max(0.0, room[name] - reserve[name])
    type_cap = np.array([table.share_capacity[n] for n in table.type_names], dtype=np.float64)
    share_frac = table.share / type_cap[table.gpu_type]
    # The (type, clock) pairs by one integer key (a sort of 1-D keys: the 2-D
    # ``np.unique(axis=1)`` took 1.3 s a call on the million ops of fleet-102400).
    key = table.gpu_type.astype(np.int64) * PAIR_KEY + table.clock_mhz.astype(np.int64)
    pairs, at = np.unique(key, return_inverse=True)
    pair_cost = np.array(
        [
            costs.on_cost[(table.type_names[int(k // PAIR_KEY)], int(k % PAIR_KEY))]
            + count_price[table.type_names[int(k // PAIR_KEY)]]
            for k in pairs.tolist()
        ]
    )
    gpu_cost = pair_cost[np.asarray(at).reshape(-1)]
    # A piece of more than half a GPU leaves room only for pieces of under half,
    # which pack among themselves anyway: charge it the whole GPU.
    fixed_all = np.where(share_frac <= 0.5 + 1e-9, share_frac, 1.0) * gpu_cost
    fixed_all = fixed_all + np.asarray(costs.op_fixed, dtype=np.float64)
    tp1 = table.tp == 1
    order = np.argsort(-residual, kind="stable")
    live = order[residual[order] > RESIDUAL_TOL].tolist()
    unit_ops = {u: _single_ops(table, u, tp1) for u in live}
    # Every unit's cover over all of its single-GPU ops, in one pass: the walk
    # below takes it wherever its types have room for it, and covers a unit on
    # its own (as before) only where a type is short.
    covers = _covers(
        [float(residual[u]) for u in live],
        [unit_ops[u] for u in live],
        table.capacity_rps,
        fixed_all,
        np.asarray(costs.op_cost, dtype=np.float64),
    )
    type_of = [table.type_names[t] for t in range(len(table.type_names))]
    top_frac = float(share_frac.max())
    chosen: list[tuple[int, float]] = []
    for u, pieces in zip(live, covers, strict=True):
        rate = float(residual[u])
        ops = unit_ops[u]
        need: dict[int, float] = {}
        for op, _ in pieces:
            t = int(table.gpu_type[op])
            need[t] = need.get(t, 0.0) + float(share_frac[op])
        if ops.size == 0:
            return None
        # Whether every op passes the room filter below (a share is at most 1 GPU).
        whole = min(room.values()) + 1e-9 >= top_frac or all(
            float(share_frac[ops[table.gpu_type[ops] == t]].max()) <= room[type_of[t]] + 1e-9
            for t in np.unique(table.gpu_type[ops]).tolist()
        )
        if not whole or any(v > room[type_of[t]] + 1e-9 for t, v in need.items()):
            left = np.array([room[type_of[t]] for t in table.gpu_type[ops]])
            ops = ops[share_frac[ops] <= left + 1e-9]
            while True:
                if ops.size == 0:
                    return None
                pieces = _cover(
                    rate, ops, table.capacity_rps[ops], fixed_all[ops], costs.op_cost[ops]
                )
                need = {}
                for op, _ in pieces:
                    t = int(table.gpu_type[op])
                    need[t] = need.get(t, 0.0) + float(share_frac[op])
                short = [t for t, v in need.items() if v > room[type_of[t]] + 1e-9]
                if not short:
                    break
                # The cover needs more of a type than is left: cover without it.
                ops = ops[~np.isin(table.gpu_type[ops], short)]
        for t, v in need.items():
            room[type_of[t]] -= v
        chosen.extend(pieces)
    return chosen


def _single_ops(table: OpTable, u: int, tp1: NDArray[np.bool_]) -> NDArray[np.int64]:
    """Unit ``u``'s single-GPU ops, ascending."""
    ops = table.ops_of(u)
    return ops[tp1[ops]]


COVER_CHUNK = 128
"""Units whose covers ``_covers`` finds in one array pass (memory: about 20 array
copies of COVER_CHUNK x ops-per-unit squared floats)."""


def _covers(
    rates: list[float],
    unit_ops: list[NDArray[np.int64]],
    cap_all: NDArray[np.float64],
    fixed_all: NDArray[np.float64],
    per_rps_all: NDArray[np.float64],
) -> list[list[tuple[int, float]]]:
    """``_cover`` of each unit (``rates[k]`` req/s over ops ``unit_ops[k]``, indices
    into the per-op ``cap_all``, ``fixed_all`` and ``per_rps_all``), the same pieces
    as one call per unit: units with as many ops are stacked and each array step of
    ``_cover`` is taken for all of them at once (the same floating-point operations
    element by element, the same first-minimum choices)."""
    out: list[list[tuple[int, float]]] = [[] for _ in rates]
    by_size: dict[int, list[int]] = {}
    for k, ops in enumerate(unit_ops):
        by_size.setdefault(int(ops.size), []).append(k)
    for size, members in by_size.items():
        if size == 0:
            continue
        for lo in range(0, len(members), COVER_CHUNK):
            part = members[lo : lo + COVER_CHUNK]
            idx = np.stack([unit_ops[k] for k in part])
            rate = np.array([rates[k] for k in part], dtype=np.float64)[:, None]
            cap, fixed, per_rps = cap_all[idx], fixed_all[idx], per_rps_all[idx]
            n_eq = np.ceil(rate / cap - 1e-9)
            cost_eq = n_eq * fixed + per_rps * rate
            m = np.floor(rate / cap + 1e-9)
            rest = rate - m * cap
            full = m * (fixed + per_rps * cap)
            fits = cap[:, None, :] >= rest[:, :, None] - RESIDUAL_TOL
            mixed = full[:, :, None] + np.where(
                rest[:, :, None] > RESIDUAL_TOL,
                fixed[:, None, :] + per_rps[:, None, :] * rest[:, :, None],
                0.0,
            )
            mixed = np.where(fits, mixed, np.inf).reshape(len(part), size * size)
            flat = np.argmin(mixed, axis=1)
            best_mixed = mixed[np.arange(len(part)), flat]
            ks = np.argmin(cost_eq, axis=1)
            for row, k in enumerate(part):
                ops = unit_ops[k]
                e = int(ks[row])
                if cost_eq[row, e] <= best_mixed[row]:
                    n = int(n_eq[row, e])
                    out[k] = [(int(ops[e]), rates[k] / n)] * n
                    continue
                i, j = divmod(int(flat[row]), size)
                pieces = [(int(ops[i]), float(cap[row, i]))] * int(m[row, i])
                if rest[row, i] > RESIDUAL_TOL:
                    pieces.append((int(ops[j]), float(rest[row, i])))
                out[k] = pieces
    return out


def _cover(
    rate: float,
    ops: NDArray[np.int64],
    cap: NDArray[np.float64],
    fixed: NDArray[np.float64],
    per_rps: NDArray[np.float64],
) -> list[tuple[int, float]]:
    """The cheapest cover of ``rate`` req/s among: n equal uses of one point (n =
    ceil(rate / cap)), or m = floor(rate / cap_i) full uses of point i and one use
    of point j (cap_j at least what is left) for the rest. Costs per use ``fixed``
    and per req/s ``per_rps``; returns (op, req/s) per use."""
    n_eq = np.ceil(rate / cap - 1e-9)
    cost_eq = n_eq * fixed + per_rps * rate
    m = np.floor(rate / cap + 1e-9)
    rest = rate - m * cap
    full = m * (fixed + per_rps * cap)
    fits = cap[None, :] >= rest[:, None] - RESIDUAL_TOL
    mixed = full[:, None] + np.where(
        rest[:, None] > RESIDUAL_TOL, fixed[None, :] + per_rps[None, :] * rest[:, None], 0.0
    )
    mixed = np.where(fits, mixed, np.inf)
    i, j = np.unravel_index(int(np.argmin(mixed)), mixed.shape)
    k = int(np.argmin(cost_eq))
    if cost_eq[k] <= mixed[i, j]:
        n = int(n_eq[k])
        return [(int(ops[k]), rate / n)] * n
    pieces = [(int(ops[i]), float(cap[i]))] * int(m[i])
    if rest[i] > RESIDUAL_TOL:
        pieces.append((int(ops[j]), float(rest[i])))
    return pieces


def _pack(
    prog: pat.PatternProgram, chosen: list[tuple[int, float]], free: dict[int, int]
) -> tuple[list[Column], list[tuple[int, float]]] | tuple[str, int]:
    """(shared configurations, the (op, req/s) pieces they hold) for ``chosen``,
    packed and consolidated (``_consolidate``), placed on classes with free GPUs; or
    (GPU type, GPUs short) when a type has too few free GPUs for its bins."""
    table, costs = prog.table, prog.costs
    groups: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for op, rate in chosen:
        groups.setdefault((int(table.gpu_type[op]), int(table.clock_mhz[op])), []).append(
            (op, rate)
        )
    limits = {t: _limits(prog, t) for t, _ in groups}
    bins: list[tuple[int, int, Bin]] = []
    for (t, clock), items in sorted(groups.items()):
        share_capacity, usable, power_cap = limits[t]
        on_w = table.on_power[(table.type_names[t], clock)]
        packed = _first_fit(table, items, share_capacity, usable, power_cap, on_w)
        bins.extend((t, clock, b) for b in packed)
    bins = _consolidate(prog, bins, limits)
    columns: list[Column] = []
    pieces: list[tuple[int, float]] = []
    for i, (t, clock, b) in enumerate(bins):
        type_name = table.type_names[t]
        classes = [c for c in prog.classes if c.type_name == type_name]
        cls = next((c for c in classes if free[c.index] > 0), None)
        if cls is None:
            return type_name, sum(1 for tb, _, _ in bins[i:] if tb == t)
        free[cls.index] -= 1
        columns.append(shared_column(cls, table, costs, clock, tuple(sorted(b.ops))))
        pieces.extend(zip(b.ops, b.rates, strict=True))
    return columns, pieces


def _limits(prog: pat.PatternProgram, t: int) -> tuple[int, float, float]:
    """(share units, usable memory GB, power cap W) of one GPU of type index ``t``;
    the cap is the least of its classes' caps (a bin may land on any of them)."""
    type_name = prog.table.type_names[t]
    problem = prog.problem
    usable = problem.gpu_type(type_name).memory_gb * (
        1.0 - problem.instance.options.memory_reserve_fraction
    )
    power_cap = min(c.power_cap_w for c in prog.classes if c.type_name == type_name)
    return prog.table.share_capacity[type_name], usable, power_cap


def _consolidate(
    prog: pat.PatternProgram,
    bins: list[tuple[int, int, Bin]],
    limits: dict[int, tuple[int, float, float]],
) -> list[tuple[int, int, Bin]]:
    """Empty the least-filled bins into the others where that costs less.

    First fit packs each (type, clock) apart, so the partial use of a cover at a
    clock no other use shares keeps a GPU on for itself. Emptiest first, each bin's
    pieces are moved, one by one, to another bin of its type, each served there by
    its unit's single-GPU op at that bin's clock with room for its rate (the one
    cheapest at that rate, its fixed part included) that fits the bin's share,
    memory and worst-case draw. The moves are kept when they all succeed and the
    bin's on-cost saved exceeds what the moved pieces cost more; else undone.
    Sorted by (type, clock), as given."""
    table, costs = prog.table, prog.costs
    by_key: dict[tuple[int, int, int], list[int]] = {}  # (unit, type, clock) -> ops
    for op in np.flatnonzero(table.tp == 1).tolist():
        key = (int(table.unit[op]), int(table.gpu_type[op]), int(table.clock_mhz[op]))
        by_key.setdefault(key, []).append(op)

    def piece_cost(op: int, rate: float) -> float:
        return float(costs.op_fixed[op]) + float(costs.op_cost[op]) * rate

    # Pruning only (the moves tried are the same): a piece needs a bin with share
    # room for its unit's smallest op of the type, and a bin's pieces at least
    # that much room in all of its type's other bins together.
    least: dict[tuple[int, int], int] = {}  # (unit, type) -> least share of its ops
    for (u, t, _), ops in by_key.items():
        small = min(int(table.share[op]) for op in ops)
        least[(u, t)] = min(least.get((u, t), small), small)
    room: dict[int, int] = {}  # share room left in a type's live bins
    # Per (type, clock): the bins with share room at the start, in order (a full
    # bin never gains room: moves only add to bins, and undoing one restores it).
    open_at: dict[tuple[int, int], list[int]] = {}
    for j, (tj, fj, bj) in enumerate(bins):
        room[tj] = room.get(tj, 0) + limits[tj][0] - bj.share
        if bj.share < limits[tj][0]:
            open_at.setdefault((tj, fj), []).append(j)
    state = _BinArrays(bins)
    open_idx = {key: np.asarray(js, dtype=np.int64) for key, js in open_at.items()}
    # (unit, type) -> its single-GPU ops of the type, clock by clock as by_key lists them
    of_unit: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (u, t, f), ops in by_key.items():
        of_unit.setdefault((u, t), []).extend((f, op) for op in ops)
    order = sorted(range(len(bins)), key=lambda i: (bins[i][2].share, i))
    for i in order:
        t, clock, b = bins[i]
        share_capacity = limits[t][0]
        need = sum(least[(int(table.unit[op]), t)] for op in b.ops)
        if need > room[t] - (share_capacity - b.share):
            continue
        saved = costs.on_cost[(table.type_names[t], clock)]
        saved += sum(piece_cost(op, r) for op, r in zip(b.ops, b.rates, strict=True))
        added = 0.0
        taken = 0
        undo: list[tuple[int, Bin]] = []  # (bin, its state before the move)
        moved = True
        for op, rate in sorted(
            zip(b.ops, b.rates, strict=True), key=lambda it: -int(table.share[it[0]])
        ):
            u = int(table.unit[op])
            best = _cheapest_move(
                table,
                bins,
                state,
                open_idx,
                of_unit[(u, t)],
                i,
                rate,
                least[(u, t)],
                limits[t],
                piece_cost,
            )
            if best is None:
                moved = False
                break
            target = bins[best[1]][2]
            undo.append((best[1], _copy(target)))
            target.add(table, best[2], rate)
            state.sync(best[1], target)
            added += best[0]
            taken += int(table.share[best[2]])
        if moved and added < saved - 1e-9:
            state.alive[i] = False
            room[t] -= share_capacity - b.share + taken
            continue
        for j, before in reversed(undo):
            _restore(bins[j][2], before)
            state.sync(j, bins[j][2])
    return [bins[i] for i in range(len(bins)) if state.alive[i]]


class _BinArrays:
    """The bins' share units, memory (GB) and worst-case draw (W) as arrays, and
    which are live, so that ``_cheapest_move`` tests a piece against every open bin
    of a clock in one array step (the same sums and comparisons as ``Bin.fits``)."""

    def __init__(self, bins: list[tuple[int, int, Bin]]) -> None:
        self.share = np.array([b.share for _, _, b in bins], dtype=np.int64)
        self.memory_gb = np.array([b.memory_gb for _, _, b in bins], dtype=np.float64)
        self.power_w = np.array([b.power_w for _, _, b in bins], dtype=np.float64)
        self.alive = np.ones(len(bins), dtype=bool)

    def sync(self, j: int, b: Bin) -> None:
        """Copy bin ``j``'s state (``b``) into the arrays."""
        self.share[j] = b.share
        self.memory_gb[j] = b.memory_gb
        self.power_w[j] = b.power_w


def _cheapest_move(
    table: OpTable,
    bins: list[tuple[int, int, Bin]],
    state: _BinArrays,
    open_idx: dict[tuple[int, int], NDArray[np.int64]],
    candidates: list[tuple[int, int]],
    source: int,
    rate: float,
    smallest: int,
    limits: tuple[int, float, float],
    piece_cost: Callable[[int, float], float],
) -> tuple[float, int, int] | None:
    """(cost, bin, op) of the cheapest move of a piece at ``rate`` req/s out of bin
    ``source``: one of its unit's ``candidates`` ((clock, op) of the bin's type)
    with room for the rate, into a live bin of its clock that it fits; among
    equal costs the first bin, then the first op. None when none fits.

    The candidates are tried by cost, each against the open bins of its clock
    (``open_idx``, the bins with share room at the start, in order) in one array
    step over their share, memory and draw; the first of those that does not hold
    the unit yet is the op's bin."""
    share_capacity, usable, power_cap = limits
    t = bins[source][0]
    priced = sorted(
        (piece_cost(op, rate), k, f, op)
        for k, (f, op) in enumerate(candidates)
        if float(table.capacity_rps[op]) >= rate - RESIDUAL_TOL
    )
    at = 0
    while at < len(priced):
        cost = priced[at][0]
        level = []
        while at < len(priced) and priced[at][0] == cost:
            level.append(priced[at])
            at += 1
        found: tuple[int, int, int] | None = None  # (bin, candidate order, op)
        for _, k, f, op in level:
            idx = open_idx.get((t, f))
            if idx is None or idx.size == 0:
                continue
            need = max(smallest, int(table.share[op]))
            ok = (
                state.alive[idx]
                & (state.share[idx] + need <= share_capacity)
                & (state.memory_gb[idx] + float(table.memory_gb[op]) <= usable + 1e-9)
                & (state.power_w[idx] + float(table.peak_power_w[op]) <= power_cap + 1e-9)
                & (idx != source)
            )
            unit = int(table.unit[op])
            for j in idx[ok].tolist():
                if found is not None and j > found[0]:
                    break
                if unit not in bins[j][2].units:
                    if found is None or (j, k) < found[:2]:
                        found = (j, k, op)
                    break
        if found is not None:
            return cost, found[0], found[2]
    return None


def _copy(b: Bin) -> Bin:
    """An independent copy of a bin's state."""
    return Bin(b.share, b.memory_gb, b.power_w, list(b.ops), set(b.units), list(b.rates))


def _restore(b: Bin, before: Bin) -> None:
    """Put a bin back to a state copied earlier."""
    b.share, b.memory_gb, b.power_w = before.share, before.memory_gb, before.power_w
    b.ops, b.units, b.rates = before.ops, before.units, before.rates


def _first_fit(
    table: OpTable,
    items: list[tuple[int, float]],
    share_capacity: int,
    memory_gb: float,
    power_cap_w: float,
    on_power_w: float,
) -> list[Bin]:
    """First-fit decreasing by share: share units, memory (GB) and the GPU power cap
    (W, on the worst-case draw: each op at its steady power at capacity, whatever
    its rate, as the verifier checks it) respected, one op per unit in a bin."""
    bins: list[Bin] = []
    room: list[Bin] = []  # the bins with share left, in the order they were opened
    for op, rate in sorted(items, key=lambda it: (-int(table.share[it[0]]), it[0])):
        target = next(
            (b for b in room if b.fits(table, op, share_capacity, memory_gb, power_cap_w)),
            None,
        )
        if target is None:
            target = Bin(0, 0.0, on_power_w)
            bins.append(target)
            room.append(target)
        target.add(table, op, rate)
        if target.share >= share_capacity:
            room.remove(target)
    return bins


def _route(
    prog: pat.PatternProgram, counts: NDArray[np.float64], new_cols: list[Column]
) -> tuple[float, NDArray[np.float64]] | None:
    """Fix every count (``counts`` per column of ``prog``, plus one per packed
    configuration, which joins ``prog``) and route the demand in an LP over the
    columns in use only (the root LP and its basis stay as they are); the
    objective and the values in the integer master's layout over every column."""
    n_before = len(prog.columns)
    extra: dict[ColumnKey, int] = {}
    for col in new_cols:
        prog.add(col)
        extra[col.key] = extra.get(col.key, 0) + 1
    index = {col.key: j for j, col in enumerate(prog.columns)}
    fixed = np.zeros(len(prog.columns))
    fixed[:n_before] = counts[:n_before]
    for key, n in extra.items():
        fixed[index[key]] += n
    used = np.flatnonzero(fixed > 0.5)
    sub = LpSession(
        prog.problem, prog.table, prog.costs, prog.classes, [prog.columns[j] for j in used]
    )
    for k, j in enumerate(used):
        sub.set_count_bounds(sub.mp.z_var[k], float(fixed[j]), float(fixed[j]))
    try:
        lp = sub.solve()
    except BackendFailure:
        return None
    if lp.artificial_rps > RESIDUAL_TOL:
        return None
    # Integer-master layout (``pattern.integer_model``): per column its count,
    # then its rates.
    offsets = column_offsets(prog)
    values = np.zeros(int(offsets[-1]))
    for k, j in enumerate(used):
        values[offsets[j]] = fixed[j]
        values[offsets[j] + 1 : offsets[j + 1]] = lp.x[np.asarray(sub.mp.r_vars[k], dtype=np.int64)]
    return lp.objective, values
