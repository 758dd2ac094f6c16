"""Configuration families: every way a job, or a (training, inference) pair, can run.

A *unit configuration* is a job alone on n whole GPUs of one type at one clock
(share 100 %), or a training job and an inference job on the same n GPUs at one
clock with SM shares s and 100 - s. Each has a duration per job (work over rate,
with the interference slowdown of the pair), a power draw above idle and a
memory need per GPU. Configurations that exceed memory or TDP are dropped, and
so are dominated ones: another configuration of the same job (pair) and GPU
type that is no slower for any of its jobs and uses no more GPUs and power.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from energyopt.families.colocation.formulations.interference import PairFeatures, Slowdown
from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.formulations.rates import (
    JobPoint,
    Physics,
    evaluate_points,
    on_extra_w,
    work_units,
)
from energyopt.families.colocation.formulations.timemodel import pair_durations
from energyopt.families.colocation.spec import TrainingJob
from energyopt.perf.clocks import candidate_clocks_mhz
from energyopt.perf.params import BoolArray, FloatArray

IntArray = NDArray[np.int64]
NO_JOB = -1


def candidate_clocks(problem: ColocationProblem, type_name: str) -> tuple[int, ...]:
    """Candidate SM clocks of a GPU type (MHz, ascending): given, or evenly spread."""
    opts = problem.instance.options
    return candidate_clocks_mhz(problem.gpu_type(type_name), opts.clocks_mhz, opts.clock_count)


def job_shares(problem: ColocationProblem, job_index: int) -> tuple[int, ...]:
    """SM shares (%) a job can run at: 100 alone, or its side of a pair split."""
    levels = problem.instance.options.share_levels_pct
    job = problem.jobs[job_index]
    side = levels if isinstance(job, TrainingJob) else tuple(100 - s for s in levels)
    return tuple(sorted({100, *side}))


def gpu_counts(problem: ColocationProblem, job_index: int) -> tuple[int, ...]:
    """GPU counts a job may get: options.gpu_counts within its min..max."""
    job = problem.jobs[job_index]
    counts = problem.instance.options.gpu_counts
    return tuple(sorted({n for n in counts if job.min_gpus <= n <= job.max_gpus}))


@dataclass(frozen=True)
class Units:
    """Unit configurations (arrays indexed by unit config).

    job_b is NO_JOB for a job alone. Durations are seconds from the unit's start
    (``timemodel.pair_durations``); power_w is the unit's draw above idle over
    all its GPUs while both jobs run (W).
    """

    job_a: IntArray
    job_b: IntArray
    type_index: IntArray
    gpus: IntArray
    clock_mhz: IntArray
    share_a: IntArray  # percent; the partner gets 100 - share_a
    point_a: IntArray
    point_b: IntArray  # -1 for a job alone
    sigma_a: FloatArray
    sigma_b: FloatArray  # 1 for a job alone
    dur_a: FloatArray
    dur_b: FloatArray  # 0 for a job alone
    power_w: FloatArray
    memory_gb: FloatArray  # per GPU, both jobs

    def __len__(self) -> int:
        return int(self.job_a.shape[0])

    @property
    def paired(self) -> BoolArray:
        """True where the unit holds two jobs."""
        return np.asarray(self.job_b != NO_JOB)

    @property
    def span_s(self) -> FloatArray:
        """Time the unit holds its GPUs: until its last job ends (s)."""
        return np.asarray(np.maximum(self.dur_a, self.dur_b))


@dataclass(frozen=True)
class ConfigTable:
    """Job points with their physics, and every non-dominated unit configuration."""

    type_names: list[str]
    clocks: dict[str, tuple[int, ...]]
    points: list[JobPoint]
    physics: Physics
    work: FloatArray  # per job
    units: Units
    pruned: int  # unit configurations dropped as dominated


def pair_features(phys: Physics, a: IntArray, b: IntArray) -> PairFeatures:
    """Features of job points ``a`` next to job points ``b``."""
    return PairFeatures(
        active_a=phys.active[a],
        active_b=phys.active[b],
        bw_a=phys.bw_use[a],
        bw_b=phys.bw_use[b],
        mem_bound_a=phys.mem_bound[a],
        footprint_a=phys.footprint[a],
        footprint_b=phys.footprint[b],
        occupancy_a=phys.sm_occupancy[a],
        occupancy_b=phys.sm_occupancy[b],
    )


def pareto_mask(groups: IntArray, metrics: FloatArray) -> BoolArray:
    """True for rows no other row of the same group dominates (ties keep the first)."""
    keep = np.ones(len(groups), dtype=bool)
    if len(groups) == 0:
        return keep
    order = np.lexsort((*metrics.T[::-1], groups))
    sorted_groups = groups[order]
    bounds = np.flatnonzero(np.diff(sorted_groups)) + 1
    for chunk in np.split(order, bounds):
        if len(chunk) < 2:
            continue
        m = metrics[chunk]
        le = np.all(m[:, None, :] <= m[None, :, :], axis=2)  # le[i, j]: i no worse than j
        lt = np.any(m[:, None, :] < m[None, :, :], axis=2)
        earlier = np.triu(np.ones((len(chunk), len(chunk)), dtype=bool), k=1)  # i before j
        dominated = np.any((le & lt) | (le & earlier), axis=0)
        keep[chunk[dominated]] = False
    return keep


def build_configs(
    problem: ColocationProblem, slowdown: Slowdown, pairs: bool = True
) -> ConfigTable:
    """Every job point and unit configuration, durations under ``slowdown``.

    ``pairs=False`` leaves out co-located pairs (every job on whole GPUs).
    """
    type_names = problem.type_names()
    clocks = {t: candidate_clocks(problem, t) for t in type_names}
    points: list[JobPoint] = []
    index: dict[tuple[int, str, int, int, int], int] = {}
    for j in range(len(problem.jobs)):
        for t in type_names:
            for n in gpu_counts(problem, j):
                for f in clocks[t]:
                    for s in job_shares(problem, j):
                        index[(j, t, n, f, s)] = len(points)
                        points.append(JobPoint(j, t, n, f, s))
    phys = evaluate_points(problem, points)
    work = np.asarray([work_units(job) for job in problem.jobs], dtype=np.float64)
    on_extra = {(t, f): on_extra_w(problem, t, f) for t in type_names for f in clocks[t]}
    usable = {t: problem.usable_memory_gb(t) for t in type_names}
    tdp = {t: problem.gpu_type(t).tdp_w - problem.gpu_type(t).idle_w for t in type_names}

    rows: dict[str, list[float]] = {k: [] for k in ("a", "b", "t", "n", "f", "s", "pa", "pb")}

    def add(a: int, b: int, t: int, n: int, f: int, s: int, pa: int, pb: int) -> None:
        for key, value in zip(rows, (a, b, t, n, f, s, pa, pb), strict=True):
            rows[key].append(value)

    training = [j for j, job in enumerate(problem.jobs) if isinstance(job, TrainingJob)]
    inference = [j for j, job in enumerate(problem.jobs) if not isinstance(job, TrainingJob)]
    levels = problem.instance.options.share_levels_pct
    for ti, t in enumerate(type_names):
        for f in clocks[t]:
            for j in range(len(problem.jobs)):
                for n in gpu_counts(problem, j):
                    p = index[(j, t, n, f, 100)]
                    if (
                        phys.memory_gb[p] <= usable[t]
                        and on_extra[(t, f)] + phys.dyn_w[p] <= (tdp[t])
                    ):
                        add(j, NO_JOB, ti, n, f, 100, p, -1)
            for s in levels if pairs else ():
                for a in training:
                    for b in inference:
                        for n in set(gpu_counts(problem, a)) & set(gpu_counts(problem, b)):
                            pa, pb = index[(a, t, n, f, s)], index[(b, t, n, f, 100 - s)]
                            if phys.memory_gb[pa] + phys.memory_gb[pb] > usable[t]:
                                continue
                            if on_extra[(t, f)] + phys.dyn_w[pa] + phys.dyn_w[pb] > tdp[t]:
                                continue
                            add(a, b, ti, n, f, s, pa, pb)
    arr = {k: np.asarray(v, dtype=np.int64) for k, v in rows.items()}
    units = _units_from_rows(problem, phys, work, arr, on_extra, type_names, slowdown)
    groups = (units.job_a * (len(problem.jobs) + 1) + (units.job_b + 1)) * len(type_names)
    groups = groups + units.type_index
    metrics = np.stack(
        [units.dur_a, units.dur_b, units.gpus.astype(np.float64), units.power_w], axis=1
    )
    keep = pareto_mask(groups, metrics)
    kept = Units(**{k: getattr(units, k)[keep] for k in Units.__dataclass_fields__})
    return ConfigTable(type_names, clocks, points, phys, work, kept, int((~keep).sum()))


def _units_from_rows(
    problem: ColocationProblem,
    phys: Physics,
    work: FloatArray,
    arr: dict[str, IntArray],
    on_extra: dict[tuple[str, int], float],
    type_names: list[str],
    slowdown: Slowdown,
) -> Units:
    pa, pb = arr["pa"], arr["pb"]
    paired = pb >= 0
    pb_safe = np.where(paired, pb, pa)
    sigma_a = np.where(paired, slowdown(pair_features(phys, pa, pb_safe)), 1.0)
    sigma_b = np.where(paired, slowdown(pair_features(phys, pb_safe, pa)), 1.0)
    wa = work[arr["a"]]
    wb = np.where(paired, work[np.maximum(arr["b"], 0)], 0.0)
    ra = phys.rate[pa]
    rb = np.where(paired, phys.rate[pb_safe], 1.0)
    dur_a, dur_b = pair_durations(wa, ra, sigma_a, wb, rb, sigma_b)
    extra = np.asarray(
        [on_extra[(type_names[t], int(f))] for t, f in zip(arr["t"], arr["f"], strict=True)]
    )
    dyn = phys.dyn_w[pa] + np.where(paired, phys.dyn_w[pb_safe], 0.0)
    mem = phys.memory_gb[pa] + np.where(paired, phys.memory_gb[pb_safe], 0.0)
    return Units(
        job_a=arr["a"],
        job_b=arr["b"],
        type_index=arr["t"],
        gpus=arr["n"],
        clock_mhz=arr["f"],
        share_a=arr["s"],
        point_a=pa,
        point_b=pb,
        sigma_a=np.asarray(sigma_a, dtype=np.float64),
        sigma_b=np.asarray(sigma_b, dtype=np.float64),
        dur_a=dur_a,
        dur_b=np.where(paired, dur_b, 0.0),
        power_w=arr["n"] * (extra + dyn),
        memory_gb=mem,
    )


MAX_SLOTS_HELD = 2**53
"""Slot counts are capped here before they become integers: a count this large is
past any horizon (at most 200 slots) and still exact as a float."""


def slots_needed(span_s: FloatArray, slot_s: float) -> IntArray:
    """Whole slots a unit holds its GPUs for (at least one; at most MAX_SLOTS_HELD, so
    that a long job on short slots never wraps around to a negative count)."""
    held = np.clip(np.ceil(span_s / slot_s - 1e-9), 1, MAX_SLOTS_HELD)
    return held.astype(np.int64)
