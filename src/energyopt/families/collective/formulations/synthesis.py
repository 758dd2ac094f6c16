"""Exact schedule synthesis for small topologies: a MILP over a time-expanded graph
(in the spirit of TACCL and TE-CCL; collective.md, section 4).

Rounds k = 0..K-1 are steps. Piece q may go from rank u to rank v in round k
(x[q,u,v,k], 0/1) only if u holds it at the start of the round (h[q,u,k]); v
holds it from the next round on. Every rank that must end with a piece holds it
after round K-1, and receives it at most once. Rank r is busy in round k for
T[r,k] >= O y[r,k] + (piece bytes / capacity of e) x (sends crossing e) for each
of its ports e (its NVLink port and NIC links, both directions), where y[r,k]
says r sends or receives in round k and O is the Simple protocol's step
overhead; the makespan M >= sum_k T[r,k] for every rank, and the schedule's time
is launch + M + the least route latency. Each rank runs its steps one after
another in the cost model's dataflow and every link is one rank's port, so this
relaxes the cost model at the Simple protocol and the max clock (no channel cap,
no reduction term, fair sharing replaced by the port's total load): the optimum
is a lower bound on the cost-model time of every schedule of K rounds of these
pieces. Copy collectives (all-gather, broadcast, all-to-all) are synthesized
directly; a reduce-scatter is the all-gather schedule reversed (each send turned
round, reducing, rounds in reverse order) and an all-reduce is that reduce-scatter
then the all-gather, as TACCL does.
"""

from __future__ import annotations

from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from energyopt.families.collective.formulations.constants import PROTOCOL_STEP_US
from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.spec import Choice, Collective, Transfer

MAX_RANKS = 8
"""Largest rank count the synthesis accepts (the MILP grows as pieces x n^2 x K)."""


@dataclass(frozen=True)
class Synthesis:
    """A synthesized schedule of one collective and what the MILP proved."""

    choice: Choice
    milp_us: float
    """The MILP's objective: the schedule's relaxed time (launch, least route
    latency and its rounds' step times at the max clock and the Simple protocol), us."""
    milp_bound_us: float
    """HiGHS' dual bound on it, us."""
    optimal: bool
    wall_s: float
    rounds: int
    """Rounds the schedule uses."""
    max_rounds: int
    """Rounds of the MILP (its optimum is over schedules of at most this many)."""


@dataclass(frozen=True)
class _Copy:
    pieces: int
    owner: list[int]
    need: list[list[int]]
    piece_bytes: float


def _copy_problem(p: CollectiveProblem, c: Collective) -> _Copy:
    n = p.n
    if c.op in ("all_gather", "reduce_scatter", "all_reduce"):
        return _Copy(
            n, list(range(n)), [[v for v in range(n) if v != q] for q in range(n)], c.bytes / n
        )
    if c.op == "broadcast":
        k = 2
        return _Copy(k, [c.root] * k, [[v for v in range(n) if v != c.root]] * k, c.bytes / k)
    owner = [s for s in range(n) for _ in range(n)]
    need = [[d] if d != s else [] for s in range(n) for d in range(n)]
    return _Copy(n * n, owner, need, c.bytes / n)


@dataclass(frozen=True)
class Milp:
    """The synthesis MILP of one collective and how to read its columns."""

    lp: highspy.HighsLp
    copy: _Copy
    pairs: list[tuple[int, int]]
    rounds: int


def _edge_rank(p: CollectiveProblem) -> dict[int, int]:
    """The rank whose port each directed edge is (every edge belongs to one GPU)."""
    rank_of = {g: r for r, g in enumerate(p.ranks)}
    out: dict[int, int] = {}
    for u, v, d in p.graph.edges(data=True):
        for end in (u, v):
            gpu = end.removesuffix(":nic")
            if gpu in rank_of:
                out[int(d["index"])] = rank_of[gpu]
    return out


