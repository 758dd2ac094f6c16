"""Memory cover inequalities of the keep-alive programme: valid rows that close
most of the arc-flow LP's gap.

Why the LP is weak: a node's GPU memory row, sum_f gpu(f, s) x[f, t, s] <= cap,
lets the LP hold a fraction of a second large model warm (two 73.6 GB models on
an 80 GB node: 1.087 of a warm model in the LP, one in any plan), and every
window's cold starts the fraction saves lower the LP's energy. Each function's
own states x windows network is a shortest-path problem (its LP is integral), so
the memory rows are the whole gap on the bundled instances.

A cover of node n is a set C of (function, state) pairs whose states lie on n and
hold the same resource (GPU or host memory, GB), with ``most`` = k, the most of
them any plan can hold in one window:

    sum_{(f, s) in C} x[f, t, s] <= k          every window t.

Valid for every plan: the pairs a plan holds on n in window t weigh at most the
node's capacity (the budget row), and any k + 1 pairs of C weigh at least the
k + 1 lightest of C, which by the choice of k exceed the capacity. (Two states
of one function are never held at once, which only makes the row looser than
the plans allow.) The row leaves every plan feasible, so the strengthened
programme has the same optimum; its LP (and the Lagrangian that prices it) is a
bound no weaker than before.

A packing cover spans the N nodes: N + 1 functions whose warm GPU memory no
assignment to their permitted nodes fits at once (each node's capacity, counting
only these warm states; tried by enumerating the N^(N + 1) assignments), so

    sum_{f in C} sum_n x[f, t, warm on n] <= N          every window t.

Valid: a plan holds each function warm on at most one node per window, and if
all N + 1 were warm their memory would be held on the nodes, which no assignment
fits (anything else held only adds). On the bundled two-node instance both 32B
models warm leave no room for a third warm model; the node covers cannot see it
(the LP splits every function half and half over the two nodes), these do.
Sought only for N <= MAX_PACKING_NODES and at most MAX_PACKING_SETS candidate sets.

The covers taken are the prefixes of a node's pairs sorted heaviest first: the
prefix of the m heaviest has k(m) = the number of its lightest pairs that fit,
non-decreasing in m, so for each k only the longest prefix is kept (it implies
the shorter ones with the same k). A cover is kept only where it cuts off LP
points: the memory row alone lets the LP hold k of C and at least ``MIN_DEPTH``
of one more.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

if TYPE_CHECKING:  # model.py imports this module for its ``covers``
    from energyopt.families.keepalive.formulations.model import (
        FloatArray,
        IntArray,
        KeepAliveProblem,
    )

MAX_COVER_MOST = 16
"""Largest right-hand side k of a cover that is kept (wider covers cut little and
add one row per window each)."""
MAX_PACKING_NODES = 3
"""Most nodes for which packing covers (sets over all nodes) are sought."""
MAX_PACKING_SETS = 2_000
"""Most candidate sets of N + 1 functions a packing-cover search tries."""
MIN_DEPTH = 0.05
"""Least share of one more member that the memory row alone lets the LP hold past
a cover's k for the cover to be kept (shallower covers cut almost nothing)."""
FIT_TOL = 1e-9
"""Relative slack on a node's capacity when counting what fits (the verifier's
float slack; counting more as fitting only weakens a cover)."""


@dataclass(frozen=True)
class Covers:
    """K cover inequalities, each applied in every window: ``matrix`` (K, F S), 1
    where state s of function f (column f S + s) is a member, at most ``most`` (K,)
    of them held at once on ``node`` (K,; -1: a packing cover over all nodes).
    ``scale`` (K,), GB per member: the capacity / (most + 1), a factor a
    subgradient method may multiply a cover's row by so that its price moves at
    the pace of the memory rows' (a positive multiple of a valid row is valid)."""

    matrix: sp.csr_matrix
    most: FloatArray
    node: IntArray
    scale: FloatArray

    def __len__(self) -> int:
        return int(self.most.shape[0])

    def held(self, states: IntArray) -> FloatArray:
        """(K, T) members the (F, T) states hold in each window."""
        n_f, n_t = states.shape
        n_s = self.matrix.shape[1] // max(1, n_f)
        cols = (np.arange(n_f)[:, None] * n_s + states).ravel()
        chosen = sp.csc_matrix(
            (np.ones(n_f * n_t), (cols, np.tile(np.arange(n_t), n_f))),
            shape=(self.matrix.shape[1], n_t),
        )
        return np.asarray((self.matrix @ chosen).toarray(), dtype=np.float64)

    def priced(self, prices: FloatArray) -> FloatArray:
        """(F S, T): the sum of ``prices`` (K, T) over the covers each state is in."""
        return np.asarray(self.matrix.T @ prices, dtype=np.float64)


def lightest_sum(w: FloatArray, size: int, count: int) -> float:
    """Sum of the ``count`` lightest of the ``size`` heaviest of ``w`` (sorted
    heaviest first), GB."""
    return float(w[size - count : size].sum())


