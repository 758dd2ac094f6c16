"""The clairvoyant keep-alive yardstick, with no memory limit and within the nodes'
memory budgets.

The yardstick knows every idle time in advance. It prices the *always-warm
timing*: the first request loads the container, every later one starts at once,
requests that arrive while the container serves join it (continuous batching), and
each idle period between two busy periods is held in its cheapest way: warm, tepid
(entered when the period starts, resumed just in time) or evicted and loaded again
just in time. After the last request the container is evicted at once.

With no memory limit every idle period takes its cheapest way on its own
(:func:`clairvoyant_j`). Within a node's memory budget the idle containers of the
node's functions share the GPU and host memory left by the busy ones, and the
cheapest ways may not fit together. :func:`budget_floor` bounds that problem from
below by Lagrangian relaxation: memory is priced per time bin (J per GB-s), every
idle period then takes its cheapest way at those prices (warm, cold, or a mix of
warm and tepid moments paying one enter and one resume), and the prices are raised
by projected subgradient steps (`solvers/subgradient.py`) where the relaxed
choices overfill a bin. Every
price vector gives a valid lower bound on the always-warm-timing optimum within
the budgets (weak duality; each bin's constraint is the time integral of the
pointwise one, a relaxation), so the best one seen is reported.

Both price the always-warm timing, so they are yardsticks rather than lower
bounds on every policy the simulator runs: a policy whose resume, load or wait for
memory delays a request serves the requests that gather meanwhile in fewer busy
periods (tests/test_keepalive_yardstick.py). Times s, energies J, powers W,
memory GB.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from energyopt.families.keepalive.spec import Function
from energyopt.solvers.subgradient import FloatArray, projected_step

BIN_S = 1.0
"""Width of the time bins the memory prices are set on, s."""
ITERATIONS = 300
"""Subgradient steps of :func:`budget_floor`."""


@dataclass(frozen=True)
class Timeline:
    """One function's requests in the always-warm timing."""

    fixed_j: float
    """Energy every way of holding the idle periods pays, J: the first load, the
    service of every request and the warm power over the busy periods."""
    busy: FloatArray
    """(start s, end s) of each busy period, shape (n, 2)."""
    gaps: FloatArray
    """(start s, end s) of each idle period between two busy periods, shape (n - 1, 2)."""


def timeline(fn: Function, times: Sequence[float]) -> Timeline:
    """The busy and idle periods of ``times`` (sorted arrival times, s) in the
    always-warm timing, and the energy they fix."""
    if not len(times):
        return Timeline(0.0, np.zeros((0, 2)), np.zeros((0, 2)))
    svc = fn.service.time_s
    ready = float(times[0]) + fn.cold_start.time_s
    busy_from, busy_until = ready, ready + svc
    busy: list[tuple[float, float]] = []
    for a in times[1:]:
        if a < busy_until:
            busy_until = max(busy_until, max(float(a), ready) + svc)
            continue
        busy.append((busy_from, busy_until))
        ready = busy_from = float(a)
        busy_until = ready + svc
    busy.append((busy_from, busy_until))
    spans = np.asarray(busy, dtype=np.float64)
    fixed = (
        fn.cold_start.energy_j
        + len(times) * svc * fn.service.power_w
        + fn.warm.power_w * float(np.sum(spans[:, 1] - spans[:, 0]))
    )
    gaps = np.column_stack([spans[:-1, 1], spans[1:, 0]])
    return Timeline(fixed, spans, gaps)


def _cheapest_j(fn: Function, lengths: FloatArray) -> FloatArray:
    """Least energy, J, of holding idle periods of ``lengths`` s with no memory
    limit: warm, tepid, or evicted and loaded again just in time."""
    best = np.minimum(fn.warm.power_w * lengths, fn.cold_start.energy_j)
    tep = fn.tepid
    if tep is not None:
        best = np.minimum(best, tep.enter_j + tep.power_w * lengths + tep.resume_j)
    return best


def clairvoyant_j(fn: Function, times: Sequence[float]) -> float:
    """The yardstick's energy with no memory limit, J (module docstring)."""
    line = timeline(fn, times)
    lengths = line.gaps[:, 1] - line.gaps[:, 0]
    return line.fixed_j + float(np.sum(_cheapest_j(fn, lengths)))


@dataclass(frozen=True)
class BudgetFloor:
    """The yardstick within the nodes' memory budgets."""

    energy_j: float
    """Best Lagrangian lower bound on it, J (at least ``unlimited_j``)."""
    unlimited_j: float
    """The yardstick with no memory limit, J (the bound at zero prices)."""
    iterations: int
    """Subgradient steps taken."""
    overfull_gb_s: float
    """At the best prices, how much the relaxed choices overfill the bins, GB x s
    summed over bins, nodes and both memories (0: those choices fit every bin's
    time integral, and the bound is the relaxation's optimum)."""


