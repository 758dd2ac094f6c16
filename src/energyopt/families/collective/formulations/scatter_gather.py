"""Scatter-then-gather broadcasts, written as synthesized schedules (collective.md,
section 4, "Scatter-gather broadcasts").

Flat, on any ranks: the message is cut into ``parts`` pieces per rank other than
the root, each held by one of them; in step 0 the root sends every piece to its
holder, and in step 1 every holder sends its pieces to every other rank but the
root. The root's ports carry the message once and every other rank takes in the
message once, in two steps of overhead, where a tree or ring relays it over
log2(n) or n - 1 steps, and a direct broadcast sends it n - 1 times from the root.
With ``root_holds``, the root holds ``parts`` pieces of its own as well, which it
sends to every other rank in step 1: the root's ports are busy in both steps, and
every step carries (n - 1)/n of the message through each port instead of the
message and (n - 2)/(n - 1) of it.

By rail, on two or more equal nodes of at least 2 ranks: the pieces are spread
over the rails (local GPU indices) in proportion to ``weights``; in step 0 the
root sends every piece to its rail's rank of the root's node; in step 1 that rank
sends it to its rail's rank of every other node (NIC) and to the other ranks of
the root's node (NVLink); in step 2 each rail rank of the other nodes passes it to
the other ranks of its node. Every NIC of the root's node carries its rail's
share once per other node, and a slow NIC's rail less.

By rail, the root first (``root_first``): in step 0 the root sends every piece to
every other rank of its node (NVLink) and the pieces of its own rail to its rail's
rank of every other node (NIC); in step 1 every other rank of the root's node sends
its rail's pieces to its rail's rank of every other node; in step 2 the rail ranks
of the other nodes pass every piece on inside their nodes (all in one step: passing
the root's rail on in step 1 puts that flow in the step in which its receiver takes
in another rail's pieces over its NIC, and its next step waits for both: 50.8 us
against 47.1 on tiny-2x2). The root's rail crosses a step
earlier, so it may carry more (tiny-2x2 bc-1m: 48.39 -> 47.12 us with 7 of 10 pieces on the root's
rail, whose NIC is whole, and 3 on the rail whose NIC runs at 0.56).

The result is a ``synthesized`` ``Choice`` (one channel, one chunk, Simple at the
max clock: the caller picks those); the verifier executes its sends like any
other.
"""

from __future__ import annotations

from collections.abc import Sequence

from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.formulations.rail_direct import part_quota
from energyopt.families.collective.spec import Choice, Collective, Transfer


def by_rail_applicable(p: CollectiveProblem) -> bool:
    """The by-rail schedule exists: at least two nodes, all of the same number (at
    least 2) of ranks."""
    return p.n_nodes > 1 and p.uniform_nodes() and p.n // p.n_nodes > 1


def scatter_gather_choice(
    p: CollectiveProblem,
    c: Collective,
    name: str,
    parts: int,
    weights: Sequence[float] | None = None,
    by_rail: bool = False,
    root_holds: bool = False,
    root_first: bool = False,
) -> Choice:
    """The scatter-gather broadcast of ``c`` (module docstring), flat or
    ``by_rail`` (rails weighted by ``weights``, None: equal), ``parts`` pieces per
    holder (the root one of the holders where ``root_holds``, flat only), by rail
    with the root sending first where ``root_first``, as a synthesized ``Choice``;
    ValueError where it does not exist (not a broadcast, fewer than 2 ranks,
    ``parts`` < 1, by rail without equal nodes or with ``root_holds``, or
    ``root_first`` without ``by_rail``)."""
    if c.op != "broadcast" or p.n < 2:
        raise ValueError(f"{name}: a scatter-gather schedule is a broadcast over 2 ranks or more")
    if parts < 1:
        raise ValueError(f"{name}: parts must be at least 1, got {parts}")
    root = c.root
    transfers: list[Transfer] = []
    if root_first and not by_rail:
        raise ValueError(f"{name}: the root sends first in the by-rail scatter-gather only")
    if not by_rail:
        holders = [r for r in range(p.n) if r != root or root_holds]
        pieces = parts * len(holders)
        for q in range(pieces):
            h = holders[q % len(holders)]
            if h != root:
                transfers.append(Transfer(step=0, src=root, dst=h, piece=q))
            transfers.extend(
                Transfer(step=1, src=h, dst=r, piece=q) for r in range(p.n) if r not in (h, root)
            )
    elif root_holds:
        raise ValueError(f"{name}: the root holds pieces in the flat scatter-gather only")
    else:
        if not by_rail_applicable(p):
            raise ValueError(f"{name}: a by-rail scatter-gather needs two or more equal nodes")
        g = p.n // p.n_nodes
        quota = part_quota(g, parts, weights)
        rails = [lane for lane in range(g) for _ in range(int(quota[lane]))]
        pieces = len(rails)
        rank = {(p.node_of[r], p.local_of[r]): r for r in range(p.n)}
        home = p.node_of[root]
        for q, lane in enumerate(rails):
            head = rank[(home, lane)]
            if root_first:
                # the root's rail crosses in step 0, the others in step 1
                cross = 0 if head == root else 1
                transfers.extend(
                    Transfer(step=0, src=root, dst=rank[(home, j)], piece=q)
                    for j in range(g)
                    if rank[(home, j)] != root
                )
                for k in range(p.n_nodes):
                    if k == home:
                        continue
                    there = rank[(k, lane)]
                    transfers.append(Transfer(step=cross, src=head, dst=there, piece=q))
                    transfers.extend(
                        Transfer(step=2, src=there, dst=rank[(k, j)], piece=q)
                        for j in range(g)
                        if j != lane
                    )
                continue
            if head != root:
                transfers.append(Transfer(step=0, src=root, dst=head, piece=q))
            transfers.extend(
                Transfer(step=1, src=head, dst=rank[(home, j)], piece=q)
                for j in range(g)
                if j != lane and rank[(home, j)] != root
            )
            for k in range(p.n_nodes):
                if k == home:
                    continue
                there = rank[(k, lane)]
                transfers.append(Transfer(step=1, src=head, dst=there, piece=q))
                transfers.extend(
                    Transfer(step=2, src=there, dst=rank[(k, j)], piece=q)
                    for j in range(g)
                    if j != lane
                )
    return Choice(
        collective=name,
        algorithm="synthesized",
        protocol="simple",
        clock_mhz=p.gpu.max_sm_clock_mhz,
        pieces=pieces,
        transfers=tuple(sorted(transfers, key=lambda t: (t.step, t.src, t.dst, t.piece))),
    )
