"""Co-location solvers return the one ``Result``, with their plan type and sense."""

from __future__ import annotations

from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.spec import ColocationPlan
from energyopt.solvers.result import OPTIMAL, Result, Sense, Status

ColocationResult = Result[ColocationPlan]
"""``objective`` and ``bound`` are in the objective's own units: mean JCT in s
(``sense`` min, the bound is a lower bound) or jobs per hour (``sense`` max, the
bound is an upper bound). Both are the planning model's figures (the interference
predictor's); the checker recomputes them with the ground truth."""


def colocation_result(
    status: Status,
    objective: float | None,
    bound: float | None,
    sense: Sense,
    wall_s: float,
    plan: ColocationPlan | None,
    solver: str,
    log: list[str] | None = None,
    diagnosis: list[str] | None = None,
) -> ColocationResult:
    """A co-location Result (arguments in the order the solvers state them)."""
    return Result(
        status,
        objective,
        bound,
        wall_s,
        plan,
        solver,
        list(log or []),
        list(diagnosis or []),
        sense=sense,
    )


def nothing_runs(problem: ColocationProblem, solver: str, wall_s: float) -> ColocationResult:
    """The throughput optimum when no job has a configuration that fits: every job
    unscheduled, 0 jobs per hour, and no plan can do better (bound 0)."""
    plan = ColocationPlan(
        instance=problem.instance.name,
        unscheduled=tuple(job.name for job in problem.jobs),
    )
    return colocation_result(
        OPTIMAL,
        0.0,
        0.0,
        "max",
        wall_s,
        plan,
        solver,
        ["no job has a configuration that fits: nothing runs (throughput 0)"],
    )
