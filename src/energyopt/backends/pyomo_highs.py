"""Solve a Pyomo MILP with HiGHS: status, incumbent, best bound, log lines."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import Any

from pyomo.contrib.solver.common.factory import SolverFactory
from pyomo.contrib.solver.common.results import SolutionStatus, TerminationCondition

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
    """Run HiGHS on ``model``; loads the best solution into the model when there is one."""
    solver = SolverFactory("highs")
    stream = _LineStream(progress)
    extra: dict[str, Any] = {"mip_rel_gap": rel_gap}
    # HiGHS fixes its thread pool at the first solve of the process: a later
    # "threads" option makes the run fail, so ``threads`` is not passed on.
    del threads
    extra.update(options or {})
    start = time.perf_counter()
    res = solver.solve(
        model,
        tee=[stream],
        time_limit=time_limit_s,
        rel_gap=rel_gap,
        solver_options=extra,
        load_solutions=False,
        raise_exception_on_nonoptimal_result=False,
    )
    wall = time.perf_counter() - start
    has_solution = res.solution_status in (SolutionStatus.optimal, SolutionStatus.feasible)
    if has_solution:
        res.solution_loader.load_vars()
    term = res.termination_condition
    if term in (TerminationCondition.provenInfeasible, TerminationCondition.infeasibleOrUnbounded):
        status = "infeasible"
    elif not has_solution:
        status = "no_solution"
    elif term == TerminationCondition.convergenceCriteriaSatisfied:
        status = "optimal"
    else:
        status = "feasible"
    objective = res.incumbent_objective if has_solution else None
    bound = res.objective_bound
    if bound is not None and (bound != bound or abs(bound) == float("inf")):
        bound = None
    if status == "infeasible" and extra.get("presolve") != "off":
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
            again.status, again.objective, again.bound, wall + again.wall_s,
            [*stream.lines, note, *again.log],
        )
    return MilpOutcome(status, objective, bound, wall, stream.lines)
