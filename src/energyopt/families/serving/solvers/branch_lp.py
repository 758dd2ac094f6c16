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
the others. Cut rows (``add_cut``) hold in every node: sum_o a_o y_o >= b, where y_o
is the number of configurations (over all classes) that hold op o; their prices
are per-item bonuses too.

Each branching and cut row has an artificial slack (cost ``ARTIFICIAL_COST`` per
unit) on its lower side, as the demand rows have: the LP over the columns generated
so far is then always feasible, and a node that only columns not generated yet could
satisfy is not mistaken for an infeasible one (its bound carries the slack's cost
until pricing finds them). Objective values are the instance's objective units (W
for power).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from energyopt.families.serving.formulations.columns import Column
from energyopt.families.serving.formulations.master import (
    ARTIFICIAL_COST,
    LpSolution,
    read_lp_solution,
)
from energyopt.families.serving.formulations.pattern import PatternProgram
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.formulations.errors import BackendFailure

AggKey = tuple[Literal["gpus", "held", "op"], int, int]
"""(kind, class, clock / unit / op) of a branching aggregate (see the module docstring)."""
Bounds = dict[AggKey, tuple[float, float]]
"""The branching restrictions of one node: aggregate -> (lower, upper) bound."""


class BranchLp(LpSession):
    """The master LP (with artificials) over the program's growing column set, with
    branching rows whose bounds change from node to node."""

    def __init__(self, prog: PatternProgram) -> None:
        super().__init__(prog.problem, prog.table, prog.costs, prog.classes, prog.columns)
        self.columns: list[Column] = list(prog.columns)
        self.rows: dict[AggKey, int] = {}
        self.cuts: list[tuple[int, NDArray[np.float64]]] = []
        """(row, coefficient per op) of each cut row."""
        self.slacks: list[int] = []
        """The artificial slack variable of every branching and cut row."""

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
        for row, per_op in self.cuts:
            coef = float(per_op[list(col.ops)].sum())
            if coef:
                self.mp.entries.append((row, z_var, coef))

    def _add_row(self, lo: float, coefficient: Callable[[Column], float]) -> int:
        """A row lo <= sum_j coefficient(column j) z_j with an artificial slack."""
        mp = self.mp
        row = mp.row(lo, np.inf)
        cols: list[int] = []
        coefs: list[float] = []
        for j, col in enumerate(self.columns):
            coef = coefficient(col)
            if coef:
                z = mp.z_var[j]
                mp.entries.append((row, z, coef))
                cols.append(z)
                coefs.append(coef)
        self.lp.add_row(
            lo, np.inf, np.asarray(cols, dtype=np.int32), np.asarray(coefs, dtype=np.float64)
        )
        slack = mp.var(ARTIFICIAL_COST, 0.0, np.inf)
        mp.entries.append((row, slack, 1.0))
        self.lp.add_col(
            ARTIFICIAL_COST,
            0.0,
            np.inf,
            np.asarray([row], dtype=np.int32),
            np.asarray([1.0], dtype=np.float64),
        )
        self.slacks.append(slack)
        return row

    def ensure_row(self, key: AggKey) -> int:
        """The row of aggregate ``key`` (added free, lower and upper bound infinite)."""
        if key not in self.rows:
            self.rows[key] = self._add_row(-np.inf, lambda col: self.coefficient(key, col))
        return self.rows[key]

    def add_cut(self, per_op: NDArray[np.float64], lo: float) -> None:
        """Add the cut sum_o per_op[o] y_o >= lo (y_o: configurations holding op o)."""
        row = self._add_row(lo, lambda col: float(per_op[list(col.ops)].sum()))
        self.cuts.append((row, per_op))

    def slack(self, x: NDArray[np.float64]) -> float:
        """Total artificial slack of the branching and cut rows at LP values ``x``."""
        return float(x[self.slacks].sum()) if self.slacks else 0.0

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
        """Re-solve (warm); prices include the branching and cut rows'. BackendFailure
        unless optimal (the slacks keep the LP feasible)."""
        out = self.lp.solve()
        if not out.optimal:
            raise BackendFailure(f"node LP: {out.status}")
        sol = read_lp_solution(
            self.mp, out.col_value, out.row_dual, out.objective, len(self.classes)
        )
        if not self.rows and not self.cuts:
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
        for row, per_op in self.cuts:
            price = float(y[row])
            if price != 0.0:
                for cls in range(len(self.classes)):
                    arr = held.setdefault(cls, np.zeros(len(self.table)))
                    arr += price * per_op
        return replace(sol, duals=replace(sol.duals, gpus_at=gpus_at, held=held))

    def integer_values(self, x: NDArray[np.float64]) -> NDArray[np.float64]:
        """Values of the integer master over the same columns (``pattern.integer_model``:
        per column its count, rounded, then its rates) at tree LP values ``x``."""
        mp = self.mp
        idx: list[int] = []
        counts: list[int] = []
        for j in range(len(self.columns)):
            counts.append(len(idx))
            idx.append(mp.z_var[j])
            idx.extend(mp.r_vars[j])
        values = np.array(x[np.asarray(idx, dtype=np.int64)], dtype=np.float64)
        values[counts] = np.round(values[counts])
        return values

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