def build_milp(p: CollectiveProblem, c: Collective, rounds: int) -> Milp:
    """The time-expanded MILP of ``c`` with ``rounds`` rounds. Its objective is the
    relaxed time of one run, us, the figure the solve's log reports for the
    collective: launch + the least route latency (the objective's constant) + the
    makespan M of the copy schedule (2 M for an all-reduce)."""
    n = p.n
    cp = _copy_problem(p, c)
    Q, K = cp.pieces, rounds
    pairs = [(u, v) for u in range(n) for v in range(n) if u != v]
    nx_ = Q * len(pairs) * K
    nh = Q * n * (K + 1)
    ny, nt = n * K, n * K

    def xi(q: int, e: int, k: int) -> int:
        return (q * len(pairs) + e) * K + k

    def hi(q: int, v: int, k: int) -> int:
        return nx_ + (q * n + v) * (K + 1) + k

    def yi(rank: int, k: int) -> int:
        return nx_ + nh + rank * K + k

    def ti(rank: int, k: int) -> int:
        return nx_ + nh + ny + rank * K + k

    mi = nx_ + nh + ny + nt
    ncol = mi + 1
    lo = np.zeros(ncol)
    up = np.ones(ncol)
    up[nx_ + nh + ny :] = np.inf
    for q in range(Q):
        for v in range(n):
            held = 1.0 if v == cp.owner[q] else 0.0
            lo[hi(q, v, 0)] = up[hi(q, v, 0)] = held
            if v in cp.need[q]:
                lo[hi(q, v, K)] = 1.0
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    rlo: list[float] = []
    rhi: list[float] = []
    r = 0

    def add(entries: list[tuple[int, float]], a: float, b: float) -> None:
        nonlocal r
        for col, val in entries:
            rows.append(r)
            cols.append(col)
            vals.append(val)
        rlo.append(a)
        rhi.append(b)
        r += 1

    into: dict[tuple[int, int], list[int]] = {}
    for e, (_u, v) in enumerate(pairs):
        into.setdefault((v, 0), []).append(e)
    for q in range(Q):
        for k in range(K):
            for e, (u, _v) in enumerate(pairs):
                add([(xi(q, e, k), 1.0), (hi(q, u, k), -1.0)], -np.inf, 0.0)
                add([(xi(q, e, k), 1.0), (yi(u, k), -1.0)], -np.inf, 0.0)
                add([(xi(q, e, k), 1.0), (yi(_v, k), -1.0)], -np.inf, 0.0)
            for v in range(n):
                add(
                    [(hi(q, v, k + 1), 1.0), (hi(q, v, k), -1.0)]
                    + [(xi(q, e, k), -1.0) for e in into[(v, 0)]],
                    -np.inf,
                    0.0,
                )
        for v in range(n):
            bound = 0.0 if v == cp.owner[q] else 1.0
            add([(xi(q, e, k), 1.0) for e in into[(v, 0)] for k in range(K)], -np.inf, bound)
    alpha = PROTOCOL_STEP_US["simple"]
    owner = _edge_rank(p)
    on_edge: dict[int, list[int]] = {}
    for e, (u, v) in enumerate(pairs):
        for edge in p.routes[u][v]:
            on_edge.setdefault(edge, []).append(e)
    for k in range(K):
        for edge, es in on_edge.items():
            coef = cp.piece_bytes / p.edge_gbs[edge] / 1e3
            rk = owner[edge]
            add(
                [(ti(rk, k), 1.0), (yi(rk, k), -alpha)]
                + [(xi(q, e, k), -coef) for q in range(Q) for e in es],
                0.0,
                np.inf,
            )
        for rk in range(n):
            add([(ti(rk, k), 1.0), (yi(rk, k), -alpha)], 0.0, np.inf)
    for rk in range(n):
        add([(mi, 1.0)] + [(ti(rk, k), -1.0) for k in range(K)], 0.0, np.inf)
    matrix = sp.csc_matrix((vals, (rows, cols)), shape=(r, ncol))
    lp = highspy.HighsLp()
    lp.num_col_ = ncol
    lp.num_row_ = r
    # the objective is the schedule's relaxed time as the solve reports it, us:
    # launch + least route latency + the makespan (twice for an all-reduce, its
    # reduce-scatter half mirrors the all-gather half this MILP schedules)
    cost = np.zeros(ncol)
    cost[mi] = 2.0 if c.op == "all_reduce" else 1.0
    lp.col_cost_ = cost
    lp.offset_ = p.rates.launch_us + p.least_route_us()
    lp.col_lower_ = lo
    lp.col_upper_ = up
    lp.row_lower_ = np.array(rlo)
    lp.row_upper_ = np.array(rhi)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = matrix.data.astype(np.float64)
    integ = [highspy.HighsVarType.kContinuous] * ncol
    for j in list(range(nx_)) + list(range(nx_ + nh, nx_ + nh + ny)):
        integ[j] = highspy.HighsVarType.kInteger
    lp.integrality_ = integ
    return Milp(lp, cp, pairs, K)


