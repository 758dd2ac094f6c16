"""The decode-merge decision of one model at one instant, and its MILP.

A *merge problem* is a model's decode instances that are up and not draining (the
candidates), the requests each holds, and what the merged instances must keep: the
observed rate with headroom (``need_rps``) against their SLO capacity. A *decision*
releases some candidates and moves each request of a released one into a kept one
(docs/formulations/serverless.md, "The merge MILP"). Its value, in the objective's
unit, is what the released instances would have cost until the epoch ends less the
price of the migrations:

    value = sum_{released i} h_i T  -  sum_{moved r -> j} (p_B B_r + p_S s_rj)

with h_i the objective per second of holding instance i (weights of a GPU-second
and of a joule times its GPUs and on power), T the seconds left in the epoch, B_r
the GB of KV cache request r moves (prompt + tokens so far), s_rj its stall (the
transfer over NVLink inside a node, the network across; no token meanwhile) and
p_B, p_S the prices of a GB and of a stalled second. A kept instance holds at most
its batch limit (``fill`` of its batch at SLO capacity: the TBT SLO) and its KV
budget; the kept capacity plus that of instances still loading covers ``need_rps``.

This module builds and decodes the MILP; ``families/serverless/solvers/merge.py`` solves it
and holds the priced greedy. Bytes B, seconds s, requests/s rps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from energyopt.backends.highs import binary_lp
from energyopt.families.serverless.formulations.model import FloatArray, IntArray
from energyopt.formulations.sparse_rows import SparseRows
from energyopt.perf.kvtransfer import Link

GB = 1e9
"""KV bytes enter the MILP's rows in GB (coefficients near 1)."""
KV_MARGIN_BYTES = 1e3
"""A merge fills a KV budget to at most this less (the MILP's row tolerance, 1e-6 GB,
never takes a kept instance over it; the greedy keeps the same margin)."""


@dataclass(frozen=True)
class DecodeFigures:
    """What a merge decision needs of one (model, option) decode instance: its SLO
    capacity (rps), the batch it runs at that capacity, its KV budget (B) and the
    objective per second of holding it (file's unit per s)."""

    capacity_rps: float
    batch_at_capacity: float
    kv_budget_bytes: float
    held_per_s: float


@dataclass(frozen=True)
class MergeRequest:
    """A request on a decode instance: id, the KV bytes its admission reserved
    (prompt + output: what counts against a budget) and the bytes a migration moves
    now (prompt + tokens so far)."""

    rid: int
    kv_bytes: float
    move_bytes: float


@dataclass(frozen=True)
class Snapshot:
    """A decode instance as the scheduler sees it at a merge point: name, node index,
    option index and its requests."""

    name: str
    node: int
    option: int
    requests: tuple[MergeRequest, ...]


@dataclass(frozen=True)
class MergeProblem:
    """Candidates i = 0..I-1 of one model (arrays of length I) and the merge's terms."""

    names: tuple[str, ...]
    node: IntArray
    capacity_rps: FloatArray
    kv_budget_bytes: FloatArray
    batch_limit: IntArray
    """Most requests a kept instance may hold after the merge."""
    held_per_s: FloatArray
    requests: tuple[tuple[MergeRequest, ...], ...]
    need_rps: float
    other_capacity_rps: float
    """Capacity of the model's instances that are not candidates (still loading), rps."""
    remaining_s: float
    price_per_gb: float
    price_per_stall_s: float
    links: tuple[Link, Link]
    """(nvlink, network): the link of a migration inside a node and across nodes."""

    @property
    def size(self) -> int:
        return len(self.names)

    @property
    def n_requests(self) -> int:
        return sum(len(r) for r in self.requests)

    def freed(self, i: int) -> float:
        """Objective saved by releasing candidate i now (held until the epoch ends)."""
        return float(self.held_per_s[i]) * max(self.remaining_s, 0.0)

    def move_cost(self, i: int, req: MergeRequest, j: int) -> float:
        """Price of migrating ``req`` from candidate i into candidate j."""
        link = self.links[0 if int(self.node[i]) == int(self.node[j]) else 1]
        stall = link.transfer_s(req.move_bytes)
        return self.price_per_gb * req.move_bytes / GB + self.price_per_stall_s * stall

    def kv_room(self, j: int) -> float:
        """KV bytes candidate j may still take in (its budget less its requests' and
        ``KV_MARGIN_BYTES``; negative: none)."""
        held = sum(r.kv_bytes for r in self.requests[j])
        return float(self.kv_budget_bytes[j]) - held - KV_MARGIN_BYTES

    def spare_rps(self) -> float:
        """Capacity above ``need_rps`` with every candidate kept (negative: short)."""
        return self.other_capacity_rps + float(self.capacity_rps.sum()) - self.need_rps


