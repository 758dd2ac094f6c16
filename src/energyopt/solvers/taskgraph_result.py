"""Result of a task-graph solve: the common ``Result`` plus the schedule and its totals."""

from __future__ import annotations

from dataclasses import dataclass

from energyopt.formulations.taskgraph.schedule import Schedule, Totals
from energyopt.solvers.result import Result


@dataclass
class TaskGraphResult(Result):
    """``plan`` stays None; ``schedule`` holds the task graph's schedule.

    ``objective`` and ``bound`` are in the objective's unit (J, ms, J*s, J*s^2);
    ``bound`` is None when the solver has no valid bound.
    """

    schedule: Schedule | None = None
    totals: Totals | None = None
