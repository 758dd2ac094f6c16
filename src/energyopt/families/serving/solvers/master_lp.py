"""The configuration master's LP relaxation, kept in one HiGHS instance while column
generation adds columns and the LP dive fixes counts, so that each re-solve starts
from the previous optimal basis (the model is ``formulations.serving.master``)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

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
        # One call for the new variables, one for the new rows: a call per column
        # and per row cost HiGHS a copy of its matrix each (0.7 ms a row on the
        # 25,600-GPU master, where a round adds thousands).
        var_terms = [new.by_var.get(v, []) for v in range(n_var, len(mp.cost))]
        self.lp.add_cols(
            np.asarray(mp.cost[n_var:], dtype=np.float64),
            np.asarray(mp.lo[n_var:], dtype=np.float64),
            np.asarray(mp.hi[n_var:], dtype=np.float64),
            *_compressed(var_terms),
        )
        row_terms = [new.by_row.get(r, []) for r in range(n_row, len(mp.row_lo))]
        self.lp.add_rows(
            np.asarray(mp.row_lo[n_row:], dtype=np.float64),
            np.asarray(mp.row_hi[n_row:], dtype=np.float64),
            *_compressed(row_terms),
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


def _compressed(
    terms: list[list[tuple[int, float]]],
) -> tuple[NDArray[np.int32], NDArray[np.int32], NDArray[np.float64]]:
    """(starts with the end appended, indices, values) of sparse vectors given as
    (index, value) lists, for ``WarmLp.add_cols`` / ``add_rows``."""
    lengths = np.fromiter((len(t) for t in terms), dtype=np.int64, count=len(terms))
    starts = np.zeros(len(terms) + 1, dtype=np.int32)
    np.cumsum(lengths, out=starts[1:])
    flat = [entry for t in terms for entry in t]
    index = np.fromiter((e[0] for e in flat), dtype=np.int32, count=len(flat))
    value = np.fromiter((e[1] for e in flat), dtype=np.float64, count=len(flat))
    return starts, index, value
