"""Solve a Pyomo MILP with HiGHS: status, incumbent, best bound, log lines.

The model goes to HiGHS as matrices: Pyomo's standard-form compiler turns it into a
sparse matrix in 3 s on the 72,320-column per-GPU model of fleet-64, where Pyomo's
own HiGHS interface, which adds rows one by one, had not handed it over after
100 s on a loaded 2-core machine, and a 60-s solve ended with no plan.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass, field
from typing import Any

import highspy
import numpy as np
import pyomo.environ as pyo
from pyomo.common.errors import InfeasibleConstraintException
from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

from energyopt.backends.highs import mixed_lp, quiet_highs
from energyopt.progress import Progress


class _LineStream(io.TextIOBase):
    """A text stream that hands each complete line to a callback and keeps it."""

    def __init__(self, sink: Progress | None) -> None:
        self.lines: list[str] = []
        self._buf = ""
        self._sink = sink

    def close(self) -> None:  # the solver closes its streams; keep collecting
        return None

    @property
    def closed(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.lines.append(line)
            if self._sink is not None:
                self._sink(line)
        return len(text)


@dataclass
class MilpOutcome:
    """What HiGHS reports for one model (objective in the model's own units)."""

    status: str  # optimal | feasible | infeasible | no_solution
    objective: float | None
    bound: float | None
    wall_s: float
    log: list[str] = field(default_factory=list)
    time_limited: bool = False
    """HiGHS stopped at its time limit (a rerun on a busier machine may differ)."""


def solve_milp(
    model: Any,
    *,
    time_limit_s: float | None = None,
    rel_gap: float = 1e-4,
    threads: int | None = None,
    options: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> MilpOutcome:
    """Run HiGHS on ``model`` (one active objective, linear); loads the best solution
    into the model's variables when there is one. ``time_limit_s`` (s) covers the
    model's translation as well as HiGHS' run; ``options`` are HiGHS options."""
    start = time.perf_counter()
    stream = _LineStream(progress)
    # HiGHS fixes its thread pool at the first solve of the process: a later
    # "threads" option makes the run fail, so ``threads`` is not passed on.
    del threads
    try:
        form = LinearStandardFormCompiler().write(model, mixed_form=True)
    except InfeasibleConstraintException as exc:
        stream.write(f"infeasible before the solve: {exc}\n")
        return MilpOutcome("infeasible", None, None, time.perf_counter() - start, stream.lines)
    h = quiet_highs()
    h.setOptionValue("output_flag", True)
    h.setOptionValue("log_to_console", False)

    def log(event: Any) -> None:
        stream.write(event.message)

    h.cbLogging.subscribe(log)
    h.setOptionValue("mip_rel_gap", rel_gap)
    for key, val in (options or {}).items():
        h.setOptionValue(key, val)
    if time_limit_s is not None:
        h.setOptionValue("time_limit", max(0.1, time_limit_s - (time.perf_counter() - start)))
    lp, integer = _as_highs(form)
    if lp.num_col_ == 0:
        # Every row was constant and met (the compiler drops those and refuses a
        # model with one that fails): any value within the bounds is optimal.
        _load(model, [], np.zeros(0))
        value = float(pyo.value(form.objectives[0]))
        return MilpOutcome("optimal", value, value, time.perf_counter() - start)
    h.passModel(lp)
    h.run()
    stream.write("\n")
    wall = time.perf_counter() - start
    info = h.getInfo()
    model_status = h.getModelStatus()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if model_status in (
        highspy.HighsModelStatus.kInfeasible,
        highspy.HighsModelStatus.kUnboundedOrInfeasible,
    ):
        status = "infeasible"
    elif not has_solution:
        status = "no_solution"
    elif model_status == highspy.HighsModelStatus.kOptimal:
        status = "optimal"
    else:
        status = "feasible"
    objective: float | None = None
    if has_solution:
        _load(model, form.columns, np.asarray(h.getSolution().col_value))
        objective = float(pyo.value(form.objectives[0]))
    bound: float | None = None
    if integer and np.isfinite(info.mip_dual_bound):
        bound = float(info.mip_dual_bound) + float(form.c_offset[0])
    elif not integer and status == "optimal":
        bound = float(info.objective_function_value) + float(form.c_offset[0])
    if bound is not None and form.objectives[0].sense == pyo.maximize:
        bound = -bound
    if status == "infeasible" and (options or {}).get("presolve") != "off":
        # HiGHS 1.16's presolve has declared feasible MILPs infeasible (x = 0 met
        # every row of a 5-column model, tests/test_cpsat_backend.py): a claim of
        # infeasibility is only taken once HiGHS repeats it without presolve.
        left = None if time_limit_s is None else max(time_limit_s - wall, 0.0)
        again = solve_milp(
            model,
            time_limit_s=left,
            rel_gap=rel_gap,
            options={**(options or {}), "presolve": "off"},
            progress=progress,
        )
        note = "HiGHS said infeasible after presolve; solved again without presolve"
        return MilpOutcome(
            again.status,
            again.objective,
            again.bound,
            wall + again.wall_s,
            [*stream.lines, note, *again.log],
            again.time_limited,
        )
    return MilpOutcome(
        status,
        objective,
        bound,
        wall,
        stream.lines,
        model_status == highspy.HighsModelStatus.kTimeLimit,
    )


def _as_highs(form: Any) -> tuple[highspy.HighsLp, bool]:
    """The compiled standard form as a HiGHS model (minimising; Pyomo's compiler
    negates a maximised objective), and whether it has integer columns."""
    columns = form.columns
    senses = np.array([row.bound_type for row in form.rows], dtype=np.int64)
    rhs = np.asarray(form.rhs, dtype=np.float64)
    integer = np.array([v.is_integer() for v in columns], dtype=np.bool_)
    lp = mixed_lp(
        np.asarray(form.c[[0], :].toarray()).ravel() if columns else np.zeros(0),
        form.A,
        np.where(senses == 1, -np.inf, rhs),
        np.where(senses == -1, np.inf, rhs),
        np.array([-np.inf if v.lb is None else float(v.lb) for v in columns]),
        np.array([np.inf if v.ub is None else float(v.ub) for v in columns]),
        integer,
    )
    return lp, bool(integer.any())


def _load(model: Any, columns: list[Any], values: np.ndarray) -> None:
    """Set the model's variables to a solution: the compiled columns to ``values``,
    every other free variable (one no row or objective reads) to the value in its
    bounds nearest 0 (integral for an integer variable)."""
    for var, x in zip(columns, values, strict=True):
        var.set_value(float(x), skip_validation=True)
    seen = {id(v) for v in columns}
    for var in model.component_data_objects(pyo.Var, descend_into=True):
        if id(var) in seen or var.fixed:
            continue
        lo = -math.inf if var.lb is None else float(var.lb)
        hi = math.inf if var.ub is None else float(var.ub)
        if var.is_integer():
            lo, hi = (
                math.ceil(lo) if lo > -math.inf else lo,
                math.floor(hi) if hi < math.inf else hi,
            )
        var.set_value(float(min(max(0.0, lo), hi)), skip_validation=True)
