"""The Result every serverless provisioning solver returns, assembled in one place."""

from __future__ import annotations

from collections.abc import Sequence

from energyopt.families.serverless.formulations.milp import FORMULATION_NAME
from energyopt.families.serverless.spec import ServerlessPlan
from energyopt.solvers.result import Result, Status, Termination


def serverless_result(
    status: Status,
    solver: str,
    wall_s: float,
    *,
    termination: Termination,
    algorithm: str,
    objective: float | None = None,
    bound: float | None = None,
    plan: ServerlessPlan | None = None,
    log: Sequence[str] = (),
    diagnosis: Sequence[str] = (),
    formulation: str = FORMULATION_NAME,
) -> Result[ServerlessPlan]:
    """A serverless solver's Result: objective and bound in the file's unit, the
    formulation the joint MILP's unless given (the fast algorithm has none)."""
    return Result(
        status,
        objective,
        bound,
        wall_s,
        plan,
        solver,
        log=list(log),
        diagnosis=list(diagnosis),
        termination=termination,
        formulation=formulation,
        algorithm=algorithm,
    )
