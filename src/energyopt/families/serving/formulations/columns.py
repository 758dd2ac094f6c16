"""Columns of the configuration formulation and their reduced costs.

A column is a configuration used by some number of GPUs of one class: either a
shared-GPU configuration (a clock and a set of placements) or a tensor-parallel
group (k whole GPUs serving one unit). Its rates are per-column variables.

Power (perf/energy.py ``power_line``): each placement that carries a rate costs its
op's fixed part (``Costs.op_fixed``) once per use of the column, on top of the
on-cost, and ``Costs.op_cost`` per req/s of its rate variable. Caps and budgets hold
on the worst-case draw, a constant per use: on-power plus each placement's steady
power at its SLO capacity (``OpTable.peak_power_w``). A configuration whose
worst-case draw exceeds its class's cap is not a column (``within_cap``).

A GPU with a current state may keep a placement of its state without a rate, to
avoid its migration penalty: such an op is ``idle`` in the column (capacity 0, no
fixed part; its worst case still counts), as the plan keeps it (``assemble_plan``)
and the verifier prices it (no power at rate 0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.configs import CAP_REL_TOL, ConfigSet
from energyopt.families.serving.formulations.costs import Costs
from energyopt.perf.oppoints import OpTable
from energyopt.perf.params import FloatArray

ColumnKey = tuple[int, int, tuple[int, ...], tuple[int, ...]]
"""(class, clock MHz, ops, idle ops) of a column."""


@dataclass(frozen=True)
class Column:
    """A configuration of one class. Costs and powers are per GPU-group using it."""

    cls: int
    clock_mhz: int
    ops: tuple[int, ...]
    gpus_per_use: int  # 1, or the TP size
    on_power_w: float  # static power of one use (all its GPUs), W
    on_cost: float  # objective cost of one use without its rates: on-cost + op_fixed of
    # each op that carries a rate - migration penalty of each current placement kept
    capacity: tuple[float, ...]  # per op, rps per use (0 for an idle op)
    worst_w: float  # worst-case draw of one use (all its GPUs), W
    within_cap: bool  # worst-case draw per GPU within the class's power cap
    idle: tuple[int, ...] = ()  # ops of ``ops`` kept at no rate (current placements)

    @property
    def key(self) -> ColumnKey:
        """Identity of the column."""
        return (self.cls, self.clock_mhz, self.ops, self.idle)


@dataclass(frozen=True)
class Duals:
    """Prices from the master LP (HiGHS sign convention: d = c - A^T y).

    ``power`` prices one W of worst-case draw (on-power and each placement's peak)
    in the class's node and cluster budget rows.

    ``gpus_at`` and ``held`` are the prices of branching rows (empty outside a
    branch-and-price tree): ``gpus_at[(c, f)]`` is the price of one GPU of class c
    at clock f (objective units per GPU), ``held[c][o]`` the price of a
    configuration of class c that holds op o (objective units per configuration).
    Both enter a configuration's reduced cost with a minus sign.
    """

    demand: FloatArray  # per unit
    count: FloatArray  # per class (<= 0)
    power: FloatArray  # per class: node budget dual + cluster budget dual (<= 0), per W
    gpus_at: Mapping[tuple[int, int], float] = field(default_factory=dict)
    held: Mapping[int, FloatArray] = field(default_factory=dict)

    def base_price(self, cls: int, clock: int) -> float:
        """Branching price of one GPU of class ``cls`` at ``clock`` (0 without one)."""
        return float(self.gpus_at.get((cls, clock), 0.0))


def kept_mask(cls: GpuClass, table: OpTable) -> NDArray[np.bool_]:
    """Per op: whether it places a unit that the class's stateful GPU holds now."""
    current = set(cls.state_units)
    if not current:
        return np.zeros(len(table), dtype=bool)
    units = [(u.workload, u.phase) in current for u in table.units]
    return np.asarray(units, dtype=bool)[table.unit]


def is_kept(cls: GpuClass, table: OpTable, op: int) -> bool:
    """Whether op ``op`` places a unit that the class's stateful GPU holds now."""
    if not cls.state_units:
        return False
    u = table.units[int(table.unit[op])]
    return (u.workload, u.phase) in set(cls.state_units)


def kept_units(cls: GpuClass, table: OpTable, ops: tuple[int, ...] | list[int]) -> int:
    """How many of the class's current placements a configuration keeps."""
    return sum(1 for o in ops if is_kept(cls, table, int(o)))


def shared_column(
    cls: GpuClass,
    table: OpTable,
    costs: Costs,
    clock: int,
    ops: tuple[int, ...],
    idle: tuple[int, ...] = (),
) -> Column:
    """Column for a shared-GPU configuration; ``idle``: ops of ``ops`` kept without a
    rate (each must be a current placement of the class's GPU)."""
    idle = tuple(sorted(o for o in ops if o in set(idle) and is_kept(cls, table, o)))
    on_power = table.on_power[(cls.type_name, clock)]
    worst = on_power + float(sum(float(table.peak_power_w[o]) for o in ops))
    fixed = float(sum(float(costs.op_fixed[o]) for o in ops if o not in idle))
    on_cost = (
        costs.on_cost[(cls.type_name, clock)]
        + fixed
        - costs.migration_penalty * kept_units(cls, table, ops)
    )
    return Column(
        cls=cls.index,
        clock_mhz=clock,
        ops=ops,
        gpus_per_use=1,
        on_power_w=on_power,
        on_cost=on_cost,
        capacity=tuple(0.0 if o in idle else float(table.capacity_rps[o]) for o in ops),
        worst_w=worst,
        within_cap=worst <= cls.power_cap_w * (1 + CAP_REL_TOL),
        idle=idle,
    )


def tp_fits(cls: GpuClass, table: OpTable, op: int) -> bool:
    """Whether a TP group of op ``op`` keeps each of its GPUs within the class's cap
    in the worst case (on-power plus its share of the op's peak)."""
    k = int(table.tp[op])
    on_power = table.on_power[(cls.type_name, int(table.clock_mhz[op]))]
    worst = on_power + float(table.peak_power_w[op]) / k
    return worst <= cls.power_cap_w * (1 + CAP_REL_TOL)


def tp_column(cls: GpuClass, table: OpTable, costs: Costs, op: int) -> Column:
    """Column for one tensor-parallel group of the class (not ``within_cap`` when its
    worst-case draw per GPU exceeds the cap)."""
    k = int(table.tp[op])
    clock = int(table.clock_mhz[op])
    on_power = table.on_power[(cls.type_name, clock)]
    return Column(
        cls=cls.index,
        clock_mhz=clock,
        ops=(op,),
        gpus_per_use=k,
        on_power_w=k * on_power,
        on_cost=k * costs.on_cost[(cls.type_name, clock)] + float(costs.op_fixed[op]),
        capacity=(float(table.capacity_rps[op]),),
        worst_w=k * on_power + float(table.peak_power_w[op]),
        within_cap=tp_fits(cls, table, op),
    )


def item_reduced_costs(table: OpTable, costs: Costs, duals: Duals, cls: int) -> FloatArray:
    """Reduced cost of one request/s of each op on a GPU of class ``cls`` (the rate
    enters no power row: caps and budgets hold on the worst case)."""
    del cls
    pi = duals.demand[table.unit]
    return np.asarray(costs.op_cost - pi)


@dataclass(frozen=True)
class ItemCosts:
    """What each op adds to a configuration's reduced cost, rates at their best.

    ``active``: its fixed part, the budget price of its peak, its capacity times its
    rate's reduced cost where negative, less its branching and migration bonuses.
    ``idle``: the same held without a rate (no fixed part, no rate), +inf where the
    op may not be idle. ``best`` is the least of the two."""

    active: FloatArray
    idle: FloatArray

    @property
    def best(self) -> FloatArray:
        return np.asarray(np.minimum(self.active, self.idle))


def item_costs(
    cls: GpuClass,
    table: OpTable,
    costs: Costs,
    duals: Duals,
    ops: NDArray[np.int64] | None = None,
) -> ItemCosts:
    """Each op's share of a configuration's reduced cost for class ``cls``
    (``ItemCosts``); of the ops ``ops`` only, in their order, when given (the same
    values as the whole table's at those ops, computed on them alone)."""
    at: NDArray[np.int64] | slice = slice(None) if ops is None else ops
    rc = costs.op_cost[at] - duals.demand[table.unit[at]]
    common = -duals.power[cls.index] * table.peak_power_w[at]
    if cls.index in duals.held:
        common = common - duals.held[cls.index][at]
    n = len(table) if ops is None else len(ops)
    idle = np.full(n, np.inf)
    if cls.state_units:
        kept = kept_mask(cls, table)[at]
        if kept.any():
            common = common - costs.migration_penalty * kept
            if costs.migration_penalty > 0:
                idle = np.where(kept, common, np.inf)
    active = common + costs.op_fixed[at] + table.capacity_rps[at] * np.minimum(0.0, rc)
    return ItemCosts(np.asarray(active), np.asarray(idle))


def base_cost(cls: GpuClass, table: OpTable, costs: Costs, duals: Duals, clock: int) -> float:
    """Reduced cost of one GPU of class ``cls`` on at ``clock`` with nothing placed:
    its on-cost less its count, budget (on-power) and branching prices."""
    on_power = table.on_power[(cls.type_name, clock)]
    return float(
        costs.on_cost[(cls.type_name, clock)]
        - duals.count[cls.index]
        - duals.power[cls.index] * on_power
        - duals.base_price(cls.index, clock)
    )


def price_configs(
    cls: GpuClass,
    configs: ConfigSet,
    table: OpTable,
    costs: Costs,
    duals: Duals,
) -> FloatArray:
    """Reduced cost of every configuration in ``configs`` for class ``cls`` (vectorized):
    each op's rate at its best value (its capacity where its reduced cost is negative,
    else 0), each current placement held idle where that is cheaper. +inf for a
    configuration whose worst-case draw exceeds the class's cap (not a column)."""
    if len(configs) == 0:
        return np.zeros(0)
    items = item_costs(cls, table, costs, duals).best
    base = base_cost(cls, table, costs, duals, configs.clock_mhz)
    starts = configs.ptr[:-1]
    flat = configs.flat
    rc = base + np.add.reduceat(items[flat], starts)
    on_power = table.on_power[(cls.type_name, configs.clock_mhz)]
    worst = on_power + np.add.reduceat(table.peak_power_w[flat], starts)
    rc = np.where(worst <= cls.power_cap_w * (1 + CAP_REL_TOL), rc, np.inf)
    return np.asarray(rc)


def priced_column(
    cls: GpuClass,
    table: OpTable,
    costs: Costs,
    duals: Duals,
    clock: int,
    ops: tuple[int, ...],
) -> Column:
    """The column of configuration ``ops`` whose reduced cost ``price_configs`` gives:
    each current placement idle where that is cheaper at ``duals``."""
    ic = item_costs(cls, table, costs, duals)
    idle = tuple(o for o in ops if ic.idle[o] < ic.active[o])
    return shared_column(cls, table, costs, clock, ops, idle)


def idle_choices(
    cls: GpuClass, table: OpTable, costs: Costs, ops: tuple[int, ...]
) -> list[tuple[int, ...]]:
    """Every choice of idle ops for configuration ``ops``: the subsets of its current
    placements, where a migration penalty makes keeping one without a rate worth
    listing (else only the empty choice)."""
    if costs.migration_penalty <= 0:
        return [()]
    free = [o for o in ops if is_kept(cls, table, o)]
    return [
        tuple(o for i, o in enumerate(free) if mask >> i & 1) for mask in range(1 << len(free))
    ]


def column_variants(
    cls: GpuClass,
    table: OpTable,
    costs: Costs,
    duals: Duals,
    clock: int,
    ops: tuple[int, ...],
    slack: float,
) -> list[Column]:
    """Every column of configuration ``ops`` (each op that may be idle active or idle)
    whose reduced cost at ``duals`` is at most ``slack``."""
    ic = item_costs(cls, table, costs, duals)
    base = base_cost(cls, table, costs, duals, clock)
    out: list[Column] = []
    for idle in idle_choices(cls, table, costs, ops):
        rc = base + float(sum(ic.idle[o] if o in idle else ic.active[o] for o in ops))
        if rc <= slack:
            col = shared_column(cls, table, costs, clock, ops, idle)
            if col.within_cap:
                out.append(col)
    return out
