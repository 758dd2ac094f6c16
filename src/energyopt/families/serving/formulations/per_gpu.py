"""Per-GPU formulation: every GPU named, binaries for (GPU, clock) and (GPU, op).

Exact for any fleet, including GPUs with a current state and migration costs.
Written out in docs/formulations/serving.md. ``strengthen=False`` gives the
plain model a user would first write (no symmetry breaking, no per-op linking of
placements to the clock, big-M rate bounds), kept as a benchmark baseline.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import pyomo.environ as pyo

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.assemble import MIN_RATE_RPS, GpuDecision, power_cap_w
from energyopt.families.serving.formulations.costs import Costs, objective_costs
from energyopt.perf.oppoints import OpTable
from energyopt.spec.cluster import Gpu

ON = 0.5
TOP_MARGIN = 1e-6
"""Relative margin above a unit's rate in the bound of a placement's rate."""


@dataclass
class PerGpuModel:
    """The Pyomo model and the index maps needed to read a plan back."""

    model: Any
    problem: Problem
    table: OpTable
    costs: Costs
    gpus: list[Gpu]
    x_keys: list[tuple[int, int]] = field(default_factory=list)  # (gpu, op)
    y_keys: list[tuple[int, int]] = field(default_factory=list)  # (gpu, clock)
    tp_keys: list[tuple[str, int]] = field(default_factory=list)  # (node, TP op)
    z_keys: list[tuple[int, int]] = field(default_factory=list)  # (gpu, TP op)
    idle_keys: list[tuple[int, int]] = field(default_factory=list)
    """(gpu, op) of a unit placed on the GPU now, under a migration penalty: the
    placement may stay at rate 0 (no fixed part) to avoid the penalty."""
    tp_members: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    """GPUs that may join a group of each TP key (node, op): those of the node and
    type whose cap holds a member's worst-case draw."""
    unservable: list[str] = field(default_factory=list)
    """Units no variable of the model can serve (the instance is infeasible)."""
    constant: float = 0.0

    def idle_fixed_cost(self) -> float:
        """Fixed costs (objective units) the loaded solution pays for placements that
        carry no rate (``MIN_RATE_RPS`` or less; a TP group counted once): the plan
        drops them, or keeps a current one idle, and pays nothing for them."""
        m, fixed = self.model, self.costs.op_fixed
        idle = set(self.idle_keys)
        total = 0.0
        for g, o in self.x_keys:
            paying = m.carry[g, o] if (g, o) in idle else m.x[g, o]
            if pyo.value(paying) > ON and float(pyo.value(m.r[g, o])) <= MIN_RATE_RPS:
                total += float(fixed[o])
        for node, o in self.tp_keys:
            groups = round(float(pyo.value(m.w[node, o])))
            if groups > 0 and float(pyo.value(m.r_tp[node, o])) / groups <= MIN_RATE_RPS:
                total += groups * float(fixed[o])
        return total

    def decisions(self) -> dict[str, GpuDecision]:
        """Per-GPU decisions from the loaded solution."""
        m = self.model
        out: dict[str, GpuDecision] = {g.id: GpuDecision() for g in self.gpus}
        for g, f in self.y_keys:
            if pyo.value(m.y[g, f]) > ON:
                out[self.gpus[g].id].clock_mhz = f
        for g, o in self.x_keys:
            if pyo.value(m.x[g, o]) > ON:
                rate = max(0.0, float(pyo.value(m.r[g, o])))
                out[self.gpus[g].id].ops.append((o, rate))
        for node, o in self.tp_keys:
            groups = round(float(pyo.value(m.w[node, o])))
            if groups <= 0:
                continue
            rate = max(0.0, float(pyo.value(m.r_tp[node, o]))) / groups
            chosen = [g for g in self.tp_members[(node, o)] if pyo.value(m.z[g, o]) > ON]
            k = int(self.table.tp[o])
            for i in range(groups):
                gid = f"{node}:tp{o}.{i}"
                for g in chosen[i * k : (i + 1) * k]:
                    out[self.gpus[g].id].tp_ops.append((o, rate, gid))
        return out


