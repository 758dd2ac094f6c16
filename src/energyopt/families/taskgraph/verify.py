"""Independent checker of task-graph schedules.

It reads only the problem's data (durations and board powers per option,
routes, DVFS costs, idle powers, deadline) and the schedule's placement,
clocks and start times, and recomputes everything else itself: end times,
transfers, the order on each GPU, clock changes, makespan, energy and the
objective. It shares no code with the solvers' own accounting.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule


@dataclass
class ScheduleCheck:
    """Violations (empty: feasible) and the recomputed totals (units in names)."""

    violations: list[str] = field(default_factory=list)
    makespan_ms: float = 0.0
    energy_j: float = 0.0
    transitions: int = 0
    objective: float = 0.0

    @property
    def ok(self) -> bool:
        """True if the schedule breaks nothing."""
        return not self.violations


def check_schedule(tg: TaskGraph, s: Schedule) -> ScheduleCheck:
    """Check ``s`` against ``tg``: placement, precedence with transfers, one task at a
    time per GPU with transition latencies, the deadline; recompute the objective."""
    out = ScheduleCheck()
    n = tg.n_tasks
    if not len(s.gpu) == len(s.option) == len(s.start) == n:
        out.violations.append(f"schedule has {len(s.gpu)} tasks, the graph {n}")
        return out
    unit_s = tg.unit_ms / 1e3
    ends: list[int] = [0] * n
    clocks: list[int] = [0] * n
    active_j = 0.0
    for i, name in enumerate(tg.task_names):
        g, k, t = s.gpu[i], s.option[i], s.start[i]
        if not 0 <= g < tg.n_gpus:
            out.violations.append(f"{name}: GPU index {g} does not exist")
            return out
        o = tg.options[tg.gpu_type[g]][i]
        if not 0 <= k < len(o.dur):
            out.violations.append(f"{name}: cannot run on {tg.gpu_names[g]} at option {k}")
            return out
        if t < 0:
            out.violations.append(f"{name}: starts before time 0")
        ends[i] = t + o.dur[k]
        clocks[i] = o.clock_mhz[k]
        active_j += o.active_w[k] * o.dur[k] * unit_s
    for j, name in enumerate(tg.task_names):
        for i, nbytes in tg.preds[j]:
            need = ends[i] + _transfer_units(tg, nbytes, s.gpu[i], s.gpu[j])
            if s.start[j] < need:
                out.violations.append(
                    f"{name}: starts at {tg.ms(s.start[j]):.6f} ms, before its input from "
                    f"{tg.task_names[i]} arrives at {tg.ms(need):.6f} ms"
                )
    busy_units = 0
    for g, gpu_name in enumerate(tg.gpu_names):
        mine = sorted((s.start[i], ends[i], i) for i in range(n) if s.gpu[i] == g)
        for (_, end_a, a), (start_b, _, b) in itertools.pairwise(mine):
            gap = tg.transition if clocks[a] != clocks[b] else 0
            if clocks[a] != clocks[b]:
                out.transitions += 1
            if start_b < end_a + gap:
                what = "overlaps" if start_b < end_a else "leaves no time for the clock change"
                out.violations.append(
                    f"{gpu_name}: {tg.task_names[b]} {what} after {tg.task_names[a]}"
                )
        busy_units += sum(e - b for b, e, _ in mine)
    makespan = max(ends)
    if tg.deadline is not None and makespan > tg.deadline:
        out.violations.append(
            f"makespan {tg.ms(makespan):.6f} ms exceeds the deadline {tg.ms(tg.deadline):.6f} ms"
        )
    idle_w = sum(tg.idle_w[tg.gpu_type[g]] for g in range(tg.n_gpus))
    # idle power whenever a GPU does not run a task: all GPUs x makespan minus busy time,
    # where each task's board power (idle included) replaces the idle power
    idle_j = idle_w * makespan * unit_s - _busy_idle_j(tg, s, unit_s)
    out.energy_j = idle_j + active_j + out.transitions * tg.transition_j
    out.makespan_ms = makespan * tg.unit_ms
    seconds = out.makespan_ms / 1e3
    out.objective = {
        "energy": out.energy_j,
        "energy_within": out.energy_j,
        "makespan": out.makespan_ms,
        "edp": out.energy_j * seconds,
        "ed2p": out.energy_j * seconds**2,
    }[tg.objective]
    return out


def _busy_idle_j(tg: TaskGraph, s: Schedule, unit_s: float) -> float:
    total = 0.0
    for i in range(tg.n_tasks):
        t = tg.gpu_type[s.gpu[i]]
        total += tg.idle_w[t] * tg.options[t][i].dur[s.option[i]] * unit_s
    return total


def _transfer_units(tg: TaskGraph, nbytes: float, a: int, b: int) -> int:
    if a == b or nbytes <= 0:
        return 0
    ms = tg.route_latency_ms[a][b] + nbytes * 1e3 / (tg.route_gbps[a][b] * 1e9)
    return max(0, math.ceil(ms / tg.unit_ms - 1e-9))
