"""The keep-alive MILP over a range of windows: one unit of flow per function
through its states x windows network, coupled by the node budgets, the SLOs and
the cold-start cap.

Column x[f, t, a, b] = 1 when function f moves from state a (in window t - 1, or
its given state before the range) to state b for window t. Rows:

- flow: one move out of the state before the range; in every later window the
  moves into a state equal the moves out of it;
- per node n and window t: GPU memory, host memory and average power (the held
  states' power, their requests' service and start energy, and the energy of the
  moves into them, over the window) within the node's budget;
- per function with an SLO: requests arriving in a state slower than the SLO at
  most the function's remaining allowance;
- with a cap: requests arriving in a cold state at most the remaining allowance.

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
from energyopt.formulations.keepalive.model import FloatArray, IntArray, KeepAliveProblem

FORMULATION_NAME = "keep-alive arc-flow MILP (states x windows, node budgets, SLO, cold cap)"


@dataclass(frozen=True)
class Milp:
    """The program's arrays; column j moves function ``fn[j]`` from ``src[j]`` to
    ``dst[j]`` for window ``win[j]``."""

    cost: FloatArray
    matrix: sp.csc_matrix
    row_lo: FloatArray
    row_hi: FloatArray
    fn: IntArray
    win: IntArray
    src: IntArray
    dst: IntArray

    def __len__(self) -> int:
        return len(self.cost)


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
) -> Milp:
    """The MILP of windows ``first`` .. ``last - 1`` (default all), each function
    starting from ``start`` (default: nothing kept), with ``slo_left`` late requests
    per function and ``cold_left`` cold starts allowed (default: the whole horizon's).
    ``minimise`` "late": the objective is the requests starting later than their
    function's limit (the throughput objective's first stage); ``late_cap``: at most
    that many such requests over all functions (its second stage)."""
    stop = p.n_windows if last is None else last
    init = np.full(p.n_functions, p.source_state, dtype=np.int64) if start is None else start
    slo = p.slo_budget if slo_left is None else slo_left
    cold_allow = p.cold_cap if cold_left is None else cold_left
    n_s, n_n, dt = p.n_states, p.n_nodes, p.window_s
    node = p.node_of()
    cold = p.is_cold()
    fn_l, win_l, src_l, dst_l = [], [], [], []
    for f in range(p.n_functions):
        states = np.flatnonzero(p.allowed[f])
        grid_a, grid_b = np.meshgrid(states, states, indexing="ij")
        a_all, b_all = grid_a.ravel(), grid_b.ravel()
        keep = np.isfinite(p.trans_j[f, a_all, b_all])
        pair_a, pair_b = a_all[keep], b_all[keep]
        for t in range(first, stop):
            if t == first:
                b0 = states[np.isfinite(p.trans_j[f, init[f], states])]
                a, b = np.full(len(b0), init[f]), b0
            else:
                a, b = pair_a, pair_b
            fn_l.append(np.full(len(a), f))
            win_l.append(np.full(len(a), t))
            src_l.append(a)
            dst_l.append(b)
    fn = np.concatenate(fn_l).astype(np.int64)
    win = np.concatenate(win_l).astype(np.int64)
    src = np.concatenate(src_l).astype(np.int64)
    dst = np.concatenate(dst_l).astype(np.int64)
    cols = np.arange(len(fn))
    move_j = p.trans_j[fn, src, dst]
    hold_j = p.state_j[fn, win, dst]
    late = p.arrivals[fn, win] * p.slow[fn, dst]
    cost = move_j + hold_j if minimise == "energy" else late
    width = stop - first
    n_f = p.n_functions
    rows: list[IntArray] = []
    colsl: list[IntArray] = []
    vals: list[FloatArray] = []
    lo: list[FloatArray] = []
    hi: list[FloatArray] = []
    offset = 0

    def flow(f: IntArray, t: IntArray | int, s: IntArray) -> IntArray:
        """Flow row (f, t, s): moves into s for window t minus moves out of it in t + 1."""
        return np.asarray((f * width + (t - first)) * n_s + s, dtype=np.int64)

    rows.append(flow(fn, win, dst))
    colsl.append(cols)
    vals.append(np.ones(len(fn)))
    later = win > first
    rows.append(flow(fn[later], win[later] - 1, src[later]))
    colsl.append(cols[later])
    vals.append(-np.ones(int(later.sum())))
    n_flow = n_f * width * n_s
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
    nt = (win - first) * n_n + node[dst]
    n_nt = width * n_n
    for kind, value in (
        (0, p.gpu_gb[fn, dst]),
        (1, p.host_gb[fn, dst]),
        (2, (hold_j + move_j) / dt),
    ):
        used = value != 0
        rows.append(offset + kind * n_nt + nt[used])
        colsl.append(cols[used])
        vals.append(value[used])
    offset += 3 * n_nt
    lo.append(np.full(3 * n_nt, -np.inf))
    hi.append(np.concatenate([np.tile(c, width) for c in (p.gpu_cap, p.host_cap, p.power_cap)]))
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
        colds = p.arrivals[fn, win] * cold[dst]
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
    )


def highs_lp(milp: Milp) -> highspy.HighsLp:
    """The MILP as a HiGHS model (0/1 columns), as ``energyopt export`` writes it."""
    return binary_lp(milp.cost, milp.matrix, milp.row_lo, milp.row_hi)


def states_of(milp: Milp, values: FloatArray, n_functions: int, first: int, last: int) -> IntArray:
    """(F, last - first) states the 0/1 solution ``values`` moves into."""
    out = np.full((n_functions, last - first), -1, dtype=np.int64)
    chosen = np.flatnonzero(values > 0.5)
    out[milp.fn[chosen], milp.win[chosen] - first] = milp.dst[chosen]
    return out
