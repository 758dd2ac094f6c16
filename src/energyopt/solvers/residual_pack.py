"""Residual packing: an integer plan from the configuration master's LP without one
LP re-solve per rounded count (the LP dive's cost at fleet scale).

Rounding the LP's fractional counts up (what the dive ends with) gives each unit a
nearly idle GPU of its own: on fleet-4096 that plan is 11 % above the bound.
Here instead:

1. the LP's tensor-parallel counts are rounded up (a TP group cannot share its
   GPUs), serving at the LP's rates; every other unit's rate is left to cover;
2. each such unit (largest rate first) gets its own cheapest cover by
   single-GPU operating points: n equal uses of one point, or m full uses of one
   and one use of another for the rest. A use is charged w(share) x (the GPU's
   on-cost at its clock + a price per GPU of its type), w(s) = s / capacity up
   to half the GPU and 1 above (a use of more than half a GPU leaves room only
   for uses of under half, which pack among themselves anyway), plus the op's
   cost per req/s; only GPU types with GPUs free are offered;
3. the uses are packed first-fit decreasing, per (GPU type, clock), into shared
   configurations (share, memory and the GPU power cap respected, one op per
   unit) placed on the classes with GPUs free; a type whose configurations
   overflow it keeps that many GPUs back on the next try;
4. steps 2-3 run with the LP's GPU prices times each of PRICE_SCALES, and the
   cheapest packing is kept;
5. one LP over the columns in use, every count fixed, routes the demand (so
   rates, power rows and budgets hold exactly) and gives the plan's objective.

It returns None when no packing fits or that LP cannot serve every rate (a
budget the packing broke); the caller keeps its other heuristics. Objective
values are the instance's objective units (W for power), rates req/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from energyopt.formulations.errors import BackendFailure
from energyopt.formulations.serving import pattern as pat
from energyopt.formulations.serving.columns import Column, shared_column
from energyopt.perf.oppoints import OpTable
from energyopt.solvers.master_lp import LpSession
from energyopt.solvers.restricted_master import column_offsets

RESIDUAL_TOL = 1e-6
"""Residual demand below this (req/s) counts as served."""


@dataclass
class _Bin:
    """One shared configuration being filled: share units and memory (GB) used,
    power at the residual rates (W), and its ops."""

    share: int
    memory_gb: float
    power_w: float
    ops: list[int] = field(default_factory=list)
    units: set[int] = field(default_factory=set)


PRICE_SCALES = (1.0, 1.1, 1.25, 1.5, 2.0)
"""Multiples of the LP's GPU prices the covers are tried at (the cheapest packing
is kept). At the LP's own price a scarce type ties with the next one for many
units and runs out early: on fleet-4096 the packing costs 2.3 % above the bound
at the LP's price of an H100 (37 W) and 1.1 % at 1.25 times it; on fleet-10240
4.1 % and 1.2 % at 1.1 times it."""
MAX_TRIES = 12
"""Packings at most: when a GPU type runs out of free GPUs, the next try keeps that
many more of its GPUs back from the residual choice."""


def residual_pack(
    session: LpSession, prog: pat.PatternProgram
) -> tuple[float, NDArray[np.float64]] | None:
    """(objective, integer-master values) of a residual-packing plan from the
    session's current LP solution, or None (see the module docstring). The packed
    configurations join ``prog`` as columns (a session that holds a prefix of
    ``prog.columns`` takes them at its next ``add``); the session itself is not
    changed."""
    base = _kept_counts(session, prog)
    if base is None:
        return None
    counts, residual, free = base
    assert prog.lp is not None
    lp_price = dict.fromkeys(prog.table.type_names, np.inf)
    for c in prog.classes:
        lp_price[c.type_name] = min(lp_price[c.type_name], -float(prog.lp.duals.count[c.index]))
    best: tuple[float, list[Column]] | None = None
    for scale in PRICE_SCALES if any(v > 0 for v in lp_price.values()) else (1.0,):
        packed = _pack_at({n: scale * v for n, v in lp_price.items()}, prog, residual, free)
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
    configurations' on-cost plus their ops' cost at the residual rates."""
    # GPUs of each type kept back from the choice: none at first; a type whose
    # bins overflow it keeps back what it was short the next time.
    reserve = dict.fromkeys(prog.table.type_names, 0)
    for _ in range(MAX_TRIES):
        chosen = _choose(prog, residual, free, reserve, count_price)
        if chosen is None:
            return None
        packed = _pack(prog, chosen, dict(free))
        if isinstance(packed, list):
            cost = sum(col.on_cost for col in packed)
            cost += float(sum(prog.costs.op_cost[op] * rate for op, rate in chosen))
            return cost, packed
        type_name, short = packed
        reserve[type_name] += short
    return None


