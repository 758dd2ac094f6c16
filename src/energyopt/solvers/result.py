"""The one result type every solver returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from energyopt.spec.plan import Plan

OPTIMAL = "optimal"
FEASIBLE = "feasible"  # a plan, optimality not proven (time limit or gap reached)
INFEASIBLE = "infeasible"
NO_SOLUTION = "no_solution"  # limit reached before any plan was found


@dataclass
class Result:
    """Outcome of a solve. ``gap`` = (objective - bound) / max(|objective|, 1e-9)."""

    status: str
    objective: float | None
    bound: float | None
    wall_s: float
    plan: Plan | None
    solver: str
    log: list[str] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float | None:
        """Relative optimality gap, or None without both a plan and a bound."""
        if self.objective is None or self.bound is None:
            return None
        return relative_gap(self.objective, self.bound)


def relative_gap(objective: float, bound: float) -> float:
    """(objective - bound) / |objective|, never negative."""
    return max(0.0, objective - bound) / max(abs(objective), 1e-9)


def status_at(objective: float, bound: float, rel_gap: float) -> str:
    """OPTIMAL when the plan is within ``rel_gap`` of the bound, else FEASIBLE."""
    return OPTIMAL if relative_gap(objective, bound) <= rel_gap + 1e-12 else FEASIBLE
