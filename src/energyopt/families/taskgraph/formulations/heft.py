"""HEFT (Topcuoglu et al., 2002) at the maximum clock: the fastest-schedule reference.

Tasks are ranked by upward rank (mean duration over the GPUs that can run
them plus the longest mean transfer-and-rank path to an exit task) and placed,
highest rank first, on the GPU where they finish earliest, using idle gaps
(insertion). Every task runs at its fastest option, so no clock ever changes.
"""

from __future__ import annotations

import bisect
import itertools

from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule


def upward_ranks(tg: TaskGraph) -> list[float]:
    """HEFT upward rank of every task (grid units)."""
    g_count = tg.n_gpus
    pairs = [(a, b) for a, b in itertools.permutations(range(g_count), 2)]
    mean_lat = sum(tg.route_latency_ms[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    mean_inv_bw = sum(1.0 / tg.route_gbps[a][b] for a, b in pairs) / len(pairs) if pairs else 0.0
    share_remote = (g_count - 1) / g_count  # a random pair of GPUs differs this often
    mean_dur: list[float] = []
    for i in range(tg.n_tasks):
        durs = [
            tg.opts(i, g).dur[tg.max_clock_option(i, g)] for g in range(g_count) if tg.can_run(i, g)
        ]
        mean_dur.append(sum(durs) / len(durs))
    rank = [0.0] * tg.n_tasks
    for i in reversed(tg.topo_order):
        best = 0.0
        for j, nbytes in tg.succs[i]:
            comm = 0.0
            if nbytes > 0 and pairs:
                comm = share_remote * (mean_lat + nbytes / 1e9 * 1e3 * mean_inv_bw) / tg.unit_ms
            best = max(best, comm + rank[j])
        rank[i] = mean_dur[i] + best
    return rank


def heft_max_clock(tg: TaskGraph, rank: list[float] | None = None) -> Schedule:
    """HEFT with insertion, every task at its fastest option."""
    options = [
        [tg.max_clock_option(i, g) if tg.can_run(i, g) else -1 for g in range(tg.n_gpus)]
        for i in range(tg.n_tasks)
    ]
    return heft(tg, options, rank)


def heft_gpu_clocks(tg: TaskGraph, clock_mhz: list[int], energy_weight: float) -> Schedule:
    """HEFT with every GPU at one clock (``clock_mhz[g]``, MHz; a task without that
    clock on g runs at its nearest clock above it, else its fastest), placing each task
    where finish + ``energy_weight`` x above-idle energy (grid units per J) is least.

    No GPU ever changes its clock when every task has the GPU's clock, so no
    transition time or energy is paid; with slow GPUs beside fast ones, tasks whose
    time barely follows the clock (memory-bound) go where they cost less energy.
    """
    options: list[list[int]] = []
    for i in range(tg.n_tasks):
        row: list[int] = []
        for g in range(tg.n_gpus):
            if not tg.can_run(i, g):
                row.append(-1)
                continue
            clocks = tg.opts(i, g).clock_mhz
            above = [k for k, c in enumerate(clocks) if c >= clock_mhz[g]]
            row.append(min(above, key=lambda k: clocks[k]) if above else tg.max_clock_option(i, g))
        options.append(row)
    return heft(tg, options, energy_weight=energy_weight)


def heft(
    tg: TaskGraph,
    options: list[list[int]],
    rank: list[float] | None = None,
    energy_weight: float = 0.0,
) -> Schedule:
    """HEFT placement with insertion, task ``i`` on GPU ``g`` at option ``options[i][g]``.

    ``options[i][g]`` is -1 where ``i`` cannot run on ``g``. Each task goes to the
    GPU of least finish + ``energy_weight`` x its above-idle energy there (grid
    units per J; 0: earliest finish); ties go to the lower dynamic energy, then the
    lower GPU index. ``rank`` replaces the upward ranks (it must decrease along
    every edge).
    """
    rank = upward_ranks(tg) if rank is None else rank
    pos = {t: k for k, t in enumerate(tg.topo_order)}
    order = sorted(range(tg.n_tasks), key=lambda i: (-rank[i], pos[i]))
    starts: list[list[int]] = [[] for _ in range(tg.n_gpus)]  # busy intervals, by start
    ends: list[list[int]] = [[] for _ in range(tg.n_gpus)]
    gpu = [-1] * tg.n_tasks
    start = [0] * tg.n_tasks
    end = [0] * tg.n_tasks
    for i in order:
        best: tuple[float, int, float, int, int] | None = None
        for g in range(tg.n_gpus):
            k = options[i][g]
            if k < 0:
                continue
            o = tg.opts(i, g)
            ready = 0
            for p, nbytes in tg.preds[i]:
                ready = max(ready, end[p] + tg.transfer(nbytes, gpu[p], g))
            t = earliest_gap(starts[g], ends[g], ready, o.dur[k])
            key = (t + o.dur[k] + energy_weight * o.dyn_j[k], t + o.dur[k], o.dyn_j[k], g, t)
            if best is None or key < best:
                best = key
        assert best is not None  # every task can run somewhere (checked on load)
        _, finish, _, g, t = best
        gpu[i], start[i], end[i] = g, t, finish
        at = bisect.bisect_left(starts[g], t)
        starts[g].insert(at, t)
        ends[g].insert(at, finish)
    return Schedule(tuple(gpu), tuple(options[i][gpu[i]] for i in range(tg.n_tasks)), tuple(start))


MAX_GAPS = 32
"""Idle gaps tried per task and GPU before appending after the last busy interval."""


def earliest_gap(starts: list[int], ends: list[int], ready: int, dur: int) -> int:
    """Earliest t >= ready with [t, t + dur) free between the sorted busy intervals
    (among the first ``MAX_GAPS`` gaps after ``ready``; else after the last interval)."""
    k = bisect.bisect_right(ends, ready)  # first interval ending after ready
    t = ready
    stop = min(len(starts), k + MAX_GAPS)
    while k < stop:
        if t + dur <= starts[k]:
            return t
        t = max(t, ends[k])
        k += 1
    return t if k == len(starts) else max(ready, ends[-1])
