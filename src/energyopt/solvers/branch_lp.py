"""The configuration master's LP with branching rows, for branch-and-price.

A branching row bounds an integer aggregate of the column counts z_j:

- ``("gpus", c, f)``: sum of k_j z_j over the columns of class c at clock f (k_j the
  GPUs of one use: 1, or the TP size), the number of GPUs of class c at clock f;
- ``("held", c, u)``: sum of z_j over the columns of class c that hold unit u, the
  number of configurations (or TP groups) of class c that serve unit u;
- ``("op", c, o)``: sum of z_j over the columns of class c that hold op o.

Every aggregate is integral in every integer plan. A row's price enters pricing
without changing its form: a ``gpus`` price shifts the base cost of one GPU at that
clock (``Duals.gpus_at``), a ``held``/``op`` price is a bonus on holding the op
(``Duals.held``), which the enumerated pricing and the knapsack DP both take per item.

One ``BranchLp`` serves the whole tree: every row is added once, the first time some
node branches on it, and a node sets the bounds of the rows it restricts and frees
the others. Objective values are the instance's objective units (W for power).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np

from energyopt.formulations.errors import BackendFailure
from energyopt.formulations.serving.columns import Column
from energyopt.formulations.serving.master import LpSolution, read_lp_solution
from energyopt.formulations.serving.pattern import PatternProgram
from energyopt.solvers.master_lp import LpSession

AggKey = tuple[Literal["gpus", "held", "op"], int, int]
"""(kind, class, clock / unit / op) of a branching aggregate (see the module docstring)."""
Bounds = dict[AggKey, tuple[float, float]]
"""The branching restrictions of one node: aggregate -> (lower, upper) bound."""


class NodeInfeasible(BackendFailure):
    """The node's LP has no feasible point: no plan meets its branching bounds."""


class BranchLp(LpSession):
    """The master LP (with artificials) over the program's growing column set, with
    branching rows whose bounds change from node to node."""

    def __init__(self, prog: PatternProgram) -> None:
        super().__init__(prog.problem, prog.table, prog.costs, prog.classes, prog.columns)
        self.columns: list[Column] = list(prog.columns)
        self.rows: dict[AggKey, int] = {}

    def coefficient(self, key: AggKey, col: Column) -> float:
        """Coefficient of ``col``'s count variable in the aggregate ``key``."""
        kind, cls, what = key
        if col.cls != cls:
            return 0.0
        if kind == "gpus":
            return float(col.gpus_per_use) if col.clock_mhz == what else 0.0
        if kind == "held":
            units = {int(self.table.unit[o]) for o in col.ops}
            return 1.0 if what in units else 0.0
        return 1.0 if what in col.ops else 0.0

    def column_added(self, col: Column, z_var: int) -> None:
        self.columns.append(col)
        for key, row in self.rows.items():
            coef = self.coefficient(key, col)
            if coef:
                self.mp.entries.append((row, z_var, coef))

    def ensure_row(self, key: AggKey) -> int:
        """The row of aggregate ``key`` (added free, lower and upper bound infinite)."""
        if key in self.rows:
            return self.rows[key]
        mp = self.mp
        row = mp.row(-np.inf, np.inf)
        cols: list[int] = []
        coefs: list[float] = []
        for j, col in enumerate(self.columns):
            coef = self.coefficient(key, col)
            if coef:
                z = mp.z_var[j]
                mp.entries.append((row, z, coef))
                cols.append(z)
                coefs.append(coef)
        self.lp.add_row(
            -np.inf,
            np.inf,
            np.asarray(cols, dtype=np.int32),
            np.asarray(coefs, dtype=np.float64),
        )
        self.rows[key] = row
        return row

    def set_node(self, bounds: Bounds) -> None:
        """Restrict the aggregates of ``bounds``; every other branching row is free."""
        for key in bounds:
            self.ensure_row(key)
        for key, row in self.rows.items():
            lo, hi = bounds.get(key, (-np.inf, np.inf))
            self.lp.change_row_bounds(row, lo, hi)

    def reset_counts(self) -> None:
        """Every count variable back to its master bounds (after a dive fixed some)."""
        for z in self.mp.z_var:
            self.set_count_bounds(z, self.mp.lo[z], self.mp.hi[z])

    def solve(self) -> LpSolution:
        """Re-solve (warm); prices include the branching rows'. NodeInfeasible when the
        LP has no feasible point, BackendFailure when it ends otherwise unsolved."""
        out = self.lp.solve()
        if not out.optimal:
            if "infeasible" in out.status.lower():
                raise NodeInfeasible(f"node LP: {out.status}")
            raise BackendFailure(f"node LP: {out.status}")
        sol = read_lp_solution(
            self.mp, out.col_value, out.row_dual, out.objective, len(self.classes)
        )
        if not self.rows:
            return sol
        y = out.row_dual
        gpus_at: dict[tuple[int, int], float] = {}
        held: dict[int, np.ndarray] = {}
        for (kind, cls, what), row in self.rows.items():
            price = float(y[row])
            if price == 0.0:
                continue
            if kind == "gpus":
                gpus_at[(cls, what)] = gpus_at.get((cls, what), 0.0) + price
                continue
            arr = held.setdefault(cls, np.zeros(len(self.table)))
            if kind == "held":
                arr[self.table.unit == what] += price
            else:
                arr[what] += price
        return replace(sol, duals=replace(sol.duals, gpus_at=gpus_at, held=held))

    def aggregates(self, x: np.ndarray) -> dict[AggKey, float]:
        """Every aggregate with a positive value at the LP values ``x``."""
        out: dict[AggKey, float] = {}
        z_idx = np.asarray(self.mp.z_var, dtype=np.int64)
        z = x[z_idx]
        for j in np.flatnonzero(z > 1e-9):
            col = self.columns[int(j)]
            v = float(z[j])
            gk: AggKey = ("gpus", col.cls, col.clock_mhz)
            out[gk] = out.get(gk, 0.0) + col.gpus_per_use * v
            for u in sorted({int(self.table.unit[o]) for o in col.ops}):
                hk: AggKey = ("held", col.cls, u)
                out[hk] = out.get(hk, 0.0) + v
            for o in col.ops:
                ok: AggKey = ("op", col.cls, int(o))
                out[ok] = out.get(ok, 0.0) + v
        return out
