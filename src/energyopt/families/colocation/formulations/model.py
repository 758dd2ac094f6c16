"""The co-location model: unit configurations on a slotted time grid, and the objective.

Time is cut into ``slots`` slots of ``slot_s`` seconds (horizon H = slots x
slot_s); units start at slot boundaries and hold their GPUs (and reserve their
power) for whole slots, until their last job ends.

- ``jct``: minimize the mean job completion time (s); a job completes at its
  unit's start plus its run time; every unit must end within the horizon.
- ``throughput``: maximize jobs completed per hour within the horizon, a job
  partly done by H counting by its done fraction; minimized internally as its
  negative. A unit may run past H (it holds its GPUs to H).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from energyopt.families.colocation.formulations.configs import (
    ConfigTable,
    build_configs,
    slots_needed,
)
from energyopt.families.colocation.formulations.interference import Slowdown, default_predictor
from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.formulations.timemodel import progress_by
from energyopt.perf.params import BoolArray, FloatArray

IntArray = NDArray[np.int64]
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class ColocationModel:
    """Everything a solver needs: configurations, occupancy, capacities, costs."""

    problem: ColocationProblem
    table: ConfigTable
    rate_a: FloatArray  # per unit configuration, work units/s alone
    rate_b: FloatArray  # 1 for a job alone
    occupancy: IntArray  # slots a unit configuration holds its GPUs
    gpu_cap: IntArray  # GPUs per type (table.type_names order)
    power_cap_w: float  # budget above the all-idle cluster power; inf without a budget

    @property
    def slots(self) -> int:
        """Slots in the horizon."""
        return self.problem.instance.options.slots

    @property
    def slot_s(self) -> float:
        """Length of a slot (s)."""
        return self.problem.instance.options.slot_s

    @property
    def objective(self) -> str:
        """``jct`` or ``throughput``."""
        return self.problem.instance.options.objective

    @property
    def n_jobs(self) -> int:
        """Number of jobs."""
        return len(self.problem.jobs)

    def cost(self, index: IntArray, start_slot: IntArray) -> FloatArray:
        """Minimized objective contribution of units ``index`` started at ``start_slot``."""
        u = self.table.units
        opts = self.problem.instance.options
        start_s = start_slot * opts.slot_s
        da, db = u.dur_a[index], u.dur_b[index]
        paired = u.job_b[index] >= 0
        if opts.objective == "jct":
            total = start_s + da + np.where(paired, start_s + db, 0.0)
            return np.asarray(total / self.n_jobs, dtype=np.float64)
        work = self.table.work
        elapsed = np.asarray(opts.horizon_s - start_s, dtype=np.float64)
        overlap = np.minimum(da, db)
        pa = progress_by(
            elapsed, work[u.job_a[index]], self.rate_a[index], u.sigma_a[index], overlap
        )
        wb = work[np.maximum(u.job_b[index], 0)]
        pb = progress_by(elapsed, wb, self.rate_b[index], u.sigma_b[index], overlap)
        done = pa + np.where(paired, pb, 0.0)
        return np.asarray(-done * SECONDS_PER_HOUR / opts.horizon_s)

    def end_slot(self, index: IntArray, start_slot: IntArray) -> IntArray:
        """First slot after the unit (capped at the horizon)."""
        return np.asarray(np.minimum(start_slot + self.occupancy[index], self.slots))

    def allowed(self, index: IntArray, start_slot: IntArray) -> BoolArray:
        """Whether unit configurations ``index`` may start at ``start_slot``."""
        if self.objective == "jct":
            return np.asarray(start_slot + self.occupancy[index] <= self.slots)
        return np.asarray(start_slot < self.slots)

    def display_objective(self, value: float) -> float:
        """The objective in user terms: mean JCT (s) or jobs per hour."""
        return value if self.objective == "jct" else -value


def build_model(
    problem: ColocationProblem, slowdown: Slowdown | None = None, pairs: bool = True
) -> ColocationModel:
    """The model with durations under ``slowdown`` (default: the learned predictor);
    ``pairs=False``: no co-location, every job on whole GPUs."""
    table = build_configs(problem, slowdown or default_predictor(), pairs)
    u = table.units
    rate_a = table.physics.rate[u.point_a]
    rate_b = np.where(u.point_b >= 0, table.physics.rate[np.maximum(u.point_b, 0)], 1.0)
    occupancy = slots_needed(u.span_s, problem.instance.options.slot_s)
    gpu_cap = np.asarray([problem.gpu_count(t) for t in table.type_names], dtype=np.int64)
    budget = problem.instance.cluster.power_budget_w
    power_cap = float("inf") if budget is None else budget - problem.idle_power_w()
    return ColocationModel(problem, table, rate_a, rate_b, occupancy, gpu_cap, power_cap)
