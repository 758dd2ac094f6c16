"""Columns of the configuration formulation and their reduced costs.

A column is a configuration used by some number of GPUs of one class: either a
shared-GPU configuration (a clock and a set of placements) or a tensor-parallel
group (k whole GPUs serving one unit). Its rates are per-column variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from energyopt.formulations.serving.classes import GpuClass
from energyopt.formulations.serving.configs import ConfigSet
from energyopt.formulations.serving.costs import Costs
from energyopt.perf.oppoints import OpTable
from energyopt.perf.params import FloatArray


@dataclass(frozen=True)
class Column:
    """A configuration of one class. Costs are per GPU-group using it."""

    cls: int
    clock_mhz: int
    ops: tuple[int, ...]
    gpus_per_use: int  # 1, or the TP size
    on_power_w: float  # static power of one use (all its GPUs), W
    on_cost: float  # objective cost of one use, without its rates
    capacity: tuple[float, ...]  # per op, rps per use
    needs_power_row: bool  # full-load power may exceed the class cap

    @property
    def key(self) -> tuple[int, int, tuple[int, ...]]:
        """Identity of the column."""
        return (self.cls, self.clock_mhz, self.ops)


@dataclass(frozen=True)
class Duals:
    """Prices from the master LP (HiGHS sign convention: d = c - A^T y).

    ``gpus_at`` and ``held`` are the prices of branching rows (empty outside a
    branch-and-price tree): ``gpus_at[(c, f)]`` is the price of one GPU of class c
    at clock f (objective units per GPU), ``held[c][o]`` the price of a
    configuration of class c that holds op o (objective units per configuration).
    Both enter a configuration's reduced cost with a minus sign.
    """

    demand: FloatArray  # per unit
    count: FloatArray  # per class (<= 0)
    power: FloatArray  # per class: node budget dual + cluster budget dual (<= 0)
    gpus_at: Mapping[tuple[int, int], float] = field(default_factory=dict)
    held: Mapping[int, FloatArray] = field(default_factory=dict)

    def base_price(self, cls: int, clock: int) -> float:
        """Branching price of one GPU of class ``cls`` at ``clock`` (0 without one)."""
        return float(self.gpus_at.get((cls, clock), 0.0))


def kept_units(cls: GpuClass, table: OpTable, ops: tuple[int, ...] | list[int]) -> int:
    """How many of the class's current placements a configuration keeps."""
    current = set(cls.state_units)
    if not current:
        return 0
    return sum(
        1
        for o in ops
        if (table.units[int(table.unit[o])].workload, table.units[int(table.unit[o])].phase)
        in current
    )


def shared_column(
    cls: GpuClass, table: OpTable, costs: Costs, clock: int, ops: tuple[int, ...]
) -> Column:
    """Column for a shared-GPU configuration."""
    on_power = table.on_power[(cls.type_name, clock)]
    full_load = on_power + float(sum(table.energy_j[o] * table.capacity_rps[o] for o in ops))
    on_cost = costs.on_cost[(cls.type_name, clock)] - costs.migration_penalty * kept_units(
        cls, table, ops
    )
    return Column(
        cls=cls.index,
        clock_mhz=clock,
        ops=ops,
        gpus_per_use=1,
        on_power_w=on_power,
        on_cost=on_cost,
        capacity=tuple(float(table.capacity_rps[o]) for o in ops),
        needs_power_row=full_load > cls.power_cap_w * (1 + 1e-9),
    )


def tp_column(cls: GpuClass, table: OpTable, costs: Costs, op: int) -> Column:
    """Column for one tensor-parallel group of the class (capacity within the power cap)."""
    k = int(table.tp[op])
    clock = int(table.clock_mhz[op])
    on_power = table.on_power[(cls.type_name, clock)]
    energy = float(table.energy_j[op])
    cap = float(table.capacity_rps[op])
    if energy > 0:
        cap = max(0.0, min(cap, (cls.power_cap_w - on_power) * k / energy))
    return Column(
        cls=cls.index,
        clock_mhz=clock,
        ops=(op,),
        gpus_per_use=k,
        on_power_w=k * on_power,
        on_cost=k * costs.on_cost[(cls.type_name, clock)],
        capacity=(cap,),
        needs_power_row=False,
    )


def item_reduced_costs(table: OpTable, costs: Costs, duals: Duals, cls: int) -> FloatArray:
    """Reduced cost of one request/s of each op on a GPU of class ``cls``."""
    pi = duals.demand[table.unit]
    return np.asarray(costs.op_cost - pi - duals.power[cls] * table.energy_j)


def price_configs(
    cls: GpuClass,
    configs: ConfigSet,
    table: OpTable,
    costs: Costs,
    duals: Duals,
) -> FloatArray:
    """Reduced cost of every configuration in ``configs`` for class ``cls`` (vectorized).

    Rates are set to their best values inside the column: full capacity for
    ops whose reduced cost is negative; when that would exceed the class power
    cap, the column's power row is honoured by a fractional knapsack.
    """
    if len(configs) == 0:
        return np.zeros(0)
    rc_item = item_reduced_costs(table, costs, duals, cls.index)
    gain = table.capacity_rps * np.minimum(0.0, rc_item)
    on_power = table.on_power[(cls.type_name, configs.clock_mhz)]
    base = (
        costs.on_cost[(cls.type_name, configs.clock_mhz)]
        - duals.count[cls.index]
        - duals.power[cls.index] * on_power
        - duals.base_price(cls.index, configs.clock_mhz)
    )
    bonus = np.zeros(len(table))
    if cls.index in duals.held:
        bonus += duals.held[cls.index]
    if cls.state_units:
        current = set(cls.state_units)
        for o in configs.items:
            u = table.units[int(table.unit[o])]
            if (u.workload, u.phase) in current:
                bonus[o] += costs.migration_penalty
    per_item = gain[configs.flat] - bonus[configs.flat]
    starts = configs.ptr[:-1]
    sums = np.add.reduceat(per_item, starts) if per_item.size else np.zeros(len(configs))
    rc = base + sums
    full = on_power + np.add.reduceat(
        (table.energy_j * table.capacity_rps * (rc_item < 0))[configs.flat], starts
    )
    over = np.flatnonzero(full > cls.power_cap_w * (1 + 1e-9))
    for j in over:
        ops = configs.ops(int(j))
        rc[j] = (
            base
            - bonus[ops].sum()
            + _knapsack_gain(
                rc_item[ops],
                table.energy_j[ops],
                table.capacity_rps[ops],
                cls.power_cap_w - on_power,
            )
        )
    return np.asarray(rc)


def _knapsack_gain(rc: FloatArray, energy: FloatArray, cap: FloatArray, budget_w: float) -> float:
    """min sum rc_i r_i  s.t.  sum energy_i r_i <= budget, 0 <= r_i <= cap_i (greedy, exact)."""
    total = 0.0
    left = max(0.0, budget_w)
    order = np.argsort(rc / np.maximum(energy, 1e-12))
    for i in order:
        if rc[i] >= 0:
            break
        take = cap[i] if energy[i] <= 0 else min(cap[i], left / energy[i])
        total += rc[i] * take
        left -= energy[i] * take
        if left <= 0:
            break
    return total
