"""Turn per-GPU decisions into a Plan (predicted power, power limits, TP groups)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import OpTable
from energyopt.spec.cluster import Gpu
from energyopt.spec.plan import GpuPlan, Placement, Plan

POWER_LIMIT_HEADROOM = 1.05
"""Power limit set this much above the predicted draw (then clamped to the range)."""
MIN_RATE_RPS = 1e-9


@dataclass
class GpuDecision:
    """What a solver decided for one GPU."""

    clock_mhz: int | None = None
    ops: list[tuple[int, float]] = field(default_factory=list)  # (op index, rate rps)
    tp_ops: list[tuple[int, float, str]] = field(default_factory=list)  # (op, group rate, id)


def power_cap_w(problem: Problem, gpu: Gpu) -> float:
    """The highest power a GPU may draw: its instance cap, else the type's max limit (W)."""
    gtype = problem.gpu_type(gpu.type)
    cap = gpu.power_cap_w if gpu.power_cap_w is not None else gtype.power_limit_max_w
    return min(cap, gtype.power_limit_max_w)


def power_limit_for(problem: Problem, gpu: Gpu, draw_w: float) -> float:
    """Power limit to set (W): ``draw_w`` plus headroom, within the allowed range.

    ``assemble_plan`` passes the GPU's worst-case draw: on-power plus each
    placement's steady power at its SLO capacity (the most it may carry), not the
    predicted power at the forecast rates, so that a load above the forecast never
    meets a limit that lowers the locked clock (docs/performance-model.md §5)."""
    gtype = problem.gpu_type(gpu.type)
    cap = power_cap_w(problem, gpu)
    limit = math.ceil(draw_w * POWER_LIMIT_HEADROOM)
    return float(max(gtype.power_limit_min_w, min(limit, cap)))


def assemble_plan(
    problem: Problem,
    table: OpTable,
    decisions: dict[str, GpuDecision],
    *,
    solver: str,
    status: str,
    objective: float | None,
    bound: float | None,
    gap: float | None,
) -> Plan:
    """Build the Plan; GPUs without a clock are off."""
    gpus: list[GpuPlan] = []
    for gpu in problem.gpus:
        d = decisions.get(gpu.id, GpuDecision())
        if d.clock_mhz is None:
            gpus.append(GpuPlan(gpu=gpu.id, type=gpu.type, on=False))
            continue
        power = table.on_power[(gpu.type, d.clock_mhz)]
        at_capacity = power  # the draw with every placement at its SLO capacity
        placements: list[Placement] = []
        current = {(p.workload, p.phase) for p in (gpu.state.placements if gpu.state else ())}
        for op, rate in d.ops:
            unit = table.units[int(table.unit[op])]
            if rate <= MIN_RATE_RPS and (unit.workload, unit.phase) not in current:
                continue  # an empty slot; kept only where it avoids a migration
            power += table.power_w(op, rate)
            at_capacity += float(table.peak_power_w[op])
            placements.append(_placement(table, op, rate, None))
        for op, rate, group in d.tp_ops:
            power += table.power_w(op, rate) / int(table.tp[op])
            at_capacity += float(table.peak_power_w[op]) / int(table.tp[op])
            placements.append(_placement(table, op, rate, group))
        gpus.append(
            GpuPlan(
                gpu=gpu.id,
                type=gpu.type,
                on=True,
                clock_mhz=d.clock_mhz,
                power_limit_w=power_limit_for(problem, gpu, max(power, at_capacity)),
                placements=tuple(placements),
                predicted_power_w=round(power, 6),
            )
        )
    return Plan(
        instance=problem.instance.name,
        gpus=tuple(gpus),
        objective=objective,
        bound=bound,
        gap=gap,
        solver=solver,
        status=status,
    )


def _placement(table: OpTable, op: int, rate: float, group: str | None) -> Placement:
    unit = table.units[int(table.unit[op])]
    share = int(table.share[op])
    profile = table.mig_profile[op]
    return Placement(
        workload=unit.workload,
        phase=unit.phase,
        share_pct=100 if profile is not None or int(table.tp[op]) > 1 else share,
        mig_profile=profile,
        rate_rps=rate,
        tp_group=group,
        tp_size=int(table.tp[op]),
    )
