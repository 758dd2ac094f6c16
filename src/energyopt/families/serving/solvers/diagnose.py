"""Explain why an instance has no feasible plan, in terms a user can act on."""

from __future__ import annotations

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import OpTable, max_gpus_per_node, op_spec, units_of
from energyopt.perf.params import build_params
from energyopt.perf.queueing import metrics_at
from energyopt.spec.instance import Instance


def unservable_units(problem: Problem, table: OpTable) -> list[str]:
    """One line per unit that no operating point can serve within its SLO."""
    lines: list[str] = []
    served = set(int(u) for u in table.unit)
    for unit in units_of(problem):
        if unit.index in served:
            continue
        wl = problem.instance.workload(unit.workload)
        model = problem.model_of(wl)
        reasons = []
        for type_name in problem.gpu_types_used():
            gpu = problem.gpu_type(type_name)
            per_node = max_gpus_per_node(problem, type_name)
            usable = gpu.memory_gb * (1 - problem.instance.options.memory_reserve_fraction)
            sizes = wl.tensor_parallel or (1, 2, 4, 8)
            k = next(
                (
                    k
                    for k in sorted(sizes)
                    if k <= per_node and model.weight_bytes / 1e9 / k < usable
                ),
                None,
            )
            if k is None:
                reasons.append(
                    f"{type_name}: weights {model.weight_bytes / 1e9:.0f} GB do not fit "
                    f"{per_node} GPU(s) of one node ({usable:.0f} GB usable each)"
                )
                continue
            full = (100, None, 1.0, 1.0, usable)
            spec = op_spec(problem, wl, unit.phase, gpu, gpu.max_sm_clock_mhz, full, k)
            met = metrics_at(build_params([spec]), np.asarray([1e-6]))
            parts = []
            if unit.phase != "decode":
                parts.append(f"TTFT {met.ttft_ms[0]:.0f} ms (SLO {wl.slo.ttft_ms:g})")
            if unit.phase != "prefill":
                parts.append(f"TBT {met.tbt_ms[0]:.1f} ms (SLO {wl.slo.tbt_ms:g})")
            reasons.append(
                f"{type_name} at {gpu.max_sm_clock_mhz} MHz, whole GPU"
                + (f" x{k} TP" if k > 1 else "")
                + ", unloaded: "
                + ", ".join(parts)
            )
        memory_only = all("do not fit" in r for r in reasons)
        advice = (
            "Add GPUs with more memory, or more GPUs of one node for tensor parallelism."
            if memory_only
            else "Relax the SLO or add faster GPUs."
        )
        lines.append(
            f"workload {unit.label!r} ({wl.model}): no GPU of the cluster can serve it even "
            f"unloaded; " + "; ".join(reasons) + ". " + advice
        )
    return lines


