"""The candidate schedules as programs: ring, double binary tree, recursive
halving-doubling, hierarchical (inside nodes, then across, then inside; with rings
or all-pairs steps inside nodes), direct,
and a synthesized schedule's own sends; each over ``channels`` parallel copies
(rings and hierarchical phases rotated per channel so they use different links).

Positions 0..n-1 are the places of the algorithm; ``order[pos]`` is the rank there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from energyopt.families.collective.formulations.program import (
    NONE,
    IntArray,
    Program,
    concat_steps,
    parallel,
    sends,
)
from energyopt.families.collective.spec import Algorithm, Choice, Op

Rows = list[tuple[int, int, int, int]]


class NotApplicable(ValueError):
    """The algorithm has no schedule for this collective or rank count."""


def applicable(algorithm: Algorithm, op: Op, n: int, node_sizes: Sequence[int]) -> bool:
    """Whether ``algorithm`` has a schedule for ``op`` over ``n`` ranks in nodes of
    ``node_sizes`` ranks (node-major)."""
    if algorithm == "synthesized":
        return False
    if algorithm == "ring":
        return op != "all_to_all"
    if algorithm == "tree":
        return op in ("all_reduce", "broadcast")
    if algorithm == "halving_doubling":
        return op == "broadcast" or (op != "all_to_all" and n & (n - 1) == 0)
    if algorithm == "hierarchical":
        return len(node_sizes) > 1 and len(set(node_sizes)) == 1 and op != "all_to_all"
    if algorithm == "hierarchical_direct":
        return (
            len(node_sizes) > 1
            and len(set(node_sizes)) == 1
            and op in ("all_reduce", "reduce_scatter", "all_gather")
        )
    return True  # direct


def _full(op: Op, n: int, pieces: int) -> Program:
    frac = np.full(pieces, 1.0 / pieces)
    none = np.full(pieces, NONE, dtype=np.int64)
    return Program(op, n, frac, none.copy(), none.copy(), ())


def _with(prog: Program, steps: tuple[IntArray, ...], **arrays: IntArray) -> Program:
    return Program(
        prog.op,
        prog.n,
        prog.frac,
        arrays.get("owner", prog.owner),
        arrays.get("dest", prog.dest),
        steps,
    )


def _ring_rs(pos: Sequence[int], pieces: Sequence[int]) -> tuple[IntArray, ...]:
    """Ring reduce-scatter over ranks ``pos`` of pieces (pieces[i] ends at pos[i])."""
    k = len(pos)
    return tuple(
        sends([(pos[i], pos[(i + 1) % k], pieces[(i - s - 1) % k], 1) for i in range(k)])
        for s in range(k - 1)
    )


def _ring_ag(pos: Sequence[int], pieces: Sequence[int]) -> tuple[IntArray, ...]:
    """Ring all-gather over ranks ``pos``, pieces[i] starting at pos[i]."""
    k = len(pos)
    return tuple(
        sends([(pos[i], pos[(i + 1) % k], pieces[(i - s) % k], 0) for i in range(k)])
        for s in range(k - 1)
    )


def ring(op: Op, order: Sequence[int], root: int) -> Program:
    n = len(order)
    o = list(order)
    if op == "broadcast":
        r = o.index(root)
        o = o[r:] + o[:r]
        base = _full(op, n, 1)
        return _with(base, tuple(sends([(o[i], o[i + 1], 0, 0)]) for i in range(n - 1)))
    base = _full(op, n, n)
    pieces = list(range(n))
    at = np.array(o, dtype=np.int64)
    if op == "all_gather":
        return _with(base, _ring_ag(o, pieces), owner=at)
    if op == "reduce_scatter":
        return _with(base, _ring_rs(o, pieces), dest=at)
    if op == "all_reduce":
        return _with(base, concat_steps(_ring_rs(o, pieces), _ring_ag(o, pieces)))
    raise NotApplicable(f"ring has no {op}")


def _heap_levels(o: Sequence[int]) -> list[list[tuple[int, int]]]:
    """(child, parent) rank pairs of a binary heap over ``o``, deepest level first."""
    n = len(o)
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[(i - 1) // 2] + 1
    top = max(depth)
    return [
        [(o[i], o[(i - 1) // 2]) for i in range(1, n) if depth[i] == d] for d in range(top, 0, -1)
    ]


def _tree_orders(order: Sequence[int], leaves_last: int) -> tuple[list[int], list[int]]:
    """The two trees' orders: the second reverses the first except its last
    ``leaves_last`` positions, so those ranks are leaves of both trees."""
    o = list(order)
    keep = o[len(o) - leaves_last :] if leaves_last else []
    rest = o[: len(o) - leaves_last]
    return o, rest[::-1] + keep


def tree(op: Op, order: Sequence[int], root: int, leaves_last: int = 0) -> Program:
    n = len(order)
    if op == "broadcast":
        o = [root] + [r for r in order if r != root]
        t1, t2 = o, [root, *o[1:][::-1]]
    else:
        t1, t2 = _tree_orders(order, leaves_last)
    base = _full(op, n, 2)
    lv = [_heap_levels(t1), _heap_levels(t2)]
    if op == "all_reduce":
        up = tuple(
            sends([(c, p, t, 1) for t in (0, 1) for c, p in lv[t][d]]) for d in range(len(lv[0]))
        )
        down = tuple(
            sends([(p, c, t, 0) for t in (0, 1) for c, p in lv[t][d]])
            for d in range(len(lv[0]) - 1, -1, -1)
        )
        return _with(base, concat_steps(up, down))
    if op == "broadcast":
        down = tuple(
            sends([(p, c, t, 0) for t in (0, 1) for c, p in lv[t][d]])
            for d in range(len(lv[0]) - 1, -1, -1)
        )
        return _with(base, down)
    raise NotApplicable(f"tree has no {op}")


def _halving(o: Sequence[int]) -> tuple[IntArray, ...]:
    """Recursive halving reduce-scatter: piece i ends at position i."""
    n = len(o)
    bits = n.bit_length() - 1
    steps = []
    for k in range(bits):
        d = n >> (k + 1)
        rows: Rows = []
        for i in range(n):
            j = i ^ d
            hi = ~((n >> k) - 1)  # bits decided before this step
            for piece in range(n):
                if (piece & hi) == (i & hi) and (piece & d) == (j & d):
                    rows.append((o[i], o[j], piece, 1))
        steps.append(sends(rows))
    return tuple(steps)


def _doubling(o: Sequence[int]) -> tuple[IntArray, ...]:
    """Recursive doubling all-gather: piece i starts at position i."""
    n = len(o)
    steps = []
    for k in range(n.bit_length() - 1):
        d = 1 << k
        low = d - 1
        rows: Rows = []
        for i in range(n):
            j = i ^ d
            for piece in range(n):
                if (piece & ~low) == (i & ~low):
                    rows.append((o[i], o[j], piece, 0))
        steps.append(sends(rows))
    return tuple(steps)


def halving_doubling(op: Op, order: Sequence[int], root: int) -> Program:
    n = len(order)
    if op == "broadcast":
        o = [root] + [r for r in order if r != root]
        base = _full(op, n, 1)
        steps = []
        k = 1
        while k < n:
            steps.append(sends([(o[i], o[i + k], 0, 0) for i in range(k) if i + k < n]))
            k *= 2
        return _with(base, tuple(steps))
    if n & (n - 1):
        raise NotApplicable("halving-doubling needs a power-of-two rank count")
    base = _full(op, n, n)
    at = np.array(order, dtype=np.int64)
    if op == "all_gather":
        return _with(base, _doubling(order), owner=at)
    if op == "reduce_scatter":
        return _with(base, _halving(order), dest=at)
    if op == "all_reduce":
        return _with(base, concat_steps(_halving(order), _doubling(order)))
    raise NotApplicable(f"halving-doubling has no {op}")


def direct(op: Op, order: Sequence[int], root: int) -> Program:
    n = len(order)
    ranks = list(range(n))
    if op == "broadcast":
        base = _full(op, n, 1)
        return _with(base, (sends([(root, d, 0, 0) for d in ranks if d != root]),))
    if op == "all_to_all":
        base = _full(op, n, n * n)
        base = Program(op, n, np.full(n * n, 1.0 / n), base.owner, base.dest, ())
        owner = np.array([s for s in ranks for _ in ranks], dtype=np.int64)
        dest = np.array([d for _ in ranks for d in ranks], dtype=np.int64)
        rows = [(s, d, s * n + d, 0) for s in ranks for d in ranks if s != d]
        return _with(base, (sends(rows),), owner=owner, dest=dest)
    base = _full(op, n, n)
    at = np.arange(n, dtype=np.int64)
    rs = (sends([(s, d, d, 1) for s in ranks for d in ranks if s != d]),)
    ag = (sends([(s, d, s, 0) for s in ranks for d in ranks if s != d]),)
    if op == "all_gather":
        return _with(base, ag, owner=at)
    if op == "reduce_scatter":
        return _with(base, rs, dest=at)
    return _with(base, concat_steps(rs, ag))


def hierarchical(
    op: Op,
    node_of: Sequence[int],
    local_of: Sequence[int],
    root: int,
    rotate: int,
    weights: Sequence[float] | None = None,
) -> Program:
    """Inside every node (ring over its ranks), across nodes (ring over the ranks of
    equal local index: a rail), inside again. Piece loc_i*N + k is the piece of the
    rank with local index loc_i in node k. ``weights`` (all-reduce and broadcast,
    whose pieces need not be equal): rail l carries that share of the message."""
    n = len(node_of)
    n_nodes = max(node_of) + 1
    g = n // n_nodes
    rank_at = {(node_of[r], local_of[r]): r for r in range(n)}
    nodes = [[rank_at[(k, (j + rotate) % g)] for j in range(g)] for k in range(n_nodes)]
    rails = [[rank_at[(k, loc_i)] for k in range(n_nodes)] for loc_i in range(g)]

    def piece(k: int, loc_i: int) -> int:
        return loc_i * n_nodes + k

    def intra(kind: str) -> tuple[IntArray, ...]:
        """Ring phase inside every node on super-pieces (all pieces of a local index)."""
        per_node = []
        for k in range(n_nodes):
            pos = nodes[k]
            loc = [local_of[r] for r in pos]
            steps: list[IntArray] = []
            for s in range(g - 1):
                rows: Rows = []
                for i in range(g):
                    if kind == "rs":
                        sup = loc[(i - s - 1) % g]
                        red = 1
                    else:
                        sup = loc[(i - s) % g]
                        red = 0
                    rows.extend(
                        (pos[i], pos[(i + 1) % g], piece(kk, sup), red) for kk in range(n_nodes)
                    )
                steps.append(sends(rows))
            per_node.append(steps)
        return tuple(np.concatenate([per_node[k][s] for k in range(n_nodes)]) for s in range(g - 1))

    def inter(kind: str) -> tuple[IntArray, ...]:
        return _rail_rings(kind, rails, n_nodes)

    base = _full(op, n, n)
    if weights is not None:
        if op not in ("all_reduce", "broadcast") or len(weights) != g:
            raise NotApplicable(f"rail weights need an all-reduce or broadcast and {g} weights")
        w = np.asarray(weights, dtype=np.float64)
        base = Program(op, n, np.repeat(w / n_nodes, n_nodes), base.owner, base.dest, ())
    at = np.array([rank_at[(p % n_nodes, p // n_nodes)] for p in range(n)], dtype=np.int64)
    if op == "all_reduce":
        return _with(base, concat_steps(intra("rs"), inter("rs"), inter("ag"), intra("ag")))
    if op == "reduce_scatter":
        return _with(base, concat_steps(intra("rs"), inter("rs")), dest=at)
    if op == "all_gather":
        return _with(base, concat_steps(inter("ag"), intra("ag")), owner=at)
    if op == "broadcast":
        base = _full(op, n, g)
        if weights is not None:
            base = Program(op, n, np.asarray(weights, dtype=np.float64), base.owner, base.dest, ())
        rk, rl = node_of[root], local_of[root]
        first = sends([(root, rank_at[(rk, loc_i)], loc_i, 0) for loc_i in range(g) if loc_i != rl])
        across: list[IntArray] = []
        span = 1
        while span < n_nodes:
            rows: Rows = []
            for loc_i in range(g):
                order = [rk] + [k for k in range(n_nodes) if k != rk]
                for i in range(span):
                    if i + span < n_nodes:
                        rows.append(
                            (
                                rank_at[(order[i], loc_i)],
                                rank_at[(order[i + span], loc_i)],
                                loc_i,
                                0,
                            )
                        )
            across.append(sends(rows))
            span *= 2
        last = sends(
            [
                (rank_at[(k, loc_i)], rank_at[(k, m)], loc_i, 0)
                for k in range(n_nodes)
                for loc_i in range(g)
                for m in range(g)
                if m != loc_i
            ]
        )
        return _with(base, concat_steps((first,), tuple(across), (last,)))
    raise NotApplicable(f"hierarchical has no {op}")


def _rail_rings(kind: str, rails: Sequence[Sequence[int]], n_nodes: int) -> tuple[IntArray, ...]:
    """Ring reduce-scatter ("rs") or all-gather ("ag") across nodes on every rail
    (``rails[l]``: the rank of local index l in each node), on the rail's pieces
    l * n_nodes + k."""
    out: list[IntArray] = []
    for s in range(n_nodes - 1):
        rows: Rows = []
        for loc_i, pos in enumerate(rails):
            for i in range(n_nodes):
                kk = (i - s - 1) % n_nodes if kind == "rs" else (i - s) % n_nodes
                rows.append(
                    (
                        pos[i],
                        pos[(i + 1) % n_nodes],
                        loc_i * n_nodes + kk,
                        1 if kind == "rs" else 0,
                    )
                )
        out.append(sends(rows))
    return tuple(out)


def hierarchical_direct(
    op: Op,
    node_of: Sequence[int],
    local_of: Sequence[int],
    weights: Sequence[float] | None = None,
) -> Program:
    """Hierarchical with all-pairs phases inside nodes: every rank sends each other
    rank of its node that rank's pieces in one step (reduce-scatter: reducing;
    all-gather: copying), the rails run rings across nodes in between. Fewer steps
    than rings inside nodes (one protocol overhead, not g - 1). With ``weights``, a
    rail whose members are slow or badly linked gets a smaller share: in an
    all-reduce of the message, so a straggler also reduces less inside its node (in
    a ring every rank reduces every piece but one); in an all-gather or a
    reduce-scatter, whose pieces belong to ranks, of each piece cut into parts
    (``_split_rails``)."""
    n = len(node_of)
    n_nodes = max(node_of) + 1
    g = n // n_nodes
    rank_at = {(node_of[r], local_of[r]): r for r in range(n)}
    rails = [[rank_at[(k, loc_i)] for k in range(n_nodes)] for loc_i in range(g)]

    def intra(kind: str) -> tuple[IntArray, ...]:
        rows: Rows = []
        for k in range(n_nodes):
            for m in range(g):
                for loc_i in range(g):
                    if loc_i == m:
                        continue
                    a, b = rank_at[(k, m)], rank_at[(k, loc_i)]
                    for kk in range(n_nodes):
                        q = loc_i * n_nodes + kk
                        rows.append((a, b, q, 1) if kind == "rs" else (b, a, q, 0))
        return (sends(rows),)

    base = _full(op, n, n)
    if weights is not None:
        if len(weights) != g:
            raise NotApplicable(f"rail weights need {g} weights")
        if op in ("all_gather", "reduce_scatter"):
            return _split_rails(op, node_of, rank_at, rails, weights)
        w = np.asarray(weights, dtype=np.float64)
        base = Program(op, n, np.repeat(w / n_nodes, n_nodes), base.owner, base.dest, ())
    at = np.array([rank_at[(q % n_nodes, q // n_nodes)] for q in range(n)], dtype=np.int64)
    if op == "all_reduce":
        return _with(
            base,
            concat_steps(
                intra("rs"),
                _rail_rings("rs", rails, n_nodes),
                _rail_rings("ag", rails, n_nodes),
                intra("ag"),
            ),
        )
    if op == "reduce_scatter":
        return _with(base, concat_steps(intra("rs"), _rail_rings("rs", rails, n_nodes)), dest=at)
    if op == "all_gather":
        return _with(base, concat_steps(_rail_rings("ag", rails, n_nodes), intra("ag")), owner=at)
    raise NotApplicable(f"hierarchical_direct has no {op}")


def _split_rails(
    op: Op,
    node_of: Sequence[int],
    rank_at: dict[tuple[int, int], int],
    rails: Sequence[Sequence[int]],
    weights: Sequence[float],
) -> Program:
    """All-gather (and, reversed, reduce-scatter) with the bytes across nodes split
    over the rails by ``weights``: every rank's piece is cut into one part per rail
    (part l: ``weights[l]`` of it); all-pairs inside every node first, so each rank
    holds its node's pieces; rail l then carries part l of every piece across nodes
    (a ring); last, all-pairs inside every node again, each rank passing on the
    parts its rail brought. A slow NIC carries less, at the cost of a second phase
    inside nodes. Piece r * g + l is part l of rank r's piece."""
    n = len(node_of)
    n_nodes = len(rails[0])
    g = len(rails)
    members = [[r for r in range(n) if node_of[r] == k] for k in range(n_nodes)]
    first: Rows = [
        (r, rank_at[(k, loc_i)], r * g + part, 0)
        for k in range(n_nodes)
        for r in members[k]
        for loc_i in range(g)
        if rank_at[(k, loc_i)] != r
        for part in range(g)
    ]
    across: list[Rows] = []
    for step in range(n_nodes - 1):
        rows: Rows = []
        for loc_i, pos in enumerate(rails):
            for i in range(n_nodes):
                src_node = (i - step) % n_nodes
                rows.extend(
                    (pos[i], pos[(i + 1) % n_nodes], r * g + loc_i, 0) for r in members[src_node]
                )
        across.append(rows)
    last: Rows = [
        (rank_at[(k, loc_i)], rank_at[(k, m)], r * g + loc_i, 0)
        for k in range(n_nodes)
        for loc_i in range(g)
        for m in range(g)
        if m != loc_i
        for r in range(n)
        if node_of[r] != k
    ]
    phases = [first, *across, last]
    w = np.asarray(weights, dtype=np.float64)
    frac = np.tile(w, n) / n
    owner = np.repeat(np.arange(n, dtype=np.int64), g)
    none = np.full(n * g, NONE, dtype=np.int64)
    if op == "all_gather":
        return Program(op, n, frac, owner, none, tuple(sends(rows) for rows in phases))
    # reduce-scatter: the all-gather reversed, every send turned round and reducing
    # (each rank receives each part once in the all-gather, so this is a reduction tree)
    turned = [[(b, a, q, 1) for a, b, q, _ in rows] for rows in reversed(phases)]
    return Program(op, n, frac, none, owner, tuple(sends(rows) for rows in turned))


