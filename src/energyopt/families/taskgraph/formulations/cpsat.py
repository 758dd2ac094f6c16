"""The exact CP-SAT model of a task graph (see docs/formulations/taskgraph.md).

Variables: a start ``s_i`` per task; an optional interval per (task, GPU,
option) of the option's fixed duration, present iff x[i,g,k]; exactly one
present per task. Per GPU: no-overlap of its intervals and, when clock changes
cost anything, a circuit over its tasks (arc i->j: j directly follows i) that
carries the transition latency and energy of consecutive tasks whose clocks
differ. Precedence: s_j >= e_i + transfer(bytes, g_i, g_j) for each pair of
GPUs (enforced under both placement literals). Makespan M >= e_i.

Times are the model's integer grid, so they are exact. Energies are integers
in units of ``energy_unit_j``, every coefficient rounded *down*: any schedule's
integer energy is <= its energy in J / unit, so CP-SAT's bound converts to a
valid bound in J (and, all objectives being nondecreasing in energy and
makespan, on EDP and ED^2P too). The schedule itself is re-evaluated exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from energyopt.families.taskgraph.formulations.idle import forced_idle
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule

LINEAR_IDLE_STEPS = 1000  # energy units per time unit of idle power (linear objectives)
PRODUCT_IDLE_STEPS = 16  # the same for EDP / ED^2P (keeps the products inside int64)
MAX_PRODUCT = 4 * 10**18


@dataclass
class CpTaskGraph:
    """A built model and the handles needed to read a schedule back."""

    model: cp_model.CpModel
    start: list[Any]
    present: dict[tuple[int, int, int], Any]
    makespan: Any
    energy: Any | None
    energy_unit_j: float
    objective_scale: float  # objective value in its unit = CP objective x scale
    horizon: int
    arcs: dict[int, list[tuple[int, int, Any]]] = field(default_factory=dict)


def build_cp_model(tg: TaskGraph, horizon: int) -> CpTaskGraph:
    """CP-SAT model of ``tg`` for its objective; every optimal schedule has makespan <=
    ``horizon`` (the caller derives it from a known schedule)."""
    m = cp_model.CpModel()
    n, gpus = tg.n_tasks, tg.n_gpus
    kind = tg.objective
    steps = PRODUCT_IDLE_STEPS if kind in ("edp", "ed2p") else LINEAR_IDLE_STEPS
    idle_j_per_unit = tg.idle_total_w * tg.unit_ms / 1e3
    eu = idle_j_per_unit / steps
    horizon = min(horizon, tg.deadline) if tg.deadline is not None else horizon
    start = [m.new_int_var(0, horizon, f"s{i}") for i in range(n)]
    end = [m.new_int_var(0, horizon, f"e{i}") for i in range(n)]
    on: dict[tuple[int, int], Any] = {}
    present: dict[tuple[int, int, int], Any] = {}
    intervals: list[list[Any]] = [[] for _ in range(gpus)]
    dyn_terms: list[tuple[Any, int]] = []
    dur_of: list[Any] = []  # each task's chosen duration, a linear expression (grid units)
    for i in range(n):
        choices = []
        dur_terms = []
        for g in range(gpus):
            o = tg.opts(i, g)
            if not o.dur:
                continue
            on[i, g] = m.new_bool_var(f"on{i}_{g}")
            lits = []
            for k, d in enumerate(o.dur):
                x = m.new_bool_var(f"x{i}_{g}_{k}")
                present[i, g, k] = x
                lits.append(x)
                intervals[g].append(m.new_optional_fixed_size_interval_var(start[i], d, x, ""))
                dur_terms.append((x, d))
                dyn_terms.append((x, math.floor(o.dyn_j[k] / eu)))
            m.add(sum(lits) == on[i, g])
            choices.append(on[i, g])
        m.add_exactly_one(choices)
        dur_of.append(sum(d * x for x, d in dur_terms))
        m.add(end[i] == start[i] + dur_of[i])
    for g in range(gpus):
        m.add_no_overlap(intervals[g])
    _break_gpu_symmetry(m, tg, on)
    for j in range(n):
        for i, nbytes in tg.preds[j]:
            m.add(start[j] >= end[i])
            for a in range(gpus):
                for b in range(gpus):
                    lag = tg.transfer(nbytes, a, b)
                    if lag > 0 and (i, a) in on and (j, b) in on:
                        m.add(start[j] >= end[i] + lag).only_enforce_if([on[i, a], on[j, b]])
    makespan = m.new_int_var(0, horizon, "makespan")
    for i in range(n):
        if not tg.succs[i]:
            m.add(makespan >= end[i])
    for g in range(gpus):
        # Redundant (no-overlap implies it), but linear: the LP relaxation then
        # knows that a GPU's tasks fit before the makespan, so a deadline forces
        # faster (costlier) options into the bound.
        busy = [(x, tg.opts(i, gg).dur[k]) for (i, gg, k), x in present.items() if gg == g]
        if busy:
            m.add(sum(d * x for x, d in busy) <= makespan)
    idle = forced_idle(tg)
    if idle.any:
        # Redundant as well: a task that runs alone keeps every other GPU waiting and
        # the graph forces waits around such tasks (idle.forced_idle), so the GPU
        # time of the tasks, counted that way, fits in G x the makespan.
        taken = [(x, idle.mult[i] * tg.opts(i, g).dur[k]) for (i, g, k), x in present.items()]
        m.add(sum(c * x for x, c in taken) + idle.gaps <= gpus * makespan)
    ancestors = _ancestors(tg)
    _add_work_rows(m, gpus, ancestors, start, end, makespan, dur_of)
    transition_terms: list[tuple[Any, int]] = []
    arcs: dict[int, list[tuple[int, int, Any]]] = {}
    if tg.transition > 0 or tg.transition_j > 0:
        tr_units = math.floor(tg.transition_j / eu)
        for g in range(gpus):
            arcs[g] = _circuit(
                m, tg, g, on, present, start, end, ancestors, transition_terms, tr_units
            )
    energy_expr = (
        steps * makespan
        + sum(c * x for x, c in dyn_terms)
        + sum(c * z for z, c in transition_terms)
    )
    cp = CpTaskGraph(m, start, present, makespan, None, eu, 1.0, horizon, arcs)
    if kind == "makespan":
        m.minimize(makespan)
        cp.objective_scale = tg.unit_ms
        return cp
    if kind in ("energy", "energy_within"):
        m.minimize(energy_expr)
        cp.objective_scale = eu
        return cp
    energy_ub = steps * horizon + sum(c for _, c in dyn_terms) + sum(c for _, c in transition_terms)
    energy = m.new_int_var(0, energy_ub, "energy")
    m.add(energy == energy_expr)
    cp.energy = energy
    edp = m.new_int_var(0, energy_ub * horizon, "edp")
    m.add_multiplication_equality(edp, [energy, makespan])
    seconds = tg.unit_ms / 1e3
    if kind == "edp":
        m.minimize(edp)
        cp.objective_scale = eu * seconds
        return cp
    if energy_ub * horizon * horizon > MAX_PRODUCT:
        raise ValueError("ED^2P does not fit in 64-bit integers at this time grid")
    ed2p = m.new_int_var(0, energy_ub * horizon * horizon, "ed2p")
    m.add_multiplication_equality(ed2p, [edp, makespan])
    m.minimize(ed2p)
    cp.objective_scale = eu * seconds * seconds
    return cp


def interchangeable_gpus(tg: TaskGraph) -> list[list[int]]:
    """Classes of GPUs (ascending, two or more each) that any schedule may swap: one
    type, and swapping any two of a class leaves every route's latency and bandwidth
    to every GPU unchanged. Swapping them in a schedule changes no duration, power,
    transfer or clock change, so it keeps the schedule feasible and its objective."""

    def alike(a: int, b: int) -> bool:
        if tg.gpu_type[a] != tg.gpu_type[b]:
            return False
        for table in (tg.route_latency_ms, tg.route_gbps):
            if table[a][b] != table[b][a]:
                return False
            for h in range(tg.n_gpus):
                if h not in (a, b) and (table[a][h] != table[b][h] or table[h][a] != table[h][b]):
                    return False
        return True

    classes: list[list[int]] = []
    for g in range(tg.n_gpus):
        for c in classes:
            if all(alike(g, h) for h in c):
                c.append(g)
                break
        else:
            classes.append([g])
    return [c for c in classes if len(c) > 1]


def _break_gpu_symmetry(m: cp_model.CpModel, tg: TaskGraph, on: dict[tuple[int, int], Any]) -> None:
    """Within each class of ``interchangeable_gpus``, GPUs are first used in class
    order along the graph's topological order: a task may run on the class's r-th GPU
    only if an earlier task runs on its (r-1)-th. Valid: relabelling a class's GPUs
    by first use maps any schedule to one that meets this, at the same objective."""
    order = list(tg.topo_order)
    for cls in interchangeable_gpus(tg):
        for p, i in enumerate(order):
            for r in range(1, len(cls)):
                lit = on.get((i, cls[r]))
                if lit is None:
                    continue
                earlier = [on[q, cls[r - 1]] for q in order[:p] if (q, cls[r - 1]) in on]
                m.add_bool_or([~lit, *earlier])


def _add_work_rows(
    m: cp_model.CpModel,
    gpus: int,
    ancestors: list[set[int]],
    start: list[Any],
    end: list[Any],
    makespan: Any,
    dur_of: list[Any],
) -> None:
    """Redundant linear rows (grid units): every ancestor of task j ends before j
    starts and every descendant starts after j ends and ends by the makespan, and
    tasks on one GPU do not overlap, so G s_j >= the ancestors' summed durations and
    G (M - e_j) >= the descendants'. Transfers and clock changes only add time, so
    every schedule meets them. They tie each task's start to the work the graph puts
    before it, which the LP relaxation otherwise sees only through single chains."""
    descendants: list[list[int]] = [[] for _ in ancestors]
    for j, anc in enumerate(ancestors):
        for a in anc:
            descendants[a].append(j)
    for j, anc in enumerate(ancestors):
        if anc:
            m.add(gpus * start[j] >= sum(dur_of[a] for a in sorted(anc)))
        if descendants[j]:
            m.add(gpus * (makespan - end[j]) >= sum(dur_of[d] for d in descendants[j]))


def _ancestors(tg: TaskGraph) -> list[set[int]]:
    anc: list[set[int]] = [set() for _ in range(tg.n_tasks)]
    for i in tg.topo_order:
        for p, _ in tg.preds[i]:
            anc[i] |= anc[p] | {p}
    return anc


def _circuit(
    m: cp_model.CpModel,
    tg: TaskGraph,
    g: int,
    on: dict[tuple[int, int], Any],
    present: dict[tuple[int, int, int], Any],
    start: list[Any],
    end: list[Any],
    ancestors: list[set[int]],
    transition_terms: list[tuple[Any, int]],
    tr_units: int,
) -> list[tuple[int, int, Any]]:
    """Circuit of GPU g (node 0 = before the first / after the last task)."""
    tasks = [i for i in range(tg.n_tasks) if (i, g) in on]
    node = {i: k + 1 for k, i in enumerate(tasks)}
    arcs: list[tuple[int, int, Any]] = []
    hints: list[tuple[int, int, Any]] = []  # (task or -1, task or -1, literal)
    empty = m.new_bool_var(f"empty{g}")
    arcs.append((0, 0, empty))
    for i in tasks:
        first, last = m.new_bool_var(""), m.new_bool_var("")
        arcs.append((0, node[i], first))
        arcs.append((node[i], 0, last))
        arcs.append((node[i], node[i], ~on[i, g]))
        hints.extend([(-1, i, first), (i, -1, last)])
    clock_lit: dict[tuple[int, int], Any] = {}  # (task, clock MHz) -> its literal on g
    changes: list[Any] = []
    for i in tasks:
        for k, c in enumerate(tg.opts(i, g).clock_mhz):
            clock_lit[i, c] = present[i, g, k]
    for i in tasks:
        for j in tasks:
            if i == j or j in ancestors[i]:
                continue
            arc = m.new_bool_var(f"arc{g}_{i}_{j}")
            arcs.append((node[i], node[j], arc))
            hints.append((i, j, arc))
            m.add(start[j] >= end[i]).only_enforce_if(arc)
            change = m.new_bool_var(f"chg{g}_{i}_{j}")
            for c in tg.opts(i, g).clock_mhz:
                other = clock_lit.get((j, c))
                if other is None:
                    m.add_bool_or([~arc, ~clock_lit[i, c], change])
                else:
                    m.add_bool_or([~arc, ~clock_lit[i, c], other, change])
            if tg.transition > 0:
                m.add(start[j] >= end[i] + tg.transition).only_enforce_if(change)
            m.add_implication(change, arc)
            transition_terms.append((change, tr_units))
            changes.append(change)
    _add_clock_count_row(m, clock_lit, changes)
    m.add_circuit(arcs)
    return hints


def _add_clock_count_row(
    m: cp_model.CpModel, clock_lit: dict[tuple[int, int], Any], changes: list[Any]
) -> None:
    """Redundant row on one GPU: its tasks run in one sequence that visits every clock
    some task runs at, so at least (clocks used - 1) consecutive pairs differ in clock
    and pay a change. ``used[c]`` is implied by every task at clock c (MHz) on the GPU;
    a schedule sets it to whether c is used, which meets the row. On layered-3x4-l4
    (one change in the optimum) it cut CP-SAT's conflicts to a proof from 40,954 to
    4,679 (one worker)."""
    used: dict[int, Any] = {}
    for (_, c), lit in clock_lit.items():
        if c not in used:
            used[c] = m.new_bool_var(f"use{c}")
        m.add_implication(lit, used[c])
    if len(used) > 1:
        m.add(sum(changes) >= sum(used.values()) - 1)


def relabelled(tg: TaskGraph, s: Schedule) -> Schedule:
    """``s`` with the GPUs of each class of ``interchangeable_gpus`` renamed in order of
    first use along the topological order (what ``_break_gpu_symmetry`` asks); the
    same durations, transfers, clock changes and objective."""
    rename = list(range(tg.n_gpus))
    order = list(tg.topo_order)
    for cls in interchangeable_gpus(tg):
        used = [g for g in dict.fromkeys(s.gpu[i] for i in order) if g in cls]
        used += [g for g in cls if g not in used]
        for target, g in zip(cls, used, strict=True):
            rename[g] = target
    return Schedule(tuple(rename[g] for g in s.gpu), s.option, s.start)


def hint(cp: CpTaskGraph, tg: TaskGraph, s: Schedule) -> None:
    """Give CP-SAT a known schedule as a starting point (relabelled to meet the
    symmetry-breaking rows)."""
    s = relabelled(tg, s)
    for (i, g, k), x in cp.present.items():
        cp.model.add_hint(x, s.gpu[i] == g and s.option[i] == k)
    for i, v in enumerate(cp.start):
        cp.model.add_hint(v, s.start[i])
    cp.model.add_hint(cp.makespan, s.makespan(tg))
    for g, seq in enumerate(s.sequences(tg)):
        follows = set(zip([-1, *seq], [*seq, -1], strict=True))
        for i, j, lit in cp.arcs.get(g, []):
            cp.model.add_hint(lit, (i, j) in follows)
