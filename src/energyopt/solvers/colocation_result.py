"""The result every co-location solver returns, in the user's terms."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from energyopt.solvers.result import relative_gap
from energyopt.spec.colocation import ColocationPlan

Sense = Literal["min", "max"]


@dataclass
class ColocationResult:
    """Outcome of a co-location solve.

    ``objective`` and ``bound`` are in the objective's own units: mean JCT in s
    (``sense`` min, the bound is a lower bound) or jobs per hour (``sense`` max,
    the bound is an upper bound). Both are the planning model's figures (the
    interference predictor's); the checker recomputes them with the ground truth.
    """

    status: str
    objective: float | None
    bound: float | None
    sense: Sense
    wall_s: float
    plan: ColocationPlan | None
    solver: str
    log: list[str] = field(default_factory=list)
    diagnosis: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float | None:
        """Relative optimality gap, or None without both a plan and a bound."""
        if self.objective is None or self.bound is None:
            return None
        if self.sense == "min":
            return relative_gap(self.objective, self.bound)
        return relative_gap(-self.objective, -self.bound)
