"""The linear programs the exhaustive optimisers of the tests solve for each fixed
choice of integer decisions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.optimize import linprog


def lp_minimum(
    cost: Any,
    a_ub: Sequence[Any],
    b_ub: Sequence[float],
    a_eq: Any,
    b_eq: Any,
    bounds: Sequence[tuple[float, float | None]],
) -> float | None:
    """The least ``cost @ x`` over ``a_ub @ x <= b_ub`` (no rows: no such constraint),
    ``a_eq @ x == b_eq`` and ``bounds``, by HiGHS through scipy; None where the LP has
    no optimum (infeasible or unbounded)."""
    res = linprog(
        cost,
        A_ub=np.asarray(a_ub) if len(a_ub) else None,
        b_ub=np.asarray(b_ub) if len(a_ub) else None,
        A_eq=a_eq,
        b_eq=b_eq,
        bounds=bounds,
        method="highs",
    )
    if res.status != 0:
        return None
    return float(res.fun)