def build_per_gpu(problem: Problem, table: OpTable, *, strengthen: bool = True) -> PerGpuModel:
    """State the per-GPU MILP in Pyomo."""
    inst = problem.instance
    costs = objective_costs(problem, table)
    gpus = problem.gpus
    opts = inst.options
    mig = opts.sharing.mode == "mig"
    m = pyo.ConcreteModel(name=f"serving-per-gpu:{inst.name}")
    pm = PerGpuModel(m, problem, table, costs, gpus)

    by_type: dict[int, list[int]] = defaultdict(list)
    tp_by_type: dict[int, list[int]] = defaultdict(list)
    for o in range(len(table)):
        (by_type if table.tp[o] == 1 else tp_by_type)[int(table.gpu_type[o])].append(o)
    type_index = {name: t for t, name in enumerate(table.type_names)}

    # An op whose worst-case draw on GPU g (on-power at its clock + its peak power,
    # a TP member's 1/k of its group's) exceeds g's cap can never be placed there:
    # it gets no variable.
    def fits(g: int, o: int) -> bool:
        gpu = gpus[g]
        worst = table.on_power[(gpu.type, int(table.clock_mhz[o]))] + float(
            table.peak_power_w[o]
        ) / int(table.tp[o])
        return worst <= power_cap_w(problem, gpu)

    for g, gpu in enumerate(gpus):
        t = type_index[gpu.type]
        pm.y_keys.extend((g, f) for f in table.clocks[gpu.type])
        pm.x_keys.extend((g, o) for o in by_type[t] if fits(g, o))
    # TP groups are formed of GPUs of one node and type. A member holds nothing
    # else, so its worst-case draw is on-power + peak / k whatever the group's rate:
    # it fits its cap or not. The members that fit are interchangeable; one key per
    # (node, op) whose integer w counts the groups.
    nodes_types: dict[tuple[str, int], list[int]] = defaultdict(list)
    for g, gpu in enumerate(gpus):
        nodes_types[(gpu.node, type_index[gpu.type])].append(g)
    for (node, t), members in nodes_types.items():
        for o in tp_by_type[t]:
            able = [g for g in members if fits(g, o)]
            if len(able) < int(table.tp[o]):
                continue
            pm.tp_keys.append((node, o))
            pm.z_keys.extend((g, o) for g in able)
            pm.tp_members[(node, o)] = able
    if costs.migration_penalty > 0:
        for g, o in pm.x_keys:
            state = gpus[g].state
            unit = table.units[int(table.unit[o])]
            if state is not None and any(
                (p.workload, p.phase) == (unit.workload, unit.phase) for p in state.placements
            ):
                pm.idle_keys.append((g, o))

    capacity = {o: float(table.capacity_rps[o]) for o in range(len(table))}
    # The most a placement carries: its capacity, or its unit's rate where less, so
    # that the LP relaxation charges at least fixed * r / top of a fixed part. The
    # rate gets a margin of TOP_MARGIN: a grid of rates (CP-SAT's) may hold no
    # point at exactly the unit's rate, and a placement that must carry it all
    # then finds none within that bound.
    top = {
        o: min(capacity[o], table.units[int(table.unit[o])].rate_rps * (1.0 + TOP_MARGIN))
        for o in range(len(table))
    }
    m.y = pyo.Var(pm.y_keys, domain=pyo.Binary)
    m.x = pyo.Var(pm.x_keys, domain=pyo.Binary)
    m.r = pyo.Var(pm.x_keys, domain=pyo.NonNegativeReals, bounds=lambda _, g, o: (0, capacity[o]))
    # carry[g, o]: the placement carries rate (and costs its fixed part); only where
    # it may stay at rate 0 (idle_keys); elsewhere x itself.
    m.carry = pyo.Var(pm.idle_keys, domain=pyo.Binary)
    m.z = pyo.Var(pm.z_keys, domain=pyo.Binary)

    def most_groups(n: str, o: int) -> int:
        return len(pm.tp_members[(n, o)]) // int(table.tp[o])

    m.w = pyo.Var(
        pm.tp_keys,
        domain=pyo.NonNegativeIntegers,
        bounds=lambda _, n, o: (0, most_groups(n, o)),
    )
    m.r_tp = pyo.Var(
        pm.tp_keys,
        domain=pyo.NonNegativeReals,
        bounds=lambda _, n, o: (0, capacity[o] * most_groups(n, o)),
    )
    idle = set(pm.idle_keys)

    def carrying(g: int, o: int) -> Any:
        """The binary whose 1 lets (g, o) carry rate and charges its fixed part."""
        return m.carry[g, o] if (g, o) in idle else m.x[g, o]

    x_of_gpu: dict[int, list[int]] = defaultdict(list)
    for g, o in pm.x_keys:
        x_of_gpu[g].append(o)
    z_of_gpu: dict[int, list[int]] = defaultdict(list)
    for g, o in pm.z_keys:
        z_of_gpu[g].append(o)

    m.cons = pyo.ConstraintList()
    add = m.cons.add
    power: dict[int, Any] = {}  # worst-case draw of each GPU (W)
    usable_frac = 1.0 - opts.memory_reserve_fraction
    for g, gpu in enumerate(gpus):
        gtype = problem.gpu_type(gpu.type)
        cap_units = table.share_capacity[gpu.type]
        clocks = table.clocks[gpu.type]
        add(sum(m.y[g, f] for f in clocks) <= 1)
        for f in clocks:
            share_terms = [
                int(table.share[o]) * m.x[g, o] for o in x_of_gpu[g] if table.clock_mhz[o] == f
            ]
            share_terms += [cap_units * m.z[g, o] for o in z_of_gpu[g] if table.clock_mhz[o] == f]
            if share_terms:
                add(sum(share_terms) <= cap_units * m.y[g, f])
        for o in x_of_gpu[g]:
            if (g, o) in idle:
                add(m.carry[g, o] <= m.x[g, o])
        if strengthen:
            for o in x_of_gpu[g]:
                add(m.x[g, o] <= m.y[g, int(table.clock_mhz[o])])
                add(m.r[g, o] <= top[o] * carrying(g, o))
            for o in z_of_gpu[g]:
                add(m.z[g, o] <= m.y[g, int(table.clock_mhz[o])])
        else:
            for o in x_of_gpu[g]:
                big_m = table.units[int(table.unit[o])].rate_rps
                add(m.r[g, o] <= big_m * carrying(g, o))
                add(m.r[g, o] <= float(table.capacity_rps[o]))
            for o in z_of_gpu[g]:
                add(m.z[g, o] <= sum(m.y[g, f] for f in clocks))
        per_unit: dict[int, list[int]] = defaultdict(list)
        for o in x_of_gpu[g]:
            per_unit[int(table.unit[o])].append(o)
        for ops in per_unit.values():
            if len(ops) > 1:
                add(sum(m.x[g, o] for o in ops) <= 1)
        usable = gtype.memory_gb * usable_frac
        if not (mig and gtype.mig_profiles) and x_of_gpu[g]:
            add(
                sum(float(table.memory_gb[o]) * m.x[g, o] for o in x_of_gpu[g])
                + sum(usable * m.z[g, o] for o in z_of_gpu[g])
                <= usable * sum(m.y[g, f] for f in clocks)
            )
        if mig:
            by_profile: dict[str, list[int]] = defaultdict(list)
            for o in x_of_gpu[g]:
                name = table.mig_profile[o]
                if name is not None:
                    by_profile[name].append(o)
            for name, ops in by_profile.items():
                limit = gtype.mig_profile(name).max_instances
                add(sum(m.x[g, o] for o in ops) <= limit)
        power[g] = gpu_power(pm, g, x_of_gpu[g], z_of_gpu[g])
        add(power[g] <= power_cap_w(problem, gpu))

    for node, o in pm.tp_keys:
        members = pm.tp_members[(node, o)]
        k = int(table.tp[o])
        add(sum(m.z[g, o] for g in members) == k * m.w[node, o])
        add(m.r_tp[node, o] <= (top[o] if strengthen else capacity[o]) * m.w[node, o])

    for u, unit in enumerate(table.units):
        served = [m.r[g, o] for g, o in pm.x_keys if table.unit[o] == u]
        served += [m.r_tp[n, o] for n, o in pm.tp_keys if table.unit[o] == u]
        if not served:
            pm.unservable.append(f"{unit.workload}:{unit.phase}")
            continue
        add(sum(served) == unit.rate_rps)

    for spec_node in inst.cluster.nodes:
        if spec_node.power_budget_w is not None:
            add(
                sum(power[g] for g, gpu in enumerate(gpus) if gpu.node == spec_node.name)
                <= spec_node.power_budget_w
            )
    if inst.cluster.power_budget_w is not None:
        add(sum(power.values()) <= inst.cluster.power_budget_w)

    if strengthen:
        _break_symmetry(pm)

    objective = (
        sum(costs.on_cost[(gpus[g].type, f)] * m.y[g, f] for g, f in pm.y_keys)
        + sum(float(costs.op_fixed[o]) * carrying(g, o) for g, o in pm.x_keys)
        + sum(float(costs.op_cost[o]) * m.r[g, o] for g, o in pm.x_keys)
        + sum(float(costs.op_fixed[o]) * m.w[n, o] for n, o in pm.tp_keys)
        + sum(float(costs.op_cost[o]) * m.r_tp[n, o] for n, o in pm.tp_keys)
    )
    if costs.migration_penalty > 0:
        objective = objective + _migration_terms(pm)
    m.obj = pyo.Objective(expr=objective, sense=pyo.minimize)
    return pm


