"""Clock classes: every GPU held at one clock, each task pinned to the class of GPUs
whose clock an LP picks for it, then list-scheduled inside its class.

On a saturated graph (the GPUs busy almost all the time at the maximum clock) the
energy comes from running memory-bound tasks, whose time hardly follows the clock,
on slow GPUs, and the rest on fast ones. HEFT with an energy weight
(``heft_gpu_clocks``) decides that task by task from finish times and packs the
two kinds of GPU loosely. Here the split is planned for the whole graph first:

1. The GPUs of one (type, clock) form a class c of n_c GPUs.
2. An LP chooses for every task i a class (x_ic in [0, 1], sum_c x_ic = 1) of least
   above-idle energy sum dyn_ic x_ic under the classes' capacities. The tasks are cut
   into ``windows`` groups by their start in a reference schedule (HEFT at the
   maximum clock), window w gets a length L_w >= 0 with sum_w L_w <= capacity, and
   in every window each class's work fits in its GPUs: sum_(i in w) d_ic x_ic <=
   n_c L_w. With one window this is the busy-time bound of the classes; with more,
   both kinds of GPU keep pace with each other through the graph, so neither waits
   for the other at the end; under a deadline a class may carry a little work
   (``BACKLOG_SHARE``) from one window into the next. Every task takes its largest
   x_ic.
3. HEFT with insertion places every task on the GPU of its class where it finishes
   first (``heft.heft`` with the other GPUs forbidden); under a deadline the last
   ``FREE_TAIL`` of the tasks (least upward rank) may go to any GPU.

4. Forward-backward passes (``justify``) repair the schedules: the tasks, latest end
   first, are placed as late as they can go (insertion, any GPU HEFT allowed them),
   then, earliest of those starts first, as early as they can (HEFT again): the
   classes' packing tightens without changing any task's class. Under a deadline every
   schedule gets ``DEADLINE_PASSES`` before it is compared with the deadline; without
   one, the best schedules get the last ``REPAIR_SHARE`` of the time.

No GPU ever changes clock. The caller keeps a schedule only if it meets the deadline
and beats what it has, and re-clocks it with the slack-reclaiming steps.
"""

from __future__ import annotations

import bisect
import time

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, hstack, vstack

from energyopt.families.taskgraph.formulations.heft import earliest_gap, heft, upward_ranks
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule, Totals, totals

DEADLINE_SHARES = (0.985, 1.0)
"""Under a deadline, the capacity (a multiple of the deadline) of each clock setting is
searched in this range for the largest whose schedule meets the deadline: a smaller
capacity moves work to the fast GPUs, which leaves HEFT room to pack."""
SHARE_STEPS = 6
"""Schedules per clock setting under a deadline (see ``class_search``)."""
RANK_SHARE = 0.992
"""Under a deadline, settings are ranked by their one-window LP at this multiple of it
(HEFT packs the classes to about 99.2-99.5 % of their GPU time): a setting without an
LP solution there would need its GPUs filled more tightly than that, and is dropped."""
BACKLOG_SHARE = 0.002
"""Under a deadline, the work each class may carry from one window into the next, per
GPU, as a share of the deadline (``class_lp``'s ``backlog``)."""
FREE_TAIL = 0.03
"""Under a deadline, the share of tasks of least upward rank that may run on any GPU
(``class_schedule``'s ``free_tail``): they even out where the classes end."""
RANK_TIME_SHARE = 0.5
"""At most this share of the search's time (under a deadline) or of the time before
the repair (without one) ranks the settings by their LPs; the settings not reached are
left out, so where time is short (a loaded machine) some are still scheduled."""
DEADLINE_PASSES = 2
"""Under a deadline, forward-backward passes (``justify``) on every class schedule
before its makespan is compared with the deadline."""
DEADLINE_WINDOWS = (100, 20)
"""Windows of the LP under a deadline; the second where the first has no solution."""
FREE_CAPACITY = 1.1
"""Without a deadline (energy, EDP, ED^2P), the most capacity (a multiple of the
reference makespan) a clock setting's one-window LP may plan (``free_prediction``)."""
FREE_STEP = 0.0025
"""Without a deadline, the step (multiple of the reference makespan) of the
capacities a setting's schedules are tried at: from one step above the capacity of
its prediction up to the first with a schedule (``FREE_WINDOWS``: the windows' LP
needs a little more than the one-window LP), at most ``FREE_TRIES`` capacities."""
FREE_TRIES = 8
"""Without a deadline, capacities per clock setting at most (see ``FREE_STEP``)."""
FREE_MORE = 2
"""Without a deadline, schedules per clock setting after its first, each one
``FREE_STEP`` up (how tightly HEFT packs varies from one capacity to the next)."""
FREE_WINDOWS = 100
"""Windows of the LP without a deadline; one window where these give no schedule
within ``FREE_TRIES`` capacities (the one-window LP has a solution from the
prediction's capacity on)."""
REPAIR_SHARE = 0.25
"""Without a deadline, the share of the search's time (predictions included) kept for
``justify`` on its best schedules (best first, each until its passes stall); no
schedule starts that would, at the last one's pace, run into it."""
REPAIR_STALL = 2
"""``justify`` stops after this many passes in a row that do not lower the objective."""


