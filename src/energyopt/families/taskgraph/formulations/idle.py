"""GPU time without tasks that every schedule has, from the graph's shape alone.

A task is *alone* when every other task is its ancestor or its descendant: while it
runs, no other task can run, so every other GPU waits. (Tasks that can overlap
others are not counted: the waits beside two tasks that run together are the same
GPU time, so their shares cannot be added.)

Between alone tasks the other GPUs wait too. Alone tasks are totally ordered (each is
an ancestor or a descendant of every other). For consecutive alone tasks a, b and a
GPU h that runs neither, what h does in (e_a, s_b) is either nothing, so it waits
s_b - e_a >= the longest chain of fastest durations strictly between a and b, or some
tasks, the first of which is a descendant of a on another GPU than a (so it starts
after a transfer from a, or after a successor of a ran elsewhere) and the last an
ancestor of b (likewise), so h waits at least ``after(a) + before(b)`` there. Summed
over the G GPUs this is at least G - 1 times the smaller of the two (the GPUs of a
and b, when they differ, share one such amount; see ``forced_idle``). Before the
first alone task and after the last the same holds with the head (longest chain
before it) and the tail (after it) in place of the chain between.

All durations are the fastest option over every GPU type and transfers the fastest
route between two different GPUs, so the amounts are lower bounds for every schedule
at every clock. Clock-change stalls are not counted here (they are GPU time without
tasks too, so the waits found are a lower bound on waits plus stalls).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from energyopt.families.taskgraph.formulations.model import TaskGraph

MAX_TASKS = 5000
"""Graphs above this many tasks get no forced idle (ancestor sets cost O(n^2) bits)."""


@dataclass(frozen=True)
class ForcedIdle:
    """GPU time (grid units, summed over GPUs) that no task can use.

    ``mult[i]``: G for a task that runs alone (every other GPU waits while it runs),
    1 for the others, so the GPU time taken by i with duration d is at least
    ``mult[i] * d`` and these shares do not overlap; ``gaps``: GPU
    time without tasks outside the runs of alone tasks (before, between and after
    them). In every schedule of makespan M on G GPUs,
    sum_i mult[i] d_i + gaps <= G M."""

    mult: tuple[int, ...]
    gaps: int

    @property
    def any(self) -> bool:
        """True if it says more than "tasks take their own duration"."""
        return self.gaps > 0 or any(m > 1 for m in self.mult)


def fastest_durations(tg: TaskGraph) -> list[int]:
    """Per task, the least duration of any option on any GPU type (grid units)."""
    return [
        min(d for t in range(len(tg.types)) for d in tg.options[t][i].dur)
        for i in range(tg.n_tasks)
    ]


def forced_idle(tg: TaskGraph) -> ForcedIdle:
    """The forced GPU time of ``tg`` without tasks (see the module's docstring); none
    on one GPU or above ``MAX_TASKS`` tasks."""
    n, gpus = tg.n_tasks, tg.n_gpus
    if gpus <= 1 or n == 0 or n > MAX_TASKS:
        return ForcedIdle((1,) * n, 0)
    anc = [0] * n
    for i in tg.topo_order:
        for p, _ in tg.preds[i]:
            anc[i] |= anc[p] | (1 << p)
    desc = [0] * n
    for i in reversed(tg.topo_order):
        for s, _ in tg.succs[i]:
            desc[i] |= desc[s] | (1 << s)
    width = [n - 1 - anc[i].bit_count() - desc[i].bit_count() for i in range(n)]
    mult = tuple(gpus if w == 0 else 1 for w in width)
    alone = [i for i in tg.topo_order if width[i] == 0]
    if not alone:
        return ForcedIdle(mult, 0)
    fd = fastest_durations(tg)
    head = [0] * n
    for i in tg.topo_order:
        head[i] = max((head[p] + fd[p] for p, _ in tg.preds[i]), default=0)
    tail = [0] * n
    for i in reversed(tg.topo_order):
        tail[i] = max((tail[s] + fd[s] for s, _ in tg.succs[i]), default=0)

    def least_transfer(nbytes: float) -> int:
        return min(tg.transfer(nbytes, a, b) for a in range(gpus) for b in range(gpus) if a != b)

    def after(i: int) -> int:
        """Least wait, on a GPU other than i's, from i's end to its next task."""
        if not tg.succs[i]:
            return 0
        return min(
            min(least_transfer(b) for _, b in tg.succs[i]),
            min(fd[s] for s, _ in tg.succs[i]),
            tail[i],
        )

    def before(i: int) -> int:
        """Least wait, on a GPU other than i's, from its last task to i's start."""
        if not tg.preds[i]:
            return 0
        return min(
            min(least_transfer(b) for _, b in tg.preds[i]),
            min(fd[p] for p, _ in tg.preds[i]),
            head[i],
        )

    per_gpu = min(before(alone[0]), head[alone[0]]) + min(after(alone[-1]), tail[alone[-1]])
    for a, b in itertools.pairwise(alone):
        per_gpu += min(after(a) + before(b), _chain_between(tg, a, b, desc[a] & anc[b], fd))
    return ForcedIdle(mult, (gpus - 1) * per_gpu)


def _chain_between(tg: TaskGraph, a: int, b: int, inside: int, fd: list[int]) -> int:
    """Longest chain of fastest durations of the tasks strictly between a and b (the
    bit set ``inside``); 0 when none lies between them."""
    if not inside:
        return 0
    finish: dict[int, int] = {}
    for v in tg.topo_order:
        if inside >> v & 1:
            finish[v] = fd[v] + max((finish.get(p, 0) for p, _ in tg.preds[v]), default=0)
    return max((finish.get(p, 0) for p, _ in tg.preds[b]), default=0)
