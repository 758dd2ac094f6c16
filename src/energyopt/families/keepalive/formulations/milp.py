"""The keep-alive MILP over a range of windows: one unit of flow per function
through its states x windows network, coupled by the node budgets, the SLOs and
the cold-start cap.

Column x[f, t, a, b] = 1 when function f moves from state a (in window t - 1, or
its given state before the range) to state b for window t. A move onto another
node costs the same whatever the state it leaves (the function enters its new
state from nothing kept), so where the moves on one node are never dearer than
entering anew (``KeepAliveProblem.cross_node_exact``) those moves pass through one
hub per function and window: a free column from each state into the hub and one
from the hub into each state, 6N columns instead of 9N(N - 1) (the same programme:
a path through the hub back onto its own node costs no less than the direct move).
Rows:

- flow: one move out of the state before the range; in every later window the
  moves into a state (the hub included) equal the moves out of it;
- per node n and window t: GPU memory, host memory and average power (the held
  states' power, their requests' service and start energy, and the energy of the
  moves into them, over the window) within the node's budget;
- per function with an SLO: requests arriving in a state slower than the SLO at
  most the function's remaining allowance;
- with a cap: requests arriving in a cold state at most the remaining allowance;
- per node memory cover and window (formulations/cuts.py): at most k of the
  cover's states held. Valid for every plan, so the optimum is unchanged; they
  close most of the LP's gap, which the memory rows' fractional warm states make.

The objective is the energy of the range, J: every column's move energy plus the
energy of holding its target state and serving its requests in the window. For
the throughput objective it is first the requests that start later than their
function's limit, then the energy with their number capped at that optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import highspy
import numpy as np
import scipy.sparse as sp

from energyopt.backends.highs import binary_lp
from energyopt.families.keepalive.formulations.model import (
    WARM,
    FloatArray,
    IntArray,
    KeepAliveProblem,
)

FORMULATION_NAME = "keep-alive arc-flow MILP (states x windows, node budgets, SLO, cold cap)"


MAX_COLUMNS = 1_000_000
"""Largest MILP (columns) that is built; past it ``milp`` and ``rolling`` refuse by
name (the Lagrangian works on every instance within the size limits). HiGHS' setup
of a model near this size takes seconds that its time limit does not interrupt."""


@dataclass(frozen=True)
class Milp:
    """The program's arrays; column j moves function ``fn[j]`` from ``src[j]`` to
    ``dst[j]`` for window ``win[j]`` (``hub`` in either: the window's hub)."""

    cost: FloatArray
    matrix: sp.csc_matrix
    row_lo: FloatArray
    row_hi: FloatArray
    fn: IntArray
    win: IntArray
    src: IntArray
    dst: IntArray
    hub: int

    def __len__(self) -> int:
        return len(self.cost)


def _arcs(p: KeepAliveProblem, f: int, hub: bool) -> tuple[IntArray, IntArray]:
    """Function f's possible moves between consecutive windows as (from, to) state
    pairs: on one node, and between nodes unless they pass through the hub."""
    n = p.n_nodes
    if hub:
        offered = p.allowed[f].reshape(3, n)
        kinds, nodes = np.flatnonzero(offered.any(axis=1)), np.flatnonzero(offered[WARM])
        grid_ka, grid_kb, grid_n = np.meshgrid(kinds, kinds, nodes, indexing="ij")
        a, b = (grid_ka * n + grid_n).ravel(), (grid_kb * n + grid_n).ravel()
    else:
        states = np.flatnonzero(p.allowed[f])
        grid_a, grid_b = np.meshgrid(states, states, indexing="ij")
        a, b = grid_a.ravel(), grid_b.ravel()
    keep = np.isfinite(p.move_j(f, a, b))
    return a[keep], b[keep]


def _arc_counts(p: KeepAliveProblem) -> tuple[IntArray, IntArray]:
    """(F,) columns per function in the first window (from the start) and in every
    later one, counted without listing them."""
    n = p.n_nodes
    kinds = np.asarray(p.allowed.reshape(p.n_functions, 3, n).any(axis=2), dtype=np.bool_)
    nodes = p.allowed.reshape(p.n_functions, 3, n)[:, WARM].sum(axis=1)  # permitted nodes
    states = kinds.sum(axis=1) * nodes
    enterable = (kinds & np.isfinite(p.enter_j)).sum(axis=1)
    pairs = kinds[:, :, None] & kinds[:, None, :] & np.isfinite(p.same_j)
    same = pairs.sum(axis=(1, 2)) * nodes
    cross = enterable * nodes * (states - kinds.sum(axis=1))
    via_hub = same + states + enterable * nodes
    later = np.where(p.cross_node_exact() & (n > 1), via_hub, same + cross)
    return enterable * nodes, later


def milp_columns(p: KeepAliveProblem, first: int = 0, last: int | None = None) -> int:
    """Columns of the MILP of windows ``first`` .. ``last - 1`` from the start
    (nothing kept), counted without building it."""
    width = (p.n_windows if last is None else last) - first
    opening, later = _arc_counts(p)
    return int(opening.sum() + (width - 1) * later.sum())


def build_milp(
    p: KeepAliveProblem,
    first: int = 0,
    last: int | None = None,
    start: IntArray | None = None,
    slo_left: FloatArray | None = None,
    cold_left: float | None = None,
    *,
    minimise: Literal["energy", "late"] = "energy",
    late_cap: float = math.inf,
    cuts: bool = True,
) -> Milp:
    """The MILP of windows ``first`` .. ``last - 1`` (default all), each function
    starting from ``start`` (default: nothing kept), with ``slo_left`` late requests
    per function and ``cold_left`` cold starts allowed (default: the whole horizon's).
    ``minimise`` "late": the objective is the requests starting later than their
    function's limit (the throughput objective's first stage); ``late_cap``: at most
    that many such requests over all functions (its second stage). ``cuts``: with
    the memory cover rows of formulations/cuts.py (valid for every plan, so the
    optimum is the same; the LP bound is stronger)."""
    stop = p.n_windows if last is None else last
    init = np.full(p.n_functions, p.source_state, dtype=np.int64) if start is None else start
    slo = p.slo_budget if slo_left is None else slo_left
    cold_allow = p.cold_cap if cold_left is None else cold_left
    n_s, n_n, dt = p.n_states, p.n_nodes, p.window_s
    hub = n_s + 1
    node = p.node_of()
    cold = p.is_cold()
    through_hub = p.cross_node_exact() & (n_n > 1)
    fn_l, win_l, src_l, dst_l = [], [], [], []
    for f in range(p.n_functions):
        states = np.flatnonzero(p.allowed[f])
        pair_a, pair_b = _arcs(p, f, bool(through_hub[f]))
        if through_hub[f]:
            entered = states[np.isfinite(p.enter_j[f, states // n_n])]
            pair_a = np.concatenate([pair_a, states, np.full(len(entered), hub)])
            pair_b = np.concatenate([pair_b, np.full(len(states), hub), entered])
        b0 = states[np.isfinite(p.move_j(f, init[f], states))]
        later = stop - first - 1
        fn_l.append(np.full(len(b0) + later * len(pair_a), f))
        win_l.append(np.full(len(b0), first))
        win_l.append(np.repeat(np.arange(first + 1, stop), len(pair_a)))
        src_l.append(np.full(len(b0), init[f]))
        src_l.append(np.tile(pair_a, later))
        dst_l.append(b0)
        dst_l.append(np.tile(pair_b, later))
    fn = np.concatenate(fn_l).astype(np.int64)
    win = np.concatenate(win_l).astype(np.int64)
    src = np.concatenate(src_l).astype(np.int64)
    dst = np.concatenate(dst_l).astype(np.int64)
    real = dst < n_s  # into a state (else into the hub)
    into = np.where(real, dst, 0)
    from_hub = src == hub
    move_j = np.where(
        from_hub,
        p.enter_j[fn, into // n_n],
        np.where(real, p.move_j(fn, np.where(from_hub, 0, src), into), 0.0),
    )
    hold_j = np.where(real, p.state_j[fn, win, into], 0.0)
    late = np.where(real, p.arrivals[fn, win] * p.slow[fn, into], 0.0)
    cols = np.arange(len(fn))
    cost = move_j + hold_j if minimise == "energy" else late
    width = stop - first
    n_f = p.n_functions
    rows: list[IntArray] = []
    colsl: list[IntArray] = []
    vals: list[FloatArray] = []
    lo: list[FloatArray] = []
    hi: list[FloatArray] = []
    offset = 0

    slots = n_s + 1  # the states, then the window's hub

    def flow(f: IntArray, t: IntArray | int, s: IntArray) -> IntArray:
        """Flow row (f, t, s): moves into s for window t minus moves out of it (in
        t + 1 for a state, in t for the hub, slot n_s)."""
        return np.asarray((f * width + (t - first)) * slots + s, dtype=np.int64)

    rows.append(flow(fn, win, np.where(real, dst, n_s)))
    colsl.append(cols)
    vals.append(np.ones(len(fn)))
    later = (win > first) & ~from_hub
    rows.append(flow(fn[later], win[later] - 1, src[later]))
    colsl.append(cols[later])
    vals.append(-np.ones(int(later.sum())))
    rows.append(flow(fn[from_hub], win[from_hub], np.full(int(from_hub.sum()), n_s)))
    colsl.append(cols[from_hub])
    vals.append(-np.ones(int(from_hub.sum())))
    n_flow = n_f * width * slots
    lo_flow = np.zeros(n_flow)
    hi_flow = np.zeros(n_flow)
    last_rows = flow(
        np.arange(n_f, dtype=np.int64)[:, None], stop - 1, np.arange(n_s, dtype=np.int64)[None, :]
    ).ravel()
    lo_flow[last_rows] = -np.inf
    hi_flow[last_rows] = np.inf
    lo.append(lo_flow)
    hi.append(hi_flow)
    offset += n_flow
    # one move out of the state before the range
    firsts = win == first
    rows.append(offset + fn[firsts])
    colsl.append(cols[firsts])
    vals.append(np.ones(int(firsts.sum())))
    lo.append(np.ones(n_f))
    hi.append(np.ones(n_f))
    offset += n_f
    # node budgets: (kind, n, t)
    nt = (win - first) * n_n + node[into]
    n_nt = width * n_n
    for kind, value in (
        (0, np.where(real, p.gpu_gb[fn, into], 0.0)),
        (1, np.where(real, p.host_gb[fn, into], 0.0)),
        (2, (hold_j + move_j) / dt),
    ):
        used = value != 0
        rows.append(offset + kind * n_nt + nt[used])
        colsl.append(cols[used])
        vals.append(value[used])
    offset += 3 * n_nt
    lo.append(np.full(3 * n_nt, -np.inf))
    hi.append(np.concatenate([np.tile(c, width) for c in (p.gpu_cap, p.host_cap, p.power_cap)]))
    # memory covers (formulations/cuts.py): per cover and window, at most ``most``
    # of its members held
    if cuts and len(p.covers):
        cov = p.covers
        member = cov.matrix.T.tocsr()[fn * n_s + into].tocoo()  # (columns, K)
        keep = real[member.row]
        col_idx, k_idx = member.row[keep], member.col[keep]
        rows.append(offset + k_idx * width + (win[col_idx] - first))
        colsl.append(cols[col_idx])
        vals.append(np.ones(len(col_idx)))
        lo.append(np.full(len(cov) * width, -np.inf))
        hi.append(np.repeat(cov.most, width))
        offset += len(cov) * width
    # SLO allowances
    with_slo = np.flatnonzero(np.isfinite(slo))
    slo_row = np.full(n_f, -1)
    slo_row[with_slo] = offset + np.arange(len(with_slo))
    pick = (late > 0) & (slo_row[fn] >= 0)
    rows.append(slo_row[fn[pick]])
    colsl.append(cols[pick])
    vals.append(late[pick])
    lo.append(np.full(len(with_slo), -np.inf))
    hi.append(np.maximum(slo[with_slo], 0.0))
    offset += len(with_slo)
    if np.isfinite(cold_allow):
        colds = p.arrivals[fn, win] * (cold[into] & real)
        pick = colds > 0
        rows.append(np.full(int(pick.sum()), offset))
        colsl.append(cols[pick])
        vals.append(colds[pick])
        lo.append(np.array([-np.inf]))
        hi.append(np.array([max(cold_allow, 0.0)]))
        offset += 1
    if math.isfinite(late_cap):
        pick = late > 0
        rows.append(np.full(int(pick.sum()), offset))
        colsl.append(cols[pick])
        vals.append(late[pick])
        lo.append(np.array([-np.inf]))
        hi.append(np.array([max(late_cap, 0.0)]))
        offset += 1
    matrix = sp.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(colsl))),
        shape=(offset, len(fn)),
    )
    return Milp(
        cost=cost,
        matrix=matrix,
        row_lo=np.concatenate(lo),
        row_hi=np.concatenate(hi),
        fn=fn,
        win=win,
        src=src,
        dst=dst,
        hub=hub,
    )


def highs_lp(milp: Milp) -> highspy.HighsLp:
    """The MILP as a HiGHS model (0/1 columns), as ``energyopt export`` writes it."""
    return binary_lp(milp.cost, milp.matrix, milp.row_lo, milp.row_hi)


def states_of(milp: Milp, values: FloatArray, n_functions: int, first: int, last: int) -> IntArray:
    """(F, last - first) states the 0/1 solution ``values`` moves into."""
    out = np.full((n_functions, last - first), -1, dtype=np.int64)
    chosen = np.flatnonzero((values > 0.5) & (milp.dst != milp.hub))
    out[milp.fn[chosen], milp.win[chosen] - first] = milp.dst[chosen]
    return out
