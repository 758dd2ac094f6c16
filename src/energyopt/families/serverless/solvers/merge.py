"""The decode-merge decision: a priced greedy (the fast path) and the merge MILP
with HiGHS (families/serverless/formulations/merge.py), and the policy that picks between
them by the size of the candidate set.

``decide_merge`` always runs the greedy; where the candidate set has at most
``max_pairs`` (request, destination) pairs (the MILP's binaries) it also solves the
MILP and takes its decision when it is worth at least the greedy's, reporting the
greedy's value against the MILP's proven bound. Values in the objective's unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from energyopt.backends.highs import solve_mip
from energyopt.families.serverless.formulations.merge import (
    KV_MARGIN_BYTES,
    NO_MERGE,
    MergeDecision,
    MergeProblem,
    MergeRequest,
    build_merge_milp,
    decision_of,
    merge_highs_lp,
    merge_value,
    merge_violations,
)
from energyopt.solvers.mip_outcome import mip_outcome
from energyopt.solvers.result import INFEASIBLE, NO_SOLUTION, OPTIMAL

MAX_PAIRS = 400
"""Largest candidate set (in (request, destination) pairs: the MILP's binaries) the
merging policy gives the MILP; larger ones take the greedy alone."""
MILP_TIME_LIMIT_S = 2.0
"""HiGHS' time limit per merge MILP (a bound is reported either way)."""


@dataclass(frozen=True)
class MergeSolution:
    """A solved merge problem: the decision, its value and, where the MILP ran, its
    proven upper bound on every merge's value and whether it proved it optimal."""

    decision: MergeDecision
    value: float
    bound: float | None
    optimal: bool
    method: str


@dataclass(frozen=True)
class MergeOutcome:
    """What the policy decided: the decision taken, its value, the greedy's value and
    the MILP's solution where it ran (None: the set was over ``max_pairs``)."""

    decision: MergeDecision
    value: float
    method: str
    greedy_value: float
    milp: MergeSolution | None


def pairs(p: MergeProblem) -> int:
    """(request, destination) pairs of the candidate set: requests x (candidates - 1)."""
    return p.n_requests * max(p.size - 1, 0)


def pack(
    p: MergeProblem,
    source: int,
    released: set[int],
    count: list[int],
    used: list[float],
    held: list[list[tuple[int, MergeRequest]]],
) -> dict[int, int] | None:
    """Best fit decreasing of the requests ``source`` holds now (``held[source]``:
    (origin, request)) into the other kept candidates, within their batch limits and
    KV budgets, own node first, the fullest first; the destination of each request
    id, or None if they do not all fit (``count``, ``used`` unchanged)."""
    targets = [j for j in range(p.size) if j != source and j not in released]
    load = {j: count[j] for j in targets}
    kv = {j: used[j] for j in targets}
    out: dict[int, int] = {}
    for _, req in sorted(held[source], key=lambda x: -x[1].kv_bytes):
        fit = [
            j
            for j in targets
            if load[j] + 1 <= int(p.batch_limit[j])
            and kv[j] + req.kv_bytes <= float(p.kv_budget_bytes[j]) - KV_MARGIN_BYTES
        ]
        if not fit:
            return None
        best = max(fit, key=lambda j: (int(p.node[j]) == int(p.node[source]), kv[j], -j))
        out[req.rid] = best
        load[best] += 1
        kv[best] += req.kv_bytes
    return out


def greedy_merge(p: MergeProblem) -> MergeDecision:
    """The priced greedy: candidates from least to most loaded; one is released when
    the capacity kept without it still covers the need, its requests (those it holds
    now) all pack into the others (``pack``) and the objective it frees exceeds the
    price of those migrations. A request moved twice ends where it last went."""
    order = sorted(range(p.size), key=lambda i: (len(p.requests[i]), i))
    count = [len(r) for r in p.requests]
    used = [sum(x.kv_bytes for x in r) for r in p.requests]
    held: list[list[tuple[int, MergeRequest]]] = [
        [(i, x) for x in r] for i, r in enumerate(p.requests)
    ]
    cap = p.other_capacity_rps + float(p.capacity_rps.sum())
    released: set[int] = set()
    for i in order:
        if cap - float(p.capacity_rps[i]) < p.need_rps:
            continue
        dest = pack(p, i, released, count, used, held)
        if dest is None:
            continue
        price = sum(p.move_cost(i, req, dest[req.rid]) for _, req in held[i])
        if p.freed(i) <= price:
            continue
        for origin, req in held[i]:
            j = dest[req.rid]
            held[j].append((origin, req))
            count[j] += 1
            used[j] += req.kv_bytes
        held[i] = []
        count[i] = 0
        used[i] = 0.0
        released.add(i)
        cap -= float(p.capacity_rps[i])
    moves = {req.rid: j for j in range(p.size) for origin, req in held[j] if origin != j}
    return MergeDecision(frozenset(released), moves)


def milp_merge(
    p: MergeProblem, *, time_limit_s: float = MILP_TIME_LIMIT_S, rel_gap: float = 1e-6
) -> MergeSolution:
    """The merge MILP with HiGHS: its best decision (NO_MERGE without an incumbent),
    the decision's value recomputed from it, and a bound on every merge's value:
    HiGHS' dual bound, or where it has none (stopped before the root relaxation)
    the value of releasing every candidate with no migration priced (prices are
    >= 0, so no merge is worth more).
    Where the capacity is short with every candidate kept no release is possible: the
    empty decision, value and bound 0 (also where the spare capacity is below every
    candidate's: none can go)."""
    if p.size == 0 or p.spare_rps() < float(p.capacity_rps.min()):
        return MergeSolution(NO_MERGE, 0.0, 0.0, True, "milp")
    milp = build_merge_milp(p)
    run = solve_mip(merge_highs_lp(milp), time_limit_s=max(0.05, time_limit_s), rel_gap=rel_gap)
    status, _, bound_cost = mip_outcome(run)
    if status is INFEASIBLE:  # releasing nothing is always feasible: a modelling error
        raise AssertionError(f"merge MILP infeasible ({run.highs_status})")
    decision = NO_MERGE
    if status is not NO_SOLUTION and run.col_value is not None:
        got = decision_of(p, milp, run.col_value)
        bad = merge_violations(p, got)
        if bad:
            raise AssertionError("merge MILP decision rejected: " + "; ".join(bad))
        decision = got
    value = merge_value(p, decision)
    trivial = sum(p.freed(i) for i in range(p.size))
    bound = max(trivial if bound_cost is None else min(-bound_cost, trivial), value)
    return MergeSolution(decision, value, bound, status is OPTIMAL, "milp")


def decide_merge(
    p: MergeProblem,
    *,
    max_pairs: int = MAX_PAIRS,
    time_limit_s: float = MILP_TIME_LIMIT_S,
) -> MergeOutcome:
    """The merging policy's decision: the greedy's, or the MILP's where the set has at
    most ``max_pairs`` pairs and the MILP's decision is worth at least the greedy's."""
    greedy = greedy_merge(p)
    g_value = merge_value(p, greedy)
    bad = merge_violations(p, greedy)
    if bad:
        raise AssertionError("greedy merge rejected: " + "; ".join(bad))
    if p.size < 2 or pairs(p) > max_pairs:  # one candidate: the greedy is exact
        return MergeOutcome(greedy, g_value, "greedy", g_value, None)
    milp = milp_merge(p, time_limit_s=time_limit_s)
    if milp.value >= g_value:
        return MergeOutcome(milp.decision, milp.value, "milp", g_value, milp)
    return MergeOutcome(greedy, g_value, "greedy", g_value, milp)
