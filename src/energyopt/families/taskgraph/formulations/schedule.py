"""A schedule of a task graph, its earliest-start timing and its totals.

A schedule gives every task a GPU, an option (a clock of that task on that
GPU's type) and a start time in grid units. Tasks on one GPU run one at a time
in start order; a clock change between two consecutive tasks of one GPU costs
the DVFS transition latency and energy. All GPUs are on from time 0 to the
makespan and draw their idle power whenever they do not run a task.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

from energyopt.families.taskgraph.formulations.model import TaskGraph


@dataclass(frozen=True)
class Schedule:
    """Per task (by index): GPU index, option index, start time (grid units)."""

    gpu: tuple[int, ...]
    option: tuple[int, ...]
    start: tuple[int, ...]

    def dur(self, tg: TaskGraph, task: int) -> int:
        """Duration of ``task`` at its option (grid units)."""
        return tg.opts(task, self.gpu[task]).dur[self.option[task]]

    def end(self, tg: TaskGraph, task: int) -> int:
        """End of ``task`` (grid units)."""
        return self.start[task] + self.dur(tg, task)

    def clock(self, tg: TaskGraph, task: int) -> int:
        """SM clock of ``task`` (MHz)."""
        return tg.opts(task, self.gpu[task]).clock_mhz[self.option[task]]

    def makespan(self, tg: TaskGraph) -> int:
        """Latest end over all tasks (grid units)."""
        return max(self.end(tg, i) for i in range(len(self.gpu)))

    def sequences(self, tg: TaskGraph) -> list[list[int]]:
        """Tasks of every GPU in start order."""
        seqs: list[list[int]] = [[] for _ in range(tg.n_gpus)]
        for i in sorted(range(len(self.gpu)), key=lambda i: (self.start[i], self.end(tg, i), i)):
            seqs[self.gpu[i]].append(i)
        return seqs


@dataclass(frozen=True)
class GpuTotals:
    """One GPU's share of a schedule."""

    tasks: int
    clock_changes: int
    busy: int  # grid units running tasks
    dyn_j: float  # energy above idle of its tasks, J
    clocks_mhz: tuple[int, ...]  # distinct clocks used, ascending


@dataclass(frozen=True)
class Totals:
    """Makespan and energy of a schedule (units in names)."""

    makespan: int  # grid units
    makespan_ms: float
    energy_j: float
    idle_j: float  # every GPU at idle power from 0 to the makespan
    dyn_j: float  # above-idle energy of all tasks
    transitions: int
    transition_j: float
    objective: float
    per_gpu: tuple[GpuTotals, ...]


def totals(tg: TaskGraph, s: Schedule) -> Totals:
    """Makespan, energy and objective of ``s`` (no feasibility check: see verify/)."""
    makespan = s.makespan(tg)
    per_gpu: list[GpuTotals] = []
    transitions = 0
    dyn_total = 0.0
    for g, seq in enumerate(s.sequences(tg)):
        clocks = [s.clock(tg, i) for i in seq]
        changes = sum(1 for a, b in itertools.pairwise(clocks) if a != b)
        dyn = sum(tg.opts(i, g).dyn_j[s.option[i]] for i in seq)
        busy = sum(s.dur(tg, i) for i in seq)
        per_gpu.append(GpuTotals(len(seq), changes, busy, dyn, tuple(sorted(set(clocks)))))
        transitions += changes
        dyn_total += dyn
    idle_j = tg.idle_total_w * tg.ms(makespan) / 1e3
    transition_j = transitions * tg.transition_j
    energy = idle_j + dyn_total + transition_j
    return Totals(
        makespan,
        tg.ms(makespan),
        energy,
        idle_j,
        dyn_total,
        transitions,
        transition_j,
        tg.objective_value(makespan, energy),
        tuple(per_gpu),
    )


def earliest_starts(
    tg: TaskGraph, gpu: list[int], option: list[int], seqs: list[list[int]]
) -> list[int]:
    """Earliest start of every task for a placement, options and per-GPU order.

    A task starts once its inputs have arrived (producer end + transfer) and the
    previous task of its GPU has ended, plus the transition latency if the two
    clocks differ. ``seqs`` must be consistent with the graph (no cycle).
    """
    n = tg.n_tasks
    prev = [-1] * n
    nxt = [-1] * n
    for seq in seqs:
        for a, b in itertools.pairwise(seq):
            prev[b] = a
            nxt[a] = b
    indeg = [len(tg.preds[i]) + (prev[i] >= 0) for i in range(n)]
    ready = deque(i for i in range(n) if indeg[i] == 0)
    start = [0] * n
    end = [0] * n
    done = 0
    while ready:
        i = ready.popleft()
        g = gpu[i]
        o = tg.opts(i, g)
        t = 0
        for p, nbytes in tg.preds[i]:
            t = max(t, end[p] + tg.transfer(nbytes, gpu[p], g))
        q = prev[i]
        if q >= 0:
            lag = tg.transition if _clock(tg, q, gpu, option) != o.clock_mhz[option[i]] else 0
            t = max(t, end[q] + lag)
        start[i] = t
        end[i] = t + o.dur[option[i]]
        done += 1
        for j, _ in tg.succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
        j = nxt[i]
        if j >= 0:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if done != n:
        raise ValueError("the GPU orders contradict the task graph (a cycle)")
    return start


def _clock(tg: TaskGraph, task: int, gpu: list[int], option: list[int]) -> int:
    return tg.opts(task, gpu[task]).clock_mhz[option[task]]
