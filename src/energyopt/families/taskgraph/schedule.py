"""Task-graph schedule file: what ``energyopt solve GRAPH -o FILE`` writes and
``energyopt verify GRAPH FILE`` reads. Times in ms, clocks in MHz."""

from __future__ import annotations

from pydantic import Field

from energyopt.spec.base import Spec


class ScheduledTask(Spec):
    """Where, at which clock and when one task runs."""

    task: str = Field(min_length=1)
    gpu: str = Field(min_length=1, description="GPU name as the task graph names it")
    clock_mhz: int = Field(gt=0)
    start_ms: float = Field(ge=0)
    end_ms: float = Field(ge=0)


class TaskGraphSchedule(Spec):
    """A schedule of every task, with the solver's account of its quality."""

    name: str
    objective: str = Field(description="objective kind of the task graph")
    objective_value: float | None = Field(default=None, description="in objective_unit")
    objective_unit: str = ""
    bound: float | None = None
    gap: float | None = None
    status: str = ""
    solver: str = ""
    makespan_ms: float = Field(default=0.0, ge=0)
    tasks: tuple[ScheduledTask, ...]