def _kept_counts(
    session: LpSession, prog: pat.PatternProgram
) -> tuple[NDArray[np.float64], NDArray[np.float64], dict[int, int]] | None:
    """(kept count per column, residual req/s per unit, free GPUs per class): the
    LP's tensor-parallel columns rounded up, serving at the LP's rate per use (a
    TP group cannot share its GPUs); every shared column at 0. None when that
    overfills a class."""
    table, mp = prog.table, session.mp
    lp = session.solve()
    z_idx = np.asarray(mp.z_var, dtype=np.int64)
    z = lp.x[z_idx]
    counts = np.zeros(z.size)
    residual = np.array([u.rate_rps for u in table.units], dtype=np.float64)
    used = np.zeros(len(prog.classes), dtype=np.int64)
    for j, col in enumerate(prog.columns[: len(z_idx)]):
        if z[j] <= 1e-9 or col.gpus_per_use == 1:
            continue
        counts[j] = np.ceil(z[j] - 1e-9)
        used[col.cls] += int(counts[j]) * col.gpus_per_use
        for op, r in zip(col.ops, mp.r_vars[j], strict=True):
            residual[int(table.unit[op])] -= float(lp.x[r])
    free = {c.index: c.size - int(used[c.index]) for c in prog.classes}
    if any(v < 0 for v in free.values()):
        return None
    return counts, np.maximum(residual, 0.0), free


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
    type, objective units per GPU), within each type's free GPUs less ``reserve``."""
    table, costs = prog.table, prog.costs
    room: dict[str, float] = dict.fromkeys(table.type_names, 0.0)
    for c in prog.classes:
        room[c.type_name] += free[c.index]
    for name in room:
        room[name] = max(0.0, room[name] - reserve[name])
    type_cap = np.array([table.share_capacity[n] for n in table.type_names], dtype=np.float64)
    share_frac = table.share / type_cap[table.gpu_type]
    pairs, at = np.unique(np.stack([table.gpu_type, table.clock_mhz]), axis=1, return_inverse=True)
    pair_cost = np.array(
        [
            costs.on_cost[(table.type_names[int(t)], int(f))]
            + count_price[table.type_names[int(t)]]
            for t, f in pairs.T
        ]
    )
    gpu_cost = pair_cost[np.asarray(at).reshape(-1)]
    # A piece of more than half a GPU leaves room only for pieces of under half,
    # which pack among themselves anyway: charge it the whole GPU.
    fixed_all = np.where(share_frac <= 0.5 + 1e-9, share_frac, 1.0) * gpu_cost
    chosen: list[tuple[int, float]] = []
    for u in np.argsort(-residual, kind="stable").tolist():
        rate = float(residual[u])
        if rate <= RESIDUAL_TOL:
            break
        ops = table.ops_of(u)
        ops = ops[table.tp[ops] == 1]
        left = np.array([room[table.type_names[t]] for t in table.gpu_type[ops]])
        ops = ops[share_frac[ops] <= left + 1e-9]
        while True:
            if ops.size == 0:
                return None
            pieces = _cover(rate, ops, table.capacity_rps[ops], fixed_all[ops], costs.op_cost[ops])
            need: dict[int, float] = {}
            for op, _ in pieces:
                t = int(table.gpu_type[op])
                need[t] = need.get(t, 0.0) + float(share_frac[op])
            short = [t for t, v in need.items() if v > room[table.type_names[t]] + 1e-9]
            if not short:
                break
            # The cover needs more of a type than is left: cover without it.
            ops = ops[~np.isin(table.gpu_type[ops], short)]
        for t, v in need.items():
            room[table.type_names[t]] -= v
        chosen.extend(pieces)
    return chosen


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
) -> list[Column] | tuple[str, int]:
    """Shared configurations holding ``chosen``, placed on classes with free GPUs;
    or (GPU type, GPUs short) when a type has too few free GPUs for its bins."""
    table, costs, problem = prog.table, prog.costs, prog.problem
    groups: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for op, rate in chosen:
        groups.setdefault((int(table.gpu_type[op]), int(table.clock_mhz[op])), []).append(
            (op, rate)
        )
    columns: list[Column] = []
    for (t, clock), items in sorted(groups.items()):
        type_name = table.type_names[t]
        usable = problem.gpu_type(type_name).memory_gb * (
            1.0 - problem.instance.options.memory_reserve_fraction
        )
        classes = [c for c in prog.classes if c.type_name == type_name]
        power_cap = min(c.power_cap_w for c in classes)
        bins = _first_fit(
            table,
            items,
            table.share_capacity[type_name],
            usable,
            power_cap,
            table.on_power[(type_name, clock)],
        )
        for b in bins:
            cls = next((c for c in classes if free[c.index] > 0), None)
            if cls is None:
                return type_name, len(bins) - bins.index(b)
            free[cls.index] -= 1
            columns.append(shared_column(cls, table, costs, clock, tuple(sorted(b.ops))))
    return columns


def _first_fit(
    table: OpTable,
    items: list[tuple[int, float]],
    share_capacity: int,
    memory_gb: float,
    power_cap_w: float,
    on_power_w: float,
) -> list[_Bin]:
    """First-fit decreasing by share: share units, memory (GB) and the GPU power cap
    (W, at the residual rates) respected, one op per unit in a bin."""
    bins: list[_Bin] = []
    room: list[_Bin] = []  # the bins with share left, in the order they were opened
    for op, rate in sorted(items, key=lambda it: (-int(table.share[it[0]]), it[0])):
        s, mem = int(table.share[op]), float(table.memory_gb[op])
        power = float(table.energy_j[op]) * rate
        u = int(table.unit[op])
        target = next(
            (
                b
                for b in room
                if u not in b.units
                and b.share + s <= share_capacity
                and b.memory_gb + mem <= memory_gb + 1e-9
                and b.power_w + power <= power_cap_w + 1e-9
            ),
            None,
        )
        if target is None:
            target = _Bin(0, 0.0, on_power_w)
            bins.append(target)
            room.append(target)
        target.share += s
        target.memory_gb += mem
        target.power_w += power
        target.ops.append(op)
        target.units.add(u)
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
    extra: dict[tuple[int, int, tuple[int, ...]], int] = {}
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
