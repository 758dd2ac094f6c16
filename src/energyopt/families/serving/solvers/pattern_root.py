"""The root of the configuration formulation: column generation to the LP bound,
then the unit cover bound at the LP's duals. Column generation as a decomposition,
the exact configuration solve and branch-and-price all start here.

Bounds are in the instance's objective units (W for power); deadlines are
``time.perf_counter`` values."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers.colgen import generate_columns
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.families.serving.solvers.unit_bound import best_unit_bound
from energyopt.perf.oppoints import OpTable
from energyopt.progress import Progress

EXACT_UNIT_BOUND_MAX_UNITS = 8
"""Up to this many units the exact solver proves each unit's cover bound with HiGHS;
above it (and always for decompositions) the grid DP bound is used."""
UNIT_BOUND_SHARE = 0.25
"""Share of the time left after column generation that the unit bound may take (its
golden-section search stops there with the best share charge found so far)."""


S = TypeVar("S", bound=LpSession)


@dataclass
class Root(Generic[S]):
    """The program after root column generation (in ``session`` where the caller
    made one), and the unit bound at its duals."""

    prog: pat.PatternProgram
    session: S | None
    unit_bound: float
    mix: float  # the unit bound's share-charge mix
    time_cut: tuple[str, ...] = ()
    """Steps a time share stopped before their effort limits (a rerun on a busier
    machine may then differ)."""


def solve_root(
    problem: Problem,
    table: OpTable,
    note: Progress,
    *,
    colgen_deadline: float,
    deadline: float,
    exact_unit_bound: bool,
    make_session: Callable[[pat.PatternProgram], S] | None = None,
    lazy_tp: bool = False,
) -> Root[S] | None:
    """Column generation until ``colgen_deadline``, then the unit bound within
    UNIT_BOUND_SHARE of the time left to ``deadline`` (proved per unit with HiGHS when
    ``exact_unit_bound`` and the instance has at most EXACT_UNIT_BOUND_MAX_UNITS
    units); the LP runs in ``make_session(prog)`` when given (else a session of its own).
    ``lazy_tp``: TP columns of units with single-GPU ops are priced, not listed
    (``pattern.prepare``).
    None, after saying so, when the LP cannot serve every rate (infeasible)."""
    prog = pat.prepare(problem, table, note, lazy_tp=lazy_tp)
    session = make_session(prog) if make_session is not None else None
    why = generate_columns(prog, note, deadline=colgen_deadline, session=session)
    assert prog.lp is not None
    if prog.lp.artificial_rps > 1e-6:
        note(f"LP relaxation cannot serve {prog.lp.artificial_rps:.3g} req/s: infeasible")
        return None
    ub_deadline = time.perf_counter() + UNIT_BOUND_SHARE * (deadline - time.perf_counter())
    unit_bound, mix = best_unit_bound(
        table,
        prog.costs,
        prog.classes,
        prog.lp.duals,
        prog.lp.budgets_w,
        prog.lp.budget_duals,
        exact=exact_unit_bound and len(table.units) <= EXACT_UNIT_BOUND_MAX_UNITS,
        deadline=ub_deadline,
    )
    cut = (("column generation",) if why == "time" else ()) + (
        ("unit bound",) if time.perf_counter() >= ub_deadline else ()
    )
    return Root(prog, session, unit_bound, mix, cut)