@dataclass
class _Node:
    """One node's idle periods split at the bin edges (one row per piece)."""

    gap: NDArray[np.int64]  # piece -> idle period (global index)
    bin: NDArray[np.int64]  # piece -> time bin
    seconds: FloatArray  # piece length, s
    fn: NDArray[np.int64]  # piece -> function (global index)
    room_gpu: FloatArray  # per bin: GB x s the busy containers leave free
    room_host: FloatArray


def _pieces(
    gaps: FloatArray, edges: FloatArray
) -> tuple[NDArray[np.int64], NDArray[np.int64], FloatArray]:
    """(period index, bin, overlap s) of every piece of the periods ``gaps`` cut at
    the bin ``edges``."""
    nbins = len(edges) - 1
    first = np.clip(np.searchsorted(edges, gaps[:, 0], side="right") - 1, 0, nbins - 1)
    last = np.clip(np.searchsorted(edges, gaps[:, 1], side="left") - 1, 0, nbins - 1)
    last = np.maximum(last, first)
    counts = last - first + 1
    idx = np.repeat(np.arange(len(gaps)), counts)
    offs = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    bins = first[idx] + offs
    lo = np.maximum(gaps[idx, 0], edges[bins])
    hi = np.minimum(gaps[idx, 1], edges[bins + 1])
    return idx.astype(np.int64), bins.astype(np.int64), np.maximum(hi - lo, 0.0)


def _room(busy: list[tuple[FloatArray, float]], capacity: float, edges: FloatArray) -> FloatArray:
    """Per bin, the time integral (GB x s) of the memory ``capacity`` less what the
    busy periods hold (each (periods, GB)), never below zero."""
    nbins = len(edges) - 1
    if math.isinf(capacity):
        return np.full(nbins, math.inf)
    times = [edges]
    deltas = [np.zeros(len(edges))]
    for spans, gb in busy:
        if len(spans) and gb > 0:
            times += [spans[:, 0], spans[:, 1]]
            deltas += [np.full(len(spans), gb), np.full(len(spans), -gb)]
    t = np.concatenate(times)
    d = np.concatenate(deltas)
    order = np.argsort(t, kind="stable")
    t, level = t[order], np.cumsum(d[order])
    seg = np.diff(t)
    free = np.maximum(capacity - level[:-1], 0.0) * seg
    mid = 0.5 * (t[:-1] + t[1:])
    inside = (mid >= edges[0]) & (mid < edges[-1]) & (seg > 0)
    bins = np.searchsorted(edges, mid[inside], side="right") - 1
    return np.bincount(bins, weights=free[inside], minlength=nbins)[:nbins].astype(np.float64)