@dataclass(frozen=True)
class MergeDecision:
    """Candidates released (indices) and every moved request's destination index."""

    released: frozenset[int]
    moves: Mapping[int, int]


NO_MERGE = MergeDecision(frozenset(), {})


def merge_problem(
    snapshots: Sequence[Snapshot],
    figures: Mapping[int, DecodeFigures],
    *,
    need_rps: float,
    other_capacity_rps: float,
    remaining_s: float,
    fill: float | None,
    max_batch: int,
    price_per_gb: float,
    price_per_stall_s: float,
    links: tuple[Link, Link],
) -> MergeProblem:
    """The merge problem of a model's candidates from the decode figures of their
    options (by option index); ``fill`` None: the batch limit is ``max_batch`` (a
    merge the plan forces), else ``max(1, floor(fill * batch at capacity))`` within it."""

    def limit(f: DecodeFigures) -> int:
        if fill is None:
            return max_batch
        return min(max_batch, max(1, math.floor(fill * f.batch_at_capacity)))

    figs = [figures[s.option] for s in snapshots]
    return MergeProblem(
        names=tuple(s.name for s in snapshots),
        node=np.array([s.node for s in snapshots], dtype=np.int64),
        capacity_rps=np.array([f.capacity_rps for f in figs], dtype=np.float64),
        kv_budget_bytes=np.array([f.kv_budget_bytes for f in figs], dtype=np.float64),
        batch_limit=np.array([limit(f) for f in figs], dtype=np.int64),
        held_per_s=np.array([f.held_per_s for f in figs], dtype=np.float64),
        requests=tuple(s.requests for s in snapshots),
        need_rps=need_rps,
        other_capacity_rps=other_capacity_rps,
        remaining_s=remaining_s,
        price_per_gb=price_per_gb,
        price_per_stall_s=price_per_stall_s,
        links=links,
    )


def merge_value(p: MergeProblem, d: MergeDecision) -> float:
    """The decision's value (objective saved less migration prices, file's unit)."""
    holder = {r.rid: (i, r) for i, reqs in enumerate(p.requests) for r in reqs}
    value = sum(p.freed(i) for i in d.released)
    for rid, j in d.moves.items():
        i, req = holder[rid]
        value -= p.move_cost(i, req, j)
    return value


def merge_violations(p: MergeProblem, d: MergeDecision) -> list[str]:
    """Why a decision is not a merge of ``p`` (empty: it is one): every request of a
    released candidate moves to a kept one, no other request moves, each kept one
    stays within its batch limit and KV budget (less ``KV_MARGIN_BYTES``), and the
    kept capacity covers the need."""
    bad: list[str] = []
    kept = [i for i in range(p.size) if i not in d.released]
    holder = {r.rid: i for i, reqs in enumerate(p.requests) for r in reqs}
    count = [len(p.requests[i]) for i in range(p.size)]
    used = [sum(r.kv_bytes for r in p.requests[i]) for i in range(p.size)]
    kv = {r.rid: r.kv_bytes for reqs in p.requests for r in reqs}
    for i in d.released:
        for r in p.requests[i]:
            if r.rid not in d.moves:
                bad.append(f"request {r.rid} of released {p.names[i]} is not moved")
    for rid, j in d.moves.items():
        if rid not in holder:
            bad.append(f"request {rid} is held by no candidate")
            continue
        if holder[rid] not in d.released:
            bad.append(f"request {rid} moves off kept {p.names[holder[rid]]}")
        if j in d.released or not 0 <= j < p.size:
            bad.append(f"request {rid} moves to {j}, not a kept candidate")
            continue
        count[j] += 1
        used[j] += kv[rid]
    for j in kept:
        if count[j] > max(int(p.batch_limit[j]), len(p.requests[j])):
            bad.append(f"{p.names[j]}: {count[j]} requests, over its limit {p.batch_limit[j]}")
        budget = max(
            float(p.kv_budget_bytes[j]) - KV_MARGIN_BYTES, sum(r.kv_bytes for r in p.requests[j])
        )
        if used[j] > budget * (1 + 1e-9):
            bad.append(f"{p.names[j]}: {used[j] / GB:.3f} GB of KV, over {budget / GB:.3f} GB")
    kept_cap = p.other_capacity_rps + float(p.capacity_rps[kept].sum())
    if d.released and kept_cap < p.need_rps - 1e-9:
        bad.append(f"kept capacity {kept_cap:.4g} rps is under the need {p.need_rps:.4g} rps")
    return bad


