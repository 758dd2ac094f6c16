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

from energyopt.catalog.problem import Problem
from energyopt.formulations.serving.assemble import GpuDecision
from energyopt.formulations.serving.classes import GpuClass, gpu_classes
from energyopt.formulations.serving.columns import Column, price_configs, shared_column, tp_column
from energyopt.formulations.serving.configs import ConfigSet, enumerate_configs
from energyopt.formulations.serving.costs import Costs, objective_costs
from energyopt.formulations.serving.master import LpSolution, Master, build_master, pyomo_model, solve_lp
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
    rounds: int = 0
    log: list[str] = field(default_factory=list)

    @property
    def lower_bound(self) -> float:
        """LP bound; valid once column generation has converged with no unserved rate."""
        assert self.lp is not None
        return self.lp.objective

    def add(self, col: Column) -> bool:
        if col.key in self.keys:
            return False
        self.keys.add(col.key)
        self.columns.append(col)
        return True

    def master(self, artificials: bool) -> Master:
        return build_master(
            self.problem, self.table, self.costs, self.classes, self.columns, artificials=artificials
        )


def check_applicable(problem: Problem, table: OpTable) -> None:
    """Raise PatternNotApplicable when only the per-GPU formulation is exact."""
    stateful = [g for g in problem.gpus if g.state is not None]
    if stateful and bool((table.tp > 1).any()):
        raise PatternNotApplicable(
            "GPUs with a current state and tensor-parallel units: use the per-GPU formulation"
        )


def prepare(problem: Problem, table: OpTable, log: Callable[[str], None] | None = None) -> PatternProgram:
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
        for (type_name, clock), cs in configs.items():
            if type_name != cls.type_name:
                continue
            singles = {}
            for j in range(len(cs)):
                ops = tuple(int(o) for o in cs.ops(j))
                for o in ops:
                    u = int(table.unit[o])
                    best = singles.get(u)
                    if best is None or table.capacity_rps[o] > table.capacity_rps[best[0]]:
                        singles[u] = (o, ops)
            for _, ops in singles.values():
                prog.add(shared_column(cls, table, costs, clock, ops))
        if cls.node is not None:
            for o in np.flatnonzero((table.tp > 1) & (table.gpu_type == table.type_names.index(cls.type_name))):
                if int(table.tp[o]) <= cls.size:
                    prog.add(tp_column(cls, table, costs, int(o)))
    if log:
        total = sum(len(c) for c in configs.values())
        log(f"pattern: {len(classes)} GPU classes, {total} maximal configurations, {len(prog.columns)} initial columns")
    return prog


def generate_columns(prog: PatternProgram, log: Callable[[str], None] | None = None) -> None:
    """Column generation to LP optimality over all maximal configurations."""
    table, costs = prog.table, prog.costs
    for rnd in range(MAX_ROUNDS):
        mp = prog.master(artificials=True)
        prog.lp = solve_lp(mp, len(table.units), len(prog.classes))
        added = 0
        best = 0.0
        for cls in prog.classes:
            for (type_name, clock), cs in prog.configs.items():
                if type_name != cls.type_name or len(cs) == 0:
                    continue
                rc = price_configs(cls, cs, table, costs, prog.lp.duals)
                order = np.argsort(rc)[:COLUMNS_PER_ROUND]
                for j in order:
                    if rc[j] >= -RC_TOL * max(1.0, abs(prog.lp.objective)):
                        break
                    best = min(best, float(rc[j]))
                    ops = tuple(int(o) for o in cs.ops(int(j)))
                    added += prog.add(shared_column(cls, table, costs, clock, ops))
        prog.rounds = rnd + 1
        if log and (rnd % 5 == 0 or added == 0):
            log(
                f"colgen round {rnd + 1}: LP {prog.lp.objective:,.2f}, "
                f"{len(prog.columns)} columns, best reduced cost {best:,.3f}"
            )
        if added == 0:
            return
    raise RuntimeError("column generation did not converge")


def columns_within(prog: PatternProgram, slack: float) -> list[Column]:
    """Every configuration column whose reduced cost is at most ``slack``."""
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
    return out


@dataclass
class IntegerModel:
    """A Pyomo MILP over a column set, with the maps to read the plan back."""

    model: Any
    master: Master
    columns: list[Column]


def integer_model(prog: PatternProgram) -> IntegerModel:
    """Pyomo MILP over the program's current columns."""
    mp = prog.master(artificials=False)
    return IntegerModel(pyomo_model(mp, f"serving-pattern:{prog.problem.instance.name}"), mp, list(prog.columns))


def decisions(prog: PatternProgram, im: IntegerModel) -> dict[str, GpuDecision]:
    """Hand each class's GPUs to the columns chosen, splitting rates evenly."""
    m, mp = im.model, im.master
    pools = {c.index: list(c.gpus) for c in prog.classes}
    out: dict[str, GpuDecision] = {g.id: GpuDecision() for g in prog.problem.gpus}
    for j, col in enumerate(im.columns):
        uses = int(round(float(pyo.value(m.v[mp.z_var[j]]))))
        if uses <= 0:
            continue
        rates = [max(0.0, float(pyo.value(m.v[r]))) / uses for r in mp.r_vars[j]]
        for use in range(uses):
            members = [pools[col.cls].pop(0) for _ in range(col.gpus_per_use)]
            group = f"{members[0].node}:tp{col.ops[0]}.{use}" if col.gpus_per_use > 1 else None
            for gpu in members:
                d = out[gpu.id]
                d.clock_mhz = col.clock_mhz
                for op, rate in zip(col.ops, rates, strict=True):
                    if group is not None:
                        d.tp_ops.append((op, rate, group))
                    else:
                        d.ops.append((op, rate))
    return out


def elapsed(start: float) -> float:
    """Seconds since ``start`` (perf_counter)."""
    return time.perf_counter() - start
