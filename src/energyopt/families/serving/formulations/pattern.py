"""Configuration (pattern) formulation: identical GPUs counted, not named.

The program (classes, configurations listed or priced by knapsack, columns, the
master) and what is read from it: reduced costs, the columns within a slack,
the plan of an integer master. Column generation over it gives the LP bound, an
integer solve over the generated columns a plan, and reduced-cost filtering
makes the final integer solve exact; those algorithms are in ``solvers/``
(``colgen``, ``lp_dive``, ``serving``; see docs/formulations/serving.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyomo.environ as pyo
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.assemble import MIN_RATE_RPS, GpuDecision, power_cap_w
from energyopt.families.serving.formulations.classes import (
    GpuClass,
    gpu_classes,
    split_tp_groups,
    tp_sizes_by_type,
)
from energyopt.families.serving.formulations.columns import (
    Column,
    ColumnKey,
    Duals,
    base_cost,
    column_variants,
    price_configs,
    shared_column,
    tp_column,
    tp_fits,
)
from energyopt.families.serving.formulations.configs import ConfigSet, enumerate_configs
from energyopt.families.serving.formulations.costs import Costs, objective_costs
from energyopt.families.serving.formulations.knapsack import (
    KnapsackItems,
    item_values,
    knapsack_items,
)
from energyopt.families.serving.formulations.master import (
    LpSolution,
    Master,
    build_master,
    pyomo_model,
)
from energyopt.formulations.errors import FormulationNotApplicable
from energyopt.perf.oppoints import OpTable

ENUMERATION_MAX_UNITS = 24
"""``auto`` pricing enumerates configurations of a (type, clock) only up to this many
units with single-GPU ops there; above it, configurations are priced by knapsack."""

Pricing = Literal["auto", "enumerate", "knapsack"]
SMALL_CLASS_GPUS = 16


class PatternNotApplicable(FormulationNotApplicable):
    """The instance needs the per-GPU formulation (reason in the message)."""


@dataclass
class PatternProgram:
    """Columns, prices and the LP bound of the configuration formulation."""

    problem: Problem
    table: OpTable
    costs: Costs
    classes: list[GpuClass]
    configs: dict[tuple[str, int], ConfigSet]
    knapsacks: dict[tuple[str, int], KnapsackItems] = field(default_factory=dict)
    columns: list[Column] = field(default_factory=list)
    keys: set[ColumnKey] = field(default_factory=set)
    lp: LpSolution | None = None
    bound: float = float("-inf")
    rounds: int = 0
    log: list[str] = field(default_factory=list)
    tp_ops: dict[int, NDArray[np.int64]] = field(default_factory=dict)
    """Per class: TP ops whose columns are priced each round instead of listed at
    the start (``prepare(..., lazy_tp=True)``); empty when every TP column is listed."""

    @property
    def enumerated(self) -> bool:
        """Every configuration is listed (so reduced-cost filtering can be exact)."""
        return not self.knapsacks

    @property
    def lower_bound(self) -> float:
        """Valid lower bound on the integer optimum (once no rate is left unserved)."""
        return self.bound

    def add(self, col: Column) -> bool:
        if col.key in self.keys:
            return False
        self.keys.add(col.key)
        self.columns.append(col)
        return True

    def master(self, artificials: bool) -> Master:
        return build_master(
            self.problem,
            self.table,
            self.costs,
            self.classes,
            self.columns,
            artificials=artificials,
        )


def is_small(prog: PatternProgram) -> bool:
    """Few enough GPUs per class that the integer solve needs no rounding help."""
    return max((c.size for c in prog.classes), default=0) <= SMALL_CLASS_GPUS


def check_applicable(problem: Problem, table: OpTable) -> None:
    """Raise PatternNotApplicable when only the per-GPU formulation is exact."""
    stateful = [g for g in problem.gpus if g.state is not None]
    if stateful and bool((table.tp > 1).any()):
        raise PatternNotApplicable(
            "GPUs with a current state and tensor-parallel units: use the per-GPU formulation"
        )
    # Classes hold GPUs of one power cap, so their TP columns never mix caps; a
    # node whose GPUs of a type have different caps could form such a group.
    sizes = tp_sizes_by_type(table)
    caps: dict[tuple[str, str], list[float]] = defaultdict(list)
    for gpu in problem.gpus:
        caps[(gpu.node, gpu.type)].append(power_cap_w(problem, gpu))
    for (node, type_name), node_caps in caps.items():
        fits = [k for k in sizes.get(type_name, ()) if k <= len(node_caps)]
        if fits and len(set(node_caps)) > 1:
            raise PatternNotApplicable(
                f"node {node} has {type_name} GPUs with different power caps that could "
                "form one tensor-parallel group: use the per-GPU formulation"
            )


def prepare(
    problem: Problem,
    table: OpTable,
    log: Callable[[str], None] | None = None,
    pricing: Pricing = "auto",
    *,
    lazy_tp: bool = False,
) -> PatternProgram:
    """Classes, configurations (listed, or priced by knapsack) and the initial columns.

    ``lazy_tp``: a TP group of a unit that also has single-GPU ops is not an initial
    column but a candidate (``PatternProgram.tp_ops``) that column generation prices
    each round (``colgen.price_tp``); at 102,400 GPUs the 239,375 TP columns listed
    at the start made the first LP solve take 214 s."""
    check_applicable(problem, table)
    costs = objective_costs(problem, table)
    classes = gpu_classes(problem, table)
    configs: dict[tuple[str, int], ConfigSet] = {}
    knapsacks: dict[tuple[str, int], KnapsackItems] = {}
    mig = problem.instance.options.sharing.mode == "mig"
    for type_name in table.type_names:
        mig_type = mig and bool(problem.gpu_type(type_name).mig_profiles)
        for clock in table.clocks[type_name]:
            ks = knapsack_items(problem, table, type_name, clock)
            many = len(set(ks.units.tolist())) > ENUMERATION_MAX_UNITS
            if not mig_type and (pricing == "knapsack" or (pricing == "auto" and many)):
                knapsacks[(type_name, clock)] = ks
                continue
            cs = enumerate_configs(problem, table, type_name, clock)
            if cs.complete:
                configs[(type_name, clock)] = cs
            elif not mig_type and pricing == "auto":
                knapsacks[(type_name, clock)] = ks
            else:
                raise PatternNotApplicable(
                    f"more than {len(cs)} configurations per GPU for {type_name} at {clock} MHz"
                )
    prog = PatternProgram(problem, table, costs, classes, configs, knapsacks)
    for cls in classes:
        top = max(table.clocks[cls.type_name])
        t = table.type_names.index(cls.type_name)
        single = np.flatnonzero((table.gpu_type == t) & (table.clock_mhz == top) & (table.tp == 1))
        best: dict[int, tuple[float, Column]] = {}
        for o in single:
            u = int(table.unit[o])
            cap = float(table.capacity_rps[o])
            col = shared_column(cls, table, costs, top, (int(o),))
            if col.within_cap and (u not in best or cap > best[u][0]):
                best[u] = (cap, col)
        for _, col in best.values():
            prog.add(col)
        tp_ops = (table.tp > 1) & (table.gpu_type == t)
        largest_node = max(_node_counts(cls).values())
        with_single = np.zeros(len(table.units), dtype=bool)
        with_single[np.asarray(table.unit)[np.asarray(table.tp) == 1]] = True
        later: list[int] = []
        for o in np.flatnonzero(tp_ops):
            if int(table.tp[o]) <= largest_node and tp_fits(cls, table, int(o)):
                if lazy_tp and with_single[int(table.unit[o])]:
                    later.append(int(o))
                else:
                    prog.add(tp_column(cls, table, costs, int(o)))
        if later:
            prog.tp_ops[cls.index] = np.asarray(later, dtype=np.int64)
    if log:
        total = sum(len(c) for c in configs.values())
        priced = f", {len(knapsacks)} (type, clock) pairs priced by knapsack" if knapsacks else ""
        lazy = sum(len(v) for v in prog.tp_ops.values())
        log(
            f"pattern: {len(classes)} GPU classes, {total} configurations listed"
            f"{priced}, {len(prog.columns)} initial columns"
            + (f", {lazy} TP columns priced each round" if lazy else "")
        )
    return prog


def _node_counts(cls: GpuClass) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gpu in cls.gpus:
        counts[gpu.node] = counts.get(gpu.node, 0) + 1
    return counts


@dataclass(frozen=True)
class KnapsackPricing:
    """The pricing problem of one class at one clock at given duals: find the items
    (single-GPU ops) of most total ``values`` that fit one GPU (``items``' share and
    memory rows); a configuration's reduced cost is at least ``base`` less that
    value. ``order`` lists the items by their own reduced cost, least first (the
    order in which a configuration found is filled)."""

    items: KnapsackItems
    base: float
    values: NDArray[np.float64]
    order: NDArray[np.int64]


def knapsack_pricing(
    prog: PatternProgram, cls: GpuClass, ks: KnapsackItems, duals: Duals
) -> KnapsackPricing:
    """The knapsack pricing problem of class ``cls`` at ``ks``' clock under ``duals``;
    ``base`` is the on-cost less the count, budget (on-power) and branching prices of
    one GPU (objective units, W for power)."""
    base = base_cost(cls, prog.table, prog.costs, duals, ks.clock_mhz)
    values = item_values(cls, ks, prog.table, prog.costs, duals)
    order = np.argsort(-values, kind="stable")
    return KnapsackPricing(ks, float(base), values, order)


def column_reduced_cost(
    prog: PatternProgram, cls: GpuClass, clock: int, ops: tuple[int, ...]
) -> NDArray[np.float64]:
    """Exact reduced cost of one configuration at its best (array of one; +inf when
    it is over the class's cap)."""
    assert prog.lp is not None
    arr = np.asarray(ops, dtype=np.int64)
    one = ConfigSet(cls.type_name, clock, arr, np.asarray([0, len(ops)], dtype=np.int64), arr, True)
    return price_configs(cls, one, prog.table, prog.costs, prog.lp.duals)


def columns_within(
    prog: PatternProgram, slack: float, limit: int | None = None
) -> list[Column] | None:
    """Every new configuration column whose reduced cost is at most ``slack`` (each
    variant of a configuration: a kept placement with or without a rate).

    None when there are more than ``limit`` of them, or when some configurations
    are priced by knapsack and so cannot be listed.
    """
    assert prog.lp is not None
    if not prog.enumerated:
        return None
    out: list[Column] = []
    for cls in prog.classes:
        for (type_name, clock), cs in prog.configs.items():
            if type_name != cls.type_name or len(cs) == 0:
                continue
            duals = prog.lp.duals
            rc = price_configs(cls, cs, prog.table, prog.costs, duals)
            for j in np.flatnonzero(rc <= slack):
                ops = tuple(int(o) for o in cs.ops(int(j)))
                for col in column_variants(cls, prog.table, prog.costs, duals, clock, ops, slack):
                    if col.key not in prog.keys:
                        out.append(col)
                        if limit is not None and len(out) > limit:
                            return None
    return out


@dataclass
class IntegerModel:
    """The integer master over a column set (as Pyomo model, or solved directly from
    the sparse master), with the maps to read the plan back."""

    model: Any | None
    master: Master
    columns: list[Column]
    values: NDArray[np.float64] | None = None

    def value(self, var: int) -> float:
        """Solution value of master variable ``var``."""
        if self.values is not None:
            return float(self.values[var])
        if self.model is None:
            raise ValueError("integer model has no solution loaded")
        return float(pyo.value(self.model.v[var]))


def integer_model(prog: PatternProgram, *, pyomo: bool = True) -> IntegerModel:
    """Integer master over the program's current columns (Pyomo model unless
    ``pyomo`` is False, for solvers that read the sparse master directly)."""
    mp = prog.master(artificials=False)
    if not pyomo:
        return IntegerModel(None, mp, list(prog.columns))
    model = pyomo_model(mp, f"serving-pattern:{prog.problem.instance.name}")
    _add_branching_aggregates(model, mp, prog)
    return IntegerModel(model, mp, list(prog.columns))


def _add_branching_aggregates(model: Any, mp: Master, prog: PatternProgram) -> None:
    """Integer totals the solver can branch on instead of single columns.

    hosts[u] = configurations holding unit u; gpus_at[c, f] = GPUs of class c at
    clock f. Both are sums of column counts, so integral in every solution; the
    branch-and-bound tree on them is far better balanced.
    """
    table = prog.table
    hosts: dict[int, list[int]] = {}
    at: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for j, col in enumerate(prog.columns):
        for op in col.ops:
            hosts.setdefault(int(table.unit[op]), []).append(j)
        at.setdefault((col.cls, col.clock_mhz), []).append((j, col.gpus_per_use))
    uses = [mp.hi[z] for z in mp.z_var]
    model.hosts = pyo.Var(
        list(hosts),
        domain=pyo.NonNegativeIntegers,
        bounds=lambda _, u: (0, sum(uses[j] for j in hosts[u])),
    )
    model.gpus_at = pyo.Var(
        list(at),
        domain=pyo.NonNegativeIntegers,
        bounds=lambda _, c, f: (0, sum(k * uses[j] for j, k in at[(c, f)])),
    )
    model.aggregates = pyo.ConstraintList()
    for u, cols in hosts.items():
        model.aggregates.add(model.hosts[u] == sum(model.v[mp.z_var[j]] for j in cols))
    for key, weighted in at.items():
        model.aggregates.add(
            model.gpus_at[key] == sum(k * model.v[mp.z_var[j]] for j, k in weighted)
        )


def _rate(total: float, uses: int) -> float:
    """Rate of one use of a column carrying ``total`` req/s over ``uses`` uses: 0 at or
    below MIN_RATE_RPS (a placement the plan does not make), see ``integer_objective``."""
    rate = max(0.0, total) / uses
    return rate if rate > MIN_RATE_RPS else 0.0


def integer_objective(
    prog: PatternProgram, values: NDArray[np.float64], columns: list[Column] | None = None
) -> float:
    """Objective of the plan that ``decisions`` makes of integer-master ``values``
    (per column of ``columns``, by default the program's: its count, then its
    rates): the master's objective less the fixed part of each op that carries no
    rate (``_rate``), which the plan does not place or keeps without power, as the
    verifier prices it. Objective units (W for power)."""
    cols = prog.columns if columns is None else columns
    costs = prog.costs
    total = costs.migration_penalty * sum(len(c.state_units) for c in prog.classes)
    at = 0
    for col in cols:
        if at + 1 + len(col.ops) > len(values):
            break
        uses = round(float(values[at]))
        if uses > 0:
            total += uses * col.on_cost
            for i, op in enumerate(col.ops):
                rate = _rate(float(values[at + 1 + i]), uses)
                if rate > 0:
                    total += float(costs.op_cost[op]) * rate * uses
                elif op not in col.idle:
                    total -= uses * float(costs.op_fixed[op])
        at += 1 + len(col.ops)
    return total


def decisions(prog: PatternProgram, im: IntegerModel) -> dict[str, GpuDecision]:
    """Hand each class's GPUs to the columns chosen, splitting rates evenly (a rate
    at or below MIN_RATE_RPS per use is 0: ``integer_objective`` prices the plan).

    TP groups are placed inside nodes first (largest first), then single GPUs.
    """
    mp = im.master
    uses_of: list[int] = [round(im.value(z)) for z in mp.z_var]
    out: dict[str, GpuDecision] = {g.id: GpuDecision() for g in prog.problem.gpus}
    for cls in prog.classes:
        mine = [j for j, col in enumerate(im.columns) if col.cls == cls.index and uses_of[j] > 0]
        tp_uses = [
            (j, u) for j in mine if im.columns[j].gpus_per_use > 1 for u in range(uses_of[j])
        ]
        groups, rest = split_tp_groups(cls, [im.columns[j].gpus_per_use for j, _ in tp_uses])
        for (j, use), members in zip(tp_uses, groups, strict=True):
            col = im.columns[j]
            rate = _rate(im.value(mp.r_vars[j][0]), uses_of[j])
            gid = f"{members[0].node}:tp{col.ops[0]}.{use}"
            for gpu in members:
                out[gpu.id].clock_mhz = col.clock_mhz
                out[gpu.id].tp_ops.append((col.ops[0], rate, gid))
        for j in mine:
            col = im.columns[j]
            if col.gpus_per_use > 1:
                continue
            rates = [_rate(im.value(r), uses_of[j]) for r in mp.r_vars[j]]
            for _ in range(uses_of[j]):
                gpu = rest.pop(0)
                out[gpu.id].clock_mhz = col.clock_mhz
                out[gpu.id].ops.extend(zip(col.ops, rates, strict=True))
    return out
