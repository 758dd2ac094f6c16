"""Rail-direct schedules over several nodes, written as synthesized schedules
(collective.md, section 4, "Rail-direct schedules").

An all-gather over N equal nodes of g ranks. Every rank's block is cut into
``parts`` equal pieces and each piece is given a rail (a local GPU index) that
carries it across nodes. In step 0 every rank sends its own pieces to every other
rank of its node over NVLink and, at the same time, the pieces of its own rail to
the rank of its rail in every other node over its NIC. A piece of another rail
crosses in step 1, from the rail's rank of the owner's node (which received it in
step 0). A rank that received a piece over its NIC passes it to the other ranks
of its node in the next step. So the NVLink gather and the first crossing share
one step, where ``hierarchical_direct`` runs them one after the other; rails are
loaded in proportion to ``weights`` (a degraded NIC or a straggler's rail carries
less), the pieces of a rank staying on its own rail as far as its rail's share
allows.

The rail exchange is an all-reduce in three steps: the message is cut into pieces,
each given a rail (in proportion to ``weights``); in step 0 every rank of a node
sends its input of a piece to the node's rank of the piece's rail, which reduces
them; in step 1 the rail's ranks of all nodes exchange those node sums, each
reducing the N - 1 it receives (their rank sets are the nodes, disjoint); in step 2
each sends the full sum to the other ranks of its node. One crossing per piece
instead of the two of reduce-scatter then all-gather, at N - 1 times the bytes on
the NICs: the better for small messages.

A reduce-scatter is that all-gather reversed (every send turned round and
reducing, steps in reverse order: each rank receives a piece at most once in the
all-gather, so the reversal is a reduction tree into the piece's owner), and an
all-reduce is the reduce-scatter then the all-gather, as the synthesis MILP's
schedules are. The result is a ``synthesized`` ``Choice``: the verifier executes
its sends symbolically like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from energyopt.families.collective.formulations.model import CollectiveProblem, IntArray
from energyopt.families.collective.spec import Choice, Collective, Op, Transfer

RAIL_DIRECT_OPS: tuple[Op, ...] = ("all_gather", "reduce_scatter", "all_reduce")
"""The ops a rail-direct schedule exists for."""


def applicable(p: CollectiveProblem, op: Op) -> bool:
    """A rail-direct schedule exists: an all-gather, reduce-scatter or all-reduce on
    at least two nodes, every node with the same number (at least 2) of ranks."""
    return op in RAIL_DIRECT_OPS and p.n_nodes > 1 and p.uniform_nodes() and p.n // p.n_nodes > 1


def rail_of_pieces(
    p: CollectiveProblem, parts: int, weights: Sequence[float] | None
) -> tuple[list[int], list[int]]:
    """(owner, rail) of every piece: ``parts`` pieces per rank, node by node; each
    node's g x parts pieces are spread over the rails in proportion to ``weights``
    (one share per local index, None: equal), each rank's own rail first."""
    g = p.n // p.n_nodes
    quota = part_quota(g, parts, weights)
    rank = {(p.node_of[r], p.local_of[r]): r for r in range(p.n)}
    owner: list[int] = []
    rail: list[int] = []
    for k in range(p.n_nodes):
        left = quota.copy()
        assign: list[list[int]] = []
        for i in range(g):
            take = int(min(parts, left[i]))
            assign.append([i] * take)
            left[i] -= take
        for i in range(g):
            while len(assign[i]) < parts:
                lane = int(np.argmax(left))
                assign[i].append(lane)
                left[lane] -= 1
        for i in range(g):
            for lane in assign[i]:
                owner.append(rank[(k, i)])
                rail.append(lane)
    return owner, rail


def part_quota(g: int, parts: int, weights: Sequence[float] | None) -> IntArray:
    """Pieces per rail of ``g * parts`` in proportion to ``weights`` (largest
    remainders; None: equal)."""
    w = np.full(g, 1.0 / g) if weights is None else np.asarray(weights, dtype=np.float64)
    if len(w) != g or np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"rail weights: need {g} non-negative shares, got {list(w)}")
    share = w / w.sum() * g * parts
    quota: IntArray = np.floor(share).astype(np.int64)
    order = np.argsort(-(share - quota), kind="stable")
    for i in order[: g * parts - int(quota.sum())]:
        quota[i] += 1
    return quota


