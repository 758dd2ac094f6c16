"""The per-job relaxation that shadow prices decompose.

Each job chooses one *job column*: a configuration (GPU type t, count n, clock
f, share s; alone or as one side of a pair) and a start slot k. Pairing is
relaxed: a paired job's run time is its shortest over every partner it could
have (so never longer than in any real pair), and it holds its share of the
GPUs for the shortest time any of its pair units holds them. The coupling
rows, per GPU type t and slot, are

    SM share      sum n s/100                      <= G_t
    job slots     sum n (2 alone, 1 paired)        <= 2 G_t   (at most 2 jobs a GPU)
    memory        sum n m                          <= G_t M_t
    power         sum n (e_f s/100 + d)            <= B - idle (per slot, all types)
    pair balance  sum_training n - sum_inference n  = 0   per (t, n, f, s, start)

where e_f is the on-power above idle at clock f and d the job's dynamic power.
Every unit schedule of the exact MILP maps to job columns that satisfy these
rows with no larger objective, so the relaxation's optimum, and any value of
its Lagrangian dual, is a lower bound on the MILP's optimum.

Rows are scaled by their capacity (balance rows by G_t), so prices of all rows
are in objective units per "whole capacity".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csr_matrix

from energyopt.families.colocation.formulations.configs import slots_needed
from energyopt.families.colocation.formulations.model import SECONDS_PER_HOUR, ColocationModel
from energyopt.families.colocation.formulations.rates import on_extra_w
from energyopt.perf.params import BoolArray, FloatArray

IntArray = NDArray[np.int64]
ROW_KINDS = ("share", "slots", "memory", "power", "balance")


@dataclass(frozen=True)
class Relaxation:
    """Job columns, their costs and scaled row usage.

    ``usage`` is (rows x columns) with rows scaled so that inequality rows read
    ``usage @ x <= 1`` and balance rows ``usage @ x = 0``. ``optional``: a job
    may take no column at cost 0 (throughput objective).
    """

    job: IntArray
    cost: FloatArray
    usage: csr_matrix
    equality: BoolArray  # per row
    row_kind: list[str]
    row_label: list[str]
    row_scale: FloatArray  # capacity in natural units (price natural = price / scale)
    n_jobs: int
    optional: bool
    # which job configuration and start each column is (for the repair)
    paired: BoolArray
    type_index: IntArray
    start: IntArray

    def __len__(self) -> int:
        return int(self.job.shape[0])


@dataclass(frozen=True)
class _JobConfigs:
    job: IntArray
    type_index: IntArray
    gpus: IntArray
    clock_mhz: IntArray
    share: IntArray
    paired: BoolArray
    duration_s: FloatArray  # shortest run time of the job over its partners
    hold_s: FloatArray  # shortest time the unit holds its GPUs over the partners
    memory_gb: FloatArray
    power_w: FloatArray


def _job_configs(model: ColocationModel) -> _JobConfigs:
    """Job configurations: each alone unit, and each side of a pair at its best partner."""
    t = model.table
    u = t.units
    phys = t.physics
    extra = {
        (ti, f): on_extra_w(model.problem, name, f)
        for ti, name in enumerate(t.type_names)
        for f in t.clocks[name]
    }
    best: dict[tuple[int, int, int, int, int, bool], list[float]] = {}
    span = u.span_s
    for i in range(len(u)):
        ti, n, f = int(u.type_index[i]), int(u.gpus[i]), int(u.clock_mhz[i])
        sides = [(int(u.job_a[i]), int(u.share_a[i]), float(u.dur_a[i]), int(u.point_a[i]))]
        pair = bool(u.job_b[i] >= 0)
        if pair:
            sides.append(
                (int(u.job_b[i]), 100 - int(u.share_a[i]), float(u.dur_b[i]), int(u.point_b[i]))
            )
        for job, share, dur, point in sides:
            key = (job, ti, n, f, share, pair)
            power = n * (extra[(ti, f)] * share / 100.0 + float(phys.dyn_w[point]))
            mem = float(phys.memory_gb[point])
            old = best.get(key)
            if old is None:
                best[key] = [dur, float(span[i]), mem, power]
            else:
                old[0] = min(old[0], dur)
                old[1] = min(old[1], float(span[i]))
    keys = list(best)
    vals = np.asarray([best[k] for k in keys], dtype=np.float64).reshape(-1, 4)
    cols = np.asarray([k[:5] for k in keys], dtype=np.int64).reshape(-1, 5)
    return _JobConfigs(
        job=cols[:, 0],
        type_index=cols[:, 1],
        gpus=cols[:, 2],
        clock_mhz=cols[:, 3],
        share=cols[:, 4],
        paired=np.asarray([k[5] for k in keys], dtype=bool),
        duration_s=vals[:, 0],
        hold_s=vals[:, 1],
        memory_gb=vals[:, 2],
        power_w=vals[:, 3],
    )


def build_relaxation(model: ColocationModel) -> Relaxation:
    """Job columns of every job configuration at every allowed start slot."""
    jc = _job_configs(model)
    problem = model.problem
    opts = problem.instance.options
    slots, n_types = model.slots, len(model.table.type_names)
    occ = slots_needed(jc.hold_s, opts.slot_s)
    g = np.repeat(np.arange(len(jc.job), dtype=np.int64), slots)
    k = np.tile(np.arange(slots, dtype=np.int64), len(jc.job))
    ok = k + occ[g] <= slots if opts.objective == "jct" else k < slots
    g, k = g[ok], k[ok]
    end = np.minimum(k + occ[g], slots)
    start_s = k * opts.slot_s
    if opts.objective == "jct":
        cost = (start_s + jc.duration_s[g]) / model.n_jobs
    else:
        frac = np.minimum((opts.horizon_s - start_s) / jc.duration_s[g], 1.0)
        cost = -frac * SECONDS_PER_HOUR / opts.horizon_s

    gpu_cap = model.gpu_cap.astype(np.float64)
    usable = np.asarray([problem.usable_memory_gb(t) for t in model.table.type_names])
    labels: list[str] = []
    kinds: list[str] = []
    scales: list[float] = []
    for kind, cap in (("share", gpu_cap), ("slots", 2 * gpu_cap), ("memory", gpu_cap * usable)):
        for ti, name in enumerate(model.table.type_names):
            for s in range(slots):
                labels.append(f"{kind} {name} slot {s}")
                kinds.append(kind)
                scales.append(float(cap[ti]))
    has_power = bool(np.isfinite(model.power_cap_w))
    if has_power:
        for s in range(slots):
            labels.append(f"power slot {s}")
            kinds.append("power")
            scales.append(max(model.power_cap_w, 1e-9))
    n_ineq = len(labels)

    col = np.arange(len(g), dtype=np.int64)
    length = end - k
    rep = np.repeat(col, length)
    slot = np.repeat(k, length) + (
        np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    )
    t_rep = jc.type_index[g][rep]
    n_rep = jc.gpus[g][rep].astype(np.float64)
    paired_rep = jc.paired[g][rep]
    rows = [
        (0 * n_types + t_rep) * slots + slot,
        (1 * n_types + t_rep) * slots + slot,
        (2 * n_types + t_rep) * slots + slot,
    ]
    vals = [
        n_rep * jc.share[g][rep] / 100.0 / gpu_cap[t_rep],
        n_rep * np.where(paired_rep, 1.0, 2.0) / (2 * gpu_cap[t_rep]),
        n_rep * jc.memory_gb[g][rep] / (gpu_cap[t_rep] * usable[t_rep]),
    ]
    cols = [rep, rep, rep]
    if has_power:
        rows.append(3 * n_types * slots + slot)
        vals.append(jc.power_w[g][rep] / max(model.power_cap_w, 1e-9))
        cols.append(rep)
    # balance rows, one per (type, n, clock, training share, start) that has paired columns
    pc = np.flatnonzero(jc.paired[g])
    is_training = np.asarray(
        [problem.jobs[j].kind == "training" for j in range(model.n_jobs)], dtype=bool
    )
    train_side = is_training[jc.job[g[pc]]]
    level = np.where(train_side, jc.share[g[pc]], 100 - jc.share[g[pc]])
    keys = np.stack(
        [jc.type_index[g[pc]], jc.gpus[g[pc]], jc.clock_mhz[g[pc]], level, k[pc]], axis=1
    )
    uniq, inverse = (
        np.unique(keys, axis=0, return_inverse=True)
        if len(pc)
        else (np.zeros((0, 5), dtype=np.int64), np.zeros(0, dtype=np.int64))
    )
    inverse = np.asarray(inverse).reshape(-1)
    for row in uniq:
        ti, n, f, lvl, s = (int(x) for x in row)
        labels.append(f"pairs {model.table.type_names[ti]} x{n} {f} MHz {lvl}% start {s}")
        kinds.append("balance")
        scales.append(float(gpu_cap[ti]))
    rows.append(n_ineq + inverse)
    gpus_pc = jc.gpus[g[pc]].astype(np.float64)
    vals.append(np.where(train_side, gpus_pc, -gpus_pc) / gpu_cap[jc.type_index[g[pc]]])
    cols.append(pc)
    usage = csr_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(len(labels), len(g)),
    )
    equality = np.asarray([kd == "balance" for kd in kinds], dtype=bool)
    return Relaxation(
        job=jc.job[g],
        cost=np.asarray(cost, dtype=np.float64),
        usage=usage,
        equality=equality,
        row_kind=kinds,
        row_label=labels,
        row_scale=np.asarray(scales, dtype=np.float64),
        n_jobs=model.n_jobs,
        optional=opts.objective == "throughput",
        paired=jc.paired[g],
        type_index=jc.type_index[g],
        start=k,
    )
