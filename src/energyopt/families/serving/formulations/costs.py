"""Objective coefficients shared by every serving formulation and by plan reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import OpTable
from energyopt.perf.params import FloatArray


@dataclass(frozen=True)
class Costs:
    """objective = sum on_cost[(type, clock)] * on + sum over placements (op_fixed[o] +
    op_cost[o] * rate) + penalty * moved; a placement is an op carrying a rate > 0
    (the fixed part is its decode loop's power, perf/energy.py ``power_line``)."""

    on_cost: dict[tuple[str, int], float]
    op_cost: FloatArray  # per op, per request/s
    op_fixed: FloatArray  # per op, per placement (a TP op: per group)
    migration_penalty: float
    description: str


def fleet_power_scale(problem: Problem) -> float:
    """Sum of TDPs of the fleet (W): divides power in the ``gpus_on`` objective."""
    return sum(problem.gpu_type(g.type).tdp_w for g in problem.gpus)


def objective_costs(problem: Problem, table: OpTable) -> Costs:
    """Coefficients of the instance's objective.

    power           : W drawn (static on-power + dynamic) = energy per second.
    power_migration : power + migration_penalty_w per placement moved off a GPU.
    gpus_on         : GPUs on + power / fleet TDP (power only breaks ties).
    edp             : on-power + dynamic power weighted by each op's latency
                      relative to the same unit at the max clock on a full GPU.
    """
    opts = problem.instance.options
    energy = np.asarray(table.marginal_j, dtype=np.float64)
    fixed = np.asarray(table.fixed_w, dtype=np.float64)
    if opts.objective == "gpus_on":
        scale = fleet_power_scale(problem)
        on = {k: 1.0 + v / scale for k, v in table.on_power.items()}
        return Costs(on, energy / scale, fixed / scale, 0.0, "GPUs on + power / fleet TDP")
    if opts.objective == "edp":
        ratio = np.where(table.ref_latency_ms > 0, table.latency_ms / table.ref_latency_ms, 1.0)
        return Costs(
            dict(table.on_power), energy * ratio, fixed * ratio, 0.0, "delay-weighted power (W)"
        )
    penalty = opts.migration_penalty_w if opts.objective == "power_migration" else 0.0
    text = "power (W)" if penalty == 0 else "power + migration penalty (W)"
    return Costs(dict(table.on_power), energy, fixed, penalty, text)