def budget_floor(
    nodes: Sequence[Sequence[tuple[Function, Sequence[float]]]],
    gpu_memory_gb: float,
    host_memory_gb: float,
    horizon_s: float,
    *,
    bin_s: float = BIN_S,
    iterations: int = ITERATIONS,
) -> BudgetFloor:
    """The yardstick (module docstring) for the functions on each node (each
    (function, sorted arrival times s)), every node holding at most
    ``gpu_memory_gb`` and ``host_memory_gb`` at once; a Lagrangian lower bound on
    it after ``iterations`` subgradient steps on prices per ``bin_s``-s bin."""
    if bin_s <= 0 or horizon_s <= 0:
        raise ValueError("budget_floor: bin_s and horizon_s must be positive")
    fns: list[Function] = []
    lines: list[Timeline] = []
    where: list[int] = []
    end = horizon_s
    for k, node in enumerate(nodes):
        for fn, times in node:
            line = timeline(fn, times)
            fns.append(fn)
            lines.append(line)
            where.append(k)
            if len(line.busy):
                end = max(end, float(line.busy[-1, 1]))
    nbins = max(1, math.ceil(end / bin_s))
    edges = np.arange(nbins + 1, dtype=np.float64) * bin_s
    fixed = sum(line.fixed_j for line in lines)
    # per function: its parameters as arrays
    warm_w = np.array([f.warm.power_w for f in fns])
    warm_g = np.array([f.warm.gpu_memory_gb for f in fns])
    warm_h = np.array([f.warm.host_memory_gb for f in fns])
    has_tepid = np.array([f.tepid is not None for f in fns])
    tep_w = np.array([f.tepid.power_w if f.tepid else 0.0 for f in fns])
    tep_g = np.array([f.tepid.gpu_memory_gb if f.tepid else 0.0 for f in fns])
    tep_h = np.array([f.tepid.host_memory_gb if f.tepid else 0.0 for f in fns])
    tep_j = np.array([f.tepid.enter_j + f.tepid.resume_j if f.tepid else math.inf for f in fns])
    load_j = np.array([f.cold_start.energy_j for f in fns])
    # every idle period, globally numbered
    gap_fn = np.concatenate(
        [np.full(len(line.gaps), i, dtype=np.int64) for i, line in enumerate(lines)]
        or [np.zeros(0, dtype=np.int64)]
    )
    all_gaps = np.concatenate([line.gaps for line in lines] or [np.zeros((0, 2))])
    length = all_gaps[:, 1] - all_gaps[:, 0]
    unlimited = fixed + float(
        np.sum(
            np.minimum.reduce(
                [warm_w[gap_fn] * length, load_j[gap_fn], tep_j[gap_fn] + tep_w[gap_fn] * length]
            )
        )
    )
    parts: list[_Node] = []
    first = 0
    for k in range(len(nodes)):
        members = [i for i, w in enumerate(where) if w == k]
        count = sum(len(lines[i].gaps) for i in members)
        sel = np.arange(first, first + count)
        first += count
        gi, bins, secs = _pieces(all_gaps[sel], edges)
        busy_gpu = [(lines[i].busy, float(warm_g[i])) for i in members]
        busy_host = [(lines[i].busy, float(warm_h[i])) for i in members]
        parts.append(
            _Node(
                sel[gi],
                bins,
                secs,
                gap_fn[sel[gi]],
                _room(busy_gpu, gpu_memory_gb, edges),
                _room(busy_host, host_memory_gb, edges),
            )
        )
    n_gaps = len(all_gaps)
    limited = [np.isfinite(p.room_gpu).all() or np.isfinite(p.room_host).all() for p in parts]
    if not any(limited) or n_gaps == 0:
        return BudgetFloor(unlimited, unlimited, 0, 0.0)
    # prices (J per GB x s): per node, the GPU memory's bins then the host memory's;
    # a memory with no limit has room inf, no subgradient, and keeps its prices at 0
    rooms = np.concatenate([np.concatenate([p.room_gpu, p.room_host]) for p in parts])
    capped = np.isfinite(rooms)
    room = np.where(capped, rooms, 0.0)
    prices = np.zeros(len(rooms))
    best, best_over, step_scale = -math.inf, 0.0, 1.0
    taken = 0
    for it in range(iterations):
        taken = it + 1
        warm_cost = np.zeros(n_gaps)
        mix_cost = np.zeros(n_gaps)
        per_part: list[tuple[FloatArray, FloatArray]] = []
        for k, p in enumerate(parts):
            at = 2 * nbins * k
            pg = prices[at : at + nbins][p.bin]
            ph = prices[at + nbins : at + 2 * nbins][p.bin]
            cw = (warm_w[p.fn] + pg * warm_g[p.fn] + ph * warm_h[p.fn]) * p.seconds
            ct = (tep_w[p.fn] + pg * tep_g[p.fn] + ph * tep_h[p.fn]) * p.seconds
            ct = np.where(has_tepid[p.fn], ct, math.inf)
            warm_cost += np.bincount(p.gap, weights=cw, minlength=n_gaps)
            mix_cost += np.bincount(p.gap, weights=np.minimum(cw, ct), minlength=n_gaps)
            per_part.append((cw, ct))
        mix_cost += tep_j[gap_fn]
        cold_cost = load_j[gap_fn]
        choice = np.argmin(np.column_stack([warm_cost, mix_cost, cold_cost]), axis=1)
        value = fixed + float(np.sum(np.minimum(np.minimum(warm_cost, mix_cost), cold_cost)))
        value -= float(prices @ room)
        held: list[FloatArray] = []
        for p, (cw, ct) in zip(parts, per_part, strict=True):
            ch = choice[p.gap]
            tepid_here = (ch == 1) & (ct < cw)
            warm_here = (ch == 0) | ((ch == 1) & ~tepid_here)
            use_g = np.where(warm_here, warm_g[p.fn], np.where(tepid_here, tep_g[p.fn], 0.0))
            use_h = np.where(warm_here, warm_h[p.fn], np.where(tepid_here, tep_h[p.fn], 0.0))
            for use in (use_g, use_h):
                per_bin = np.bincount(p.bin, weights=use * p.seconds, minlength=nbins)
                held.append(np.asarray(per_bin[:nbins], dtype=np.float64))
        g = np.where(capped, np.concatenate(held) - room, 0.0)
        # how much the relaxed choices overfill the bins (a price at zero with room to
        # spare is no overfill)
        over = float(np.sum(np.maximum(g, 0.0)))
        if value > best:
            best, best_over = value, over
        # Polyak step (solvers/subgradient.py) towards an estimate 5 % of the
        # yardstick above the best, the estimate halved every 25 steps
        target = best + 0.05 * step_scale * max(unlimited - fixed, 1.0)
        prices, norm2 = projected_step(prices, g, value, target, 1.0)
        if norm2 <= 1e-18:
            break
        if it % 25 == 24:
            step_scale *= 0.5
    return BudgetFloor(max(best, unlimited), unlimited, taken, best_over)
