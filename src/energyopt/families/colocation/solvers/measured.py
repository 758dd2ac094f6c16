"""Schedules for jobs of measured types on whole GPUs: isolated, or paired by predicted gain.

The co-location family's MILP and decomposition pair a training job with an
inference job under MPS shares, with features from the performance model; the
measured pairs (``families/colocation/formulations/measured.py``) are two training jobs of
measured types sharing a whole K80, P100 or V100, with no clocks, shares or job
shapes to choose. These schedulers plan that setting:

- ``schedule_isolated``: every job alone on one GPU; units are list scheduled
  (in the given order, or shortest first), each on the GPU where it ends first.
- ``schedule_paired``: starts from every job alone, shortest first, and forms
  pairs that lower the mean JCT predicted under the table it is given:
  candidates are two jobs close in shortest-first order whose pair saves at
  least ``min_gain`` of their GPU time alone on some GPU type (``pair_gain``),
  tried by decreasing gain, each kept when the list schedule with it predicts a
  lower mean JCT. A pair runs at the slowdowns of ``sigma`` while both jobs run
  and each job at its full speed after its partner ends
  (``timemodel.pair_durations``); it holds its GPU until both have ended.
  (A maximum-gain matching over all jobs, tried first, paired short jobs with
  long ones and lost to the isolated schedule: the short job then waits behind
  the long one's hold time.)

Both take the slowdown table they plan with (``sigma[g, a, b]``): the predictor's
for a real plan, the measured one for an oracle reference. The plan's objective
is the mean JCT under that table; ``families/colocation/verify_measured.py`` scores the plan
on the measurements.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from energyopt.families.colocation.formulations.measured import (
    MeasuredCluster,
    MeasuredJob,
    MeasuredPairs,
    MeasuredPlan,
    MeasuredUnit,
)
from energyopt.families.colocation.formulations.timemodel import pair_durations
from energyopt.perf.params import FloatArray

MIN_GAIN = 0.05
"""Smallest predicted fraction of GPU time a pair must save to be a candidate."""
WINDOW = 4
"""Candidate partners: jobs at most this many places apart in shortest-first order."""


def unit_durations(
    data: MeasuredPairs, sigma: FloatArray, jobs: Sequence[MeasuredJob], g: int
) -> tuple[float, ...] | None:
    """Run time (s) of each job of a unit on GPU type ``g`` from the unit's start,
    under the slowdowns ``sigma``; None where a job or the pair does not run on g."""
    rates = [float(data.alone[g, j.job_type]) for j in jobs]
    if min(rates) <= 0:
        return None
    if len(jobs) == 1:
        return (jobs[0].steps / rates[0],)
    a, b = jobs[0].job_type, jobs[1].job_type
    if not bool(data.runs()[g, a, b]):
        return None
    da, db = pair_durations(
        np.asarray(jobs[0].steps),
        np.asarray(rates[0]),
        np.asarray(float(sigma[g, a, b])),
        np.asarray(jobs[1].steps),
        np.asarray(rates[1]),
        np.asarray(float(sigma[g, b, a])),
    )
    return float(da), float(db)


Durations = dict[tuple[MeasuredJob, ...], list[tuple[float, ...] | None]]
"""Cache: a unit's run times per GPU type (``unit_durations``)."""


def _list_schedule(
    data: MeasuredPairs,
    sigma: FloatArray,
    cluster: MeasuredCluster,
    units: list[tuple[MeasuredJob, ...]],
    solver: str,
    cache: Durations | None = None,
) -> MeasuredPlan:
    """Place ``units`` in order, each on the GPU where it ends first (ties: lower id)."""
    gpus = cluster.gpu_ids()
    free = [0.0] * len(gpus)
    known: Durations = {} if cache is None else cache
    placed: list[MeasuredUnit] = []
    ends: list[float] = []
    for unit in units:
        per_type = known.get(unit)
        if per_type is None:
            per_type = [
                unit_durations(data, sigma, unit, g) if count else None
                for g, count in enumerate(cluster.counts)
            ]
            known[unit] = per_type
        best: tuple[float, int, tuple[float, ...]] | None = None
        for i, (_, g) in enumerate(gpus):
            durations = per_type[g]
            if durations is None:
                continue
            end = free[i] + max(durations)
            if best is None or end < best[0]:
                best = (end, i, durations)
        if best is None:
            names = ", ".join(j.name for j in unit)
            raise ValueError(f"no GPU of the cluster runs the unit ({names})")
        end, i, durations = best
        start = free[i]
        placed.append(MeasuredUnit(gpus[i][0], start, tuple(j.name for j in unit)))
        ends.extend(start + d for d in durations)
        free[i] = end
    return MeasuredPlan(tuple(placed), float(np.mean(ends)) if ends else 0.0, solver)


