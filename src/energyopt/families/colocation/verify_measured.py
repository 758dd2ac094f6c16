"""Check a measured-pairs plan and score it on the measured slowdowns.

Nothing here reads a scheduler's tables: each unit's jobs run at their measured
alone throughput on the unit's GPU type, slowed by the measured slowdown of the
pair (``MeasuredPairs.slowdown``) while both run and at full speed after the
partner ends (``timemodel.pair_durations``). Units on one GPU run in the order of
their planned start, each at its planned start or later once the GPU is free.

Violations: an unknown GPU or job, a job missing or in two units, a unit with no
job or more than two, a job twice in one unit, a negative or non-finite start,
a job whose type does not run on the GPU type (measured alone throughput 0), a
pair that did not run there (measured pair throughput 0).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from energyopt.families.colocation.formulations.measured import (
    MeasuredCluster,
    MeasuredJob,
    MeasuredPairs,
    MeasuredPlan,
)
from energyopt.families.colocation.formulations.timemodel import pair_durations
from energyopt.perf.params import FloatArray


@dataclass(frozen=True)
class MeasuredOutcome:
    """Violations, and where there are none: each job's completion (s), mean JCT (s),
    makespan (s) and GPU time held by units (GPU-s)."""

    violations: tuple[str, ...]
    completion_s: dict[str, float]
    mean_jct_s: float
    makespan_s: float
    gpu_time_s: float

    @property
    def ok(self) -> bool:
        """The plan has no violations."""
        return not self.violations


def check_measured_plan(
    data: MeasuredPairs,
    cluster: MeasuredCluster,
    jobs: Sequence[MeasuredJob],
    plan: MeasuredPlan,
    sigma: FloatArray | None = None,
) -> MeasuredOutcome:
    """Check ``plan`` and run it with ``sigma`` (default: the measured slowdowns)."""
    truth = data.slowdown() if sigma is None else sigma
    runs = data.runs()
    gpu_type = dict(cluster.gpu_ids())
    by_name = {j.name: j for j in jobs}
    problems: list[str] = []
    seen = Counter(name for unit in plan.units for name in unit.jobs)
    for name in sorted(set(by_name) - set(seen)):
        problems.append(f"job {name} is in no unit")
    for name, times in sorted(seen.items()):
        if name not in by_name:
            problems.append(f"unit names unknown job {name}")
        elif times > 1:
            problems.append(f"job {name} is in {times} units")
    per_gpu: dict[str, list[tuple[float, int]]] = {}
    for k, unit in enumerate(plan.units):
        where = f"units[{k}]"
        if unit.gpu not in gpu_type:
            problems.append(f"{where}: unknown GPU {unit.gpu}")
            continue
        if not 1 <= len(unit.jobs) <= 2:
            problems.append(f"{where}: {len(unit.jobs)} jobs (one or two share a GPU)")
            continue
        if len(set(unit.jobs)) != len(unit.jobs):
            problems.append(f"{where}: job {unit.jobs[0]} twice")
            continue
        if not (math.isfinite(unit.start_s) and unit.start_s >= 0):
            problems.append(f"{where}: start {unit.start_s} s is not a time >= 0")
            continue
        if any(name not in by_name for name in unit.jobs):
            continue
        g = gpu_type[unit.gpu]
        types = [by_name[name].job_type for name in unit.jobs]
        slow = [name for name, a in zip(unit.jobs, types, strict=True) if data.alone[g, a] <= 0]
        if slow:
            problems.append(f"{where}: {slow[0]} does not run on {cluster.gpu_types[g]}")
            continue
        if len(types) == 2 and not bool(runs[g, types[0], types[1]]):
            names = [data.job_types[a] for a in types]
            problems.append(f"{where}: the pair {names} did not run on {cluster.gpu_types[g]}")
            continue
        per_gpu.setdefault(unit.gpu, []).append((unit.start_s, k))
    if problems:
        return MeasuredOutcome(tuple(problems), {}, math.nan, math.nan, math.nan)
    completion: dict[str, float] = {}
    held = 0.0
    for gpu, order in per_gpu.items():
        g = gpu_type[gpu]
        free = 0.0
        for planned, k in sorted(order):
            unit = plan.units[k]
            unit_jobs = [by_name[name] for name in unit.jobs]
            rates = [float(data.alone[g, j.job_type]) for j in unit_jobs]
            if len(unit_jobs) == 1:
                durations = [unit_jobs[0].steps / rates[0]]
            else:
                a, b = unit_jobs[0].job_type, unit_jobs[1].job_type
                da, db = pair_durations(
                    np.asarray(unit_jobs[0].steps),
                    np.asarray(rates[0]),
                    np.asarray(float(truth[g, a, b])),
                    np.asarray(unit_jobs[1].steps),
                    np.asarray(rates[1]),
                    np.asarray(float(truth[g, b, a])),
                )
                durations = [float(da), float(db)]
            start = max(planned, free)
            for job, duration in zip(unit_jobs, durations, strict=True):
                completion[job.name] = start + duration
            free = start + max(durations)
            held += max(durations)
    ends = list(completion.values())
    return MeasuredOutcome(
        (),
        completion,
        float(np.mean(ends)) if ends else 0.0,
        max(ends, default=0.0),
        held,
    )
