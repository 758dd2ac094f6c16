"""The process's HiGHS: silent instances, the thread-pool rule, and the runs the
solvers share (an LP kept warm while it grows, a MIP solved to its bound).

HiGHS prints a banner to fd 1 on its first instance in a process, and fixes its
thread pool at its first run (changing ``threads`` afterwards breaks every solve).
Every HiGHS instance of energyopt is made here, so that state has one owner.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import highspy
import numpy as np
from numpy.typing import NDArray

_BANNER_SHOWN = False

_new_highs: Callable[[], highspy.Highs] = highspy.Highs
"""``highspy.Highs`` with a typed signature (its ``__init__`` is unannotated)."""


def highs_started() -> bool:
    """Whether this process has created a HiGHS instance (through ``quiet_highs``)."""
    return _BANNER_SHOWN


def quiet_highs() -> highspy.Highs:
    """A silent HiGHS instance (the first one per process prints a banner to fd 1)."""
    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = _new_highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, 1)
            h = _new_highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(devnull)
        _BANNER_SHOWN = True
    h.setOptionValue("output_flag", False)
    return h


def single_threaded_highs() -> None:
    """Fix HiGHS' process-wide thread pool at one thread (for worker processes that
    run in parallel already); it must be the first HiGHS run of the process."""
    h = quiet_highs()
    h.setOptionValue("threads", 1)
    h.addVars(1, np.zeros(1), np.ones(1))
    h.run()


def mixed_lp(
    cost: NDArray[np.float64],
    matrix: Any,
    row_lo: NDArray[np.float64],
    row_hi: NDArray[np.float64],
    col_lo: NDArray[np.float64],
    col_hi: NDArray[np.float64],
    integer: NDArray[np.bool_],
) -> highspy.HighsLp:
    """A mixed-integer program min cost.x, row_lo <= matrix x <= row_hi, col_lo <= x
    <= col_hi, x_j integer where ``integer[j]``, as a HiGHS model (``matrix`` a scipy
    CSC matrix, one column per variable; numpy's infinities for no bound)."""
    lp = highspy.HighsLp()
    n = len(cost)
    lp.num_col_ = n
    lp.num_row_ = matrix.shape[0]
    lp.col_cost_ = np.asarray(cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(col_lo, dtype=np.float64)
    lp.col_upper_ = np.asarray(col_hi, dtype=np.float64)
    lp.row_lower_ = np.asarray(row_lo, dtype=np.float64)
    lp.row_upper_ = np.asarray(row_hi, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = matrix.data.astype(np.float64)
    lp.integrality_ = [
        highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in integer
    ]
    return lp


def binary_lp(
    cost: NDArray[np.float64],
    matrix: Any,
    row_lo: NDArray[np.float64],
    row_hi: NDArray[np.float64],
) -> highspy.HighsLp:
    """A 0/1 program min cost.x, row_lo <= matrix x <= row_hi as a HiGHS model
    (``matrix`` a scipy CSC matrix, one column per variable)."""
    n = len(cost)
    return mixed_lp(
        cost, matrix, row_lo, row_hi, np.zeros(n), np.ones(n), np.ones(n, dtype=np.bool_)
    )


@dataclass(frozen=True)
class LpValues:
    """One LP run: HiGHS' model status, and when it is optimal the column values,
    the row duals (HiGHS convention d = c - A'y) and the objective (offset included)."""

    optimal: bool
    status: str
    col_value: NDArray[np.float64]
    row_dual: NDArray[np.float64]
    objective: float


class WarmLp:
    """An LP held in one HiGHS instance while columns, rows and bounds change, so that
    each re-solve starts from the previous optimal basis."""

    def __init__(self, lp: highspy.HighsLp) -> None:
        self._h = quiet_highs()
        self._h.passModel(lp)

    def add_col(
        self,
        cost: float,
        lo: float,
        hi: float,
        rows: NDArray[np.int32],
        coefs: NDArray[np.float64],
    ) -> None:
        """Append a column with entries ``coefs`` in ``rows`` (infinite bounds allowed)."""
        self._h.addCol(cost, _finite_or_inf(lo), _finite_or_inf(hi), len(rows), rows, coefs)

    def add_row(
        self,
        lo: float,
        hi: float,
        cols: NDArray[np.int32],
        coefs: NDArray[np.float64],
    ) -> None:
        """Append a row lo <= coefs . x[cols] <= hi (infinite sides allowed)."""
        self._h.addRow(_finite_or_inf(lo), _finite_or_inf(hi), len(cols), cols, coefs)

    def add_cols(
        self,
        cost: NDArray[np.float64],
        lo: NDArray[np.float64],
        hi: NDArray[np.float64],
        starts: NDArray[np.int32],
        rows: NDArray[np.int32],
        coefs: NDArray[np.float64],
    ) -> None:
        """Append columns in one call: column j has entries ``coefs[starts[j]:starts[j+1]]``
        in rows ``rows[...]`` (``starts`` has one entry per column plus the end;
        infinite bounds allowed). One call per column cost about 0.7 ms each on a
        master of 25,600 GPUs, where HiGHS grows its matrix once per call."""
        n = len(cost)
        if n == 0:
            return
        self._h.addCols(
            n,
            np.asarray(cost, dtype=np.float64),
            _inf_array(lo),
            _inf_array(hi),
            int(starts[-1]),
            starts[:-1],
            rows,
            coefs,
        )

    def add_rows(
        self,
        lo: NDArray[np.float64],
        hi: NDArray[np.float64],
        starts: NDArray[np.int32],
        cols: NDArray[np.int32],
        coefs: NDArray[np.float64],
    ) -> None:
        """Append rows ``lo <= coefs . x[cols] <= hi`` in one call: row i has entries
        ``starts[i]:starts[i+1]`` (``starts`` has one entry per row plus the end;
        infinite sides allowed)."""
        n = len(lo)
        if n == 0:
            return
        self._h.addRows(
            n, _inf_array(lo), _inf_array(hi), int(starts[-1]), starts[:-1], cols, coefs
        )

    def change_col_bounds(self, col: int, lo: float, hi: float) -> None:
        """New bounds of column ``col``; they stay until changed again."""
        self._h.changeColBounds(col, lo, hi)

    def change_row_bounds(self, row: int, lo: float, hi: float) -> None:
        """New bounds of row ``row`` (infinite sides allowed); they stay until changed."""
        self._h.changeRowBounds(row, _finite_or_inf(lo), _finite_or_inf(hi))

    def solve(self) -> LpValues:
        """Run HiGHS (warm) and read the solution when it is optimal."""
        h = self._h
        h.run()
        status = h.getModelStatus()
        words = h.modelStatusToString(status)
        if status != highspy.HighsModelStatus.kOptimal:
            empty = np.zeros(0)
            return LpValues(False, words, empty, empty, float("nan"))
        sol = h.getSolution()
        return LpValues(
            True,
            words,
            np.asarray(sol.col_value),
            np.asarray(sol.row_dual),
            float(h.getInfo().objective_function_value),
        )


def _inf_array(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """Bounds ``values`` as float64 with numpy's infinities as HiGHS' own."""
    out = np.asarray(values, dtype=np.float64).copy()
    out[out == np.inf] = highspy.kHighsInf
    out[out == -np.inf] = -highspy.kHighsInf
    return out


def _finite_or_inf(value: float) -> float:
    """``value`` with numpy's infinities as HiGHS' own."""
    if value == np.inf:
        return float(highspy.kHighsInf)
    if value == -np.inf:
        return -float(highspy.kHighsInf)
    return value


class MipStatus(StrEnum):
    """How a MIP (or LP) run ended, in the terms the solvers act on."""

    OPTIMAL = "optimal"
    """Solved: optimal within the requested gap."""
    INFEASIBLE = "infeasible"
    """Proven: the model has no feasible point."""
    CUT_OFF = "cut_off"
    """Proven: no feasible point is better than the ``objective_bound`` cutoff."""
    OTHER = "other"
    """Anything else (time limit, unbounded-or-infeasible, error): nothing proven."""


_MIP_STATUS = {
    highspy.HighsModelStatus.kOptimal: MipStatus.OPTIMAL,
    highspy.HighsModelStatus.kInfeasible: MipStatus.INFEASIBLE,
    highspy.HighsModelStatus.kObjectiveBound: MipStatus.CUT_OFF,
}


@dataclass(frozen=True)
class MipRun:
    """One MIP run: whether HiGHS proved optimality (within its gap), the incumbent's
    objective (nan without one) and HiGHS' dual bound (-inf without one); for a model
    without integer columns (an LP) the bound is HiGHS' objective value, the LP optimum
    when ``status`` is OPTIMAL. ``status`` says how the run ended, ``highs_status`` in
    HiGHS' words (for logs); ``col_value`` is the incumbent's column values, None
    without one; ``time_limited`` whether the time limit (not an effort limit or a
    proof) ended it."""

    optimal: bool
    objective: float
    dual_bound: float
    status: MipStatus
    highs_status: str
    col_value: NDArray[np.float64] | None
    time_limited: bool = False

    @property
    def has_plan(self) -> bool:
        """Whether HiGHS holds a feasible incumbent (``col_value`` is not None)."""
        return self.col_value is not None


def solve_mip(
    lp: highspy.HighsLp,
    *,
    time_limit_s: float,
    rel_gap: float,
    objective_bound: float | None = None,
    node_limit: int | None = None,
) -> MipRun:
    """Run HiGHS on a mixed-integer model until optimal (relative gap ``rel_gap``) or
    ``time_limit_s`` seconds; with ``objective_bound`` (a finite value in the
    objective's unit) HiGHS stops once no plan can be better than it (``CUT_OFF``);
    with ``node_limit`` it stops after that many branch-and-bound nodes (an effort
    limit: the same model gives the same result on a quiet or a loaded machine).
    A model without integer columns is solved as an LP."""
    h = quiet_highs()
    h.setOptionValue("time_limit", time_limit_s)
    h.setOptionValue("mip_rel_gap", rel_gap)
    if objective_bound is not None:
        h.setOptionValue("objective_bound", float(objective_bound))
    if node_limit is not None:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    h.passModel(lp)
    h.run()
    info = h.getInfo()
    model_status = h.getModelStatus()
    status = _MIP_STATUS.get(model_status, MipStatus.OTHER)
    has_plan = info.primal_solution_status == 2  # kSolutionStatusFeasible
    objective = float(info.objective_function_value) if has_plan else float("nan")
    integer = any(v == highspy.HighsVarType.kInteger for v in lp.integrality_)
    dual_bound = info.mip_dual_bound if integer else info.objective_function_value
    return MipRun(
        status is MipStatus.OPTIMAL,
        objective,
        float(dual_bound),
        status,
        h.modelStatusToString(model_status),
        np.asarray(h.getSolution().col_value) if has_plan else None,
        model_status == highspy.HighsModelStatus.kTimeLimit,
    )