def diagnose_infeasible(problem: Problem, table: OpTable) -> list[str]:
    """Which demand cannot be met, and which limit binds (fleet size or power budgets)."""
    lines: list[str] = []
    fleet = problem.gpus
    total_needed = 0.0
    for unit in table.units:
        ops = table.ops_of(unit.index)
        if len(ops) == 0:
            continue
        frac = np.asarray(
            [
                int(table.tp[o])
                if table.tp[o] > 1
                else int(table.share[o])
                / table.share_capacity[table.type_names[int(table.gpu_type[o])]]
                for o in ops
            ]
        )
        per_gpu = table.capacity_rps[ops] / frac  # per whole-GPU equivalent
        best = float(per_gpu.max())
        types = {table.type_names[int(table.gpu_type[o])] for o in ops}
        count = sum(1 for g in fleet if g.type in types)
        need = unit.rate_rps / best if best > 0 else float("inf")
        total_needed += need
        if count * best < unit.rate_rps:
            lines.append(
                f"workload {unit.label!r} needs {unit.rate_rps:g} req/s; all {count} GPUs able "
                f"to run it serve at most {count * best:.3g} req/s within its SLO"
            )
    if total_needed > len(fleet):
        lines.append(
            f"the workloads need at least {total_needed:.1f} GPUs even at their most "
            f"efficient operating points; the fleet has {len(fleet)}"
        )
    floor_w = _minimum_power_w(problem, table)
    inst = problem.instance
    if inst.cluster.power_budget_w is not None and floor_w > inst.cluster.power_budget_w:
        lines.append(
            f"cluster power budget {inst.cluster.power_budget_w:g} W is below the power of "
            f"serving the load at its most efficient operating points ({floor_w:.0f} W, "
            "on-power share and dynamic power)"
        )
    if not lines:
        budgets = [n.name for n in inst.cluster.nodes if n.power_budget_w is not None]
        has_budget = bool(budgets) or inst.cluster.power_budget_w is not None
        if has_budget and _feasible_without_budgets(problem):
            lines.append(
                "without the power budgets even the relaxed (fractional) problem is "
                "feasible, so the budgets bind: raise the budget of "
                f"{'the cluster' if not budgets else ', '.join(budgets)} or move load"
            )
        if not lines:
            lines.append(
                "no single limit explains it: the combination of SM shares, memory and "
                "tensor-parallel groups per node cannot host all workloads together"
            )
    return lines


def _minimum_power_w(problem: Problem, table: OpTable) -> float:
    """A lower bound on the fleet's power (W): each unit's rate at its cheapest power
    per req/s over its ops, counting on-power and the fixed part.

    A placement of op o at rate r <= top_o (its capacity, or its unit's rate if
    less) draws fixed_o + marginal_o * r >= r * (fixed_o / top_o + marginal_o), and
    takes a share frac_o of a GPU (s_o / S_t, or k_o whole GPUs for TP) whose
    on-power is at least the sum of its placements' frac_o * on_o * r / c_o. The
    plan's power, and so its worst-case draw that budgets hold, is at least the sum
    of these per-request figures times the rates."""
    total = 0.0
    for unit in table.units:
        ops = table.ops_of(unit.index)
        if len(ops) == 0 or unit.rate_rps <= 0:
            continue
        per_rps = []
        for o in ops:
            type_name = table.type_names[int(table.gpu_type[o])]
            frac = (
                float(table.tp[o])
                if table.tp[o] > 1
                else int(table.share[o]) / table.share_capacity[type_name]
            )
            on = table.on_power[(type_name, int(table.clock_mhz[o]))]
            capacity = float(table.capacity_rps[o])
            per_rps.append(
                float(table.marginal_j[o])
                + float(table.fixed_w[o]) / table.top_rps(int(o))
                + frac * on / capacity
            )
        total += unit.rate_rps * min(per_rps)
    return total


def _feasible_without_budgets(problem: Problem) -> bool:
    """Whether dropping node and cluster budgets makes the instance solvable."""
    from energyopt.catalog.problem import Problem as _Problem
    from energyopt.families.serving.formulations import pattern as pat
    from energyopt.families.serving.solvers.colgen import generate_columns
    from energyopt.formulations.errors import BackendFailure, FormulationNotApplicable
    from energyopt.perf.oppoints import build_op_table

    inst = problem.instance
    nodes = tuple(n.model_copy(update={"power_budget_w": None}) for n in inst.cluster.nodes)
    cluster = inst.cluster.model_copy(update={"nodes": nodes, "power_budget_w": None})
    relaxed = _Problem(
        Instance.model_validate(inst.model_copy(update={"cluster": cluster}).model_dump()),
        problem.catalog,
        problem.source,
    )
    table = build_op_table(relaxed)
    try:
        prog = pat.prepare(relaxed, table)
        generate_columns(prog)
    except (FormulationNotApplicable, BackendFailure):
        return False
    return prog.lp is not None and prog.lp.artificial_rps <= 1e-6