def synthesized(op: Op, n: int, choice: Choice) -> Program:
    """A synthesized schedule's own pieces and sends."""
    if choice.pieces is None or choice.transfers is None:
        raise NotApplicable("a synthesized schedule needs pieces and transfers")
    p = choice.pieces
    frac = np.full(p, 1.0 / p) if op != "all_to_all" else np.full(p, float(n) / p)
    owner = np.array(choice.piece_owner or [NONE] * p, dtype=np.int64)
    dest = np.array(choice.piece_dest or [NONE] * p, dtype=np.int64)
    n_steps = 1 + max((t.step for t in choice.transfers), default=-1)
    rows: list[Rows] = [[] for _ in range(n_steps)]
    for t in choice.transfers:
        rows[t.step].append((t.src, t.dst, t.piece, int(t.reduce)))
    return Program(op, n, frac, owner, dest, tuple(sends(r) for r in rows))


def program_of(
    op: Op,
    algorithm: Algorithm,
    n: int,
    node_of: Sequence[int],
    local_of: Sequence[int],
    root: int,
    channels: int,
    order: Sequence[int] | None,
    leaves_last: int = 0,
    choice: Choice | None = None,
    weights: Sequence[float] | None = None,
) -> Program:
    """The program of one schedule; NotApplicable if the algorithm has none."""
    sizes = [list(node_of).count(k) for k in sorted(set(node_of))]
    if algorithm == "synthesized":
        assert choice is not None
        one = synthesized(op, n, choice)
        return parallel([one] * channels) if channels > 1 else one
    if not applicable(algorithm, op, n, sizes):
        raise NotApplicable(f"{algorithm} has no schedule for {op} over {n} ranks")
    o = list(order) if order is not None else list(range(n))
    progs = []
    for c in range(channels):
        if algorithm == "ring":
            progs.append(ring(op, rotate_in_nodes(o, node_of, c), root))
        elif algorithm == "tree":
            progs.append(tree(op, o, root, leaves_last))
        elif algorithm == "halving_doubling":
            progs.append(halving_doubling(op, o, root))
        elif algorithm == "hierarchical":
            progs.append(hierarchical(op, node_of, local_of, root, c, weights))
        elif algorithm == "hierarchical_direct":
            progs.append(hierarchical_direct(op, node_of, local_of, weights))
        else:
            progs.append(direct(op, o, root))
    return progs[0] if channels == 1 else parallel(progs)


def rotate_in_nodes(order: list[int], node_of: Sequence[int], c: int) -> list[int]:
    """The ring order with every node's run of ranks rotated by ``c``, so channel c
    leaves and enters each node through other GPUs (other NICs)."""
    out: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and node_of[order[j]] == node_of[order[i]]:
            j += 1
        run = order[i:j]
        r = c % len(run)
        out.extend(run[r:] + run[:r])
        i = j
    return out
