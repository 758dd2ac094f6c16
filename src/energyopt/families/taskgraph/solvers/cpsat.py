"""Solve a task graph exactly with CP-SAT, warm-started from the list scheduler.

The horizon is the latest makespan an optimal schedule can have, derived from
the heuristic's schedule (objective h): every GPU draws its idle power P until
the makespan, so E >= P M and energy <= h gives M <= h / P, EDP <= h gives
M <= sqrt(h / P), ED^2P <= h gives M <= (h / P)^(1/3); for the makespan
objective M <= h, for energy_within the deadline. The bound is CP-SAT's best
bound converted from integer units (valid: see families/taskgraph/formulations/cpsat.py),
raised to the cheap bounds of ``formulations.taskgraph.bounds`` when those are
higher. The status is optimal when the exact gap is within ``rel_gap``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ortools.sat.python import cp_model

from energyopt.backends.cpsat import cp_solver
from energyopt.families.taskgraph.formulations.bounds import lower_bounds
from energyopt.families.taskgraph.formulations.cpsat import CpTaskGraph, build_cp_model, hint
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule, totals
from energyopt.families.taskgraph.solvers.heuristic import solve_heuristic
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Result,
    Termination,
    relative_gap,
)

WARM_SEARCH_SHARE = 0.125
"""Share of the time limit the warm start's placement search may use past its default
evaluations (graphs up to 200 tasks): on cholesky-4x4, 400 evaluations instead of 100
found 14.209 J instead of 14.273 J, a better hint and cut-off for CP-SAT."""
SEARCH_SHARE = 0.93
"""Share of the time left after the warm start that CP-SAT's search may take ..."""
CLOSING_S = 1.0
"""... less this (s): on a loaded machine CP-SAT stops a few seconds past its limit
(its workers check the clock between steps) and the bounds and the checker run after
it, so the whole solve stays within ``time_limit_s``."""
MIN_SEARCH_S = 0.1
"""Least search time (s), even when the warm start used up the limit."""


def horizon_from(tg: TaskGraph, objective: float) -> int:
    """Largest makespan (grid units) a schedule of objective <= ``objective`` can have."""
    idle_j_per_unit = tg.idle_total_w * tg.unit_ms / 1e3
    if tg.objective == "makespan":
        units = objective / tg.unit_ms
    elif tg.objective in ("energy", "energy_within"):
        units = objective / idle_j_per_unit
    elif tg.objective == "edp":
        units = math.sqrt(objective / (idle_j_per_unit * tg.unit_ms / 1e3))
    else:
        units = (objective / (idle_j_per_unit * (tg.unit_ms / 1e3) ** 2)) ** (1 / 3)
    return math.floor(units * (1 + 1e-9)) + 1


def solve_cpsat(
    tg: TaskGraph,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-4,
    workers: int = 2,
    progress: Callable[[str], None] | None = None,
    search_evals: int | None = None,
) -> Result[Schedule]:
    """Best schedule CP-SAT finds within the limits, with a valid bound and gap.

    ``search_evals`` is passed to the warm-starting list scheduler."""
    begin = time.perf_counter()
    say = progress or (lambda _line: None)
    warm = solve_heuristic(
        tg,
        search_evals=search_evals,
        time_limit_s=time_limit_s / 4,
        search_s=WARM_SEARCH_SHARE * time_limit_s,
    )
    log = [f"heuristic: {line}" for line in warm.log]
    if warm.plan is not None and warm.objective is not None:
        horizon = horizon_from(tg, warm.objective)
        say(
            f"list scheduler: objective {warm.objective:.6g}; CP-SAT horizon "
            f"{tg.ms(horizon):.3f} ms"
        )
    else:
        horizon = tg.deadline if tg.deadline is not None else _serial_horizon(tg)
    cp = build_cp_model(tg, horizon)
    if warm.plan is not None:
        hint(cp, tg, warm.plan)
    remaining = time_limit_s - (time.perf_counter() - begin)
    solver = cp_solver(
        max(MIN_SEARCH_S, SEARCH_SHARE * remaining - CLOSING_S), rel_gap / 4, workers
    )
    status = solver.solve(cp.model, _Progress(say, cp.objective_scale))
    name = solver.status_name(status)
    log.append(
        f"cp-sat {name}: objective {solver.objective_value} bound "
        f"{solver.best_objective_bound} (integer units x {cp.objective_scale:.6g})"
    )
    say(f"CP-SAT {name} after {solver.wall_time:.1f} s")
    wall = time.perf_counter() - begin
    if status == cp_model.INFEASIBLE:
        if warm.plan is None:
            return Result(
                INFEASIBLE,
                None,
                None,
                wall,
                None,
                "cpsat",
                log,
                ["no schedule meets the deadline (proved by CP-SAT)"],
            )
        raise RuntimeError("CP-SAT calls a model infeasible that has a known schedule")
    best = warm.plan
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        s = _read(cp, tg, solver)
        if best is None or totals(tg, s).objective < totals(tg, best).objective:
            best = s
    incumbent = None if best is None else totals(tg, best).objective
    bound: float | None = lower_bounds(tg).objective(tg, incumbent)
    if warm.bound is not None:
        bound = max(bound or 0.0, warm.bound)
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = max(bound or 0.0, solver.best_objective_bound * cp.objective_scale)
    if best is None:
        return Result(
            NO_SOLUTION,
            None,
            bound,
            wall,
            None,
            "cpsat",
            log,
            ["no schedule found within the time limit"],
        )
    tot = totals(tg, best)
    assert bound is not None
    gap = relative_gap(tot.objective, bound)
    state = OPTIMAL if gap <= rel_gap else FEASIBLE
    return Result(
        state,
        tot.objective,
        bound,
        wall,
        best,
        "cpsat",
        log,
        termination=Termination.CONVERGED if state == OPTIMAL else Termination.TIME_LIMIT,
        algorithm="cp-sat warm-started by the list scheduler",
    )


class _Progress(cp_model.CpSolverSolutionCallback):
    """One progress line per improving CP-SAT solution: the model's objective (its
    energy coefficients are rounded down), the proven bound and their gap."""

    def __init__(self, say: Callable[[str], None], scale: float) -> None:
        super().__init__()
        self._say = say
        self._scale = scale

    def on_solution_callback(self) -> None:
        value = self.objective_value * self._scale
        bound = self.best_objective_bound * self._scale
        gap = relative_gap(value, bound)
        self._say(
            f"CP-SAT: model objective {value:.6g}, bound {bound:.6g}, gap {gap:.2%}, "
            f"{self.wall_time:.1f} s"
        )


def _serial_horizon(tg: TaskGraph) -> int:
    """Makespan of running everything one after another at the slowest options."""
    total = 0
    for i in range(tg.n_tasks):
        total += max(max(tg.options[t][i].dur, default=0) for t in range(len(tg.types)))
        for _, nbytes in tg.succs[i]:
            total += max(
                tg.transfer(nbytes, a, b) for a in range(tg.n_gpus) for b in range(tg.n_gpus)
            )
    return total + tg.n_tasks * tg.transition


def _read(cp: CpTaskGraph, tg: TaskGraph, solver: cp_model.CpSolver) -> Schedule:
    gpu = [-1] * tg.n_tasks
    option = [-1] * tg.n_tasks
    for (i, g, k), x in cp.present.items():
        if solver.boolean_value(x):
            gpu[i], option[i] = g, k
    start = [int(solver.value(v)) for v in cp.start]
    return Schedule(tuple(gpu), tuple(option), tuple(start))
