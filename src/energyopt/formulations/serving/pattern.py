"""Configuration (pattern) formulation: identical GPUs counted, not named.

Column generation over maximal configurations gives the LP bound; an integer
solve over the generated columns gives a plan; reduced-cost filtering then adds
every configuration that could still improve on that plan, so the final integer
solve is exact (see docs/formulations/serving.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyomo.environ as pyo
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.formulations.serving.assemble import GpuDecision
from energyopt.formulations.serving.classes import GpuClass, gpu_classes, split_tp_groups
from energyopt.formulations.serving.columns import Column, price_configs, shared_column, tp_column
from energyopt.formulations.serving.configs import ConfigSet, enumerate_configs
from energyopt.formulations.serving.costs import Costs, objective_costs
from energyopt.formulations.serving.master import (
    LpSolution,
    Master,
    build_master,
    pyomo_model,
    solve_lp,
)
from energyopt.perf.oppoints import OpTable

RC_TOL = 1e-6
COLUMNS_PER_ROUND = 8
MAX_ROUNDS = 500


class PatternNotApplicable(ValueError):
    """The instance needs the per-GPU formulation (reason in the message)."""


@dataclass
class PatternProgram:
    """Columns, prices and the LP bound of the configuration formulation."""

    problem: Problem
    table: OpTable
    costs: Costs
    classes: list[GpuClass]
    configs: dict[tuple[str, int], ConfigSet]
    columns: list[Column] = field(default_factory=list)
    keys: set[tuple[int, int, tuple[int, ...]]] = field(default_factory=set)
    lp: LpSolution | None = None
    bound: float = float("-inf")
    rounds: int = 0
    log: list[str] = field(default_factory=list)

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


def check_applicable(problem: Problem, table: OpTable) -> None:
    """Raise PatternNotApplicable when only the per-GPU formulation is exact."""
    stateful = [g for g in problem.gpus if g.state is not None]
    if stateful and bool((table.tp > 1).any()):
        raise PatternNotApplicable(
            "GPUs with a current state and tensor-parallel units: use the per-GPU formulation"
        )


def prepare(
    problem: Problem, table: OpTable, log: Callable[[str], None] | None = None
) -> PatternProgram:
    """Classes, enumerated configurations and the initial columns."""
    check_applicable(problem, table)
    costs = objective_costs(problem, table)
    classes = gpu_classes(problem, table)
    configs: dict[tuple[str, int], ConfigSet] = {}
    for type_name in table.type_names:
        for clock in table.clocks[type_name]:
            cs = enumerate_configs(problem, table, type_name, clock)
            if not cs.complete:
                raise PatternNotApplicable(
                    f"more than {len(cs)} configurations per GPU for {type_name} at {clock} MHz"
                )
            configs[(type_name, clock)] = cs
    prog = PatternProgram(problem, table, costs, classes, configs)
    for cls in classes:
        top = max(table.clocks[cls.type_name])
        cs = configs[(cls.type_name, top)]
        best: dict[int, tuple[float, tuple[int, ...]]] = {}
        for j in range(len(cs)):
            ops = tuple(int(o) for o in cs.ops(j))
            if len(ops) != 1:
                continue
            u = int(table.unit[ops[0]])
            cap = float(table.capacity_rps[ops[0]])
            if u not in best or cap > best[u][0]:
                best[u] = (cap, ops)
        for _, ops in best.values():
            prog.add(shared_column(cls, table, costs, top, ops))
        tp_ops = (table.tp > 1) & (table.gpu_type == table.type_names.index(cls.type_name))
        for o in np.flatnonzero(tp_ops):
            if int(table.tp[o]) <= max(_node_counts(cls).values()):
                prog.add(tp_column(cls, table, costs, int(o)))
    if log:
        total = sum(len(c) for c in configs.values())
        log(
            f"pattern: {len(classes)} GPU classes, {total} maximal configurations, "
            f"{len(prog.columns)} initial columns"
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

    Sets ``prog.bound``: the LP value corrected by the most negative reduced
    cost per class (a Lagrangian bound, valid even if pricing stopped early).
    """
    table, costs = prog.table, prog.costs
    for rnd in range(MAX_ROUNDS):
        mp = prog.master(artificials=True)
        prog.lp = solve_lp(mp, len(table.units), len(prog.classes))
        added = 0
        best = 0.0
        correction = 0.0
        for cls in prog.classes:
            class_min = 0.0
            for (type_name, clock), cs in prog.configs.items():
                if type_name != cls.type_name or len(cs) == 0:
                    continue
                rc = price_configs(cls, cs, table, costs, prog.lp.duals)
                class_min = min(class_min, float(rc.min()))
                order = np.argsort(rc)[:COLUMNS_PER_ROUND]
                for j in order:
                    if rc[j] >= -RC_TOL * max(1.0, abs(prog.lp.objective)):
                        break
                    best = min(best, float(rc[j]))
                    ops = tuple(int(o) for o in cs.ops(int(j)))
                    added += prog.add(shared_column(cls, table, costs, clock, ops))
            correction += cls.size * class_min
        prog.rounds = rnd + 1
        prog.bound = prog.lp.objective + correction
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
            return
    if log:
        log(f"column generation stopped after {MAX_ROUNDS} rounds; bound is the Lagrangian one")


def columns_within(
    prog: PatternProgram, slack: float, limit: int | None = None
) -> list[Column] | None:
    """Every new configuration column whose reduced cost is at most ``slack``.

    None when there are more than ``limit`` of them.
    """
    assert prog.lp is not None
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
    model.hosts = pyo.Var(list(hosts), domain=pyo.NonNegativeIntegers)
    model.gpus_at = pyo.Var(list(at), domain=pyo.NonNegativeIntegers)
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