def decode_schedule(
    p: CollectiveProblem,
    c: Collective,
    name: str,
    milp: Milp,
    values: np.ndarray,
    objective: float,
    dual_bound: float,
    optimal: bool,
    wall_s: float,
) -> Synthesis:
    """The copy schedule that the MILP solution ``values`` states (``objective`` and
    ``dual_bound``: the solver's figures for it, in the MILP's units)."""
    n = p.n
    cp, pairs, K, Q = milp.copy, milp.pairs, milp.rounds, milp.copy.pieces
    nx_ = Q * len(pairs) * K

    def xi(q: int, e: int, k: int) -> int:
        return (q * len(pairs) + e) * K + k

    x = np.round(np.asarray(values)[:nx_])
    sent = [
        (k, u, v, q)
        for q in range(Q)
        for e, (u, v) in enumerate(pairs)
        for k in range(K)
        if x[xi(q, e, k)] > 0.5
    ]
    used = sorted({k for k, *_ in sent})
    renum = {k: i for i, k in enumerate(used)}
    k_used = len(used)
    ag = [(renum[k], u, v, q) for k, u, v, q in sent]
    if c.op == "reduce_scatter":
        transfers = [
            Transfer(step=k_used - 1 - k, src=v, dst=u, piece=q, reduce=True) for k, u, v, q in ag
        ]
    elif c.op == "all_reduce":
        transfers = [
            Transfer(step=k_used - 1 - k, src=v, dst=u, piece=q, reduce=True) for k, u, v, q in ag
        ]
        transfers += [Transfer(step=k_used + k, src=u, dst=v, piece=q) for k, u, v, q in ag]
    else:
        transfers = [Transfer(step=k, src=u, dst=v, piece=q) for k, u, v, q in ag]
    owner: tuple[int, ...] | None = None
    dest: tuple[int, ...] | None = None
    if c.op in ("all_gather", "all_to_all", "broadcast") and c.op != "broadcast":
        owner = tuple(cp.owner)
    if c.op == "reduce_scatter":
        dest = tuple(cp.owner)
    if c.op == "all_to_all":
        dest = tuple(d for _ in range(n) for d in range(n))
    choice = Choice(
        collective=name,
        algorithm="synthesized",
        protocol="simple",
        clock_mhz=p.gpu.max_sm_clock_mhz,
        pieces=Q,
        piece_owner=owner,
        piece_dest=dest,
        transfers=tuple(sorted(transfers, key=lambda t: (t.step, t.src, t.dst, t.piece))),
    )
    fixed = p.rates.launch_us + p.least_route_us()
    return Synthesis(
        choice=choice,
        milp_us=objective,
        milp_bound_us=dual_bound if np.isfinite(dual_bound) else fixed,
        optimal=optimal,
        wall_s=wall_s,
        rounds=k_used,
        max_rounds=K,
    )
