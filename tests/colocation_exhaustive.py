"""Tiny co-location instances and an exhaustive optimiser written apart from the
formulations, for the canonical test of every co-location solver.

The optimiser reads only the performance model of a job at one configuration
(``rates.evaluate_points``: rate, power, memory and contention features), the
on-power of a clock, the interference predictor the problem is planned with, and
the instance. Everything else is its own, from the model's definition in
docs/formulations/colocation.md: which configurations exist (no dominance
pruning), memory and TDP limits, the run times of a pair, whole-slot holding of
GPUs and power, and both objectives. It enumerates every pairing of training with
inference jobs, every configuration of every unit and every start slot, with
resources checked slot by slot.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from energyopt.families.colocation.formulations.interference import PairFeatures, default_predictor
from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.formulations.rates import (
    JobPoint,
    Physics,
    evaluate_points,
    on_extra_w,
)
from energyopt.families.colocation.spec import (
    ColocationPlan,
    InferenceJob,
    PlanUnit,
    TrainingJob,
    UnitJob,
)

H200 = "H200-SXM-141GB"
H100 = "H100-SXM5-80GB"
SLOT_TOL = 1e-9
"""A run of exactly k slots holds k slots (the time grid's rounding tolerance)."""


@dataclass(frozen=True)
class Option:
    """One way to run a unit (one job, or a training and an inference job): GPU type,
    GPU count, clock (MHz), SM shares (%), run time of each job (s), power above
    idle while both run (W, over all its GPUs), and each job's speed while its
    partner runs and alone (work units/s) with its work."""

    jobs: tuple[int, ...]
    type_name: str
    gpus: int
    clock_mhz: int
    shares: tuple[int, ...]
    run_s: tuple[float, ...]
    power_w: float
    slowed: tuple[float, ...]
    alone: tuple[float, ...]
    work: tuple[float, ...]


@dataclass(frozen=True)
class Optimum:
    """The exhaustive optimum (mean JCT s, or jobs per hour), None when no plan
    exists; ``plans`` is how many complete plans were evaluated."""

    value: float | None
    plans: int
    best: tuple[tuple[Option, int], ...] | None = None


def _work(job: TrainingJob | InferenceJob) -> float:
    return float(job.iterations if isinstance(job, TrainingJob) else job.items)


def _clocks(problem: ColocationProblem, type_name: str) -> tuple[int, ...]:
    clocks = problem.instance.options.clocks_mhz
    assert clocks is not None and type_name in clocks, "the canonical set gives clocks"
    return tuple(sorted(clocks[type_name]))


def _counts(problem: ColocationProblem, j: int) -> list[int]:
    job = problem.jobs[j]
    counts = problem.instance.options.gpu_counts
    return sorted({n for n in counts if job.min_gpus <= n <= job.max_gpus})


def _features(phys: Physics, a: int, b: int) -> PairFeatures:
    def at(values: np.ndarray, k: int) -> np.ndarray:
        return np.asarray([values[k]])

    return PairFeatures(
        active_a=at(phys.active, a),
        active_b=at(phys.active, b),
        bw_a=at(phys.bw_use, a),
        bw_b=at(phys.bw_use, b),
        mem_bound_a=at(phys.mem_bound, a),
        footprint_a=at(phys.footprint, a),
        footprint_b=at(phys.footprint, b),
        occupancy_a=at(phys.sm_occupancy, a),
        occupancy_b=at(phys.sm_occupancy, b),
    )


def pair_run_times(
    work: tuple[float, float], slowed: tuple[float, float], alone: tuple[float, float]
) -> tuple[float, float]:
    """Run times of two jobs started together: both progress at their slowed speed
    until one has done its work; the other then does what is left alone."""
    t = [work[k] / slowed[k] for k in range(2)]
    first = 0 if t[0] <= t[1] else 1
    other = 1 - first
    left = work[other] - slowed[other] * t[first]
    out = [0.0, 0.0]
    out[first] = t[first]
    out[other] = t[first] + max(left, 0.0) / alone[other]
    return out[0], out[1]


def options(problem: ColocationProblem) -> dict[tuple[int, ...], list[Option]]:
    """Every configuration of every possible unit that fits memory and TDP."""
    predictor = default_predictor()
    opts = problem.instance.options
    n_jobs = len(problem.jobs)
    out: dict[tuple[int, ...], list[Option]] = {}
    training = [j for j in range(n_jobs) if isinstance(problem.jobs[j], TrainingJob)]
    inference = [j for j in range(n_jobs) if j not in training]
    for t in problem.type_names():
        gpu = problem.gpu_type(t)
        usable = problem.usable_memory_gb(t)
        for f in _clocks(problem, t):
            extra = on_extra_w(problem, t, f)
            for j in range(n_jobs):
                for n in _counts(problem, j):
                    phys = evaluate_points(problem, [JobPoint(j, t, n, f, 100)])
                    if phys.memory_gb[0] > usable:
                        continue
                    if gpu.idle_w + extra + phys.dyn_w[0] > gpu.tdp_w:
                        continue
                    w = _work(problem.jobs[j])
                    r = float(phys.rate[0])
                    power = n * (extra + float(phys.dyn_w[0]))
                    out.setdefault((j,), []).append(
                        Option((j,), t, n, f, (100,), (w / r,), power, (r,), (r,), (w,))
                    )
            for s in opts.share_levels_pct:
                for a, b in itertools.product(training, inference):
                    for n in sorted(set(_counts(problem, a)) & set(_counts(problem, b))):
                        phys = evaluate_points(
                            problem, [JobPoint(a, t, n, f, s), JobPoint(b, t, n, f, 100 - s)]
                        )
                        if float(phys.memory_gb[0] + phys.memory_gb[1]) > usable:
                            continue
                        dyn = float(phys.dyn_w[0] + phys.dyn_w[1])
                        if gpu.idle_w + extra + dyn > gpu.tdp_w:
                            continue
                        sigma = (
                            float(predictor(_features(phys, 0, 1))[0]),
                            float(predictor(_features(phys, 1, 0))[0]),
                        )
                        alone = (float(phys.rate[0]), float(phys.rate[1]))
                        slowed = (alone[0] / sigma[0], alone[1] / sigma[1])
                        work = (_work(problem.jobs[a]), _work(problem.jobs[b]))
                        run = pair_run_times(work, slowed, alone)
                        power = n * (extra + dyn)
                        out.setdefault((a, b), []).append(
                            Option((a, b), t, n, f, (s, 100 - s), run, power, slowed, alone, work)
                        )
    return out


def _done(option: Option, k: int, elapsed: float) -> float:
    """Fraction of job k of the unit done ``elapsed`` s after the unit started."""
    if elapsed <= 0:
        return 0.0
    both = min(option.run_s)  # time both jobs run (0 for a job alone: it runs alone)
    if len(option.jobs) == 1:
        both = 0.0
    slow = min(elapsed, both) * option.slowed[k]
    fast = max(elapsed - both, 0.0) * option.alone[k]
    return min((slow + fast) / option.work[k], 1.0)


def _matchings(problem: ColocationProblem) -> list[list[tuple[int, ...]]]:
    """Every partition of the jobs into singles and (training, inference) pairs."""
    n_jobs = len(problem.jobs)
    training = [j for j in range(n_jobs) if isinstance(problem.jobs[j], TrainingJob)]
    inference = [j for j in range(n_jobs) if j not in training]
    out: list[list[tuple[int, ...]]] = []
    for k in range(min(len(training), len(inference)) + 1):
        for ts in itertools.combinations(training, k):
            for is_ in itertools.permutations(inference, k):
                pairs = list(zip(ts, is_, strict=True))
                paired = {j for p in pairs for j in p}
                out.append([*pairs, *((j,) for j in range(n_jobs) if j not in paired)])
    return out


Pick = tuple[Option, int] | None
"""A unit's configuration and start slot, or None: not run (throughput only)."""


class _Search:
    """Depth-first enumeration of one pairing's units, resources checked per slot."""

    def __init__(self, problem: ColocationProblem) -> None:
        inst = problem.instance
        opts = inst.options
        self.slots, self.slot_s = opts.slots, opts.slot_s
        self.horizon = self.slots * self.slot_s
        self.jct = opts.objective == "jct"
        self.n_jobs = len(problem.jobs)
        budget = inst.cluster.power_budget_w
        self.power_cap = math.inf if budget is None else budget - problem.idle_power_w()
        self.gpus = {t: problem.gpu_count(t) for t in problem.type_names()}
        self.by_unit = options(problem)
        self.best_value: float | None = None
        self.best_plan: tuple[tuple[Option, int], ...] | None = None
        self.plans = 0
        self.used_gpus: dict[str, list[int]] = {}
        self.used_power: list[float] = []
        self.chosen: list[Pick] = []

    def held(self, option: Option) -> int:
        """Whole slots the unit holds its GPUs and power (at least one)."""
        return max(1, math.ceil(max(option.run_s) / self.slot_s - SLOT_TOL))

    def choices(self, unit: tuple[int, ...]) -> list[Pick]:
        out: list[Pick] = [] if self.jct else [None]
        for option in self.by_unit.get(unit, []):
            for start in range(self.slots):
                if self.jct and start + self.held(option) > self.slots:
                    continue  # every unit ends within the horizon
                out.append((option, start))
        return out

    def value(self) -> float:
        total = 0.0
        for pick in self.chosen:
            if pick is None:
                continue
            option, start = pick
            for k in range(len(option.jobs)):
                if self.jct:
                    total += (start * self.slot_s + option.run_s[k]) / self.n_jobs
                else:
                    done = _done(option, k, self.horizon - start * self.slot_s)
                    total += done * 3600.0 / self.horizon
        return total

    def run(self, units: list[tuple[int, ...]]) -> None:
        lists = [self.choices(u) for u in units]
        if any(not c for c in lists):
            return
        self.used_gpus = {t: [0] * self.slots for t in self.gpus}
        self.used_power = [0.0] * self.slots
        self.chosen = []
        self._place(lists, 0)

    def _fits(self, option: Option, span: range) -> bool:
        used = self.used_gpus[option.type_name]
        cap = self.gpus[option.type_name]
        if any(used[s] + option.gpus > cap for s in span):
            return False
        limit = self.power_cap * (1 + 1e-9)
        return all(self.used_power[s] + option.power_w <= limit for s in span)

    def _take(self, option: Option, span: range, sign: int) -> None:
        for s in span:
            self.used_gpus[option.type_name][s] += sign * option.gpus
            self.used_power[s] += sign * option.power_w

    def _place(self, lists: list[list[Pick]], i: int) -> None:
        if i == len(lists):
            self.plans += 1
            value = self.value()
            better = self.best_value is None or (
                value < self.best_value if self.jct else value > self.best_value
            )
            if better:
                self.best_value = value
                self.best_plan = tuple(p for p in self.chosen if p is not None)
            return
        for pick in lists[i]:
            span = range(0)
            if pick is not None:
                option, start = pick
                span = range(start, min(start + self.held(option), self.slots))
                if not self._fits(option, span):
                    continue
                self._take(option, span, 1)
            self.chosen.append(pick)
            self._place(lists, i + 1)
            self.chosen.pop()
            if pick is not None:
                self._take(pick[0], span, -1)


def exhaustive_optimum(problem: ColocationProblem) -> Optimum:
    """The best plan of the slotted model by enumeration (see module docstring)."""
    search = _Search(problem)
    for units in _matchings(problem):
        search.run(units)
    return Optimum(search.best_value, search.plans, search.best_plan)


def as_plan(problem: ColocationProblem, best: tuple[tuple[Option, int], ...]) -> ColocationPlan:
    """The exhaustive optimum as a plan file: units in start order on GPUs of their
    type that are free by then (a unit holds its GPUs for whole slots)."""
    opts = problem.instance.options
    free_at: dict[str, int] = {gpu: 0 for gpu, _ in problem.instance.cluster.gpu_ids()}
    type_of = dict(problem.instance.cluster.gpu_ids())
    units: list[PlanUnit] = []
    for option, start in sorted(best, key=lambda pick: pick[1]):
        ready = [g for g in free_at if type_of[g] == option.type_name and free_at[g] <= start]
        assert len(ready) >= option.gpus, "slot counts hold, so GPUs are free"
        held = max(1, math.ceil(max(option.run_s) / opts.slot_s - SLOT_TOL))
        for g in ready[: option.gpus]:
            free_at[g] = start + held
        units.append(
            PlanUnit(
                gpu_type=option.type_name,
                gpus=tuple(ready[: option.gpus]),
                clock_mhz=option.clock_mhz,
                start_s=start * opts.slot_s,
                jobs=tuple(
                    UnitJob(job=problem.jobs[j].name, share_pct=s)
                    for j, s in zip(option.jobs, option.shares, strict=True)
                ),
            )
        )
    placed = {uj.job for u in units for uj in u.jobs}
    unscheduled = tuple(job.name for job in problem.jobs if job.name not in placed)
    return ColocationPlan(
        instance=problem.instance.name, units=tuple(units), unscheduled=unscheduled
    )
