"""The one result type every solver of every problem family returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, Literal, TypeVar

PlanT = TypeVar("PlanT")
Sense = Literal["min", "max"]


class Status(StrEnum):
    """What a solve established about its plan (equal to its lower-case name as a str)."""

    OPTIMAL = "optimal"
    """A plan within the requested gap of the solver's valid bound."""
    FEASIBLE = "feasible"
    """A plan, optimality not proven (a limit was reached, or the solver has no bound)."""
    INFEASIBLE = "infeasible"
    """Proven: no plan exists."""
    NO_SOLUTION = "no_solution"
    """A limit was reached before any plan was found; nothing is proven."""


class Termination(StrEnum):
    """Why the solver stopped."""

    CONVERGED = "converged"
    """Its own stopping rule: the gap was reached or the search space exhausted."""
    TIME_LIMIT = "time_limit"
    EFFORT_LIMIT = "effort_limit"
    """An iteration, node or column limit."""
    HEURISTIC = "heuristic"
    """A constructive method that stops when it has built its plan."""
    INFEASIBLE = "infeasible"
    """The problem (or, for a restriction, the restriction) has no plan."""


OPTIMAL = Status.OPTIMAL
FEASIBLE = Status.FEASIBLE
INFEASIBLE = Status.INFEASIBLE
NO_SOLUTION = Status.NO_SOLUTION


@dataclass
class Result(Generic[PlanT]):
    """Outcome of a solve.

    ``objective`` is the plan's own cost in the family's objective unit, recomputed
    from the plan; ``bound`` is a valid bound on the optimum (lower for ``sense``
    min, upper for max), or None when the solver has none. ``formulation`` and
    ``algorithm`` say what actually produced the plan; ``fallback`` records why it
    is not what the solver was asked for, if so.
    """

    status: Status
    objective: float | None
    bound: float | None
    wall_s: float
    plan: PlanT | None
    solver: str
    log: list[str] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)
    sense: Sense = "min"
    termination: Termination | None = None
    formulation: str = ""
    algorithm: str = ""
    fallback: str | None = None
    certified: bool = False
    """True once ``settle`` has made objective, bound and status the plan's own."""

    @property
    def gap(self) -> float | None:
        """Relative optimality gap, or None without both a plan and a bound."""
        if self.objective is None or self.bound is None:
            return None
        if self.sense == "min":
            return relative_gap(self.objective, self.bound)
        return relative_gap(-self.objective, -self.bound)


OBJECTIVE_REL_TOL = 1e-6
"""Relative difference at which a solver's objective disagrees with its plan's cost."""


def objective_tolerance(cost: float) -> float:
    """Absolute tolerance of an objective comparison at ``cost``."""
    return OBJECTIVE_REL_TOL * max(1.0, abs(cost))


def settle(result: Result[PlanT], cost: float, rel_gap: float, note: Callable[[str], None]) -> None:
    """Make ``result`` report its verified plan's own ``cost``.

    A differing figure from the solver is logged as a solver failure; a bound on the
    wrong side of the cost is invalid, logged and dropped; status and gap follow
    from the cost. The caller has verified the plan.
    """
    tol = objective_tolerance(cost)
    if result.objective is None or abs(result.objective - cost) > tol:
        stated = "none" if result.objective is None else f"{result.objective:,.6f}"
        note(
            f"solver failure: reported objective {stated}, but the plan it returned costs "
            f"{cost:,.6f}; reporting the plan's cost"
        )
    result.objective = cost
    bound = result.bound
    if bound is not None and (bound > cost + tol if result.sense == "min" else bound < cost - tol):
        note(f"invalid bound {bound:,.6f} on the wrong side of the plan's cost: bound dropped")
        bound = None
    if bound is not None:
        bound = min(bound, cost) if result.sense == "min" else max(bound, cost)
    result.bound = bound
    if result.status in (OPTIMAL, FEASIBLE):
        gap = result.gap
        result.status = OPTIMAL if gap is not None and gap <= rel_gap + 1e-12 else FEASIBLE
    result.certified = True


def relative_gap(objective: float, bound: float) -> float:
    """(objective - bound) / |objective|, never negative (minimisation)."""
    return max(0.0, objective - bound) / max(abs(objective), 1e-9)


def status_at(objective: float, bound: float, rel_gap: float) -> Status:
    """OPTIMAL when the plan is within ``rel_gap`` of the bound, else FEASIBLE."""
    return OPTIMAL if relative_gap(objective, bound) <= rel_gap + 1e-12 else FEASIBLE


def stop_reason(
    cuts: Sequence[str],
    within_gap: bool,
    note: Callable[[str], None],
    *,
    otherwise: Termination = Termination.EFFORT_LIMIT,
) -> Termination:
    """Why a decomposition stopped: ``time_limit`` when a time share cut any of the
    stages in ``cuts`` before its effort limit (said through ``note``: a rerun on a
    busier machine may then differ), else ``converged`` when the plan is within the
    target gap, else ``otherwise`` (an effort limit ended it)."""
    if cuts:
        note(
            f"stopped by the time limit in: {', '.join(dict.fromkeys(cuts))} (a rerun on a "
            "busier machine may give another plan; a longer limit makes the run repeatable)"
        )
        return Termination.TIME_LIMIT
    return Termination.CONVERGED if within_gap else otherwise
