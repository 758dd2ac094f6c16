"""Plans and instances as text a person can read."""

from __future__ import annotations

from energyopt.catalog.problem import Problem
from energyopt.families.serving.verify import PlanEvaluation
from energyopt.perf.oppoints import OpTable
from energyopt.solvers.result import Result
from energyopt.spec.plan import Plan


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


def format_plan(problem: Problem, plan: Plan, ev: PlanEvaluation) -> list[str]:
    """Per GPU: clock, predicted power at the planned rates, worst-case draw (every
    placement at its SLO capacity: what caps, limits and budgets are checked on),
    power limit, placements with share, rate and SLO use. Powers in W."""
    rows: list[list[str]] = []
    for gp in plan.gpus:
        if not gp.on:
            rows.append([gp.gpu, gp.type, "off", "", "", "", ""])
            continue
        parts = []
        for pl in gp.placements:
            share = pl.mig_profile or (f"TP{pl.tp_size}" if pl.tp_size > 1 else f"{pl.share_pct}%")
            name = pl.workload if pl.phase == "both" else f"{pl.workload}:{pl.phase}"
            ttft, tbt = ev.headroom.get((gp.gpu, f"{pl.workload}:{pl.phase}"), (0.0, 0.0))
            slo = []
            if pl.phase != "decode":
                slo.append(f"TTFT {ttft:.0%}")
            if pl.phase != "prefill":
                slo.append(f"TBT {tbt:.0%}")
            parts.append(f"{name} {share} {pl.rate_rps:.2f} req/s ({' '.join(slo)} of SLO)")
        power = ev.gpu_power_w.get(gp.gpu, gp.predicted_power_w)
        worst = ev.gpu_worst_w.get(gp.gpu)
        rows.append(
            [
                gp.gpu,
                gp.type,
                f"{gp.clock_mhz} MHz",
                f"{power:.0f} W",
                f"{worst:.0f} W" if worst is not None else "",
                f"{gp.power_limit_w:.0f} W" if gp.power_limit_w else "",
                "; ".join(parts) if parts else "(idle)",
            ]
        )
    return _table(rows, ["GPU", "type", "clock", "power", "worst case", "limit", "placements"])


def format_totals(
    problem: Problem, plan: Plan, ev: PlanEvaluation, result: Result[Plan] | None
) -> list[str]:
    """Totals: power, GPUs on, objective, bound, gap, time."""
    lines = [
        f"GPUs on: {ev.gpus_on} of {len(problem.gpus)}; predicted power {ev.total_power_w:,.1f} W "
        f"({ev.total_power_w * 3.6:,.0f} kJ per hour)"
    ]
    if plan.objective is not None:
        bound = f"{plan.bound:,.3f}" if plan.bound is not None else "none"
        gap = f"{plan.gap:.3%}" if plan.gap is not None else "unknown"
        lines.append(
            f"objective {plan.objective:,.3f}, bound {bound}, gap {gap}, status {plan.status}"
        )
    if result is not None:
        how = f" ({result.formulation} formulation)" if result.formulation else ""
        why = f", stopped: {result.termination}" if result.termination is not None else ""
        lines.append(f"solver {result.solver}{how}{why}, {result.wall_s:.2f} s")
    return lines


def format_problem(problem: Problem, table: OpTable) -> list[str]:
    """Instance summary and, per unit, its best operating point per GPU type with its
    energy per request (J) at its top rate: its power line there over the rate,
    (fixed W + J per request x top) / top, so a unit run far below the op's
    capacity carries its decode loop's share; and the same per output token."""
    inst = problem.instance
    lines = [
        f"instance {inst.name}: {len(problem.gpus)} GPUs in {len(inst.cluster.nodes)} nodes, "
        f"{len(inst.workloads)} workloads, objective {inst.options.objective}"
    ]
    for type_name in problem.gpu_types_used():
        n = sum(1 for g in problem.gpus if g.type == type_name)
        clocks = ", ".join(str(c) for c in table.clocks[type_name])
        lines.append(f"  {n} x {type_name}; candidate clocks {clocks} MHz")
    rows: list[list[str]] = []
    for unit in table.units:
        ops = table.ops_of(unit.index)
        for t, type_name in enumerate(table.type_names):
            mine = [o for o in ops if table.gpu_type[o] == t]
            if not mine:
                rows.append(
                    [unit.label, f"{unit.rate_rps:g}", type_name, "none meets the SLO", "", "", ""]
                )
                continue
            best = max(mine, key=lambda o: table.capacity_rps[o] / table.tp[o])
            wl = problem.instance.workload(unit.workload)
            tokens = 1.0 if unit.phase == "prefill" else wl.output_tokens.mean
            share = table.mig_profile[best] or f"{table.share[best]}%"
            top = table.top_rps(best)
            per_request = table.power_w(best, top) / top
            rows.append(
                [
                    unit.label,
                    f"{unit.rate_rps:g}",
                    type_name,
                    f"{table.clock_mhz[best]} MHz {share} TP{table.tp[best]}",
                    f"{table.capacity_rps[best]:.2f} req/s",
                    f"{per_request:.1f} J/req",
                    f"{per_request / tokens:.3f} J/token",
                ]
            )
    lines.append(
        f"operating points: {len(table)} with positive SLO capacity; highest capacity per type:"
    )
    lines += [
        "  " + r
        for r in _table(
            rows, ["unit", "req/s", "GPU type", "op. point", "capacity", "at top rate", "per token"]
        )
    ]
    return lines
