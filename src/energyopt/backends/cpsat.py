"""OR-Tools CP-SAT: the one place a CP-SAT solver is made (``cp_solver``), and a
linear Pyomo model solved with CP-SAT, with a certified bound.

CP-SAT needs integers, so continuous variables are expressed in steps of
``resolution`` and every row is scaled to integers. Two such models are solved:

* the **restriction** (the plan): rows rounded conservatively (<= rows round
  coefficients up and the right-hand side down, >= rows the reverse; equality
  rows become >= rows), so each of its solutions is feasible for the exact model.
  CP-SAT chooses every integer decision; the continuous values are then
  recomputed exactly by an LP (HiGHS) with those decisions fixed, which is
  feasible because lowering rates from CP-SAT's only loosens the rows that hold
  them. Its bound is for the restriction only and is never reported.
* the **relaxation** (the bound): each continuous value of an exact solution,
  moved to the grid point next to it in the direction that does not raise the
  objective, changes a row by at most ``|coefficient| x resolution``; the rows
  are widened by that much, coefficients rounded towards the side that only
  loosens them (variables are non-negative) and the right-hand sides outwards,
  the objective's coefficients rounded down. Every exact solution so maps to a
  solution of the relaxation costing no more, so CP-SAT's proven bound on it is
  a lower bound of the exact optimum, and a relaxation proven infeasible proves
  the exact model infeasible.

The restriction gets up to ``PLAN_SHARE`` of the time limit and the relaxation
the rest (at least ``MIN_BOUND_S``). An infeasible restriction with a feasible
(or unsolved) relaxation is "no solution", not a proof of infeasibility.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pyomo.environ as pyo
from ortools.sat.python import cp_model
from pyomo.repn import generate_standard_repn

from energyopt.backends.pyomo_highs import MilpOutcome, solve_milp
from energyopt.progress import Progress
from energyopt.spec.errors import SolverError

ROW_SCALE = 1e6
MAX_COEF = 1e12
OBJ_RESOLUTION = 1e3
MAX_OBJ_COEF = 1e9
MAX_INT = 2**31
MAX_EXACT_OBJECTIVE = 2.0**52
"""The relaxation's scaled objective stays below this over every variable's range,
so CP-SAT's integer bound converts back to the model's units without loss."""
PLAN_SHARE = 0.7
"""Share of the time limit for the restriction (the plan); the relaxation gets the rest."""
MIN_BOUND_S = 0.2
"""Least time given to the relaxation (s), even when the restriction used its share."""


def solve_cpsat(
    model: Any,
    *,
    time_limit_s: float | None = None,
    rel_gap: float = 1e-4,
    threads: int | None = None,
    resolution: float = 1e-4,
    bound_resolution: float = 1e-6,
    progress: Progress | None = None,
    bound: bool = True,
) -> MilpOutcome:
    """Run CP-SAT on ``model``; loads the solution into the Pyomo variables.

    ``resolution`` and ``bound_resolution`` are the steps of continuous variables
    in the restriction and the relaxation (model units; the relaxation's bound
    loses about ``bound_resolution`` x the coefficients of each row). The
    outcome's objective is the exact model's value at the loaded solution,
    its bound the relaxation's proven bound (model units), ``time_limited`` True
    when either solve stopped at its time limit. ``bound`` False skips the
    relaxation for a caller that does not use the bound: the restriction gets the
    whole time limit, and the outcome has no bound (and so never says infeasible).
    """
    start = time.perf_counter()
    log: list[str] = []
    plan = _Discretized(model, resolution, relaxed=False)
    share = PLAN_SHARE if bound else 1.0
    plan_limit = None if time_limit_s is None else max(0.1, share * time_limit_s)
    code, solver = plan.solve(plan_limit, rel_gap, threads, log, progress, "cp-sat")
    if code == cp_model.MODEL_INVALID:
        raise CpSatModelError("CP-SAT rejects the model as invalid")
    log.append(
        f"cp-sat status {solver.StatusName(code)}; the restriction's own bound "
        f"{solver.BestObjectiveBound() / plan.obj_scale + plan.obj_const:,.3f} (not reported)"
    )
    time_limited = code == cp_model.FEASIBLE or code == cp_model.UNKNOWN
    objective: float | None = None
    if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        plan.load(solver)
        if _polish(model, log):
            objective = float(pyo.value(plan.objective.expr))
    if not bound:
        wall = time.perf_counter() - start
        if objective is None:
            return MilpOutcome("no_solution", None, None, wall, log, time_limited)
        return MilpOutcome("feasible", objective, None, wall, log, time_limited)
    bound_limit = (
        None
        if time_limit_s is None
        else max(MIN_BOUND_S, time_limit_s - (time.perf_counter() - start))
    )
    certified, infeasible, cut = _relaxation_bound(
        model, bound_resolution, bound_limit, rel_gap, threads, log, progress
    )
    time_limited = time_limited or cut
    wall = time.perf_counter() - start
    if infeasible:
        return MilpOutcome("infeasible", None, None, wall, log)
    if objective is None:
        return MilpOutcome("no_solution", None, certified, wall, log, time_limited)
    if certified is not None:
        certified = min(certified, objective)
    return MilpOutcome("feasible", objective, certified, wall, log, time_limited)


def _relaxation_bound(
    model: Any,
    resolution: float,
    time_limit_s: float | None,
    rel_gap: float,
    threads: int | None,
    log: list[str],
    progress: Progress | None,
) -> tuple[float | None, bool, bool]:
    """(bound on the exact optimum or None, relaxation proven infeasible, stopped
    at the time limit) from CP-SAT on the relaxed discretization."""
    try:
        relax = _Discretized(model, resolution, relaxed=True)
    except _NoRelaxation as exc:
        log.append(f"cp-sat relaxation not built ({exc}); no bound from CP-SAT")
        return None, False, False
    code, solver = relax.solve(time_limit_s, rel_gap, threads, log, None, "cp-sat relaxation")
    if progress is not None:
        progress(
            f"cp-sat relaxation: {solver.StatusName(code)} after {solver.WallTime():.1f} s, "
            f"bound {solver.BestObjectiveBound() / relax.obj_scale + relax.obj_const:,.3f}"
        )
    if code == cp_model.INFEASIBLE:
        log.append("cp-sat relaxation infeasible: the exact model has no solution")
        return None, True, False
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        log.append(f"cp-sat relaxation status {solver.StatusName(code)}: no bound")
        return None, False, code == cp_model.UNKNOWN
    bound = solver.BestObjectiveBound() / relax.obj_scale + relax.obj_const
    log.append(f"cp-sat relaxation status {solver.StatusName(code)}; certified bound {bound:,.3f}")
    return bound, False, code == cp_model.FEASIBLE


class _NoRelaxation(Exception):
    """The relaxation's rounding needs non-negative variables."""


