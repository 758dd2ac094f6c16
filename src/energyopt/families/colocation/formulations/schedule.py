"""Slot schedules of unit configurations: capacity bookkeeping, list scheduling, plans.

A schedule is a list of (unit configuration, start slot) plus the jobs left
unscheduled (throughput objective only). ``SlotCapacity`` tracks the GPUs per
type and the power left in every slot; ``place_units`` is the list scheduler
that the repair and the baselines share; ``to_plan`` puts a schedule on GPU ids.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from energyopt.families.colocation.formulations.model import ColocationModel
from energyopt.families.colocation.spec import ColocationPlan, PlanUnit, UnitJob
from energyopt.perf.params import BoolArray, FloatArray

IntArray = NDArray[np.int64]
POWER_TOL_W = 1e-6


@dataclass
class Schedule:
    """Chosen unit configurations with start slots; jobs not started."""

    unit: list[int] = field(default_factory=list)
    start: list[int] = field(default_factory=list)
    unscheduled: list[int] = field(default_factory=list)

    def objective(self, model: ColocationModel) -> float:
        """Minimized model objective (unscheduled jobs contribute 0)."""
        if not self.unit:
            return 0.0
        u = np.asarray(self.unit, dtype=np.int64)
        k = np.asarray(self.start, dtype=np.int64)
        return float(model.cost(u, k).sum())


class SlotCapacity:
    """GPUs per (type, slot) and power per slot still free."""

    def __init__(self, model: ColocationModel) -> None:
        self.model = model
        slots = model.slots
        self.gpus = np.repeat(model.gpu_cap[:, None].astype(np.float64), slots, axis=1)
        self.power = np.full(slots, model.power_cap_w, dtype=np.float64)

    def feasible(self, configs: IntArray) -> BoolArray:
        """feasible[c, k]: configuration ``configs[c]`` fits when started at slot k."""
        m = self.model
        units = m.table.units
        slots = m.slots
        out = np.zeros((len(configs), slots), dtype=bool)
        starts = np.arange(slots, dtype=np.int64)
        for occ in np.unique(m.occupancy[configs]):
            sel = np.flatnonzero(m.occupancy[configs] == occ)
            width = int(min(occ, slots))
            pad_g = np.concatenate([self.gpus, np.full((len(self.gpus), width), np.inf)], axis=1)
            pad_p = np.concatenate([self.power, np.full(width, np.inf)])
            gmin = sliding_window_view(pad_g, width, axis=1).min(axis=2)[:, :slots]
            pmin = sliding_window_view(pad_p, width).min(axis=1)[:slots]
            c = configs[sel]
            ok = gmin[units.type_index[c]] >= units.gpus[c][:, None]
            ok &= pmin[None, :] >= units.power_w[c][:, None] - POWER_TOL_W
            out[sel] = ok & m.allowed(c[:, None], starts[None, :])
        return out

    def take(self, config: int, start: int) -> None:
        """Reserve what ``config`` started at ``start`` holds."""
        m = self.model
        units = m.table.units
        end = int(m.end_slot(np.asarray([config]), np.asarray([start]))[0])
        self.gpus[units.type_index[config], start:end] -= units.gpus[config]
        self.power[start:end] -= units.power_w[config]


def group_configs(model: ColocationModel) -> dict[tuple[int, int], IntArray]:
    """Unit configurations by (job a, job b); job b is -1 for a job alone."""
    units = model.table.units
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, (a, b) in enumerate(zip(units.job_a.tolist(), units.job_b.tolist(), strict=True)):
        groups[(a, b)].append(i)
    return {k: np.asarray(v, dtype=np.int64) for k, v in groups.items()}


def place_units(
    model: ColocationModel,
    order: Sequence[tuple[int, int]],
    groups: dict[tuple[int, int], IntArray],
    extra_cost: Callable[[IntArray, IntArray], FloatArray] | None = None,
    capacity: SlotCapacity | None = None,
) -> Schedule | None:
    """List-schedule the units ``order`` (pairs (a, b), b = -1 alone) one by one.

    Each unit takes the configuration and start slot that minimize its objective
    contribution plus ``extra_cost(configs, starts)`` among those that fit. A pair
    that fits nowhere is split into its two jobs; a job that fits nowhere is
    unscheduled (throughput) or makes the schedule fail (jct: returns None).
    """
    cap = capacity or SlotCapacity(model)
    sched = Schedule()
    pending = list(order)
    while pending:
        a, b = pending.pop(0)
        configs = groups.get((a, b))
        choice = None
        if configs is not None and len(configs):
            ok = cap.feasible(configs)
            if ok.any():
                c_idx, k_idx = np.nonzero(ok)
                cand = configs[c_idx]
                score = model.cost(cand, k_idx)
                if extra_cost is not None:
                    score = score + extra_cost(cand, k_idx)
                best = int(np.lexsort((k_idx, score))[0])
                choice = (int(cand[best]), int(k_idx[best]))
        if choice is not None:
            cap.take(*choice)
            sched.unit.append(choice[0])
            sched.start.append(choice[1])
            continue
        if b >= 0:
            pending[0:0] = [(a, -1), (b, -1)]
            continue
        if model.objective == "jct":
            return None
        sched.unscheduled.append(a)
    return sched


def to_plan(model: ColocationModel, schedule: Schedule) -> ColocationPlan:
    """The schedule on GPU ids: units start in slot order on GPUs free by then."""
    problem = model.problem
    units = model.table.units
    ids: dict[str, list[str]] = defaultdict(list)
    for gid, type_name in problem.instance.cluster.gpu_ids():
        ids[type_name].append(gid)
    free_at: dict[str, dict[str, int]] = {t: dict.fromkeys(g, 0) for t, g in ids.items()}
    order = sorted(range(len(schedule.unit)), key=lambda i: (schedule.start[i], i))
    planned: list[PlanUnit] = []
    for i in order:
        u, k = schedule.unit[i], schedule.start[i]
        type_name = model.table.type_names[int(units.type_index[u])]
        end = int(model.end_slot(np.asarray([u]), np.asarray([k]))[0])
        free = [g for g in ids[type_name] if free_at[type_name][g] <= k]
        need = int(units.gpus[u])
        if len(free) < need:
            raise ValueError(f"schedule uses more {type_name} GPUs than exist in slot {k}")
        chosen = free[:need]
        for g in chosen:
            free_at[type_name][g] = end
        jobs = [
            UnitJob(job=problem.jobs[int(units.job_a[u])].name, share_pct=int(units.share_a[u]))
        ]
        if units.job_b[u] >= 0:
            jobs.append(
                UnitJob(
                    job=problem.jobs[int(units.job_b[u])].name,
                    share_pct=100 - int(units.share_a[u]),
                )
            )
        planned.append(
            PlanUnit(
                gpu_type=type_name,
                gpus=tuple(chosen),
                clock_mhz=int(units.clock_mhz[u]),
                start_s=k * model.slot_s,
                jobs=tuple(jobs),
            )
        )
    return ColocationPlan(
        instance=problem.instance.name,
        units=tuple(planned),
        unscheduled=tuple(problem.jobs[j].name for j in sorted(schedule.unscheduled)),
    )
