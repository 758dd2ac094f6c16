"""Slack- and throughput-aware list scheduling with per-task clocks (DEFT-style).

1. Placement and order: HEFT with insertion, every task at its maximum clock.
2. Slack reclamation for a makespan target D: in the order of the graph plus
   the GPU orders, each task takes the option of least above-idle energy
   (transition energy to its GPU neighbours included) that still lets every
   later task meet its latest finish for D; a first sweep lets each task use
   half of its slack, a second all of it, so slack spreads along chains.
3. Merging: a run of tasks between two clock changes moves to a neighbour's
   clock when the transitions it removes save more energy than the run's new
   clock costs (faster clocks are always safe; slower ones are re-timed).
4. The target D: HEFT's makespan for ``makespan``; four targets from HEFT's
   makespan to the deadline for ``energy_within``; for energy, EDP and ED^2P a
   sweep of D over multiples of HEFT's makespan. The best schedule is kept.
   Every step only lowers the energy above idle and keeps the makespan <= D,
   and D = HEFT's makespan is always tried, so the result is never worse than
   HEFT at the maximum clock in any of the five objectives.

5. Per-GPU clocks (all objectives but makespan): HEFT with each GPU held at one
   clock and an energy weight in its placement (``heft_gpu_clocks``), the clocks
   lowered GPU by GPU while the objective falls (``gpu_clock_descent``); the best
   such schedule is re-clocked by steps 2-4 and kept if it beats the rest.
6. Clock classes (graphs above ``CLASS_TASKS`` tasks, before step 5): GPUs held at
   one clock per class, an LP picks every task's class under the classes' GPU time,
   HEFT places each task within its class (``clock_classes.class_search``).

The bound reported is ``families.taskgraph.formulations.bounds`` (critical path
and work bounds with least energies, the Lagrangian busy-time bound, and for EDP
and ED^2P the makespan-interval bound given the schedule found): valid, but far
from tight where precedence, transfers and the GPUs' one-at-a-time order set the
makespan.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping

import numpy as np

from energyopt.families.taskgraph.formulations.bounds import lower_bounds
from energyopt.families.taskgraph.formulations.heft import (
    heft_gpu_clocks,
    heft_max_clock,
    upward_ranks,
)
from energyopt.families.taskgraph.formulations.model import TaskGraph, TaskOptions
from energyopt.families.taskgraph.formulations.schedule import Schedule, earliest_starts, totals
from energyopt.families.taskgraph.solvers.clock_classes import class_search, class_settings
from energyopt.solvers.result import (
    FEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Result,
    Termination,
    relative_gap,
)

SWEEP = (1.0, 1.03, 1.07, 1.15, 1.3, 1.5, 1.8, 2.2, 3.0)
SWEEP_LARGE = (1.0, 1.1, 1.3, 1.8)
LARGE_GRAPH = 2000  # tasks; above it the sweep is shorter and slower merges are not re-timed
ALPHAS = (0.5, 1.0)


class _State:
    """Placement, GPU orders and per-task options under change."""

    def __init__(self, tg: TaskGraph, base: Schedule) -> None:
        self.tg = tg
        n = tg.n_tasks
        self.gpu = list(base.gpu)
        self.option = list(base.option)
        self.seqs = base.sequences(tg)
        self.prev = [-1] * n
        self.next = [-1] * n
        for seq in self.seqs:
            for a, b in itertools.pairwise(seq):
                self.prev[b] = a
                self.next[a] = b
        self.opts = [tg.opts(i, self.gpu[i]) for i in range(n)]
        self.lag_in = [
            [(p, tg.transfer(nbytes, self.gpu[p], self.gpu[i])) for p, nbytes in tg.preds[i]]
            for i in range(n)
        ]
        self.lag_out = [
            [(j, tg.transfer(nbytes, self.gpu[i], self.gpu[j])) for j, nbytes in tg.succs[i]]
            for i in range(n)
        ]
        self.order = self._combined_order()

    def _combined_order(self) -> list[int]:
        n = self.tg.n_tasks
        indeg = [len(self.lag_in[i]) + (self.prev[i] >= 0) for i in range(n)]
        queue = deque(i for i in range(n) if indeg[i] == 0)
        order: list[int] = []
        while queue:
            i = queue.popleft()
            order.append(i)
            for j, _ in self.lag_out[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    queue.append(j)
            j = self.next[i]
            if j >= 0:
                indeg[j] -= 1
                if indeg[j] == 0:
                    queue.append(j)
        return order

    def dur(self, i: int) -> int:
        return self.opts[i].dur[self.option[i]]

    def clock(self, i: int) -> int:
        return self.opts[i].clock_mhz[self.option[i]]

    def latest_finish(self, deadline: int) -> list[int]:
        """Latest finish of every task for makespan <= ``deadline`` (current options)."""
        tau = self.tg.transition
        lf = [deadline] * self.tg.n_tasks
        for i in reversed(self.order):
            best = deadline
            for j, lag in self.lag_out[i]:
                best = min(best, lf[j] - self.dur(j) - lag)
            j = self.next[i]
            if j >= 0:
                change = tau if self.clock(i) != self.clock(j) else 0
                best = min(best, lf[j] - self.dur(j) - change)
            lf[i] = best
        return lf

    def earliest_finish(self) -> list[int]:
        """Earliest finish of every task with the current options (grid units)."""
        tau = self.tg.transition
        ef = [0] * self.tg.n_tasks
        for i in self.order:
            t = 0
            for p, lag in self.lag_in[i]:
                t = max(t, ef[p] + lag)
            q = self.prev[i]
            if q >= 0:
                t = max(t, ef[q] + (tau if self.clock(q) != self.clock(i) else 0))
            ef[i] = t + self.dur(i)
        return ef

    def move_runs(self, deadline: int, tries: int) -> None:
        """Give whole runs of equal clock on one GPU a new common clock (no new
        clock change), cheapest first, where the makespan stays <= ``deadline``."""
        for seq in self.seqs:
            k = 0
            while k < len(seq):
                end = k
                while end + 1 < len(seq) and self.clock(seq[end + 1]) == self.clock(seq[k]):
                    end += 1
                self._move_run(seq[k : end + 1], deadline, tries)
                k = end + 1

    def _move_run(self, run: list[int], deadline: int, tries: int) -> None:
        clocks = set(self.opts[run[0]].clock_mhz)
        for i in run[1:]:
            clocks &= set(self.opts[i].clock_mhz)
        now = sum(self.opts[i].dyn_j[self.option[i]] for i in run)
        ranked: list[tuple[float, int]] = []
        for c in clocks:
            energy = sum(self.opts[i].dyn_j[self.opts[i].clock_mhz.index(c)] for i in run)
            if energy < now:
                ranked.append((energy, c))
        old = [self.option[i] for i in run]
        for _, c in sorted(ranked)[:tries]:
            for i in run:
                self.option[i] = self.opts[i].clock_mhz.index(c)
            if max(self.earliest_finish()) <= deadline:
                return
        for i, k in zip(run, old, strict=True):
            self.option[i] = k

    def sweep_back(self, deadline: int, alpha: float) -> None:
        """The mirror of ``sweep``: reverse order, latest starts of the tasks already
        seen, earliest finishes (current options) of the rest."""
        tg = self.tg
        tau, e_tr = tg.transition, tg.transition_j
        ef = self.earliest_finish()
        ls = [0] * tg.n_tasks  # latest start of tasks already processed
        for i in reversed(self.order):
            limit_dag = deadline
            for j, lag in self.lag_out[i]:
                limit_dag = min(limit_dag, ls[j] - lag)
            es_dag = 0
            for p, lag in self.lag_in[i]:
                es_dag = max(es_dag, ef[p] + lag)
            q, nx = self.prev[i], self.next[i]
            o = self.opts[i]
            clock_q = self.clock(q) if q >= 0 else -1
            clock_nx = self.clock(nx) if nx >= 0 else -1

            def window(k: int) -> tuple[int, int]:
                """(earliest start, latest start) of option k."""
                c = o.clock_mhz[k]  # noqa: B023 (called only in this iteration)
                latest = _limit(limit_dag, c, nx, ls, clock_nx, tau)  # noqa: B023
                es = _ready(es_dag, c, q, ef, clock_q, tau)  # noqa: B023
                return es, latest - o.dur[k]  # noqa: B023

            cur = self.option[i]
            es_cur, ls_cur = window(cur)
            cap = ls_cur - int(alpha * max(0, ls_cur - es_cur))
            best_k, best_key = cur, (float("inf"), 0)
            for k in range(len(o.dur)):
                es, latest = window(k)
                if k != cur and (latest < es or latest < cap):
                    continue
                cost = _option_cost(o, k, clock_q, clock_nx, e_tr)
                key = (cost, -latest)
                if key < best_key:
                    best_k, best_key = k, key
            self.option[i] = best_k
            ls[i] = -int(best_key[1])

    def sweep(self, deadline: int, alpha: float) -> None:
        """One slack-reclaiming pass (keeps makespan <= ``deadline``)."""
        tg = self.tg
        tau, e_tr = tg.transition, tg.transition_j
        lf = self.latest_finish(deadline)
        ef = [0] * tg.n_tasks
        for i in self.order:
            es_dag = 0
            for p, lag in self.lag_in[i]:
                es_dag = max(es_dag, ef[p] + lag)
            limit_dag = deadline
            for j, lag in self.lag_out[i]:
                limit_dag = min(limit_dag, lf[j] - self.dur(j) - lag)
            q, nx = self.prev[i], self.next[i]
            o = self.opts[i]
            clock_q = self.clock(q) if q >= 0 else -1
            clock_nx = self.clock(nx) if nx >= 0 else -1
            starts_nx = {nx: lf[nx] - self.dur(nx)} if nx >= 0 else {}

            def window(k: int) -> tuple[int, int]:
                """(earliest finish, latest finish) of option k."""
                c = o.clock_mhz[k]  # noqa: B023 (called only in this iteration)
                es = _ready(es_dag, c, q, ef, clock_q, tau)  # noqa: B023
                limit = _limit(limit_dag, c, nx, starts_nx, clock_nx, tau)  # noqa: B023
                return es + o.dur[k], limit  # noqa: B023

            cur = self.option[i]
            ef_cur, limit_cur = window(cur)
            cap = ef_cur + int(alpha * max(0, limit_cur - ef_cur))
            best_k, best_key = cur, (float("inf"), 0)
            for k in range(len(o.dur)):
                finish, limit = window(k)
                # the current option always fits (its successors' latest starts allow it)
                if k != cur and (finish > limit or finish > cap):
                    continue
                cost = _option_cost(o, k, clock_q, clock_nx, e_tr)
                key = (cost, finish)
                if key < best_key:
                    best_k, best_key = k, key
            self.option[i] = best_k
            ef[i] = int(best_key[1])

    def merge_runs(self, deadline: int, retime: bool) -> None:
        """Move runs of equal clock to a neighbour's clock where that saves energy."""
        for seq in self.seqs:
            k = 0
            while k < len(seq):
                end = k
                while end + 1 < len(seq) and self.clock(seq[end + 1]) == self.clock(seq[k]):
                    end += 1
                run = seq[k : end + 1]
                left = self.clock(seq[k - 1]) if k > 0 else None
                right = self.clock(seq[end + 1]) if end + 1 < len(seq) else None
                self._try_merge(run, left, right, deadline, retime)
                k = end + 1

    def _try_merge(
        self, run: list[int], left: int | None, right: int | None, deadline: int, retime: bool
    ) -> None:
        current = self.clock(run[0])
        before = (left is not None and left != current) + (right is not None and right != current)
        for target in {c for c in (left, right) if c is not None and c != current}:
            picks = [
                self.opts[i].clock_mhz.index(target) if target in self.opts[i].clock_mhz else -1
                for i in run
            ]
            if min(picks) < 0:
                continue
            after = (left is not None and left != target) + (right is not None and right != target)
            delta = sum(
                self.opts[i].dyn_j[k] - self.opts[i].dyn_j[self.option[i]]
                for i, k in zip(run, picks, strict=True)
            )
            delta += self.tg.transition_j * (after - before)
            if delta >= 0:
                continue
            faster = all(
                self.opts[i].dur[k] <= self.dur(i) for i, k in zip(run, picks, strict=True)
            )
            old = [self.option[i] for i in run]
            for i, k in zip(run, picks, strict=True):
                self.option[i] = k
            if faster:
                return
            if retime and max(s + self.dur(i) for i, s in enumerate(self.starts())) <= deadline:
                return
            for i, k in zip(run, old, strict=True):
                self.option[i] = k

    def starts(self) -> list[int]:
        return earliest_starts(self.tg, self.gpu, self.option, self.seqs)

    def schedule(self) -> Schedule:
        return Schedule(tuple(self.gpu), tuple(self.option), tuple(self.starts()))


