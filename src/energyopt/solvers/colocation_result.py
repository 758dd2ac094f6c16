"""Co-location solvers return the one ``Result``, with their plan type and sense."""

from __future__ import annotations

from energyopt.solvers.result import Result, Sense, Status
from energyopt.spec.colocation import ColocationPlan

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
