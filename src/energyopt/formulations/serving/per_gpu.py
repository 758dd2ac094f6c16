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
from energyopt.formulations.serving.assemble import GpuDecision, power_cap_w
from energyopt.formulations.serving.costs import Costs, objective_costs
from energyopt.perf.oppoints import OpTable
from energyopt.spec.cluster import Gpu

ON = 0.5
POOLED = -1
"""Slot index of the TP key of interchangeable GPUs (one cap): its w counts groups."""


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
    tp_keys: list[tuple[str, int, int]] = field(default_factory=list)  # (node, op, slot)
    z_keys: list[tuple[int, int, int]] = field(default_factory=list)  # (gpu, tp op, slot)
    slot_members: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)
    """GPUs that may join each TP group slot (node, op, slot)."""
    unservable: list[str] = field(default_factory=list)
    """Units no variable of the model can serve (the instance is infeasible)."""
    constant: float = 0.0

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
        for node, o, j in self.tp_keys:
            groups = round(float(pyo.value(m.w[node, o, j])))
            if groups <= 0:
                continue
            rate = max(0.0, float(pyo.value(m.r_tp[node, o, j]))) / groups
            chosen = [g for g in self.slot_members[(node, o, j)] if pyo.value(m.z[g, o, j]) > ON]
            k = int(self.table.tp[o])
            for i in range(groups):
                gid = f"{node}:tp{o}.{j if j != POOLED else i}"
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

    for g, gpu in enumerate(gpus):
        t = type_index[gpu.type]
        pm.y_keys.extend((g, f) for f in table.clocks[gpu.type])
        pm.x_keys.extend((g, o) for o in by_type[t])
    # TP groups are formed of GPUs of one node and type, whatever their power caps.
    # Where those GPUs share one cap they are interchangeable: one POOLED key whose
    # integer w counts the groups. Otherwise each possible group of an op is a slot
    # j (binary w), each GPU may join one slot, and each member's cap limits it.
    nodes_types: dict[tuple[str, int], list[int]] = defaultdict(list)
    slot_members = pm.slot_members
    for g, gpu in enumerate(gpus):
        nodes_types[(gpu.node, type_index[gpu.type])].append(g)
    for (node, t), members in nodes_types.items():
        pooled = len({power_cap_w(problem, gpus[g]) for g in members}) == 1
        for o in tp_by_type[t]:
            k = int(table.tp[o])
            slots = [POOLED] if pooled and len(members) >= k else range(len(members) // k)
            for j in slots:
                pm.tp_keys.append((node, o, j))
                pm.z_keys.extend((g, o, j) for g in members)
                slot_members[(node, o, j)] = members

    capacity = {o: float(table.capacity_rps[o]) for o in range(len(table))}
    m.y = pyo.Var(pm.y_keys, domain=pyo.Binary)
    m.x = pyo.Var(pm.x_keys, domain=pyo.Binary)
    m.r = pyo.Var(pm.x_keys, domain=pyo.NonNegativeReals, bounds=lambda _, g, o: (0, capacity[o]))
    m.z = pyo.Var(pm.z_keys, domain=pyo.Binary)

    def most_groups(n: str, o: int, j: int) -> int:
        return 1 if j != POOLED else len(slot_members[(n, o, j)]) // int(table.tp[o])

    m.w = pyo.Var(
        pm.tp_keys,
        domain=pyo.NonNegativeIntegers,
        bounds=lambda _, n, o, j: (0, most_groups(n, o, j)),
    )
    m.r_tp = pyo.Var(
        pm.tp_keys,
        domain=pyo.NonNegativeReals,
        bounds=lambda _, n, o, j: (0, capacity[o] * most_groups(n, o, j)),
    )

    x_of_gpu: dict[int, list[int]] = defaultdict(list)
    for g, o in pm.x_keys:
        x_of_gpu[g].append(o)
    z_of_gpu: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for g, o, j in pm.z_keys:
        z_of_gpu[g].append((o, j))

    m.cons = pyo.ConstraintList()
    add = m.cons.add
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
            share_terms += [
                cap_units * m.z[g, o, j] for o, j in z_of_gpu[g] if table.clock_mhz[o] == f
            ]
            if share_terms:
                add(sum(share_terms) <= cap_units * m.y[g, f])
        if strengthen:
            for o in x_of_gpu[g]:
                add(m.x[g, o] <= m.y[g, int(table.clock_mhz[o])])
                add(m.r[g, o] <= float(table.capacity_rps[o]) * m.x[g, o])
            for o, j in z_of_gpu[g]:
                add(m.z[g, o, j] <= m.y[g, int(table.clock_mhz[o])])
        else:
            for o in x_of_gpu[g]:
                big_m = table.units[int(table.unit[o])].rate_rps
                add(m.r[g, o] <= big_m * m.x[g, o])
                add(m.r[g, o] <= float(table.capacity_rps[o]))
            for o, j in z_of_gpu[g]:
                add(m.z[g, o, j] <= sum(m.y[g, f] for f in clocks))
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
                + sum(usable * m.z[g, o, j] for o, j in z_of_gpu[g])
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
        add(gpu_power(pm, g) <= power_cap_w(problem, gpu))

    for node, o, j in pm.tp_keys:
        members = slot_members[(node, o, j)]
        k = int(table.tp[o])
        add(sum(m.z[g, o, j] for g in members) == k * m.w[node, o, j])
        if j == POOLED:
            # One cap for every member: each group's rate within it.
            per_group = min(capacity[o], tp_rate_limit(problem, table, o, gpus[members[0]]))
            add(m.r_tp[node, o, j] <= per_group * m.w[node, o, j])
            continue
        add(m.r_tp[node, o, j] <= capacity[o] * m.w[node, o, j])
        if j > 0 and strengthen:
            add(m.w[node, o, j] <= m.w[node, o, j - 1])
        for g in members:
            # A member's power (on-power + its 1/k of the group's dynamic power) stays
            # within its own cap: the group is limited by its tightest member.
            rate_limit = tp_rate_limit(problem, table, o, gpus[g])
            if rate_limit < capacity[o]:
                slack = capacity[o] - rate_limit
                add(m.r_tp[node, o, j] <= capacity[o] - slack * m.z[g, o, j])

    for u, unit in enumerate(table.units):
        served = [m.r[g, o] for g, o in pm.x_keys if table.unit[o] == u]
        served += [m.r_tp[n, o, j] for n, o, j in pm.tp_keys if table.unit[o] == u]
        if not served:
            pm.unservable.append(f"{unit.workload}:{unit.phase}")
            continue
        add(sum(served) == unit.rate_rps)

    for spec_node in inst.cluster.nodes:
        if spec_node.power_budget_w is not None:
            add(node_power(pm, spec_node.name) <= spec_node.power_budget_w)
    if inst.cluster.power_budget_w is not None:
        add(sum(node_power(pm, n.name) for n in inst.cluster.nodes) <= inst.cluster.power_budget_w)

    if strengthen:
        _break_symmetry(pm)

    objective = (
        sum(costs.on_cost[(gpus[g].type, f)] * m.y[g, f] for g, f in pm.y_keys)
        + sum(float(costs.op_cost[o]) * m.r[g, o] for g, o in pm.x_keys)
        + sum(float(costs.op_cost[o]) * m.r_tp[n, o, j] for n, o, j in pm.tp_keys)
    )
    if costs.migration_penalty > 0:
        objective = objective + _migration_terms(pm)
    m.obj = pyo.Objective(expr=objective, sense=pyo.minimize)
    return pm


def gpu_power(pm: PerGpuModel, g: int) -> Any:
    """Predicted power of GPU g from shared placements (TP members: see tp_capacity)."""
    m, table, gpu = pm.model, pm.table, pm.gpus[g]
    on = sum(table.on_power[(gpu.type, f)] * m.y[g, f] for f in table.clocks[gpu.type])
    dyn = sum(float(table.energy_j[o]) * m.r[g, o] for gg, o in pm.x_keys if gg == g)
    return on + dyn


def node_power(pm: PerGpuModel, node: str) -> Any:
    """Predicted power of all GPUs of a node, TP groups included (W)."""
    m, table = pm.model, pm.table
    terms = [gpu_power(pm, g) for g, gpu in enumerate(pm.gpus) if gpu.node == node]
    terms += [float(table.energy_j[o]) * m.r_tp[n, o, j] for n, o, j in pm.tp_keys if n == node]
    return sum(terms)


def tp_rate_limit(problem: Problem, table: OpTable, o: int, gpu: Gpu) -> float:
    """Largest group rate of TP op ``o`` (req/s) at which member ``gpu`` stays within
    its power cap: on-power + energy * rate / k <= cap. Never negative."""
    energy = float(table.energy_j[o])
    if energy <= 0:
        return float(table.capacity_rps[o])
    on = table.on_power[(gpu.type, int(table.clock_mhz[o]))]
    k = int(table.tp[o])
    return max(0.0, (power_cap_w(problem, gpu) - on) * k / energy)


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