def _ready(es_dag: int, clock: int, prev: int, finish: list[int], clock_prev: int, tau: int) -> int:
    """Earliest start after the inputs and the previous task of the GPU."""
    if prev < 0:
        return es_dag
    return max(es_dag, finish[prev] + (tau if clock != clock_prev else 0))


def _limit(
    limit_dag: int,
    clock: int,
    nxt: int,
    starts: Mapping[int, int] | list[int],
    clock_next: int,
    tau: int,
) -> int:
    """Latest finish before the outputs' and the next task's latest starts."""
    if nxt < 0:
        return limit_dag
    return min(limit_dag, starts[nxt] - (tau if clock != clock_next else 0))


def reclaim(tg: TaskGraph, base: Schedule, deadline: int) -> Schedule:
    """``base``'s placement and order with clocks chosen for makespan <= ``deadline``."""
    state = _State(tg, base)
    large = tg.n_tasks > LARGE_GRAPH
    state.move_runs(deadline, tries=1 if large else 6)
    for alpha in ALPHAS:
        state.sweep(deadline, alpha)
        state.sweep_back(deadline, alpha)
    if not large:  # each try re-times the whole graph
        state.move_runs(deadline, tries=6)
    state.merge_runs(deadline, retime=tg.n_tasks <= LARGE_GRAPH)
    return state.schedule()


