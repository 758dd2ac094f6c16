"""Solve a linear Pyomo model with OR-Tools CP-SAT.

CP-SAT needs integers, so continuous variables are expressed in steps of
``resolution`` and every row is scaled and rounded conservatively (<= rows round
coefficients up and the right-hand side down, >= rows the reverse; equality rows
become >= rows). CP-SAT so chooses every integer decision; the continuous values
are then recomputed exactly by an LP (HiGHS) with those decisions fixed, which is
feasible because lowering rates from CP-SAT's only loosens the rows that hold
them. CP-SAT's own bound is for the discretized model: it is logged, never
reported as a bound of the exact one, and an infeasible discretized model is
reported as "no solution", not as a proof of infeasibility.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pyomo.environ as pyo
from ortools.sat.python import cp_model
from pyomo.repn import generate_standard_repn

from energyopt.progress import Progress
from energyopt.solvers.highs_backend import MilpOutcome, solve_milp

ROW_SCALE = 1e6
MAX_COEF = 1e12
OBJ_RESOLUTION = 1e3
MAX_OBJ_COEF = 1e9
MAX_INT = 2**31


def solve_cpsat(
    model: Any,
    *,
    time_limit_s: float | None = None,
    rel_gap: float = 1e-4,
    threads: int | None = None,
    resolution: float = 1e-4,
    progress: Progress | None = None,
) -> MilpOutcome:
    """Run CP-SAT on ``model``; loads the solution into the Pyomo variables."""
    start = time.perf_counter()
    cp = cp_model.CpModel()
    step: dict[int, float] = {}
    ints: dict[int, Any] = {}
    pyvars: dict[int, Any] = {}
    for var in model.component_data_objects(pyo.Var, active=True):
        if var.fixed:
            continue
        integral = var.is_integer() or var.is_binary()
        delta = 1.0 if integral else resolution
        if var.lb is None or var.ub is None:
            raise CpSatModelError(
                f"variable {var.name} has no finite bounds: the formulation must bound "
                "every variable for CP-SAT"
            )
        lb = math.ceil(var.lb / delta - 1e-9)
        ub = math.floor(var.ub / delta + 1e-9)
        if ub > MAX_INT:
            raise CpSatModelError(
                f"variable {var.name} ranges up to {var.ub:g}, more than CP-SAT's "
                f"integers hold in steps of {delta:g}"
            )
        ints[id(var)] = cp.new_int_var(int(lb), int(ub), var.name)
        step[id(var)] = delta
        pyvars[id(var)] = var
    for con in model.component_data_objects(pyo.Constraint, active=True):
        repn = generate_standard_repn(con.body)
        if not repn.is_linear():
            raise ValueError(f"constraint {con.name} is not linear")
        const = float(repn.constant)
        terms = [
            (id(v), float(c)) for v, c in zip(repn.linear_vars, repn.linear_coefs, strict=True)
        ]
        if con.has_ub():
            _add_row(
                cp,
                ints,
                step,
                terms,
                float(pyo.value(con.upper)) - const,
                upper=True,
                equal=con.equality,
            )
        if con.has_lb() and not con.equality:
            _add_row(
                cp, ints, step, terms, float(pyo.value(con.lower)) - const, upper=False, equal=False
            )
    obj = next(model.component_data_objects(pyo.Objective, active=True))
    orepn = generate_standard_repn(obj.expr)
    pairs = [
        (id(v), float(c) * step[id(v)])
        for v, c in zip(orepn.linear_vars, orepn.linear_coefs, strict=True)
        if c != 0
    ]
    smallest = min((abs(c) for _, c in pairs), default=1.0)
    biggest = max((abs(c) for _, c in pairs), default=1.0)
    obj_scale = min(OBJ_RESOLUTION / smallest, MAX_OBJ_COEF / biggest)
    cp.minimize(sum(round(c * obj_scale) * ints[k] for k, c in pairs))
    solver = cp_model.CpSolver()
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(0.1, time_limit_s)
    solver.parameters.relative_gap_limit = rel_gap
    solver.parameters.num_workers = threads or 2
    log: list[str] = []

    class _Cb(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            line = (
                f"cp-sat incumbent {self.ObjectiveValue() / obj_scale:,.3f} "
                f"bound {self.BestObjectiveBound() / obj_scale:,.3f} at {self.WallTime():.1f}s"
            )
            log.append(line)
            if progress is not None:
                progress(line)

    invalid = cp.validate()
    if invalid:
        raise CpSatModelError(f"CP-SAT rejects the model: {invalid}")
    code = solver.Solve(cp, _Cb())
    if code == cp_model.MODEL_INVALID:
        raise CpSatModelError("CP-SAT rejects the model as invalid")
    wall = time.perf_counter() - start
    log.append(
        f"cp-sat status {solver.StatusName(code)}; discretized bound "
        f"{solver.BestObjectiveBound() / obj_scale:,.3f}"
    )
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return MilpOutcome("no_solution", None, None, wall, log)
    for key, var in pyvars.items():
        var.set_value(solver.Value(ints[key]) * step[key], skip_validation=True)
    if not _polish(model, log):
        return MilpOutcome("no_solution", None, None, time.perf_counter() - start, log)
    objective = float(pyo.value(obj.expr))
    return MilpOutcome("feasible", objective, None, time.perf_counter() - start, log)


class CpSatModelError(RuntimeError):
    """The model handed to CP-SAT is malformed (a bug in the formulation, not a
    property of the instance); never reported as "no solution"."""


def _polish(model: Any, log: list[str]) -> bool:
    """Fix the integer decisions and recompute the continuous values exactly (LP)."""
    fixed = [
        v
        for v in model.component_data_objects(pyo.Var, active=True)
        if not v.fixed and (v.is_integer() or v.is_binary())
    ]
    for v in fixed:
        v.fix(round(float(v.value)))
    try:
        out = solve_milp(model, time_limit_s=60.0)
    finally:
        for v in fixed:
            v.unfix()
    log.append(f"rates recomputed by LP with the integer decisions fixed: {out.status}")
    return out.objective is not None


def _add_row(
    cp: cp_model.CpModel,
    ints: dict[int, Any],
    step: dict[int, float],
    terms: list[tuple[int, float]],
    rhs: float,
    *,
    upper: bool,
    equal: bool,
) -> None:
    """Add sum coef*x (<=, >=, ==) rhs, rounded so integer solutions stay feasible."""
    scaled = [(k, c * step[k]) for k, c in terms if c != 0.0]
    if not scaled:
        return
    biggest = max(abs(c) for _, c in scaled)
    smallest = min(abs(c) for _, c in scaled)
    integral = all(abs(c - round(c)) < 1e-9 for _, c in scaled)
    scale = 1.0 if integral else min(ROW_SCALE / smallest, MAX_COEF / biggest)
    if equal:
        if integral and all(step[k] == 1.0 for k, _ in scaled) and abs(rhs - round(rhs)) < 1e-9:
            cp.add(sum(round(c) * ints[k] for k, c in scaled) == round(rhs))
        else:
            _add_row(cp, ints, step, terms, rhs, upper=False, equal=False)
        return
    if upper:
        expr = sum(math.ceil(c * scale - 1e-12) * ints[k] for k, c in scaled)
        cp.add(expr <= math.floor(rhs * scale + 1e-9))
    else:
        expr = sum(math.floor(c * scale + 1e-12) * ints[k] for k, c in scaled)
        cp.add(expr >= math.ceil(rhs * scale - 1e-9))