def rail_exchange_choice(
    p: CollectiveProblem,
    c: Collective,
    name: str,
    parts: int,
    weights: Sequence[float] | None = None,
) -> Choice:
    """The rail exchange all-reduce of ``c`` (module docstring) with ``g * parts``
    pieces spread over the rails by ``weights``, as a synthesized ``Choice`` (one
    channel, one chunk, Simple at the max clock); ValueError where it does not
    exist (an all-reduce on at least two equal nodes of at least 2 ranks)."""
    if c.op != "all_reduce" or not applicable(p, c.op):
        raise ValueError(
            f"{name}: a rail exchange needs an all-reduce on at least two equal nodes of at "
            "least 2 ranks"
        )
    if parts < 1:
        raise ValueError(f"{name}: parts must be at least 1, got {parts}")
    g = p.n // p.n_nodes
    quota = part_quota(g, parts, weights)
    rails = [lane for lane in range(g) for _ in range(int(quota[lane]))]
    rank = {(p.node_of[r], p.local_of[r]): r for r in range(p.n)}
    transfers: list[Transfer] = []
    for q, lane in enumerate(rails):
        for a in range(p.n_nodes):
            head = rank[(a, lane)]
            others = [rank[(a, j)] for j in range(g) if j != lane]
            transfers.extend(
                Transfer(step=0, src=r, dst=head, piece=q, reduce=True) for r in others
            )
            transfers.extend(
                Transfer(step=1, src=rank[(b, lane)], dst=head, piece=q, reduce=True)
                for b in range(p.n_nodes)
                if b != a
            )
            transfers.extend(Transfer(step=2, src=head, dst=r, piece=q) for r in others)
    return Choice(
        collective=name,
        algorithm="synthesized",
        protocol="simple",
        clock_mhz=p.gpu.max_sm_clock_mhz,
        pieces=len(rails),
        transfers=tuple(sorted(transfers, key=lambda t: (t.step, t.src, t.dst, t.piece))),
    )


def all_gather_sends(
    p: CollectiveProblem, owner: Sequence[int], rail: Sequence[int]
) -> list[tuple[int, int, int, int]]:
    """The rail-direct all-gather's sends (step, src, dst, piece) of pieces with
    these owners and rails."""
    g = p.n // p.n_nodes
    rank = {(p.node_of[r], p.local_of[r]): r for r in range(p.n)}
    out: list[tuple[int, int, int, int]] = []
    for q, (o, lane) in enumerate(zip(owner, rail, strict=True)):
        a, i = p.node_of[o], p.local_of[o]
        out.extend((0, o, rank[(a, j)], q) for j in range(g) if j != i)
        cross = 0 if lane == i else 1
        for b in range(p.n_nodes):
            if b == a:
                continue
            out.append((cross, rank[(a, lane)], rank[(b, lane)], q))
            out.extend((cross + 1, rank[(b, lane)], rank[(b, j)], q) for j in range(g) if j != lane)
    return out


def rail_direct_choice(
    p: CollectiveProblem,
    c: Collective,
    name: str,
    parts: int,
    weights: Sequence[float] | None = None,
) -> Choice:
    """The rail-direct schedule of ``c`` as a synthesized ``Choice`` (one channel, one
    chunk, the Simple protocol at the max clock: the caller picks those);
    ValueError where ``applicable`` is false or ``parts`` < 1."""
    if not applicable(p, c.op):
        raise ValueError(
            f"{name}: a rail-direct schedule needs an all-gather, reduce-scatter or all-reduce "
            "on at least two equal nodes of at least 2 ranks"
        )
    if parts < 1:
        raise ValueError(f"{name}: parts must be at least 1, got {parts}")
    owner, rail = rail_of_pieces(p, parts, weights)
    sends = all_gather_sends(p, owner, rail)
    last = max(s for s, *_ in sends)
    if c.op == "all_gather":
        transfers = [Transfer(step=s, src=a, dst=b, piece=q) for s, a, b, q in sends]
    else:
        transfers = [
            Transfer(step=last - s, src=b, dst=a, piece=q, reduce=True) for s, a, b, q in sends
        ]
        if c.op == "all_reduce":
            transfers += [
                Transfer(step=last + 1 + s, src=a, dst=b, piece=q) for s, a, b, q in sends
            ]
    return Choice(
        collective=name,
        algorithm="synthesized",
        protocol="simple",
        clock_mhz=p.gpu.max_sm_clock_mhz,
        pieces=len(owner),
        piece_owner=tuple(owner) if c.op == "all_gather" else None,
        piece_dest=tuple(owner) if c.op == "reduce_scatter" else None,
        transfers=tuple(sorted(transfers, key=lambda t: (t.step, t.src, t.dst, t.piece))),
    )
