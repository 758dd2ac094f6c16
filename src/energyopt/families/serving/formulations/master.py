"""The master program over columns: as a sparse LP for HiGHS (column generation)
and as a Pyomo MILP (the integer solve over the selected columns), and the
reading of an LP solution as prices. The algorithms that solve it are in
``solvers/`` (``master_lp``, ``colgen``, ``lp_dive``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
import pyomo.environ as pyo
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import Column, Duals
from energyopt.families.serving.formulations.costs import Costs
from energyopt.perf.oppoints import OpTable

ARTIFICIAL_COST = 1e7
"""Cost per unserved request/s in the LP, so early masters stay feasible."""


@dataclass
class Master:
    """Sparse master program: min c'x  s.t.  row_lo <= A x <= row_hi,  lo <= x <= hi."""

    cost: list[float] = field(default_factory=list)
    lo: list[float] = field(default_factory=list)
    hi: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    row_lo: list[float] = field(default_factory=list)
    row_hi: list[float] = field(default_factory=list)
    entries: list[tuple[int, int, float]] = field(default_factory=list)  # (row, var, coef)
    z_var: list[int] = field(default_factory=list)  # per column: its count variable
    r_vars: list[list[int]] = field(default_factory=list)  # per column: rate vars per op
    artificial: list[int] = field(default_factory=list)  # per unit
    demand_row: list[int] = field(default_factory=list)
    count_row: list[int] = field(default_factory=list)
    class_power_rows: list[list[int]] = field(default_factory=list)  # per class
    budget_rows: list[tuple[int, float]] = field(default_factory=list)  # (row, budget W)
    constant: float = 0.0

    def var(self, cost: float, lo: float, hi: float, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lo.append(lo)
        self.hi.append(hi)
        self.integer.append(integer)
        return len(self.cost) - 1

    def row(self, lo: float, hi: float) -> int:
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        return len(self.row_lo) - 1


def build_master(
    problem: Problem,
    table: OpTable,
    costs: Costs,
    classes: list[GpuClass],
    columns: list[Column],
    *,
    artificials: bool,
) -> Master:
    """Assemble the master over ``columns``."""
    mp = empty_master(problem, table, costs, classes, artificials=artificials)
    for col in columns:
        add_column(mp, table, costs, classes, col)
    return mp


def empty_master(
    problem: Problem,
    table: OpTable,
    costs: Costs,
    classes: list[GpuClass],
    *,
    artificials: bool,
) -> Master:
    """The master's demand, count and budget rows, without columns."""
    inst = problem.instance
    mp = Master()
    mp.constant = costs.migration_penalty * sum(len(c.state_units) for c in classes)
    mp.demand_row = [mp.row(u.rate_rps, u.rate_rps) for u in table.units]
    mp.count_row = [mp.row(-np.inf, c.size) for c in classes]
    node_row = {
        n.name: mp.row(-np.inf, n.power_budget_w)
        for n in inst.cluster.nodes
        if n.power_budget_w is not None
    }
    cluster_row = (
        mp.row(-np.inf, inst.cluster.power_budget_w)
        if inst.cluster.power_budget_w is not None
        else None
    )
    mp.budget_rows = [(r, float(mp.row_hi[r])) for r in node_row.values()]
    if cluster_row is not None:
        mp.budget_rows.append((cluster_row, float(mp.row_hi[cluster_row])))
    for c in classes:
        rows = []
        if c.node is not None and c.node in node_row:
            rows.append(node_row[c.node])
        if cluster_row is not None:
            rows.append(cluster_row)
        mp.class_power_rows.append(rows)
    if artificials:
        for u in range(len(table.units)):
            a = mp.var(ARTIFICIAL_COST, 0.0, np.inf)
            mp.artificial.append(a)
            mp.entries.append((mp.demand_row[u], a, 1.0))
    return mp


def add_column(
    mp: Master, table: OpTable, costs: Costs, classes: list[GpuClass], col: Column
) -> None:
    """Append one column: its count variable (at most 0 when the column is not
    within its class's cap), rate variables and their rows. A use costs
    ``col.on_cost`` (with the fixed part of each op carrying a rate) and puts its
    worst-case draw ``col.worst_w`` in the class's budget rows; each rate costs
    ``op_cost`` per req/s and enters no power row."""
    cls = classes[col.cls]
    uses = cls.size // col.gpus_per_use if col.within_cap else 0
    z = mp.var(col.on_cost, 0.0, float(uses), integer=True)
    mp.z_var.append(z)
    mp.entries.append((mp.count_row[col.cls], z, float(col.gpus_per_use)))
    for prow in mp.class_power_rows[col.cls]:
        mp.entries.append((prow, z, col.worst_w))
    rs = []
    for op, cap in zip(col.ops, col.capacity, strict=True):
        # Bounded (cap x uses) as well as linked to z below, so that every variable
        # of the integer master has a finite range (CP-SAT needs one).
        r = mp.var(float(costs.op_cost[op]), 0.0, float(cap) * uses)
        rs.append(r)
        unit = int(table.unit[op])
        mp.entries.append((mp.demand_row[unit], r, 1.0))
        link = mp.row(-np.inf, 0.0)
        mp.entries.append((link, r, 1.0))
        mp.entries.append((link, z, -cap))
    mp.r_vars.append(rs)


@dataclass
class LpSolution:
    """Optimal LP values and prices."""

    objective: float
    x: np.ndarray
    duals: Duals
    artificial_rps: float
    budget_duals: list[float]
    budgets_w: list[float]


def to_highs_lp(mp: Master, *, integer: bool) -> highspy.HighsLp:
    """The master in HiGHS' column-wise form (count variables integer if ``integer``)."""
    n = len(mp.cost)
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(mp.row_lo)
    lp.col_cost_ = np.asarray(mp.cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(mp.lo, dtype=np.float64)
    lp.col_upper_ = np.asarray(mp.hi, dtype=np.float64)
    lp.row_lower_ = np.asarray(mp.row_lo, dtype=np.float64)
    lp.row_upper_ = np.asarray(mp.row_hi, dtype=np.float64)
    ent = np.asarray(mp.entries, dtype=np.float64).reshape(-1, 3)
    ent = ent[np.lexsort((ent[:, 0], ent[:, 1]))]
    cols = ent[:, 1].astype(np.int64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(cols, np.arange(n + 1)).astype(np.int32)
    lp.a_matrix_.index_ = ent[:, 0].astype(np.int32)
    lp.a_matrix_.value_ = ent[:, 2]
    if integer:
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
            for flag in mp.integer
        ]
        lp.offset_ = mp.constant
    return lp


def read_lp_solution(
    mp: Master,
    x: NDArray[np.float64],
    row_dual: NDArray[np.float64],
    objective: float,
    n_classes: int,
) -> LpSolution:
    """The master's reading of an optimal LP: its values ``x``, row duals ``row_dual``
    (HiGHS convention d = c - A'y) and the solver's ``objective`` (without the
    master's constant), as prices per demand, count and class power row."""
    y = row_dual
    power = np.zeros(n_classes)
    for c, rows in enumerate(mp.class_power_rows):
        power[c] = float(sum(y[r] for r in rows))
    duals = Duals(
        demand=y[mp.demand_row],
        count=y[mp.count_row] if mp.count_row else np.zeros(n_classes),
        power=power,
    )
    artificial = float(x[mp.artificial].sum()) if mp.artificial else 0.0
    return LpSolution(
        objective + mp.constant,
        x,
        duals,
        artificial,
        [float(y[r]) for r, _ in mp.budget_rows],
        [b for _, b in mp.budget_rows],
    )


@dataclass(frozen=True)
class Appended:
    """What a master gained since an earlier size: per new variable its entries in
    the rows that existed then, per new row its entries (row and variable indices
    are the master's)."""

    first_var: int
    first_row: int
    by_var: dict[int, list[tuple[int, float]]]
    by_row: dict[int, list[tuple[int, float]]]


def appended_since(mp: Master, n_var: int, n_row: int, n_ent: int) -> Appended:
    """The entries added to ``mp`` after it had ``n_var`` variables, ``n_row`` rows and
    ``n_ent`` entries, split into column-wise and row-wise parts."""
    by_var: dict[int, list[tuple[int, float]]] = {}
    by_row: dict[int, list[tuple[int, float]]] = {}
    for r, v, coef in mp.entries[n_ent:]:
        if r < n_row:
            by_var.setdefault(v, []).append((r, coef))
        else:
            by_row.setdefault(r, []).append((v, coef))
    return Appended(n_var, n_row, by_var, by_row)


def pyomo_model(mp: Master, name: str) -> Any:
    """The master as a Pyomo MILP (count variables integer)."""
    m = pyo.ConcreteModel(name=name)
    n = len(mp.cost)
    m.v = pyo.Var(range(n))
    for i in range(n):
        var = m.v[i]
        var.domain = pyo.NonNegativeIntegers if mp.integer[i] else pyo.NonNegativeReals
        var.setlb(mp.lo[i])
        var.setub(None if mp.hi[i] == np.inf else mp.hi[i])
    rows: list[list[tuple[int, float]]] = [[] for _ in mp.row_lo]
    for r, v, coef in mp.entries:
        rows[r].append((v, coef))
    m.rows = pyo.ConstraintList()
    for r, terms in enumerate(rows):
        if not terms:
            continue
        expr = sum(coef * m.v[v] for v, coef in terms)
        lo, hi = mp.row_lo[r], mp.row_hi[r]
        if lo == hi:
            m.rows.add(expr == lo)
        elif lo == -np.inf:
            m.rows.add(expr <= hi)
        else:
            m.rows.add(pyo.inequality(lo, expr, hi))
    m.obj = pyo.Objective(expr=sum(mp.cost[i] * m.v[i] for i in range(n)) + mp.constant)
    return m