@dataclass(frozen=True)
class MergeMilp:
    """The merge MILP: columns y_i (candidate i released), i = 0..I-1, then x_q for
    each (request, destination) pair q: ``pair_rid[q]`` from ``pair_from[q]`` to
    ``pair_to[q]``; minimise ``cost`` (= -value) over the rows."""

    cost: FloatArray
    matrix: sp.csc_matrix
    row_lo: FloatArray
    row_hi: FloatArray
    pair_rid: IntArray
    pair_from: IntArray
    pair_to: IntArray

    def __len__(self) -> int:
        return int(self.cost.shape[0])


def build_merge_milp(p: MergeProblem) -> MergeMilp:
    """Rows (docs/formulations/serverless.md):

    * each request of candidate i moves once iff i is released: sum_j x_rj = y_i;
    * it moves only into a kept one: x_rj + y_j <= 1;
    * batch: sum_r x_rj <= (L_j - n_j)^+ (1 - y_j);
    * KV: sum_r k_r x_rj <= (K_j - kv_j)^+ (1 - y_j) (GB);
    * capacity: sum_i c_i y_i <= spare (the capacity above the need with all kept).

    A pair (r, j) is a column only where r fits into j alone (by count and KV)."""
    n = p.size
    slots = [max(int(p.batch_limit[j]) - len(p.requests[j]), 0) for j in range(n)]
    room = [max(p.kv_room(j) / GB, 0.0) for j in range(n)]
    cost = [-p.freed(i) for i in range(n)]
    rid, src, dst = [], [], []
    for i in range(n):
        for r in p.requests[i]:
            for j in range(n):
                if j != i and slots[j] >= 1 and r.kv_bytes / GB <= room[j] + 1e-12:
                    rid.append(r.rid)
                    src.append(i)
                    dst.append(j)
                    cost.append(p.move_cost(i, r, j))
    kv_of = {r.rid: r.kv_bytes / GB for reqs in p.requests for r in reqs}
    rows = SparseRows()
    row = rows.add

    by_rid: dict[int, list[int]] = {}
    by_dst: dict[int, list[int]] = {j: [] for j in range(n)}
    for q in range(len(rid)):
        by_rid.setdefault(rid[q], []).append(n + q)
        by_dst[dst[q]].append(n + q)
    for i in range(n):
        for r in p.requests[i]:
            row([(c, 1.0) for c in by_rid.get(r.rid, [])] + [(i, -1.0)], 0.0, 0.0)
    for q in range(len(rid)):
        row([(n + q, 1.0), (dst[q], 1.0)], -np.inf, 1.0)
    for j in range(n):
        if by_dst[j]:
            row([*((c, 1.0) for c in by_dst[j]), (j, float(slots[j]))], -np.inf, slots[j])
            kv_row = [(c, kv_of[rid[c - n]]) for c in by_dst[j]]
            row([*kv_row, (j, room[j])], -np.inf, room[j])
    row([(i, float(p.capacity_rps[i])) for i in range(n)], -np.inf, p.spare_rps())
    width = n + len(rid)
    matrix = rows.matrix(width)
    return MergeMilp(
        cost=np.array(cost, dtype=np.float64),
        matrix=matrix,
        row_lo=rows.lower(),
        row_hi=rows.upper(),
        pair_rid=np.array(rid, dtype=np.int64),
        pair_from=np.array(src, dtype=np.int64),
        pair_to=np.array(dst, dtype=np.int64),
    )


def merge_highs_lp(milp: MergeMilp) -> highspy.HighsLp:
    """The merge MILP as a HiGHS model (every column binary)."""
    return binary_lp(milp.cost, milp.matrix, milp.row_lo, milp.row_hi)


def decision_of(p: MergeProblem, milp: MergeMilp, values: FloatArray) -> MergeDecision:
    """The decision of the MILP's column values (rounded to 0/1)."""
    n = p.size
    released = frozenset(i for i in range(n) if values[i] > 0.5)
    moves = {
        int(milp.pair_rid[q]): int(milp.pair_to[q])
        for q in range(len(milp.pair_rid))
        if values[n + q] > 0.5
    }
    return MergeDecision(released, moves)
