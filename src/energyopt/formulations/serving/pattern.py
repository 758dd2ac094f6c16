"""Configuration (pattern) formulation: identical GPUs counted, not named.

Column generation over maximal configurations gives the LP bound; an integer
solve over the generated columns gives a plan; reduced-cost filtering then adds
every configuration that could still improve on that plan, so the final integer
solve is exact (see docs/formulations/serving.md).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyomo.environ as pyo
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.formulations.errors import FormulationNotApplicable
from energyopt.formulations.serving.assemble import GpuDecision, power_cap_w
from energyopt.formulations.serving.classes import (
    GpuClass,
    gpu_classes,
    split_tp_groups,
    tp_sizes_by_type,
)
from energyopt.formulations.serving.columns import (
    Column,
    Duals,
    item_reduced_costs,
    price_configs,
    shared_column,
    tp_column,
)
from energyopt.formulations.serving.configs import ConfigSet, enumerate_configs
from energyopt.formulations.serving.costs import Costs, objective_costs
from energyopt.formulations.serving.knapsack import (
    COARSE_STEP_GB,
    KnapsackItems,
    best_configuration,
    greedy_configuration,
    item_values,
    knapsack_items,
    repair_and_fill,
)
from energyopt.formulations.serving.master import (
    LpSession,
    LpSolution,
    Master,
    build_master,
    pyomo_model,
)
from energyopt.perf.oppoints import OpTable

RC_TOL = 1e-6
COLUMNS_PER_ROUND = 8
MAX_ROUNDS = 500
ENUMERATION_MAX_UNITS = 24
"""``auto`` pricing enumerates configurations of a (type, clock) only up to this many
units with single-GPU ops there; above it, configurations are priced by knapsack."""

Pricing = Literal["auto", "enumerate", "knapsack"]
SMALL_CLASS_GPUS = 16
EXACT = 2
"""Pricing effort whose knapsack is exact (see ``knapsack_price``)."""


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
    keys: set[tuple[int, int, tuple[int, ...]]] = field(default_factory=set)
    lp: LpSolution | None = None
    bound: float = float("-inf")
    rounds: int = 0
    log: list[str] = field(default_factory=list)

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
) -> PatternProgram:
    """Classes, configurations (listed, or priced by knapsack) and the initial columns."""
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
        best: dict[int, tuple[float, int]] = {}
        for o in single:
            u = int(table.unit[o])
            cap = float(table.capacity_rps[o])
            if u not in best or cap > best[u][0]:
                best[u] = (cap, int(o))
        for _, op in best.values():
            prog.add(shared_column(cls, table, costs, top, (op,)))
        tp_ops = (table.tp > 1) & (table.gpu_type == t)
        largest_node = max(_node_counts(cls).values())
        for o in np.flatnonzero(tp_ops):
            if int(table.tp[o]) <= largest_node:
                prog.add(tp_column(cls, table, costs, int(o)))
    if log:
        total = sum(len(c) for c in configs.values())
        priced = f", {len(knapsacks)} (type, clock) pairs priced by knapsack" if knapsacks else ""
        log(
            f"pattern: {len(classes)} GPU classes, {total} maximal configurations listed"
            f"{priced}, {len(prog.columns)} initial columns"
        )
    return prog


def _node_counts(cls: GpuClass) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gpu in cls.gpus:
        counts[gpu.node] = counts.get(gpu.node, 0) + 1
    return counts


def generate_columns(
    prog: PatternProgram, log: Callable[[str], None] | None = None, deadline: float | None = None
) -> None:
    """Column generation to LP optimality over all maximal configurations.

    Sets ``prog.bound``: the best Lagrangian bound seen (the LP value corrected by
    the most negative reduced cost per class), valid even if pricing stopped early.
    Knapsack-priced configurations are searched with the coarse DP first; the exact
    DP runs when the coarse one finds nothing (and at the time limit), so every
    bound reported comes from exact pricing.
    """
    session = LpSession(prog.problem, prog.table, prog.costs, prog.classes, prog.columns)
    for rnd in range(MAX_ROUNDS):
        if len(session.mp.z_var) < len(prog.columns):
            session.add(prog.columns[len(session.mp.z_var) :])
        prog.lp = session.solve()
        effort = EXACT if prog.enumerated else 0
        added, best, bound = _price_round(prog, effort=effort)
        while not added and effort < EXACT:
            effort += 1
            added, best, bound = _price_round(prog, effort=effort)
        if bound is not None:
            prog.bound = max(prog.bound, bound)
        prog.rounds = rnd + 1
        if log and (rnd % 5 == 0 or added == 0):
            log(
                f"colgen round {rnd + 1}: LP {prog.lp.objective:,.2f}, "
                f"{len(prog.columns)} columns, best reduced cost {best:,.3f}"
            )
        if added == 0:
            return
        if deadline is not None and time.perf_counter() > deadline:
            if log:
                log("column generation stopped at the time limit; bound is the Lagrangian one")
            break
    else:
        if log:
            log(f"column generation stopped after {MAX_ROUNDS} rounds; bound is Lagrangian")
    session.add(prog.columns[len(session.mp.z_var) :])
    prog.lp = session.solve()
    _, _, bound = _price_round(prog, effort=EXACT, add=False)
    if bound is not None:
        prog.bound = max(prog.bound, bound)


def _price_round(
    prog: PatternProgram, *, effort: int, add: bool = True
) -> tuple[int, float, float | None]:
    """Price every class at the current duals: (columns added, best reduced cost,
    Lagrangian bound or None when some pricing was not exact)."""
    assert prog.lp is not None
    table, costs, duals = prog.table, prog.costs, prog.lp.duals
    tol = -RC_TOL * max(1.0, abs(prog.lp.objective))
    added = 0
    best = 0.0
    correction = 0.0
    for cls in prog.classes:
        class_min = 0.0
        for (type_name, clock), cs in prog.configs.items():
            if type_name != cls.type_name or len(cs) == 0:
                continue
            rc = price_configs(cls, cs, table, costs, duals)
            class_min = min(class_min, float(rc.min()))
            for j in np.argsort(rc)[:COLUMNS_PER_ROUND]:
                if rc[j] >= tol:
                    break
                best = min(best, float(rc[j]))
                if add:
                    ops = tuple(int(o) for o in cs.ops(int(j)))
                    added += prog.add(shared_column(cls, table, costs, clock, ops))
        for (type_name, clock), ks in prog.knapsacks.items():
            if type_name != cls.type_name or len(ks) == 0:
                continue
            low, found = knapsack_price(prog, cls, ks, duals, effort=effort)
            class_min = min(class_min, low)
            for ops in found:
                rc_found = float(column_reduced_cost(prog, cls, clock, ops)[0])
                if rc_found < tol:
                    best = min(best, rc_found)
                    if add:
                        added += prog.add(shared_column(cls, table, costs, clock, ops))
        correction += cls.size * class_min
    bound = prog.lp.objective + correction if np.isfinite(correction) else None
    return added, best, bound


def knapsack_price(
    prog: PatternProgram, cls: GpuClass, ks: KnapsackItems, duals: Duals, *, effort: int
) -> tuple[float, list[tuple[int, ...]]]:
    """(lower bound on the class's least reduced cost at this clock, configurations
    worth pricing exactly).

    ``effort`` 0 picks up to COLUMNS_PER_ROUND greedy configurations on disjoint
    units, 1 runs the coarse DP (both fast and proving nothing: the first element
    is then -inf), 2 the exact DP that the bound comes from.
    """
    table, costs = prog.table, prog.costs
    on_power = table.on_power[(cls.type_name, ks.clock_mhz)]
    base = (
        costs.on_cost[(cls.type_name, ks.clock_mhz)]
        - duals.count[cls.index]
        - duals.power[cls.index] * on_power
    )
    values = item_values(cls, ks, table, costs, duals)
    rc_item = item_reduced_costs(table, costs, duals, cls.index)[ks.items]
    order = np.argsort(rc_item, kind="stable")
    if effort == 0:
        found: list[tuple[int, ...]] = []
        left = values.copy()
        for _ in range(COLUMNS_PER_ROUND):
            value, chosen = greedy_configuration(ks, left)
            if not chosen or base - value >= 0:
                break
            found.append(repair_and_fill(ks, values, chosen, order))
            taken = np.isin(ks.units, ks.units[chosen])
            left[taken] = 0.0
        return -np.inf, found
    if effort >= EXACT:
        value, chosen = best_configuration(ks, values)
        low = base - value
    else:
        value, chosen = best_configuration(ks, values, step_gb=COARSE_STEP_GB, feasible=True)
        low = -np.inf
    if effort >= EXACT and not chosen:
        low = min(0.0, base)
    return low, ([repair_and_fill(ks, values, chosen, order)] if chosen else [])


def column_reduced_cost(
    prog: PatternProgram, cls: GpuClass, clock: int, ops: tuple[int, ...]
) -> NDArray[np.float64]:
    """Exact reduced cost of one configuration (array of one)."""
    assert prog.lp is not None
    arr = np.asarray(ops, dtype=np.int64)
    one = ConfigSet(cls.type_name, clock, arr, np.asarray([0, len(ops)], dtype=np.int64), arr, True)
    return price_configs(cls, one, prog.table, prog.costs, prog.lp.duals)


def columns_within(
    prog: PatternProgram, slack: float, limit: int | None = None
) -> list[Column] | None:
    """Every new configuration column whose reduced cost is at most ``slack``.

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
            rc = price_configs(cls, cs, prog.table, prog.costs, prog.lp.duals)
            for j in np.flatnonzero(rc <= slack):
                ops = tuple(int(o) for o in cs.ops(int(j)))
                col = shared_column(cls, prog.table, prog.costs, clock, ops)
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


def decisions(prog: PatternProgram, im: IntegerModel) -> dict[str, GpuDecision]:
    """Hand each class's GPUs to the columns chosen, splitting rates evenly.

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
            rate = max(0.0, im.value(mp.r_vars[j][0])) / uses_of[j]
            gid = f"{members[0].node}:tp{col.ops[0]}.{use}"
            for gpu in members:
                out[gpu.id].clock_mhz = col.clock_mhz
                out[gpu.id].tp_ops.append((col.ops[0], rate, gid))
        for j in mine:
            col = im.columns[j]
            if col.gpus_per_use > 1:
                continue
            rates = [max(0.0, im.value(r)) / uses_of[j] for r in mp.r_vars[j]]
            for _ in range(uses_of[j]):
                gpu = rest.pop(0)
                out[gpu.id].clock_mhz = col.clock_mhz
                out[gpu.id].ops.extend(zip(col.ops, rates, strict=True))
    return out


def elapsed(start: float) -> float:
    """Seconds since ``start`` (perf_counter)."""
    return time.perf_counter() - start