class _Discretized:
    """``model`` as a CP-SAT model in integer steps: the restriction (every solution
    feasible for ``model``) or, ``relaxed``, the relaxation (every solution of
    ``model`` maps to one of it costing no more)."""

    def __init__(self, model: Any, resolution: float, *, relaxed: bool) -> None:
        self.relaxed = relaxed
        self.cp = cp_model.CpModel()
        self.step: dict[int, float] = {}
        self.ints: dict[int, Any] = {}
        self.pyvars: dict[int, Any] = {}
        self.reach: dict[int, int] = {}
        """The largest magnitude of each variable's integer (steps)."""
        self.moves: dict[int, int] = {}
        """Relaxation: +1 / -1 for a continuous variable an exact value moves up / down."""
        self.objective = next(model.component_data_objects(pyo.Objective, active=True))
        orepn = generate_standard_repn(self.objective.expr)
        if not orepn.is_linear():
            raise ValueError("the objective is not linear")
        self.obj_const = float(orepn.constant)
        obj_coef = {
            id(v): float(c) for v, c in zip(orepn.linear_vars, orepn.linear_coefs, strict=True)
        }
        for var in model.component_data_objects(pyo.Var, active=True):
            if not var.fixed:
                self._add_var(var, resolution, obj_coef.get(id(var), 0.0))
        for con in model.component_data_objects(pyo.Constraint, active=True):
            repn = generate_standard_repn(con.body)
            if not repn.is_linear():
                raise ValueError(f"constraint {con.name} is not linear")
            const = float(repn.constant)
            terms = [
                (id(v), float(c)) for v, c in zip(repn.linear_vars, repn.linear_coefs, strict=True)
            ]
            if con.has_ub():
                self._row(
                    terms, float(pyo.value(con.upper)) - const, upper=True, equal=con.equality
                )
            if con.has_lb() and not con.equality:
                self._row(terms, float(pyo.value(con.lower)) - const, upper=False, equal=False)
        pairs = [(k, c * self.step[k]) for k, c in obj_coef.items() if c != 0]
        smallest = min((abs(c) for _, c in pairs), default=1.0)
        biggest = max((abs(c) for _, c in pairs), default=1.0)
        self.obj_scale = min(OBJ_RESOLUTION / smallest, MAX_OBJ_COEF / biggest)
        if relaxed:
            # Rounding each coefficient down costs up to one unit per step of its
            # variable: scale as far as the objective's range stays exact in a float.
            reach = sum(abs(c) * self.reach[k] for k, c in pairs)
            self.obj_scale = MAX_EXACT_OBJECTIVE / max(reach, 1e-300)
        if relaxed:
            coefs = [(k, math.floor(c * self.obj_scale - 1e-9)) for k, c in pairs]
        else:
            coefs = [(k, round(c * self.obj_scale)) for k, c in pairs]
        self.cp.minimize(sum(c * self.ints[k] for k, c in coefs))
        invalid = self.cp.validate()
        if invalid:
            raise CpSatModelError(f"CP-SAT rejects the model: {invalid}")

    def _add_var(self, var: Any, resolution: float, obj_coef: float) -> None:
        integral = var.is_integer() or var.is_binary()
        delta = 1.0 if integral else resolution
        if self.relaxed and not integral and var.ub is not None:
            # The relaxation may take coarser steps where a range needs them.
            delta = max(delta, abs(var.ub) / (MAX_INT // 2))
        if var.lb is None or var.ub is None:
            raise CpSatModelError(
                f"variable {var.name} has no finite bounds: the formulation must bound "
                "every variable for CP-SAT"
            )
        if self.relaxed and var.lb < 0:
            raise _NoRelaxation(f"variable {var.name} may be negative")
        if self.relaxed and not integral:
            # An exact value moves to the grid point below it when that does not
            # raise the objective, else to the one above: the range covers both.
            lb = math.floor(var.lb / delta + 1e-9)
            ub = math.ceil(var.ub / delta - 1e-9)
            self.moves[id(var)] = -1 if obj_coef >= 0 else 1
        else:
            lb = math.ceil(var.lb / delta - 1e-9)
            ub = math.floor(var.ub / delta + 1e-9)
        if ub > MAX_INT:
            raise CpSatModelError(
                f"variable {var.name} ranges up to {var.ub:g}, more than CP-SAT's "
                f"integers hold in steps of {delta:g}"
            )
        self.ints[id(var)] = self.cp.new_int_var(int(lb), int(ub), var.name)
        self.reach[id(var)] = max(abs(int(lb)), abs(int(ub)))
        self.step[id(var)] = delta
        self.pyvars[id(var)] = var

    def _row(self, terms: list[tuple[int, float]], rhs: float, *, upper: bool, equal: bool) -> None:
        if self.relaxed:
            _add_relaxed_row(
                self.cp, self.ints, self.step, self.moves, terms, rhs, upper=upper, equal=equal
            )
        else:
            _add_row(self.cp, self.ints, self.step, terms, rhs, upper=upper, equal=equal)

    def solve(
        self,
        time_limit_s: float | None,
        rel_gap: float,
        threads: int | None,
        log: list[str],
        progress: Progress | None,
        name: str,
    ) -> tuple[Any, cp_model.CpSolver]:
        """CP-SAT's status code and the solver holding its solution."""
        solver = cp_solver(time_limit_s, rel_gap, threads or 2)
        scale, const = self.obj_scale, self.obj_const

        class _Cb(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                line = (
                    f"{name} incumbent {self.ObjectiveValue() / scale + const:,.3f} "
                    f"bound {self.BestObjectiveBound() / scale + const:,.3f} "
                    f"at {self.WallTime():.1f}s"
                )
                log.append(line)
                if progress is not None:
                    progress(line)

        return solver.Solve(self.cp, _Cb()), solver

    def load(self, solver: cp_model.CpSolver) -> None:
        """Write the restriction's solution into the Pyomo variables."""
        for key, var in self.pyvars.items():
            var.set_value(solver.Value(self.ints[key]) * self.step[key], skip_validation=True)


def cp_solver(time_limit_s: float | None, rel_gap: float, workers: int) -> cp_model.CpSolver:
    """The one place a CP-SAT solver is made: a time limit (s; at least 0.1 s, none
    when ``None``), a relative gap at which it stops (a fraction), and its worker
    threads."""
    solver = cp_model.CpSolver()
    if time_limit_s is not None:
        solver.parameters.max_time_in_seconds = max(0.1, time_limit_s)
    solver.parameters.relative_gap_limit = rel_gap
    solver.parameters.num_workers = workers
    return solver


class CpSatModelError(SolverError):
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


def _add_relaxed_row(
    cp: cp_model.CpModel,
    ints: dict[int, Any],
    step: dict[int, float],
    moves: dict[int, int],
    terms: list[tuple[int, float]],
    rhs: float,
    *,
    upper: bool,
    equal: bool,
) -> None:
    """Add sum coef*x (<=, >=, ==) rhs, widened and rounded so that every exact
    solution, its continuous values moved by less than one step in the direction
    ``moves`` gives, satisfies it."""
    scaled = [(k, c * step[k]) for k, c in terms if c != 0.0]
    if not scaled:
        return
    if equal:
        for side in (True, False):
            _add_relaxed_row(cp, ints, step, moves, terms, rhs, upper=side, equal=False)
        return
    # One step of every continuous term whose move tightens the row, plus a margin
    # for floating-point error.
    tighten = 1 if upper else -1
    widen = sum(abs(c) for k, c in scaled if moves.get(k, 0) * c * tighten > 0)
    widen += 1e-9 * (abs(rhs) + sum(abs(c) for _, c in scaled))
    biggest = max(abs(c) for _, c in scaled)
    smallest = min(abs(c) for _, c in scaled)
    integral = all(abs(c - round(c)) < 1e-12 for _, c in scaled) and widen < 1e-6
    scale = 1.0 if integral else min(ROW_SCALE / smallest, MAX_COEF / biggest)
    if upper:
        expr = sum(
            math.floor(c * scale + (0.5 if integral else -1e-9)) * ints[k] for k, c in scaled
        )
        cp.add(expr <= math.floor((rhs + widen) * scale + 1e-6) + (0 if integral else 1))
    else:
        expr = sum(math.ceil(c * scale - (0.5 if integral else -1e-9)) * ints[k] for k, c in scaled)
        cp.add(expr >= math.ceil((rhs - widen) * scale - 1e-6) - (0 if integral else 1))