def gpu_power(pm: PerGpuModel, g: int, ops: list[int], tp_ops: list[int]) -> Any:
    """Worst-case draw of GPU g (W): on-power at its clock, plus the peak power of
    each op placed on it (``ops``, its x keys) and 1/k of each TP op's peak for a
    TP group it joins (``tp_ops``, its z keys), whatever the rates; the figure the
    verifier checks caps and budgets on."""
    m, table, gpu = pm.model, pm.table, pm.gpus[g]
    on = sum(table.on_power[(gpu.type, f)] * m.y[g, f] for f in table.clocks[gpu.type])
    peak = sum(float(table.peak_power_w[o]) * m.x[g, o] for o in ops)
    tp = sum(float(table.peak_power_w[o]) / int(table.tp[o]) * m.z[g, o] for o in tp_ops)
    return on + peak + tp


def _break_symmetry(pm: PerGpuModel) -> None:
    """Order interchangeable GPUs (same node, type and cap, no state) by clock level."""
    m, gpus, table = pm.model, pm.gpus, pm.table
    groups: dict[tuple[str, str, float | None], list[int]] = defaultdict(list)
    for g, gpu in enumerate(gpus):
        if gpu.state is None:
            groups[(gpu.node, gpu.type, gpu.power_cap_w)].append(g)
    for (_, type_name, _), members in groups.items():
        clocks = table.clocks[type_name]
        for a, b in pairwise(members):
            level_a = sum((i + 1) * m.y[a, f] for i, f in enumerate(clocks))
            level_b = sum((i + 1) * m.y[b, f] for i, f in enumerate(clocks))
            m.cons.add(level_a >= level_b)


def _migration_terms(pm: PerGpuModel) -> Any:
    """penalty * (placements of the current state that the plan removes)."""
    m, table, costs = pm.model, pm.table, pm.costs
    keys: list[tuple[int, int]] = []
    kept: dict[tuple[int, int], list[Any]] = {}
    for g, gpu in enumerate(pm.gpus):
        if gpu.state is None:
            continue
        current_units = dict.fromkeys((p.workload, p.phase) for p in gpu.state.placements)
        for workload, phase in current_units:
            for u, unit in enumerate(table.units):
                if unit.workload == workload and unit.phase == phase:
                    keys.append((g, u))
                    kept[(g, u)] = [
                        m.x[gg, o] for gg, o in pm.x_keys if gg == g and table.unit[o] == u
                    ]
    m.moved = pyo.Var(keys, domain=pyo.NonNegativeReals, bounds=(0, 1))
    for key in keys:
        m.cons.add(m.moved[key] >= 1 - sum(kept[key]))
    return costs.migration_penalty * sum(m.moved[k] for k in keys)
