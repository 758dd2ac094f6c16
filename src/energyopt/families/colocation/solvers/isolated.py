"""Static isolated allocation, the baseline: no sharing, first come first served.

Each job, in file order, gets whole dedicated GPUs in the shape it asks for (its
largest allowed GPU count, at the highest candidate clock the power budget
allows) on the GPU type where
it would finish first; a job that does not fit waits until GPUs and power free
up, and no job starts before the one ahead of it (no backfilling). Start times
are continuous (not on the slot grid). A heuristic: it reports no bound.
"""

from __future__ import annotations

import time

import numpy as np

from energyopt.families.colocation.formulations.model import ColocationModel
from energyopt.families.colocation.formulations.timemodel import progress_by
from energyopt.families.colocation.solvers.result import ColocationResult, colocation_result
from energyopt.families.colocation.spec import ColocationPlan, PlanUnit, UnitJob
from energyopt.solvers.result import FEASIBLE, NO_SOLUTION, Sense

SECONDS_PER_HOUR = 3600.0


def requested_configs(model: ColocationModel, job: int) -> list[int]:
    """Per GPU type, the job's alone configuration with the most GPUs, then the highest
    clock, among those whose power fits the budget."""
    u = model.table.units
    out = []
    for t in range(len(model.table.type_names)):
        mine = np.flatnonzero(
            (u.job_a == job)
            & (u.job_b < 0)
            & (u.type_index == t)
            & (u.power_w <= model.power_cap_w + 1e-9)
        )
        if len(mine):
            out.append(int(mine[np.lexsort((u.clock_mhz[mine], u.gpus[mine]))[-1]]))
    return out


def solve_isolated(model: ColocationModel) -> ColocationResult:
    """The baseline plan; its objective in the planning model, no bound."""
    t0 = time.perf_counter()
    sense: Sense = "min" if model.objective == "jct" else "max"
    problem = model.problem
    u = model.table.units
    ids: dict[int, list[str]] = {t: [] for t in range(len(model.table.type_names))}
    for gid, type_name in problem.instance.cluster.gpu_ids():
        ids[model.table.type_names.index(type_name)].append(gid)
    free = {g: 0.0 for t in ids for g in ids[t]}
    running: list[tuple[float, float, float]] = []  # (start, end, power above idle)
    last = 0.0
    planned: list[PlanUnit] = []
    finish: list[float] = []
    done = 0.0
    for j, job in enumerate(problem.jobs):
        best: tuple[float, float, int, list[str]] | None = None
        for c in requested_configs(model, j):
            if u.power_w[c] > model.power_cap_w:
                continue
            gpus = ids[int(u.type_index[c])]
            n = int(u.gpus[c])
            if n > len(gpus):
                continue
            times = sorted({last, *(free[g] for g in gpus), *(e for _, e, _ in running)})
            for t in (x for x in times if x >= last):
                avail = [g for g in gpus if free[g] <= t]
                power = sum(p for s, e, p in running if s <= t < e)
                if len(avail) >= n and power + u.power_w[c] <= model.power_cap_w + 1e-9:
                    end = t + float(u.dur_a[c])
                    if best is None or end < best[1]:
                        best = (t, end, c, sorted(avail, key=lambda g: free[g])[:n])
                    break
        if best is None:
            # The baseline's own shape does not fit; other shapes may (no claim that
            # the instance has no plan).
            diag = [f"job {job.name}: no whole-GPU configuration fits the cluster and budget"]
            return colocation_result(
                NO_SOLUTION,
                None,
                None,
                sense,
                time.perf_counter() - t0,
                None,
                "isolated",
                diagnosis=diag,
            )
        start, end, c, chosen = best
        for g in chosen:
            free[g] = end
        running.append((start, end, float(u.power_w[c])))
        last = start
        finish.append(end)
        elapsed = np.asarray(model.problem.instance.options.horizon_s - start)
        done += float(
            progress_by(
                elapsed,
                np.asarray(model.table.work[j]),
                np.asarray(model.rate_a[c]),
                np.asarray(1.0),
                np.asarray(0.0),
            )
        )
        planned.append(
            PlanUnit(
                gpu_type=model.table.type_names[int(u.type_index[c])],
                gpus=tuple(chosen),
                clock_mhz=int(u.clock_mhz[c]),
                start_s=start,
                jobs=(UnitJob(job=job.name, share_pct=100),),
            )
        )
    if model.objective == "jct":
        objective = float(np.mean(finish))
    else:
        objective = done * SECONDS_PER_HOUR / problem.instance.options.horizon_s
    plan = ColocationPlan(instance=problem.instance.name, units=tuple(planned))
    return colocation_result(
        FEASIBLE,
        objective,
        None,
        sense,
        time.perf_counter() - t0,
        plan,
        "isolated",
        ["static isolated allocation (heuristic, no bound)"],
    )