def _targets(tg: TaskGraph, base_makespan: int) -> list[int]:
    if tg.objective == "energy_within":
        assert tg.deadline is not None
        # a longer makespan costs idle energy: try the fastest makespan too
        span = tg.deadline - base_makespan
        return sorted({base_makespan + span * k // 3 for k in range(4)})
    if tg.objective == "makespan":
        return [base_makespan]
    factors = SWEEP if tg.n_tasks <= LARGE_GRAPH else SWEEP_LARGE
    return sorted({int(base_makespan * f) for f in factors})


def _best_clocks(
    tg: TaskGraph, base: Schedule, log: list[str] | None = None
) -> tuple[Schedule, float]:
    """Best schedule over the makespan targets for ``base``'s placement and order."""
    base_makespan = base.makespan(tg)
    best: Schedule | None = None
    best_obj = float("inf")
    for target in _targets(tg, base_makespan):
        s = reclaim(tg, base, max(target, base_makespan))
        obj = totals(tg, s).objective
        if log is not None:
            log.append(f"target {tg.ms(target):.6f} ms: objective {obj:.9g}")
        if obj < best_obj:
            best, best_obj = s, obj
    assert best is not None
    return best, best_obj


def _moved(tg: TaskGraph, base: Schedule, task: int, gpu: int) -> Schedule:
    """``base`` with ``task`` on ``gpu`` at its fastest option, in start order there."""
    gpus = list(base.gpu)
    option = list(base.option)
    gpus[task] = gpu
    option[task] = tg.max_clock_option(task, gpu)
    seqs: list[list[int]] = [[] for _ in range(tg.n_gpus)]
    for i in sorted(range(tg.n_tasks), key=lambda i: (base.start[i], i)):
        seqs[gpus[i]].append(i)
    return Schedule(tuple(gpus), tuple(option), tuple(earliest_starts(tg, gpus, option, seqs)))


class _Budget:
    """Evaluations left to a placement search: ``evals`` of them, then more until
    ``time.perf_counter()`` passes ``until`` (s). ``extra_s`` is the time spent past
    the ``evals``."""

    def __init__(self, evals: int, until: float) -> None:
        self.left = evals
        self.until = until
        self.extra_from: float | None = None if evals > 0 else time.perf_counter()

    def more(self) -> bool:
        return self.left > 0 or time.perf_counter() < self.until

    def spend(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.extra_from = time.perf_counter()

    @property
    def extra_s(self) -> float:
        """Seconds spent since the ``evals`` ran out (0 while they last)."""
        return 0.0 if self.extra_from is None else time.perf_counter() - self.extra_from


def _local_search(
    tg: TaskGraph, base: Schedule, best: Schedule, best_obj: float, budget: _Budget
) -> tuple[Schedule, float]:
    """First-improvement moves of single tasks to other GPUs, each re-clocked, while
    the budget lasts. Moves must keep the max-clock makespan within the deadline."""
    improved = True
    while improved and budget.more():
        improved = False
        for i in tg.topo_order:
            for g in range(tg.n_gpus):
                if g == base.gpu[i] or not tg.can_run(i, g) or not budget.more():
                    continue
                cand = _moved(tg, base, i, g)
                if tg.deadline is not None and cand.makespan(tg) > tg.deadline:
                    continue
                s, obj = _best_clocks(tg, cand)
                budget.spend()
                if obj < best_obj * (1 - 1e-9):
                    base, best, best_obj, improved = cand, s, obj, True
    return best, best_obj


def improve_placement(
    tg: TaskGraph,
    base: Schedule,
    best: Schedule,
    best_obj: float,
    evals: int,
    seed: int = 0,
    until: float = -math.inf,
) -> tuple[Schedule, float, float]:
    """Local search from HEFT's placement, then from HEFT runs on randomly perturbed
    ranks (+-20%), until ``evals`` re-clocked placements have been evaluated and
    ``time.perf_counter()`` has passed ``until`` (s; default: evaluations only).
    Returns the best schedule, its objective and the seconds spent past the
    ``evals``."""
    budget = _Budget(evals, until)
    best, best_obj = _local_search(tg, base, best, best_obj, budget)
    rng = random.Random(seed)
    ranks = upward_ranks(tg)
    while budget.more():
        noisy = [r * (1.0 + rng.uniform(-0.2, 0.2)) for r in ranks]
        for i in reversed(tg.topo_order):  # keep ranks decreasing along every edge
            for j, _ in tg.succs[i]:
                noisy[i] = max(noisy[i], noisy[j] + 1e-6)
        start = heft_max_clock(tg, noisy)
        budget.spend()
        if tg.deadline is not None and start.makespan(tg) > tg.deadline:
            continue
        s, obj = _best_clocks(tg, start)
        if obj < best_obj * (1 - 1e-9):
            best, best_obj = s, obj
        best, best_obj = _local_search(tg, start, best, best_obj, budget)
    return best, best_obj, budget.extra_s


CLASS_TASKS = 200
"""Graphs above this many tasks (no placement search) try clock classes
(``clock_classes.class_search``) before the per-GPU clock descent, in the first two
thirds of its time."""
GPU_CLOCK_EVALS = 60
"""Most HEFT runs the per-GPU clock descent makes (each places every task once)."""
ENERGY_WEIGHTS = (0.5, 1.0, 0.25)
"""The per-GPU clock HEFT weighs a task's above-idle energy at these shares of the
graph's mean fastest duration per J of mean fastest above-idle energy (the first
to start with, the others where the descent stalls)."""


def _clock_lists(tg: TaskGraph) -> list[tuple[int, ...]]:
    """Per GPU type, every clock any task has there, ascending (MHz)."""
    out: list[tuple[int, ...]] = []
    for per_type in tg.options:
        out.append(tuple(sorted({c for o in per_type for c in o.clock_mhz})))
    return out


SEED_PRICES = (1.0, 2.0, 4.0, 8.0, 16.0)
"""Busy-time prices, in multiples of one GPU's idle power, at which
``priced_clock_levels`` suggests per-GPU clocks."""


def priced_clock_levels(
    tg: TaskGraph, clocks: list[tuple[int, ...]], rounding: str = "down"
) -> list[list[int]]:
    """Per-GPU clock levels (indices into ``clocks`` of each GPU's type) suggested by
    the busy-time prices of the Lagrangian bound: at a price lambda (J per grid
    unit) every task takes the (type, option) of least above-idle energy + lambda x
    duration; each type's GPUs are shared among its clocks in proportion to the time
    the tasks chose there, the shares rounded ``down`` (the GPUs left over at the
    maximum clock, which leaves room for a deadline) or to the ``nearest`` (largest
    remainders); slowest clocks on the lowest GPU indices, as the descent keeps them.
    On a saturated graph of memory- and compute-bound tasks this puts about as many
    GPUs at the lowest clock as the memory-bound work fills, which one-GPU-at-a-time
    descent from the maximum does not reach within its evaluations. Distinct
    suggestions, in ``SEED_PRICES`` order."""
    n_types = len(tg.types)
    gpus_of = [[g for g in range(tg.n_gpus) if tg.gpu_type[g] == t] for t in range(n_types)]
    width = max((len(o.dur) for per in tg.options for o in per), default=0)
    if tg.n_tasks == 0 or width == 0:
        return []
    dyn = np.full((n_types, tg.n_tasks, width), np.inf)
    dur = np.zeros((n_types, tg.n_tasks, width))
    level = np.zeros((n_types, tg.n_tasks, width), dtype=np.int64)
    for t in range(n_types):
        if not gpus_of[t]:
            continue
        for i, o in enumerate(tg.options[t]):
            k = len(o.dur)
            dyn[t, i, :k] = o.dyn_j
            dur[t, i, :k] = o.dur
            level[t, i, :k] = [clocks[t].index(c) for c in o.clock_mhz]
    per_gpu_idle = tg.idle_total_w * tg.unit_ms / 1e3 / tg.n_gpus  # J per grid unit
    rows = np.arange(tg.n_tasks)
    out: list[list[int]] = []
    for price in SEED_PRICES:
        cost = (dyn + price * per_gpu_idle * dur).transpose(1, 0, 2).reshape(tg.n_tasks, -1)
        pick = cost.argmin(axis=1)
        t_of, k_of = pick // width, pick % width
        chosen_dur = dur[t_of, rows, k_of]
        chosen_level = level[t_of, rows, k_of]
        levels = [len(clocks[tg.gpu_type[g]]) - 1 for g in range(tg.n_gpus)]
        for t in range(n_types):
            n = len(gpus_of[t])
            load = np.bincount(
                chosen_level[t_of == t],
                weights=chosen_dur[t_of == t],
                minlength=len(clocks[t]),
            )
            if n == 0 or load.sum() <= 0:
                continue
            quota = load / load.sum() * n
            counts = np.floor(quota).astype(int)
            spare = n - int(counts.sum())
            if rounding == "down":  # the GPUs left over run at the maximum clock
                counts[-1] += spare
            else:  # largest remainders
                for v in np.argsort(-(quota - counts), kind="stable")[:spare]:
                    counts[v] += 1
            ladder = [v for v in range(len(clocks[t])) for _ in range(int(counts[v]))]
            for g, v in zip(gpus_of[t], ladder, strict=True):
                levels[g] = v
        if levels not in out:
            out.append(levels)
    return out


def gpu_clock_descent(
    tg: TaskGraph, stop_at: float, evals: int = GPU_CLOCK_EVALS
) -> tuple[Schedule, float] | None:
    """Best schedule of HEFT with one clock per GPU (``heft_gpu_clocks``), the clocks
    lowered one GPU and one level at a time, from the maximum or from the best of the
    suggestions of ``priced_clock_levels`` if one is better, while the objective
    falls (first improvement: the fastest GPU first, each to its lowest clock first;
    the deadline, if any, must hold), until ``evals`` HEFT runs or the clock
    ``time.perf_counter()`` passes ``stop_at`` (s). Where no move helps, the other
    energy weights of ``ENERGY_WEIGHTS`` are tried at the clocks reached and the
    descent goes on with one that helps. GPUs of one type keep non-decreasing clocks
    in index order (they are alike for the search). None if no such schedule meets
    the deadline."""
    clocks = _clock_lists(tg)
    fast_dur = 0.0
    fast_dyn = 0.0
    for i in range(tg.n_tasks):
        g = next(g for g in range(tg.n_gpus) if tg.can_run(i, g))
        k = tg.max_clock_option(i, g)
        fast_dur += tg.opts(i, g).dur[k]
        fast_dyn += tg.opts(i, g).dyn_j[k]
    scale = fast_dur / fast_dyn if fast_dyn > 0 else 0.0
    weights = [w * scale for w in ENERGY_WEIGHTS]
    weight = weights[0]
    level = [len(clocks[tg.gpu_type[g]]) - 1 for g in range(tg.n_gpus)]

    def run(levels: list[int], weight: float) -> tuple[Schedule, float] | None:
        s = heft_gpu_clocks(tg, [clocks[tg.gpu_type[g]][v] for g, v in enumerate(levels)], weight)
        if tg.deadline is not None and s.makespan(tg) > tg.deadline:
            return None
        return s, totals(tg, s).objective

    best = run(level, weight)
    used = 1
    for rounding in ("down", "nearest"):
        seeds = priced_clock_levels(tg, clocks, rounding)
        if tg.deadline is not None:
            # highest price (fewest slow GPUs) first, each at two energy weights, and
            # no lower price once one meets the deadline at neither
            seeds.reverse()
        for seed in seeds:
            met = False
            for w in weights[:2] if tg.deadline is not None else weights[:1]:
                if used >= evals or time.perf_counter() >= stop_at:
                    return best
                got = run(seed, w)
                used += 1
                if got is None:
                    continue
                met = True
                if best is None or got[1] < best[1] * (1 - 1e-9):
                    best, level, weight = got, seed, w
                break
            if not met:
                break
    improved = best is not None
    while improved and best is not None:
        improved = False
        moves: list[tuple[int, int]] = []  # (GPU, new level)
        for g in range(tg.n_gpus):
            same_before = g > 0 and tg.gpu_type[g - 1] == tg.gpu_type[g]
            if not (same_before and level[g - 1] == level[g]):
                # the first GPU of a run of equal clocks in its type, to any lower clock
                # that keeps the type's order (lowest first: the largest saving)
                floor = level[g - 1] if same_before else 0
                moves.extend((g, v) for v in range(floor, level[g]))
        moves.sort(key=lambda m: (-level[m[0]], m[1]))
        for g, v in moves:
            if used >= evals or time.perf_counter() >= stop_at:
                return best
            trial = list(level)
            trial[g] = v
            got = run(trial, weight)
            used += 1
            if got is not None and got[1] < best[1] * (1 - 1e-9):
                best, level, improved = got, trial, True
                break
        for other in weights:
            if improved or other == weight:
                continue
            if used >= evals or time.perf_counter() >= stop_at:
                return best
            got = run(level, other)
            used += 1
            if got is not None and got[1] < best[1] * (1 - 1e-9):
                best, weight, improved = got, other, True
    return best


def solve_heuristic(
    tg: TaskGraph,
    progress: Callable[[str], None] | None = None,
    search_evals: int | None = None,
    time_limit_s: float | None = None,
    search_s: float | None = None,
) -> Result[Schedule]:
    """Schedule ``tg`` for its objective; every returned schedule is checked by the caller.

    ``search_evals``: re-clocked placements the placement search may evaluate
    (default min(200, max(20, 2000 / tasks)) up to 200 tasks, none above; with the
    default, it goes on until ``search_s`` seconds after the start if that is given:
    CP-SAT's warm start asks for it, where a better hint pays).
    ``time_limit_s`` (s, default none) stops the per-GPU clock descent early; it
    does not cut the other steps, which are bounded by their evaluation counts.
    """
    start = time.perf_counter()
    say = progress or (lambda _line: None)
    base = heft_max_clock(tg)
    base_makespan = base.makespan(tg)
    say(f"HEFT at max clock: makespan {tg.ms(base_makespan):.3f} ms")
    log = [f"heft makespan {tg.ms(base_makespan):.6f} ms"]
    if tg.deadline is not None and base_makespan > tg.deadline:
        return Result(
            NO_SOLUTION,
            None,
            None,
            time.perf_counter() - start,
            None,
            "heuristic",
            log,
            [
                f"HEFT at max clock needs {tg.ms(base_makespan):.3f} ms, more than the "
                f"deadline {tg.ms(tg.deadline):.3f} ms"
            ],
        )
    best, best_obj = _best_clocks(tg, base, log)
    say(f"clocks chosen: objective {best_obj:.6g}")
    default = min(200, max(20, 2000 // tg.n_tasks)) if tg.n_tasks <= 200 else 0
    budget = default if search_evals is None else search_evals
    extra_s = 0.0  # placement search past its default evaluations, s
    if budget > 0:
        # with the default budget, CP-SAT's warm start (``search_s``) lets the search
        # go on past its evaluations; the time it takes there is not charged to the
        # per-GPU clock descent below
        until = -math.inf if search_evals is not None or search_s is None else start + search_s
        best, best_obj, extra_s = improve_placement(tg, base, best, best_obj, budget, until=until)
        log.append(f"after placement moves: objective {best_obj:.9g}")
        say(f"placement moves: objective {best_obj:.6g}")
    # the per-GPU clock descent's share of the time limit: until ``descent_stop``
    descent_from = time.perf_counter()
    limit = math.inf if time_limit_s is None else time_limit_s
    descent_stop = descent_from + max(0.0, limit - 3.0 * (descent_from - start - extra_s))
    if tg.objective != "makespan" and tg.n_tasks > CLASS_TASKS:
        # clock classes planned by an LP, in the first two thirds of the descent's time
        clocks = _clock_lists(tg)
        seeds = [lv for r in ("down", "nearest") for lv in priced_clock_levels(tg, clocks, r)]
        stop = descent_from + (descent_stop - descent_from) * 2 / 3
        got = class_search(tg, clocks, class_settings(tg, clocks, seeds), base, stop)
        if got is not None:
            # its re-clocking comes out of the descent's time
            before = time.perf_counter()
            s, obj = _best_clocks(tg, got[0])
            descent_stop -= time.perf_counter() - before
            if got[1] < obj:
                s, obj = got
            log.append(f"clock classes, re-clocked: objective {obj:.9g}")
            say(f"clock classes: objective {obj:.6g}")
            if obj < best_obj:
                best, best_obj = s, obj
    if tg.objective != "makespan":
        # the rest of its time (the re-clocking of its schedule takes a share of the
        # time limit after it)
        found = gpu_clock_descent(tg, descent_stop)
        if found is not None:
            # re-clocked, or as HEFT left it if that is better (at one clock per GPU
            # there are no clock changes, which the re-clocking may add)
            held, held_obj = found
            s, obj = _best_clocks(tg, held)
            if held_obj < obj:
                s, obj = held, held_obj
            log.append(f"per-GPU clock HEFT, re-clocked: objective {obj:.9g}")
            say(f"per-GPU clocks: objective {obj:.6g}")
            if obj < best_obj:
                best, best_obj = s, obj
    tot = totals(tg, best)
    bound = lower_bounds(tg).objective(tg, tot.objective)
    status = OPTIMAL if relative_gap(tot.objective, bound) <= 1e-9 else FEASIBLE
    return Result(
        status,
        tot.objective,
        bound,
        time.perf_counter() - start,
        best,
        "heuristic",
        log,
        termination=Termination.HEURISTIC,
        algorithm="HEFT placement, slack reclaiming, local search and per-GPU clocks",
    )


def _option_cost(
    o: TaskOptions, k: int, clock_before: int, clock_after: int, switch_j: float
) -> float:
    """Dynamic energy of option k (J) plus a clock change for each neighbour on the
    GPU (clock -1: none) that runs at another clock."""
    c = o.clock_mhz[k]
    cost = float(o.dyn_j[k])
    if clock_before >= 0 and c != clock_before:
        cost += switch_j
    if clock_after >= 0 and c != clock_after:
        cost += switch_j
    return cost
