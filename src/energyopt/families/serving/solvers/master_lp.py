"""The configuration master's LP relaxation, kept in one HiGHS instance while column
generation adds columns and the LP dive fixes counts, so that each re-solve starts
from the previous optimal basis (the model is ``formulations.serving.master``)."""

from __future__ import annotations

import numpy as np

from energyopt.backends.highs import WarmLp
from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import Column
from energyopt.families.serving.formulations.costs import Costs
from energyopt.families.serving.formulations.master import (
    LpSolution,
    add_column,
    appended_since,
    build_master,
    read_lp_solution,
    to_highs_lp,
)
from energyopt.formulations.errors import BackendFailure
from energyopt.perf.oppoints import OpTable


class LpSession:
    """The master LP (with artificials) over a growing column set, in one HiGHS
    instance. Objective values are the instance's objective units (W for power)."""

    def __init__(
        self,
        problem: Problem,
        table: OpTable,
        costs: Costs,
        classes: list[GpuClass],
        columns: list[Column],
    ) -> None:
        self.table = table
        self.costs = costs
        self.classes = classes
        self.mp = build_master(problem, table, costs, classes, columns, artificials=True)
        self.lp = WarmLp(to_highs_lp(self.mp, integer=False))

    def add(self, columns: list[Column]) -> None:
        """Append columns to the master and to the LP held by HiGHS."""
        mp = self.mp
        n_var, n_row, n_ent = len(mp.cost), len(mp.row_lo), len(mp.entries)
        for col in columns:
            add_column(mp, self.table, self.costs, self.classes, col)
            self.column_added(col, mp.z_var[-1])
        if len(mp.cost) == n_var:
            return
        new = appended_since(mp, n_var, n_row, n_ent)
        for v in range(n_var, len(mp.cost)):
            terms = new.by_var.get(v, [])
            self.lp.add_col(
                mp.cost[v],
                mp.lo[v],
                mp.hi[v],
                np.asarray([t[0] for t in terms], dtype=np.int32),
                np.asarray([t[1] for t in terms], dtype=np.float64),
            )
        for r in range(n_row, len(mp.row_lo)):
            terms = new.by_row.get(r, [])
            self.lp.add_row(
                mp.row_lo[r],
                mp.row_hi[r],
                np.asarray([t[0] for t in terms], dtype=np.int32),
                np.asarray([t[1] for t in terms], dtype=np.float64),
            )

    def column_added(self, col: Column, z_var: int) -> None:
        """Called after ``col`` (count variable ``z_var``) joins the master, before it
        is passed to HiGHS: a subclass may append the column's entries in rows of its
        own (``self.mp.entries``)."""
        del col, z_var

    def set_count_bounds(self, var: int, lo: float, hi: float) -> None:
        """Bounds of master variable ``var`` (a column's count) in the LP from now on."""
        self.lp.change_col_bounds(var, lo, hi)

    def solve(self) -> LpSolution:
        """Re-solve (warm) and read values and prices; BackendFailure unless optimal."""
        out = self.lp.solve()
        if not out.optimal:
            raise BackendFailure(f"master LP: {out.status}")
        return read_lp_solution(
            self.mp, out.col_value, out.row_dual, out.objective, len(self.classes)
        )
