"""Solve the sparse configuration master as a MIP with highspy, with a warm start.

The Pyomo interface to HiGHS cannot pass a starting solution; the staged solve
of the configuration formulation re-solves growing column sets and gains most
from starting at the best plan found so far (HiGHS' neighbourhood heuristics
need an incumbent).
"""

from __future__ import annotations

import time

import highspy
import numpy as np
from numpy.typing import NDArray

from energyopt.backends.highs import quiet_highs
from energyopt.backends.pyomo_highs import MilpOutcome
from energyopt.families.serving.formulations.master import Master, to_highs_lp
from energyopt.progress import Progress


def solve_master_mip(
    mp: Master,
    *,
    time_limit_s: float,
    rel_gap: float,
    threads: int | None = None,
    start: NDArray[np.float64] | None = None,
    progress: Progress | None = None,
    stop_at: float | None = None,
    heuristic_effort: float | None = None,
    certified_bound: float | None = None,
    max_nodes: int | None = None,
) -> tuple[MilpOutcome, NDArray[np.float64] | None]:
    """(outcome, variable values) of the integer master; values None without a plan.

    ``stop_at``: stop as soon as a plan with at most this objective is found (the
    caller holds a bound that makes such a plan good enough). ``heuristic_effort``:
    HiGHS' share of effort in primal heuristics (its default is 0.05).
    ``certified_bound``: a bound valid for the whole problem; progress lines then
    show it and the incumbent's gap to it instead of HiGHS' bound, which holds only
    for this master's columns.
    ``max_nodes``: branch-and-bound nodes at most (an effort limit: the same model
    gives the same outcome however loaded the machine is, when the time limit is
    not reached first).
    """
    h = quiet_highs()
    n = len(mp.cost)
    lp = to_highs_lp(mp, integer=True)
    h.passModel(lp)
    h.setOptionValue("time_limit", max(0.5, time_limit_s))
    h.setOptionValue("mip_rel_gap", rel_gap)
    if heuristic_effort is not None:
        h.setOptionValue("mip_heuristic_effort", heuristic_effort)
    if max_nodes is not None:
        h.setOptionValue("mip_max_nodes", max_nodes)
    # HiGHS fixes its thread pool at the first solve of the process; setting
    # "threads" afterwards makes the run fail, so ``threads`` is not passed on.
    del threads
    if progress is not None:

        def improving(event: object) -> None:
            d = event.data_out  # type: ignore[attr-defined]
            obj = d.objective_function_value
            if certified_bound is not None:
                gap = max(0.0, obj - certified_bound) / max(abs(obj), 1e-9)
                progress(
                    f"highs: incumbent {obj:,.3f}, bound {certified_bound:,.3f}, "
                    f"gap {gap:.3%}, {d.running_time:.1f} s"
                )
                return
            bound = d.mip_dual_bound
            progress(f"highs: incumbent {obj:,.3f}, bound {bound:,.3f}, {d.running_time:.1f} s")

        h.cbMipImprovingSolution.subscribe(improving)
    if stop_at is not None:

        def interrupt(event: object) -> None:
            d = event.data_out  # type: ignore[attr-defined]
            if d.objective_function_value <= stop_at:
                event.data_in.user_interrupt = True  # type: ignore[attr-defined]

        h.cbMipInterrupt.subscribe(interrupt)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(padded_start(start, n))
        h.setSolution(sol)
    t0 = time.perf_counter()
    h.run()
    outcome, values = _read_mip(h, mp, time.perf_counter() - t0)
    if start is not None and outcome.objective is not None and values is not None:
        own = values_objective(mp, values)
        if abs(own - outcome.objective) > START_MISMATCH_REL_TOL * max(1.0, abs(own)):
            # HiGHS returned values whose cost is not the objective it reports (seen
            # with a starting solution under presolve): solve again without a start.
            if progress is not None:
                progress(
                    f"highs: returned values cost {own:,.6f}, reported {outcome.objective:,.6f}; "
                    "solving again without the starting solution"
                )
            h.clearSolver()
            h.passModel(lp)
            h.setOptionValue("time_limit", max(0.5, time_limit_s - outcome.wall_s))
            t1 = time.perf_counter()
            h.run()
            again, values = _read_mip(h, mp, outcome.wall_s + time.perf_counter() - t1)
            if again.objective is None:
                # No plan within the time left: keep the start's own values and cost.
                values = padded_start(start, n)
                again = MilpOutcome(
                    "feasible",
                    values_objective(mp, values),
                    None,
                    again.wall_s,
                    time_limited=again.time_limited,
                )
            outcome = again
    return outcome, values


START_MISMATCH_REL_TOL = 1e-6
"""Relative difference between HiGHS' objective and its values' cost that is a failure."""


def padded_start(start: NDArray[np.float64], n: int) -> NDArray[np.float64]:
    """A starting solution cut or zero-padded to ``n`` columns."""
    padded = np.zeros(n)
    padded[: min(n, len(start))] = start[:n]
    return padded


def values_objective(mp: Master, values: NDArray[np.float64]) -> float:
    """The master's objective at ``values``: cost . values + constant."""
    return float(np.dot(mp.cost, values[: len(mp.cost)])) + float(mp.constant)


def _read_mip(
    h: highspy.Highs, mp: Master, wall: float
) -> tuple[MilpOutcome, NDArray[np.float64] | None]:
    """Outcome of a finished HiGHS MIP run; the objective is the values' own cost."""
    status = h.getModelStatus()
    info = h.getInfo()
    timed = status == highspy.HighsModelStatus.kTimeLimit
    if status == highspy.HighsModelStatus.kInfeasible:
        return MilpOutcome("infeasible", None, None, wall), None
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    values = np.asarray(h.getSolution().col_value) if has else None
    bound = float(info.mip_dual_bound)
    bound_value = bound if np.isfinite(bound) else None
    if values is None:
        return MilpOutcome("no_solution", None, bound_value, wall, time_limited=timed), None
    done = status == highspy.HighsModelStatus.kOptimal
    objective = float(info.objective_function_value)
    outcome = MilpOutcome(
        "optimal" if done else "feasible", objective, bound_value, wall, time_limited=timed
    )
    return outcome, values
