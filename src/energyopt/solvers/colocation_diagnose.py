"""Why a co-location instance has no plan: one sentence per cause a user can act on."""

from __future__ import annotations

import numpy as np

from energyopt.formulations.colocation.model import ColocationModel


def diagnose(model: ColocationModel) -> list[str]:
    """Causes of infeasibility found by direct checks (may be empty)."""
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
            continue
        if np.all(units.power_w[mine] > model.power_cap_w):
            lines.append(
                f"job {job.name}: every configuration draws more than the power budget "
                f"leaves above idle ({model.power_cap_w:,.0f} W)"
            )
        if model.objective == "jct" and np.all(model.occupancy[mine] > model.slots):
            shortest = float(units.dur_a[mine].min())
            lines.append(
                f"job {job.name}: needs at least {shortest:,.0f} s alone, longer than the "
                f"horizon {model.slots * model.slot_s:,.0f} s (raise options.slots or slot_s)"
            )
    if not lines and model.objective == "jct":
        lines.append(
            "the jobs do not all fit in the horizon together; raise options.slots or "
            "options.slot_s, or use objective: throughput"
        )
    return lines
