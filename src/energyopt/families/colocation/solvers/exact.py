"""Exact co-location solve: the time-indexed unit MILP with HiGHS (highspy)."""

from __future__ import annotations

import time

import highspy
import numpy as np

from energyopt.backends.highs import binary_lp, quiet_highs
from energyopt.families.colocation.formulations.milp import Milp, build_milp
from energyopt.families.colocation.formulations.model import ColocationModel
from energyopt.families.colocation.formulations.schedule import Schedule, to_plan
from energyopt.families.colocation.solvers.diagnose import diagnose, no_plan_status
from energyopt.families.colocation.solvers.result import (
    ColocationResult,
    colocation_result,
    nothing_runs,
)
from energyopt.progress import Progress
from energyopt.solvers.result import FEASIBLE, NO_SOLUTION, OPTIMAL, Sense


def highs_lp(milp: Milp) -> highspy.HighsLp:
    """The unit MILP as a HiGHS model (0/1 columns)."""
    return binary_lp(milp.cost, milp.matrix, milp.row_lo, milp.row_hi)


def schedule_of(milp: Milp, values: np.ndarray, model: ColocationModel) -> Schedule:
    """The schedule a 0/1 solution picks; jobs in no chosen column are unscheduled."""
    chosen = np.flatnonzero(values > 0.5)
    sched = Schedule([int(milp.unit[i]) for i in chosen], [int(milp.start[i]) for i in chosen])
    units = model.table.units
    covered = set(units.job_a[milp.unit[chosen]].tolist())
    covered |= set(units.job_b[milp.unit[chosen]].tolist())
    sched.unscheduled = [j for j in range(model.n_jobs) if j not in covered]
    return sched


def solve_exact(
    model: ColocationModel,
    *,
    time_limit_s: float = 120.0,
    rel_gap: float = 1e-4,
    progress: Progress | None = None,
) -> ColocationResult:
    """Solve the unit MILP to ``rel_gap`` or the time limit; best plan and HiGHS' bound."""
    say = progress or (lambda _line: None)
    t0 = time.perf_counter()
    sense: Sense = "min" if model.objective == "jct" else "max"
    milp = build_milp(model)
    say(f"exact: {len(milp):,} columns (unit configuration x start), {milp.matrix.shape[0]} rows")
    if len(milp) == 0:
        if model.objective == "throughput":
            return nothing_runs(model.problem, "exact", time.perf_counter() - t0)
        return _infeasible(model, sense, t0, "no unit configuration fits the horizon")
    h = quiet_highs()
    h.passModel(highs_lp(milp))
    h.setOptionValue("time_limit", max(0.5, time_limit_s))
    h.setOptionValue("mip_rel_gap", rel_gap)

    def improving(event: object) -> None:
        d = event.data_out  # type: ignore[attr-defined]
        inc = model.display_objective(float(d.objective_function_value))
        raw = float(d.mip_dual_bound)
        if not np.isfinite(raw):
            say(f"exact: incumbent {inc:,.3f}, no bound yet")
            return
        bnd = model.display_objective(raw)
        gap = abs(inc - bnd) / max(abs(inc), 1e-9)
        say(f"exact: incumbent {inc:,.3f}, bound {bnd:,.3f}, gap {100 * gap:.2f}%")

    h.cbMipImprovingSolution.subscribe(improving)
    h.run()
    wall = time.perf_counter() - t0
    status = h.getModelStatus()
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        return _infeasible(model, sense, t0, "the MILP is infeasible")
    bound_raw = float(info.mip_dual_bound)
    bound = model.display_objective(bound_raw) if np.isfinite(bound_raw) else None
    if info.primal_solution_status != 2:  # no feasible solution
        return colocation_result(NO_SOLUTION, None, bound, sense, wall, None, "exact")
    values = np.asarray(h.getSolution().col_value)
    sched = schedule_of(milp, values, model)
    objective = model.display_objective(sched.objective(model))
    done = status == highspy.HighsModelStatus.kOptimal
    if bound is not None:
        # HiGHS stops at its own tolerance; never report a bound past the plan
        bound = min(bound, objective) if sense == "min" else max(bound, objective)
    return colocation_result(
        OPTIMAL if done else FEASIBLE,
        objective,
        bound,
        sense,
        wall,
        to_plan(model, sched),
        "exact",
        [f"HiGHS {status.name}, {len(milp)} columns, {wall:.1f} s"],
    )


def _infeasible(model: ColocationModel, sense: Sense, t0: float, reason: str) -> ColocationResult:
    """No plan on the slotted grid: infeasible only where no horizon would help."""
    return colocation_result(
        no_plan_status(model),
        None,
        None,
        sense,
        time.perf_counter() - t0,
        None,
        "exact",
        [reason],
        diagnose(model),
    )