def _part_way(begin: float, end: float, share: float) -> float:
    """The time (s) ``share`` of the way from ``begin`` to ``end`` (s); ``end`` where
    it is infinite or not after ``begin``."""
    return begin + share * (end - begin) if begin < end < float("inf") else end


def class_option(tg: TaskGraph, task: int, gpu: int, clock_mhz: int) -> int:
    """Option of ``task`` on ``gpu`` held at ``clock_mhz``: that clock, else the nearest
    clock above it, else the fastest option (as ``heft_gpu_clocks``); -1 if it cannot
    run there."""
    if not tg.can_run(task, gpu):
        return -1
    clocks = tg.opts(task, gpu).clock_mhz
    above = [k for k, c in enumerate(clocks) if c >= clock_mhz]
    return min(above, key=lambda k: clocks[k]) if above else tg.max_clock_option(task, gpu)


def gpu_classes(tg: TaskGraph, clock_mhz: list[int]) -> list[int]:
    """Per GPU, the index of its class: its distinct (type, clock) of ``clock_mhz``
    (MHz), numbered in order of each class's first GPU."""
    keys: dict[tuple[int, int], int] = {}
    return [keys.setdefault((tg.gpu_type[g], clock_mhz[g]), len(keys)) for g in range(tg.n_gpus)]


def class_lp(
    tg: TaskGraph,
    clock_mhz: list[int],
    reference: Schedule,
    capacity: int,
    windows: int,
    backlog: int = 0,
) -> tuple[list[int], float] | None:
    """For every task, the index of its class (a distinct (type, clock) of
    ``clock_mhz``, in first-GPU order) from the LP of the module docstring, with
    ``capacity`` grid units in all over the windows, and the LP's above-idle energy
    (J); None if the LP has no solution. ``backlog`` (grid units): each class may
    carry work of up to n_c x ``backlog`` from one window into the next (b_cw >= 0,
    b_cw >= b_c,w-1 + work_cw - n_c L_w, none after the last window); 0 holds every
    window to its own length."""
    got = _class_lp(tg, clock_mhz, reference, capacity, windows, backlog, 0.0)
    return None if got is None else (got[0], got[1])


