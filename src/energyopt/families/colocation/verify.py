"""Check a co-location plan and recompute its outcome with the ground-truth interference.

Nothing here reads a solver's model: each unit's jobs are re-evaluated from the
plan's own settings (GPU type, count, clock, shares) with the performance model,
co-located jobs slow each other by the ground-truth contention model (not the
predictor the solvers use), and the plan is run on a timeline:

- units are dispatched in the order of their planned start (first come, first
  served); a unit starts at its planned time, or later once its GPUs are free
  and the power budget has room for it (power admission);
- in a pair, each job runs at its rate over its slowdown while both run and at
  its full rate after its partner has finished; a unit holds its GPUs until its
  last job ends.

Violations are the constraints a plan itself breaks: unknown or missing jobs and
GPUs, a job in two places, pairs that are not one training and one inference
job, shares over 100 %, GPU counts outside a job's range, unsupported clocks,
memory or TDP exceeded on a GPU, a unit that alone exceeds the power budget.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from energyopt.families.colocation.formulations.configs import pair_features
from energyopt.families.colocation.formulations.interference import Slowdown, true_slowdown
from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.formulations.rates import (
    JobPoint,
    evaluate_points,
    on_extra_w,
    work_units,
)
from energyopt.families.colocation.spec import ColocationPlan, PlanUnit
from energyopt.verify.violation import Violation

REL_TOL = 1e-6
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class JobRun:
    """When a job ran (s), on how many GPUs, and its slowdown while co-located."""

    job: str
    unit: int
    start_s: float
    end_s: float
    gpus: int
    slowdown: float
    sm_busy_s: float  # SM-seconds of useful work over all its GPUs, in whole-GPU units


@dataclass
class ColocationEvaluation:
    """Recomputed figures of a plan (times in s, power in W)."""

    violations: list[Violation] = field(default_factory=list)
    runs: dict[str, JobRun] = field(default_factory=dict)
    not_run: list[str] = field(default_factory=list)
    mean_jct_s: float = float("nan")
    makespan_s: float = 0.0
    jobs_per_hour: float = 0.0
    horizon_jobs_per_hour: float = 0.0
    sm_utilization: float = 0.0
    gpu_allocation: float = 0.0
    peak_power_w: float = 0.0
    objective: float = float("nan")

    @property
    def ok(self) -> bool:
        """True when the plan breaks no constraint."""
        return not self.violations


@dataclass
class _Unit:
    index: int
    unit: PlanUnit
    jobs: list[int]
    shares: list[int]
    durations: list[float]
    slowdowns: list[float]
    rates: list[float]
    sm_busy: list[float]
    power_both_w: float
    power_after_w: float  # while only the longer-running job is left
    first_end: float  # run time until the first job ends
    span: float


def evaluate_colocation(
    problem: ColocationProblem, plan: ColocationPlan, slowdown: Slowdown = true_slowdown
) -> ColocationEvaluation:
    """Check the plan and run it on the timeline under ``slowdown``."""
    ev = ColocationEvaluation()
    bad = ev.violations.append
    inst = problem.instance
    names = {job.name: j for j, job in enumerate(problem.jobs)}
    gpu_type_of = dict(inst.cluster.gpu_ids())
    seen: Counter[str] = Counter()
    for u in plan.units:
        seen.update(uj.job for uj in u.jobs)
    seen.update(plan.unscheduled)
    for name, count in sorted(seen.items()):
        if name not in names:
            bad(Violation("job", name, "not a job of the instance"))
        elif count > 1:
            bad(Violation("job", name, f"appears {count} times (units and unscheduled)"))
    for job in problem.jobs:
        if job.name not in seen:
            bad(Violation("job", job.name, "in no unit and not listed as unscheduled"))
    if plan.unscheduled and inst.options.objective == "jct":
        bad(
            Violation(
                "job",
                ", ".join(plan.unscheduled),
                "the jct objective needs every job to run; unscheduled is for throughput",
            )
        )
    units: list[_Unit] = []
    for i, u in enumerate(plan.units):
        checked = _check_unit(problem, i, u, names, gpu_type_of, bad)
        if checked is not None:
            units.append(_evaluate_unit(problem, checked, u, slowdown))
    _run_timeline(problem, units, ev)
    return ev


def _check_unit(
    problem: ColocationProblem,
    i: int,
    u: PlanUnit,
    names: dict[str, int],
    gpu_type_of: dict[str, str],
    report: Callable[[Violation], None],
) -> _Unit | None:
    where = f"unit {i} ({', '.join(j.job for j in u.jobs)})"
    ok = True
    if u.gpu_type not in problem.type_names():
        report(Violation("gpu", where, f"GPU type {u.gpu_type!r} is in no pool"))
        return None
    dup = sorted({g for g in u.gpus if u.gpus.count(g) > 1})
    if dup:
        report(Violation("gpu", where, f"GPU {dup[0]} listed twice"))
        ok = False
    for g in u.gpus:
        if g not in gpu_type_of:
            report(Violation("gpu", where, f"no GPU {g!r} in the cluster"))
            ok = False
        elif gpu_type_of[g] != u.gpu_type:
            report(Violation("gpu", where, f"GPU {g} is a {gpu_type_of[g]}, not {u.gpu_type}"))
            ok = False
    gpu = problem.gpu_type(u.gpu_type)
    if u.clock_mhz not in gpu.sm_clocks_mhz():
        report(Violation("clock", where, f"{u.clock_mhz} MHz is not a clock of {gpu.name}"))
        ok = False
    jobs = [names.get(uj.job, -1) for uj in u.jobs]
    if min(jobs) < 0:
        return None
    shares = [uj.share_pct for uj in u.jobs]
    if len(jobs) == 2:
        kinds = sorted(problem.jobs[j].kind for j in jobs)
        if kinds != ["inference", "training"]:
            report(Violation("pair", where, "a pair must be one training and one inference job"))
            ok = False
        if jobs[0] == jobs[1]:
            return None
    if sum(shares) > 100:
        report(Violation("share", where, f"SM shares add up to {sum(shares)}% (over 100%)"))
        ok = False
    for j in jobs:
        job = problem.jobs[j]
        if not job.min_gpus <= len(u.gpus) <= job.max_gpus:
            report(
                Violation(
                    "gpus",
                    where,
                    f"{job.name} gets {len(u.gpus)} GPUs, outside {job.min_gpus}..{job.max_gpus}",
                )
            )
            ok = False
    if not ok:
        return None
    return _Unit(i, u, jobs, shares, [], [], [], [], 0.0, 0.0, 0.0, 0.0)


def _evaluate_unit(
    problem: ColocationProblem, unit: _Unit, u: PlanUnit, slowdown: Slowdown
) -> _Unit:
    n = len(u.gpus)
    points = [
        JobPoint(j, u.gpu_type, n, u.clock_mhz, s)
        for j, s in zip(unit.jobs, unit.shares, strict=True)
    ]
    phys = evaluate_points(problem, points)
    work = np.asarray([work_units(problem.jobs[j]) for j in unit.jobs])
    if len(points) == 2:
        a, b = np.asarray([0]), np.asarray([1])
        sig = [
            float(slowdown(pair_features(phys, a, b))[0]),
            float(slowdown(pair_features(phys, b, a))[0]),
        ]
        durations = _run_pair([float(w) for w in work], [float(r) for r in phys.rate], sig)
    else:
        sig = [1.0]
        durations = [float(work[0] / phys.rate[0])]
    unit.slowdowns = sig
    unit.durations = durations
    unit.rates = [float(r) for r in phys.rate]
    alone = work / phys.rate
    unit.sm_busy = [
        float(n * phys.sm_occupancy[k] * phys.active[k] * alone[k]) for k in range(len(points))
    ]
    extra = on_extra_w(problem, u.gpu_type, u.clock_mhz)
    unit.power_both_w = n * (extra + float(phys.dyn_w.sum()))
    longer = int(np.argmax(durations))
    unit.power_after_w = n * (extra + float(phys.dyn_w[longer]))
    unit.first_end = min(durations)
    unit.span = max(durations)
    return unit


def _run_pair(work: list[float], rate: list[float], slowdown: list[float]) -> list[float]:
    """Run time (s) of each job of a pair, stepped event by event (the checker's own
    arithmetic, not the formulation's closed form): both progress at rate / slowdown
    until the first finishes; the other then runs alone at its full rate."""
    speed = [r / s for r, s in zip(rate, slowdown, strict=True)]
    left = list(work)
    first = min(range(2), key=lambda k: (left[k] / speed[k], k))
    other = 1 - first
    t_first = left[first] / speed[first]
    left[other] -= speed[other] * t_first
    return (
        [t_first, t_first + max(left[other], 0.0) / rate[other]]
        if first == 0
        else [t_first + max(left[other], 0.0) / rate[other], t_first]
    )


def _work_done(
    elapsed_s: float, work: float, rate: float, slowdown: float, overlap_s: float
) -> float:
    """Fraction of a job's work done ``elapsed_s`` after its unit started: at
    rate / slowdown during the first ``overlap_s`` seconds, at rate after."""
    t = max(elapsed_s, 0.0)
    slow = min(t, overlap_s)
    done = rate / slowdown * slow + rate * max(t - overlap_s, 0.0)
    return min(done / work, 1.0)


def _check_memory_and_tdp(problem: ColocationProblem, unit: _Unit) -> list[Violation]:
    u = unit.unit
    where = f"unit {unit.index} ({', '.join(j.job for j in u.jobs)})"
    n = len(u.gpus)
    phys = evaluate_points(
        problem,
        [
            JobPoint(j, u.gpu_type, n, u.clock_mhz, s)
            for j, s in zip(unit.jobs, unit.shares, strict=True)
        ],
    )
    out = []
    usable = problem.usable_memory_gb(u.gpu_type)
    need = float(phys.memory_gb.sum())
    if need > usable * (1 + REL_TOL):
        out.append(Violation("memory", where, f"{need:.1f} GB per GPU, {usable:.1f} GB usable"))
    gpu = problem.gpu_type(u.gpu_type)
    per_gpu = gpu.idle_w + unit.power_both_w / n
    if per_gpu > gpu.tdp_w * (1 + REL_TOL):
        out.append(Violation("power", where, f"{per_gpu:.0f} W per GPU, TDP {gpu.tdp_w:.0f} W"))
    return out


def _power_at(unit: _Unit, start: float, t: float) -> float:
    if t < start or t >= start + unit.span:
        return 0.0
    return unit.power_both_w if t < start + unit.first_end else unit.power_after_w


def _run_timeline(problem: ColocationProblem, units: list[_Unit], ev: ColocationEvaluation) -> None:
    inst = problem.instance
    budget = inst.cluster.power_budget_w
    cap = float("inf") if budget is None else budget - problem.idle_power_w()
    for unit in units:
        for v in _check_memory_and_tdp(problem, unit):
            ev.violations.append(v)
    order = sorted(units, key=lambda x: (x.unit.start_s, x.index))
    gpu_free: dict[str, float] = {}
    started: list[tuple[_Unit, float]] = []
    last_start = 0.0
    for unit in order:
        where = f"unit {unit.index} ({', '.join(j.job for j in unit.unit.jobs)})"
        if unit.power_both_w > cap * (1 + REL_TOL):
            ev.violations.append(
                Violation(
                    "power",
                    where,
                    f"draws {unit.power_both_w:,.0f} W above idle; the budget leaves "
                    f"{cap:,.0f} W, so it can never start",
                )
            )
            continue
        t = max(unit.unit.start_s, last_start, *(gpu_free.get(g, 0.0) for g in unit.unit.gpus))
        events = sorted({s + x.first_end for x, s in started} | {s + x.span for x, s in started})
        while True:
            used = sum(_power_at(x, s, t) for x, s in started)
            if used + unit.power_both_w <= cap * (1 + REL_TOL) + 1e-9:
                break
            later = [e for e in events if e > t]
            t = later[0]  # some running unit ends or drops power: power only falls
        started.append((unit, t))
        last_start = t
        for g in unit.unit.gpus:
            gpu_free[g] = t + unit.span
        ev.peak_power_w = max(ev.peak_power_w, sum(_power_at(x, s, t) for x, s in started))
        for k, j in enumerate(unit.jobs):
            name = problem.jobs[j].name
            ev.runs[name] = JobRun(
                name,
                unit.index,
                t,
                t + unit.durations[k],
                len(unit.unit.gpus),
                unit.slowdowns[k],
                unit.sm_busy[k],
            )
    ev.peak_power_w += problem.idle_power_w()
    ev.not_run = [j.name for j in problem.jobs if j.name not in ev.runs]
    _figures(problem, started, ev)


def _figures(
    problem: ColocationProblem, started: list[tuple[_Unit, float]], ev: ColocationEvaluation
) -> None:
    inst = problem.instance
    horizon = inst.options.horizon_s
    total_gpus = sum(p.count for p in inst.cluster.pools)
    if not ev.runs:
        ev.objective = 0.0 if inst.options.objective == "throughput" else float("nan")
        return
    ends = [r.end_s for r in ev.runs.values()]
    ev.makespan_s = max(ends)
    ev.mean_jct_s = float(np.mean(ends))
    ev.jobs_per_hour = len(ev.runs) * SECONDS_PER_HOUR / max(ev.makespan_s, 1e-9)
    done = 0.0
    for unit, start in started:
        overlap = unit.first_end if len(unit.jobs) == 2 else 0.0
        for k, j in enumerate(unit.jobs):
            done += _work_done(
                horizon - start,
                float(work_units(problem.jobs[j])),
                unit.rates[k],
                unit.slowdowns[k],
                overlap,
            )
    ev.horizon_jobs_per_hour = done * SECONDS_PER_HOUR / horizon
    busy = sum(r.sm_busy_s for r in ev.runs.values())
    held = sum(len(unit.unit.gpus) * unit.span for unit, _ in started)
    ev.sm_utilization = busy / (total_gpus * ev.makespan_s)
    ev.gpu_allocation = held / (total_gpus * ev.makespan_s)
    if inst.options.objective == "jct":
        ev.objective = ev.mean_jct_s if not ev.not_run else float("nan")
    else:
        ev.objective = ev.horizon_jobs_per_hour
