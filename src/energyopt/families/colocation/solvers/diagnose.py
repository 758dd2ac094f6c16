"""Why a co-location instance has no plan: one sentence per cause a user can act on."""

from __future__ import annotations

import numpy as np

from energyopt.families.colocation.formulations.model import ColocationModel
from energyopt.solvers.result import INFEASIBLE, NO_SOLUTION, Status


def unrunnable(model: ColocationModel) -> list[str]:
    """Causes no horizon removes (may be empty): a budget below idle, a job with no
    configuration that fits a GPU's memory and TDP, or none within the power budget.
    Without one, every job can run alone, one after another, past any horizon: a plan
    exists, and a slotted solver that finds none has only run out of slots."""
    problem = model.problem
    units = model.table.units
    lines: list[str] = []
    budget = problem.instance.cluster.power_budget_w
    if budget is not None and model.power_cap_w < 0:
        lines.append(
            f"the power budget {budget:,.0f} W is below the idle power of the cluster "
            f"{problem.idle_power_w():,.0f} W"
        )
    alone = units.job_b < 0
    for j, job in enumerate(problem.jobs):
        mine = np.flatnonzero(alone & (units.job_a == j))
        if len(mine) == 0:
            lines.append(
                f"job {job.name}: no configuration fits a GPU's memory and TDP "
                f"(allow more GPUs with max_gpus, or add larger GPUs)"
            )
        elif np.all(units.power_w[mine] > model.power_cap_w):
            lines.append(
                f"job {job.name}: every configuration draws more than the power budget "
                f"leaves above idle ({model.power_cap_w:,.0f} W)"
            )
    return lines


def diagnose(model: ColocationModel) -> list[str]:
    """Why the slotted solvers found no plan: the causes no horizon removes, else the
    jobs the horizon is too short for (may be empty)."""
    lines = unrunnable(model)
    if lines or model.objective != "jct":
        return lines
    problem = model.problem
    units = model.table.units
    alone = units.job_b < 0
    horizon = model.slots * model.slot_s
    for j, job in enumerate(problem.jobs):
        mine = np.flatnonzero(alone & (units.job_a == j))
        if np.all(model.occupancy[mine] > model.slots):
            shortest = float(units.dur_a[mine].min())
            lines.append(
                f"job {job.name}: needs at least {shortest:,.0f} s alone, longer than the "
                f"horizon {horizon:,.0f} s (raise options.slots or slot_s)"
            )
    if not lines:
        lines.append(
            "the jobs do not all fit in the horizon together; raise options.slots or "
            "options.slot_s, or use objective: throughput"
        )
    lines.append(
        f"a plan exists past the horizon: every job can run alone, one after another "
        f"(solver isolated schedules that way, with no horizon); the slotted solvers "
        f"place every unit within the horizon {horizon:,.0f} s"
    )
    return lines


def no_plan_status(model: ColocationModel) -> Status:
    """INFEASIBLE where a cause no horizon removes is found, else NO_SOLUTION: a plan
    the slotted solvers cannot place within the horizon may still run past it (the
    checker accepts any start time), so their failing is no proof."""
    return INFEASIBLE if unrunnable(model) else NO_SOLUTION