def _class_lp(
    tg: TaskGraph,
    clock_mhz: list[int],
    reference: Schedule,
    capacity: int,
    windows: int,
    backlog: int,
    length_cost: float,
) -> tuple[list[int], float, float] | None:
    """``class_lp`` with ``length_cost`` (J per grid unit) charged on the windows'
    lengths: the picks, the above-idle energy (J) and the windows' total length (grid
    units, at most ``capacity``)."""
    n = tg.n_tasks
    cls = gpu_classes(tg, clock_mhz)
    nc = max(cls) + 1
    members = [cls.index(c) for c in range(nc)]  # each class's first GPU
    count = np.bincount(cls, minlength=nc).astype(float)
    rows_i: list[int] = []
    rows_c: list[int] = []
    dur: list[float] = []
    dyn: list[float] = []
    for i in range(n):
        for c, g in enumerate(members):
            k = class_option(tg, i, g, clock_mhz[g])
            if k < 0:
                continue
            o = tg.opts(i, g)
            rows_i.append(i)
            rows_c.append(c)
            dur.append(float(o.dur[k]))
            dyn.append(float(o.dyn_j[k]))
    nv = len(rows_i)
    var_i = np.array(rows_i)
    var_c = np.array(rows_c)
    start = np.asarray(reference.start, dtype=float)
    span = max(float(reference.makespan(tg)), 1.0)
    win = np.minimum((start / span * windows).astype(int), windows - 1)
    # rows: (window, class) work + b_c,w-1 - b_cw <= n_c L_w, then sum_w L_w <= capacity;
    # variables x, L, b
    cells = np.arange(windows * nc)
    work = coo_matrix(
        (np.array(dur), (win[var_i] * nc + var_c, np.arange(nv))), shape=(windows * nc, nv)
    )
    lengths = coo_matrix(
        (-np.tile(count, windows), (cells, cells // nc)), shape=(windows * nc, windows)
    )
    later = cells[cells >= nc]
    carry = coo_matrix(
        (
            np.concatenate([-np.ones(len(cells)), np.ones(len(later))]),
            (np.concatenate([cells, later]), np.concatenate([cells, later - nc])),
        ),
        shape=(windows * nc, windows * nc),
    )
    total = hstack(
        [coo_matrix((1, nv)), coo_matrix(np.ones((1, windows))), coo_matrix((1, windows * nc))]
    )
    a_ub = vstack([hstack([work, lengths, carry]), total]).tocsr()
    b_ub = np.concatenate([np.zeros(windows * nc), [float(capacity)]])
    a_eq = hstack(
        [
            coo_matrix((np.ones(nv), (var_i, np.arange(nv))), shape=(n, nv)),
            coo_matrix((n, windows + windows * nc)),
        ]
    ).tocsr()
    cost = np.concatenate([np.array(dyn), np.full(windows, length_cost), np.zeros(windows * nc)])
    carried = np.tile(count, windows) * float(backlog)
    carried[(windows - 1) * nc :] = 0.0
    bounds = np.concatenate(
        [
            np.array([(0.0, 1.0)] * nv + [(0.0, np.inf)] * windows),
            np.column_stack([np.zeros(windows * nc), carried]),
        ]
    )
    res = linprog(
        cost, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=np.ones(n), bounds=bounds, method="highs"
    )
    if res.x is None:
        return None
    x = res.x[:nv]
    pick = [-1] * n
    best = [-1.0] * n
    for v in range(nv):
        i = rows_i[v]
        if x[v] > best[i]:
            best[i], pick[i] = float(x[v]), rows_c[v]
    length = float(np.sum(res.x[nv : nv + windows]))
    return pick, float(res.fun) - length_cost * length, length


def class_schedule(
    tg: TaskGraph,
    clock_mhz: list[int],
    reference: Schedule,
    capacity: int,
    windows: int,
    backlog: int = 0,
    free_tail: float = 0.0,
) -> Schedule | None:
    """HEFT with every GPU g at ``clock_mhz[g]`` (MHz) and every task restricted to the
    GPUs of the class ``class_lp`` gives it (with ``backlog``), except the share
    ``free_tail`` of the tasks of least upward rank (the last HEFT places), which may
    run on any GPU; None where the LP has no solution."""
    options = class_options(tg, clock_mhz, reference, capacity, windows, backlog, free_tail)
    return None if options is None else heft(tg, options)


def class_options(
    tg: TaskGraph,
    clock_mhz: list[int],
    reference: Schedule,
    capacity: int,
    windows: int,
    backlog: int = 0,
    free_tail: float = 0.0,
) -> list[list[int]] | None:
    """The options ``class_schedule`` gives HEFT: ``options[i][g]`` is task i's option
    on GPU g at ``clock_mhz[g]`` (MHz) where g is in i's class or i is in the free
    tail, else -1; None where the LP has no solution."""
    lp = class_lp(tg, clock_mhz, reference, capacity, windows, backlog)
    if lp is None:
        return None
    pick = lp[0]
    cls = gpu_classes(tg, clock_mhz)
    rank = upward_ranks(tg)
    free = set(sorted(range(tg.n_tasks), key=lambda i: rank[i])[: int(free_tail * tg.n_tasks)])
    return [
        [
            class_option(tg, i, g, clock_mhz[g]) if cls[g] == pick[i] or i in free else -1
            for g in range(tg.n_gpus)
        ]
        for i in range(tg.n_tasks)
    ]


def latest_ends(tg: TaskGraph, schedule: Schedule, options: list[list[int]]) -> list[int]:
    """A backward list schedule: the tasks, latest end in ``schedule`` first, each placed
    as late as it can go (insertion into the idle gaps) on the GPU among those
    ``options`` allows (``options[i][g]``: task i's option on g, -1 where not allowed)
    where it starts latest, counting time back from the end. Per task, its start
    counted back from the end (grid units): larger is earlier; it exceeds every
    successor's by at least the task's duration plus the transfer."""
    end = [schedule.end(tg, i) for i in range(tg.n_tasks)]
    order = sorted(range(tg.n_tasks), key=lambda i: (-end[i], -schedule.start[i], i))
    starts: list[list[int]] = [[] for _ in range(tg.n_gpus)]  # busy, counted back
    ends: list[list[int]] = [[] for _ in range(tg.n_gpus)]
    gpu = [-1] * tg.n_tasks
    back = [0] * tg.n_tasks  # start counted back from the end
    for i in order:
        best: tuple[int, int, int] | None = None
        for g in range(tg.n_gpus):
            k = options[i][g]
            if k < 0:
                continue
            d = tg.opts(i, g).dur[k]
            ready = 0
            for j, nbytes in tg.succs[i]:
                ready = max(ready, back[j] + tg.transfer(nbytes, g, gpu[j]))
            t = earliest_gap(starts[g], ends[g], ready, d)
            if best is None or (t + d, g, t) < best:
                best = (t + d, g, t)
        assert best is not None  # the schedule ran i on an allowed GPU
        back[i], g, t = best
        gpu[i] = g
        at = bisect.bisect_left(starts[g], t)
        starts[g].insert(at, t)
        ends[g].insert(at, back[i])
    return back


def justify(
    tg: TaskGraph,
    schedule: Schedule,
    options: list[list[int]],
    stop_at: float,
    passes: int | None = None,
) -> tuple[Schedule, float]:
    """Forward-backward improvement of a list schedule made by ``heft(tg, options)``:
    a backward pass (``latest_ends``) then HEFT with the tasks in the order of those
    latest starts (earliest first), over and over, until ``REPAIR_STALL`` passes in a
    row do not improve, ``passes`` passes (None: no limit) or ``time.perf_counter()``
    passes ``stop_at`` (s). Every pass is a valid schedule on the GPUs ``options``
    allows (so every task keeps its class and, with one clock per GPU, no GPU changes
    clock). The best schedule among ``schedule`` and the passes, least time past the
    deadline first (none without one), then least objective, and its objective (the
    objective's unit): never worse than ``schedule`` by that order, so within the
    deadline where ``schedule`` is."""

    def key(tot: Totals) -> tuple[int, float]:
        late = 0 if tg.deadline is None else max(0, tot.makespan - tg.deadline)
        return late, tot.objective

    first = totals(tg, schedule)
    best, best_key = schedule, key(first)
    current = schedule
    stalled = done = 0
    while (
        stalled < REPAIR_STALL
        and (passes is None or done < passes)
        and time.perf_counter() < stop_at
    ):
        back = latest_ends(tg, current, options)
        current = heft(tg, options, [float(b) for b in back])
        done += 1
        got = key(totals(tg, current))
        if got < best_key:
            best, best_key = current, got
            stalled = 0
        else:
            stalled += 1
    return best, best_key[1]


def class_settings(
    tg: TaskGraph, clocks: list[tuple[int, ...]], seeds: list[list[int]]
) -> list[list[int]]:
    """Clock settings (a level per GPU, an index into ``clocks`` of its type as in
    ``heuristic.priced_clock_levels``) to try, from the priced suggestions ``seeds``:
    the GPUs a seed holds at its type's lowest level there, every other GPU at the
    type's top level (two classes), and the same with the first one or (with three
    or more fast GPUs) two of those fast GPUs of each type at each level between (three
    classes). Distinct, in seed order."""
    top = [len(c) - 1 for c in clocks]
    out: list[list[int]] = []
    for seed in seeds:
        low = {
            t: min(v for g, v in enumerate(seed) if tg.gpu_type[g] == t) for t in set(tg.gpu_type)
        }
        two = [v if v == low[tg.gpu_type[g]] else top[tg.gpu_type[g]] for g, v in enumerate(seed)]
        variants = [two]
        for t in sorted(low):
            fast = [g for g in range(tg.n_gpus) if tg.gpu_type[g] == t and two[g] == top[t]]
            if not fast:
                continue
            for middle in (fast[:1], fast[:2]) if len(fast) > 2 else (fast[:1],):
                for v in range(low[t] + 1, top[t]):
                    variants.append([v if h in middle else two[h] for h in range(tg.n_gpus)])
        for setting in variants:
            if setting not in out:
                out.append(setting)
    return out


def class_search(
    tg: TaskGraph,
    clocks: list[tuple[int, ...]],
    levels: list[list[int]],
    reference: Schedule,
    stop_at: float,
) -> tuple[Schedule, float] | None:
    """Best clock-class schedule over the clock settings (``levels``: a level per GPU,
    an index into ``clocks`` of its type, MHz) until ``time.perf_counter()`` passes
    ``stop_at`` (s); None if none meets the deadline.

    The settings are tried fewest classes first (two classes pack best), then most
    GPUs at a level between the lowest and the top first (a middle class of two GPUs
    packs tighter than one), each group in the order of their one-window LP's energy
    at a capacity of ``RANK_SHARE`` of the deadline (without one, the first of
    ``FREE_PLANS`` of the reference's makespan);
    settings whose LP has no solution there are dropped. Under a deadline, each
    setting's capacity starts at the deadline; while its schedule misses it, the
    capacity is scaled by deadline / makespan (less 0.1 %; halfway to the lower end
    of the range where that falls below it), and where the schedule meets it or the
    LP has no solution it moves halfway back up to the last capacity that missed,
    within ``DEADLINE_SHARES`` and for at most ``SHARE_STEPS`` schedules; each schedule
    gets ``DEADLINE_PASSES`` passes of ``justify`` first. The best
    schedule within the deadline is kept; settings whose LP energy plus the idle
    energy of the least makespan (fastest work over all GPUs) is no less than the
    best schedule's energy are skipped (a cut-off of the search, not a bound: the LP
    is at ``RANK_SHARE``).

    Without a deadline the settings are tried in the order of their predicted
    objective (``free_prediction``), each at capacities from one ``FREE_STEP``
    above that of its prediction, a step at a time, up to the first with a schedule
    (the tightest capacity packs best; at most ``FREE_TRIES``) and ``FREE_MORE``
    steps beyond it, until ``REPAIR_SHARE`` of the time is left; in that time the
    schedules, best first, are repaired by ``justify`` (each until its passes stall),
    and the best by the objective is kept."""
    if tg.deadline is None:
        return _free_search(tg, clocks, levels, reference, stop_at)
    target = tg.deadline
    settings = [[clocks[tg.gpu_type[g]][v] for g, v in enumerate(lv)] for lv in levels]
    ranked: list[tuple[int, int, float, int]] = []
    rank_at = int(RANK_SHARE * target)
    ranked_by = _part_way(time.perf_counter(), stop_at, RANK_TIME_SHARE)
    for k, setting in enumerate(settings):
        if time.perf_counter() >= ranked_by:
            break
        lp = class_lp(tg, setting, reference, rank_at, 1)
        if lp is not None:
            top = [len(c) - 1 for c in clocks]
            middle = sum(0 < v < top[tg.gpu_type[g]] for g, v in enumerate(levels[k]))
            ranked.append((len(set(setting)), -middle, lp[1], k))
    fastest = sum(
        min(min(o.dur) for o in (tg.options[t][i] for t in set(tg.gpu_type)) if o.dur)
        for i in range(tg.n_tasks)
    )
    idle_j = tg.idle_total_w * tg.ms(fastest / tg.n_gpus) / 1e3
    best: tuple[Schedule, float] | None = None

    backlog = int(BACKLOG_SHARE * target)
    tail = FREE_TAIL

    def consider(setting: list[int], capacity: int, windows: tuple[int, ...]) -> int | None:
        """The schedule's makespan (grid units; kept if it is the best within the
        deadline), or None where the LP has no solution."""
        nonlocal best
        for w in windows:
            options = class_options(tg, setting, reference, capacity, w, backlog, tail)
            if options is None:
                continue
            s, _ = justify(tg, heft(tg, options), options, stop_at, DEADLINE_PASSES)
            tot = totals(tg, s)
            met = tg.deadline is None or tot.makespan <= tg.deadline
            if met and (best is None or tot.objective < best[1]):
                best = (s, tot.objective)
            return tot.makespan
        return None

    for _, _, dyn_j, k in sorted(ranked):
        if best is not None and dyn_j + idle_j >= best[1]:
            continue
        # secant steps on the capacity: scale it by deadline / makespan (a little
        # less) while the schedule misses the deadline, halfway back up once it meets
        # it or the LP has no solution
        lo, hi = DEADLINE_SHARES
        share = hi
        for _ in range(SHARE_STEPS):
            if time.perf_counter() >= stop_at:
                return best
            span = consider(settings[k], int(share * target), DEADLINE_WINDOWS)
            if span is None or span <= target:
                # no LP solution (too little capacity) or a schedule within the
                # deadline: halfway back up
                if share >= hi:
                    break
                lo, share = share, (share + hi) / 2
            else:
                hi = share
                scaled = share * target / span * (1 - 1e-3)
                share = scaled if scaled > lo else (lo + hi) / 2
    return best


def free_prediction(
    tg: TaskGraph, setting: list[int], reference: Schedule
) -> tuple[float, float] | None:
    """Predicted objective (the objective's unit) of the clock setting ``setting``
    (MHz per GPU) and its capacity (a multiple of the reference's makespan), from
    one one-window LP whose length L (at most ``FREE_CAPACITY`` of the reference's
    makespan) is free at a price per unit of time: the idle power of all GPUs, plus,
    for an objective E x M^p, p E / M of the reference (the objective's slope in M
    against E, taken at the reference: first order). The prediction is the LP's
    above-idle energy plus the idle energy over L, at a makespan of L; None if the
    LP has no solution. A ranking of settings, not a bound (schedules pack longer)."""
    span = reference.makespan(tg)
    power = {"edp": 1, "ed2p": 2}.get(tg.objective, 0)
    ref = totals(tg, reference)
    per_ms = tg.idle_total_w / 1e3 + power * ref.energy_j / tg.ms(ref.makespan)
    got = _class_lp(tg, setting, reference, int(FREE_CAPACITY * span), 1, 0, per_ms * tg.ms(1))
    if got is None:
        return None
    energy_j = got[1] + tg.idle_total_w * tg.ms(got[2]) / 1e3
    return tg.objective_value(round(got[2]), energy_j), got[2] / span


def _free_search(
    tg: TaskGraph,
    clocks: list[tuple[int, ...]],
    levels: list[list[int]],
    reference: Schedule,
    stop_at: float,
) -> tuple[Schedule, float] | None:
    """``class_search`` without a deadline (see its docstring)."""
    span = reference.makespan(tg)
    begin = time.perf_counter()
    repair_at = _part_way(begin, stop_at, 1.0 - REPAIR_SHARE)
    settings = [[clocks[tg.gpu_type[g]][v] for g, v in enumerate(lv)] for lv in levels]
    ranked: list[tuple[float, float, int]] = []
    ranked_by = _part_way(begin, repair_at, RANK_TIME_SHARE)
    for k, setting in enumerate(settings):
        if time.perf_counter() >= ranked_by:
            break
        got = free_prediction(tg, setting, reference)
        if got is not None:
            ranked.append((got[0], got[1], k))
    backlog = int(BACKLOG_SHARE * span)
    found_all: list[tuple[float, int, Schedule, list[list[int]]]] = []
    _free_schedules(tg, settings, ranked, reference, backlog, repair_at, found_all)
    best: tuple[Schedule, float] | None = None
    # the best first, each repaired until its passes stall, while the time lasts
    for objective, _, s, options in sorted(found_all, key=lambda f: (f[0], f[1])):
        if time.perf_counter() < stop_at:
            repaired = justify(tg, s, options, stop_at)
        else:
            repaired = (s, objective)
        if best is None or repaired[1] < best[1]:
            best = repaired
    return best


def _free_schedules(
    tg: TaskGraph,
    settings: list[list[int]],
    ranked: list[tuple[float, float, int]],
    reference: Schedule,
    backlog: int,
    stop_at: float,
    found_all: list[tuple[float, int, Schedule, list[list[int]]]],
) -> None:
    """The class schedules of ``_free_search`` (see ``class_search``), appended to
    ``found_all`` as (objective, order found, schedule, HEFT's options) while the
    last one's time, from ``time.perf_counter()``, would end by ``stop_at`` (s)."""
    span = reference.makespan(tg)
    took = 0.0  # s, the last schedule (or LP without a solution)
    for _, least, k in sorted(ranked):
        for windows in (FREE_WINDOWS, 1):
            share = least
            found = 0
            for _ in range(FREE_TRIES + FREE_MORE):
                now = time.perf_counter()
                if now + took >= stop_at:
                    return
                share += FREE_STEP
                options = class_options(
                    tg, settings[k], reference, int(share * span), windows, backlog, FREE_TAIL
                )
                if options is None:
                    took = time.perf_counter() - now
                    if found:
                        break
                    continue
                s = heft(tg, options)
                took = time.perf_counter() - now
                found_all.append((totals(tg, s).objective, len(found_all), s, options))
                found += 1
                if found > FREE_MORE:
                    break
            if found:
                break
