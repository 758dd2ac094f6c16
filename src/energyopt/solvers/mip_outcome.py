"""What one HiGHS MIP run establishes, in the terms of a solver's Result."""

from __future__ import annotations

import numpy as np

from energyopt.backends.highs import MipRun, MipStatus
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Status,
    Termination,
)


def mip_outcome(run: MipRun) -> tuple[Status, Termination, float | None]:
    """(status, termination, bound) of a run on a whole problem's MIP.

    Proven infeasible: INFEASIBLE, with no bound. Otherwise the termination is
    CONVERGED when HiGHS solved it and TIME_LIMIT when it stopped earlier (at its
    time limit or any other stop it reports), the status OPTIMAL or FEASIBLE
    accordingly with an incumbent and NO_SOLUTION without one, and the bound HiGHS'
    dual bound (in the model's objective unit) when it is finite, else None.
    """
    if run.status is MipStatus.INFEASIBLE:
        return INFEASIBLE, Termination.INFEASIBLE, None
    bound = run.dual_bound if np.isfinite(run.dual_bound) else None
    termination = Termination.CONVERGED if run.optimal else Termination.TIME_LIMIT
    if not run.has_plan:
        return NO_SOLUTION, termination, bound
    return (OPTIMAL if run.optimal else FEASIBLE), termination, bound