def _shortest(
    data: MeasuredPairs, sigma: FloatArray, cluster: MeasuredCluster, unit: tuple[MeasuredJob, ...]
) -> float:
    """The unit's hold time on the GPU type where it is shortest (s)."""
    times = [
        max(d)
        for g in range(len(cluster.counts))
        if cluster.counts[g] and (d := unit_durations(data, sigma, unit, g)) is not None
    ]
    return min(times) if times else float("inf")


def schedule_isolated(
    data: MeasuredPairs,
    sigma: FloatArray,
    cluster: MeasuredCluster,
    jobs: Sequence[MeasuredJob],
    shortest_first: bool = True,
) -> MeasuredPlan:
    """Every job alone on one whole GPU, list scheduled (shortest first or in the given order)."""
    units: list[tuple[MeasuredJob, ...]] = [(j,) for j in jobs]
    if shortest_first:
        units.sort(key=lambda u: _shortest(data, sigma, cluster, u))
    name = "isolated, shortest first" if shortest_first else "isolated, in order"
    return _list_schedule(data, sigma, cluster, units, name)


def pair_gain(
    data: MeasuredPairs, sigma: FloatArray, cluster: MeasuredCluster, a: MeasuredJob, b: MeasuredJob
) -> float:
    """Largest fraction of the two jobs' GPU time alone that pairing them saves,
    over the GPU types of the cluster the pair runs on (-inf where it runs on none)."""
    best = float("-inf")
    for g, count in enumerate(cluster.counts):
        if not count:
            continue
        pair = unit_durations(data, sigma, (a, b), g)
        alone_a = unit_durations(data, sigma, (a,), g)
        alone_b = unit_durations(data, sigma, (b,), g)
        if pair is None or alone_a is None or alone_b is None:
            continue
        total = alone_a[0] + alone_b[0]
        best = max(best, 1.0 - max(pair) / total)
    return best


def schedule_paired(
    data: MeasuredPairs,
    sigma: FloatArray,
    cluster: MeasuredCluster,
    jobs: Sequence[MeasuredJob],
    min_gain: float = MIN_GAIN,
    window: int = WINDOW,
    solver: str = "paired by predicted gain",
) -> MeasuredPlan:
    """Pairs that lower the mean JCT predicted under ``sigma``, list scheduled shortest first.

    Starts from every job alone, shortest first. Candidate pairs are two jobs at
    most ``window`` apart in that order whose pair saves at least ``min_gain`` of
    their GPU time (``pair_gain``), tried in order of decreasing gain; a candidate
    whose jobs are both still alone is formed when the list schedule with it has a
    lower mean JCT under ``sigma`` than without it.
    """
    order = sorted(jobs, key=lambda j: _shortest(data, sigma, cluster, (j,)))
    candidates: list[tuple[float, int, int]] = []
    for i in range(len(order)):
        for k in range(i + 1, min(i + 1 + window, len(order))):
            gain = pair_gain(data, sigma, cluster, order[i], order[k])
            if gain >= min_gain:
                candidates.append((gain, i, k))
    candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
    hold: dict[tuple[MeasuredJob, ...], float] = {
        (j,): _shortest(data, sigma, cluster, (j,)) for j in order
    }
    units: list[tuple[MeasuredJob, ...]] = [(j,) for j in order]
    cache: Durations = {}
    best = _list_schedule(data, sigma, cluster, units, solver, cache)
    partner: dict[int, int] = {}
    for _, i, k in candidates:
        if i in partner or k in partner:
            continue
        pair = (order[i], order[k])
        hold[pair] = _shortest(data, sigma, cluster, pair)
        trial = [u for u in units if u not in ((order[i],), (order[k],))] + [pair]
        trial.sort(key=lambda u: hold[u])
        plan = _list_schedule(data, sigma, cluster, trial, solver, cache)
        if plan.objective_s < best.objective_s:
            best, units = plan, trial
            partner[i], partner[k] = k, i
    return best