def prefix_covers(weights: FloatArray, capacity: float) -> list[tuple[int, int]]:
    """(m, k) for the covers among ``weights`` sorted heaviest first (GB): the m
    heaviest hold at most k at once within ``capacity`` GB; the longest prefix per
    k, only those that cut at least MIN_DEPTH of a member off the memory row's LP
    and have k <= MAX_COVER_MOST."""
    w = np.sort(np.asarray(weights, dtype=np.float64))[::-1]
    n = len(w)
    room = capacity * (1 + FIT_TOL) + FIT_TOL
    # k(m): how many of the prefix's lightest fit. The j lightest of the m heaviest
    # are w[m - j : m]; their sums grow one term per j (j terms each, so rounding
    # stays at the capacity's scale), counted up to MAX_COVER_MOST + 1.
    k = np.zeros(n + 1, dtype=np.int64)
    lightest = np.zeros(n + 1)
    for j in range(1, min(n, MAX_COVER_MOST + 1) + 1):
        lightest[j:] += w[: n + 1 - j]
        k[j:] += lightest[j:] <= room
    longest: dict[int, int] = {}
    for size in range(2, n + 1):
        most = int(k[size])
        if most >= size or most > MAX_COVER_MOST:
            continue
        # the LP fills the lightest members first: it holds ``most`` of them and
        # this fraction of the next; keep the cover where that fraction is real
        depth = (room - lightest_sum(w, size, most)) / w[size - most - 1]
        if depth >= MIN_DEPTH:
            longest[most] = size
    return sorted((m, k) for k, m in longest.items())


def memory_covers(p: KeepAliveProblem) -> Covers:
    """The cover inequalities of every node's GPU and host memory, then the packing
    covers over all nodes (module docstring)."""
    n_s = p.n_states
    node = p.node_of()
    rows: list[IntArray] = []
    cols: list[IntArray] = []
    most: list[float] = []
    nodes: list[int] = []
    scale: list[float] = []
    for held, caps in ((p.gpu_gb, p.gpu_cap), (p.host_gb, p.host_cap)):
        f_all, s_all = np.nonzero(p.allowed & (held > 0))
        for n in range(p.n_nodes):
            here = node[s_all] == n
            f_idx, s_idx = f_all[here], s_all[here]
            weights = held[f_idx, s_idx]
            order = np.argsort(-weights, kind="stable")
            for m, k in prefix_covers(weights, float(caps[n])):
                picked = order[:m]
                rows.append(np.full(m, len(most), dtype=np.int64))
                cols.append(f_idx[picked] * n_s + s_idx[picked])
                most.append(float(k))
                nodes.append(n)
                scale.append(float(caps[n]) / (k + 1))
    for members, k in packing_sets(p):
        rows.append(np.full(len(members), len(most), dtype=np.int64))
        cols.append(members)
        most.append(float(k))
        nodes.append(-1)
        scale.append(float(p.gpu_cap.min()) / (k + 1))
    n_rows = len(most)
    row = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)
    col = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
    return Covers(
        matrix=sp.csr_matrix((np.ones(len(row)), (row, col)), shape=(n_rows, p.n_functions * n_s)),
        most=np.asarray(most, dtype=np.float64),
        node=np.asarray(nodes, dtype=np.int64),
        scale=np.asarray(scale, dtype=np.float64),
    )


def packing_sets(p: KeepAliveProblem) -> list[tuple[IntArray, int]]:
    """Packing covers over all nodes: (columns f S + s of the warm states, on every
    permitted node, of N + 1 functions whose warm GPU memory cannot be held at once
    on the N nodes, N). Only for N <= MAX_PACKING_NODES and at most
    MAX_PACKING_SETS candidate sets (module docstring)."""
    n_n, n_s = p.n_nodes, p.n_states
    warm_gb = p.gpu_gb[:, :n_n]  # (F, N): the warm state on each node
    permitted = p.allowed[:, :n_n]
    heavy = np.flatnonzero((warm_gb * permitted).max(axis=1) > 0)
    if n_n > MAX_PACKING_NODES or math.comb(len(heavy), n_n + 1) > MAX_PACKING_SETS:
        return []
    room = p.gpu_cap * (1 + FIT_TOL) + FIT_TOL
    # every assignment of N + 1 functions to nodes: (A, N + 1) node indices
    assign = np.array(list(itertools.product(range(n_n), repeat=n_n + 1)), dtype=np.int64)
    out: list[tuple[IntArray, int]] = []
    for chosen in itertools.combinations(heavy, n_n + 1):
        fns = np.array(chosen, dtype=np.int64)
        weight = warm_gb[fns[None, :], assign]  # (A, N + 1)
        ok = permitted[fns[None, :], assign].all(axis=1)
        load = np.zeros((len(assign), n_n))
        np.add.at(load, (np.arange(len(assign))[:, None], assign), weight)
        if np.any(ok & np.all(load <= room[None, :], axis=1)):
            continue
        f_idx, n_idx = np.nonzero(permitted[fns])
        out.append((fns[f_idx] * n_s + n_idx, n_n))
    return out
