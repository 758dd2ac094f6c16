"""The exact co-location MILP: choose unit configurations and start slots.

Variables x[u, k] in {0, 1}: unit configuration u (a job alone, or a training and
an inference job together) starts at slot k.

    minimize    sum c[u, k] x[u, k]
    subject to  sum_{(u, k) holding job j} x[u, k]  = 1  (jct) or <= 1 (throughput)
                sum_{(u, k) of type t, active in slot s} n_u x[u, k] <= G_t    (GPUs)
                sum_{(u, k) active in slot s} P_u x[u, k] <= B - idle            (power)

GPUs of one type are interchangeable, so any solution is placed on GPU ids by
starting the units in slot order on free GPUs (``schedule.assign_gpus``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csc_matrix

from energyopt.families.colocation.formulations.model import ColocationModel
from energyopt.perf.params import FloatArray

IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class Milp:
    """Columns (unit configuration, start slot) and the constraint matrix."""

    unit: IntArray
    start: IntArray
    cost: FloatArray
    matrix: csc_matrix
    row_lo: FloatArray
    row_hi: FloatArray

    def __len__(self) -> int:
        return int(self.unit.shape[0])


def start_columns(model: ColocationModel) -> tuple[IntArray, IntArray]:
    """Every allowed (unit configuration, start slot)."""
    n_units = len(model.table.units)
    unit = np.repeat(np.arange(n_units, dtype=np.int64), model.slots)
    start = np.tile(np.arange(model.slots, dtype=np.int64), n_units)
    ok = model.allowed(unit, start)
    return unit[ok], start[ok]


def build_milp(model: ColocationModel) -> Milp:
    """The time-indexed unit MILP of ``model``."""
    units = model.table.units
    unit, start = start_columns(model)
    cost = model.cost(unit, start)
    end = model.end_slot(unit, start)
    n_jobs, n_types, slots = model.n_jobs, len(model.table.type_names), model.slots
    cols = np.arange(len(unit), dtype=np.int64)
    rows: list[IntArray] = []
    col_ids: list[IntArray] = []
    vals: list[FloatArray] = []
    # cover rows 0..n_jobs-1
    rows.append(units.job_a[unit])
    col_ids.append(cols)
    vals.append(np.ones(len(unit)))
    paired = units.job_b[unit] >= 0
    rows.append(units.job_b[unit][paired])
    col_ids.append(cols[paired])
    vals.append(np.ones(int(paired.sum())))
    # GPU rows n_jobs + t * slots + s ; power rows after them
    gpu_base = n_jobs
    power_base = gpu_base + n_types * slots
    has_power = np.isfinite(model.power_cap_w)
    length = end - start
    rep = np.repeat(cols, length)
    offset = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
    slot = np.repeat(start, length) + offset
    rows.append(gpu_base + units.type_index[unit][rep] * slots + slot)
    col_ids.append(rep)
    vals.append(units.gpus[unit][rep].astype(np.float64))
    if has_power:
        rows.append(power_base + slot)
        col_ids.append(rep)
        vals.append(units.power_w[unit][rep])
    n_rows = power_base + (slots if has_power else 0)
    matrix = csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(col_ids))),
        shape=(n_rows, len(unit)),
    )
    row_lo = np.zeros(n_rows)
    row_hi = np.zeros(n_rows)
    row_hi[:n_jobs] = 1.0
    row_lo[:n_jobs] = 1.0 if model.objective == "jct" else 0.0
    row_lo[gpu_base:power_base] = -np.inf
    row_hi[gpu_base:power_base] = np.repeat(model.gpu_cap.astype(np.float64), slots)
    if has_power:
        row_lo[power_base:] = -np.inf
        row_hi[power_base:] = model.power_cap_w
    return Milp(unit, start, np.asarray(cost, dtype=np.float64), matrix, row_lo, row_hi)
