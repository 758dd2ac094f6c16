"""Synthesis with the time-expanded MILP (families/collective/formulations/synthesis.py), and
``auto``: the better of selection and synthesis for every collective."""

from __future__ import annotations

import time
from itertools import product

import highspy
import numpy as np

from energyopt.backends.highs import quiet_highs
from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.formulations.rail_direct import (
    RAIL_DIRECT_OPS,
    applicable,
    rail_direct_choice,
    rail_exchange_choice,
)
from energyopt.families.collective.formulations.scatter_gather import (
    by_rail_applicable,
    scatter_gather_choice,
)
from energyopt.families.collective.formulations.synthesis import (
    MAX_RANKS,
    Synthesis,
    build_milp,
    decode_schedule,
)
from energyopt.families.collective.solvers.exact import (
    EXACT_MAX_CANDIDATES,
    certificate_lines,
    exhaustive,
    search_size,
)
from energyopt.families.collective.solvers.select import (
    CHANNELS,
    Evaluator,
    Scored,
    Structure,
    Winners,
    collective_bound,
    objective_key,
    plan_result,
    rail_weights,
    root_key,
    select_all,
)
from energyopt.families.collective.spec import Collective, CollectivePlan
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import Result, Termination

ROUNDS = 3
"""Rounds of the time-expanded graph (at most n - 1)."""
MIN_MILP_S = 0.1
"""Least time share worth a MILP: a collective whose share of what is left of the
limit is smaller keeps selection's schedule."""


RAIL_PARTS = (1, 2, 4, 8)
"""Pieces per rank of the rail-direct schedules searched (more let the rail weights
be met more closely, at more flows)."""
RAIL_CHUNKS = (1, 2, 3, 4)
"""Pipelined chunks of the rail-direct schedules searched (3 is the best of 1-8 for
the large multi-node all-reduces: the four-step rail schedule of ar-32m on 4 x 8
GPUs takes 337.2 / 290.3 / 284.4 / 288.7 us at 1 / 2 / 3 / 4 chunks; each chunk
more adds a step that waits on a network landing)."""
RAIL_CHANNELS = (2, 4, 8, 16)
"""Channels of the rail-direct schedules searched."""


def rail_direct_search(
    p: CollectiveProblem, ev: Evaluator, scored: list[Scored], deadline: float
) -> tuple[int, bool]:
    """Offer every all-gather, reduce-scatter and all-reduce of a trace on equal nodes
    the rail-direct schedules, and every all-reduce the rail exchange too
    (``formulations/rail_direct.py``: ``RAIL_PARTS`` pieces per rank or rail, equal or
    health-weighted rails, ``RAIL_CHANNELS`` x ``RAIL_CHUNKS``, every
    protocol and, for the energy objective, clock) until ``deadline`` (perf_counter
    seconds); ``scored[i]`` is replaced where one is better by the objective. Returns
    (collectives improved, whether every schedule was scored)."""
    weighted = rail_weights(p)
    improved = 0
    complete = True
    for op in RAIL_DIRECT_OPS:
        idx = [i for i, c in enumerate(p.collectives) if c.op == op]
        if not idx or not applicable(p, op):
            continue
        sizes = sorted({p.collectives[i].bytes for i in idx})
        at = {b: j for j, b in enumerate(sizes)}
        w = Winners.empty(len(sizes))
        probe = Collective(op=op, bytes=1)
        makers = [rail_direct_choice]
        if op == "all_reduce":
            makers.insert(0, rail_exchange_choice)
        for parts in RAIL_PARTS:
            for weights, make in product(
                (None, weighted) if weighted is not None else (None,), makers
            ):
                if parts == 1 and weights is not None:
                    continue  # one piece per rank: every piece stays on its own rail
                choice = make(p, probe, op, parts, weights)
                for ch in RAIL_CHANNELS:
                    for k in RAIL_CHUNKS:
                        if time.perf_counter() >= deadline:
                            complete = False
                            break
                        s = Structure("synthesized", ch, k, None, 0)
                        ev.offer_best(w, op, 0, s, np.asarray(sizes, dtype=np.float64), choice)
        improved += _take_winners(p, idx, at, w, scored)
    return improved, complete


def _take_winners(
    p: CollectiveProblem,
    idx: list[int],
    at: dict[int, int],
    w: Winners,
    scored: list[Scored],
) -> int:
    """Replace ``scored[i]`` for each collective ``i`` of ``idx`` by the winner of its
    size (``at``: bytes -> the size's index in ``w``) where that is better by the
    objective; returns how many were replaced."""
    improved = 0
    for i in idx:
        j = at[p.collectives[i].bytes]
        if w.which[j] is None:
            continue
        x = w.scored(j, p.name_of(i))
        if objective_key(p, x) < objective_key(p, scored[i]):
            scored[i] = x
            improved += 1
    return improved


SCATTER_PARTS = (1, 2, 4, 5)
"""Pieces per holder (flat) or per rail (by rail) of the scatter-gather broadcasts searched."""
ROOT_RAIL_BOOST = (1.0, 1.5, 2.0)
"""Factors on the root's rail weight of the by-rail broadcasts in which the root
sends first (its rail crosses a step earlier than the others)."""


def scatter_gather_search(
    p: CollectiveProblem, ev: Evaluator, scored: list[Scored], deadline: float
) -> tuple[int, bool]:
    """Offer every broadcast of a trace the scatter-gather schedules
    (``formulations/scatter_gather.py``: flat, with or without the root holding
    pieces, and by rail on equal nodes with equal or health-weighted rails, and
    with the root sending first, its rail's weight times ``ROOT_RAIL_BOOST``;
    ``SCATTER_PARTS`` pieces, ``RAIL_CHANNELS`` plus one channel x ``RAIL_CHUNKS``,
    every protocol and, for the energy objective, clock)
    until ``deadline`` (perf_counter seconds); ``scored[i]`` is replaced where one is
    better by the objective. Returns (collectives improved, whether every schedule
    was scored)."""
    weighted = rail_weights(p)
    improved = 0
    complete = True
    roots = sorted({c.root for c in p.collectives if c.op == "broadcast"})
    for root in roots:
        # (by rail, rail weights, the root holds pieces too, the root sends first)
        shapes: list[tuple[bool, tuple[float, ...] | None, bool, bool]] = [
            (False, None, False, False),
            (False, None, True, False),
        ]
        if by_rail_applicable(p):
            shapes.append((True, None, False, False))
            if weighted is not None:
                shapes.append((True, weighted, False, False))
            base = weighted or (1.0,) * (p.n // p.n_nodes)
            for boost in ROOT_RAIL_BOOST:
                # the root's rail crosses a step earlier: it may carry more
                lane = p.local_of[root]
                w_first = tuple(x * (boost if i == lane else 1.0) for i, x in enumerate(base))
                shapes.append(
                    (True, None if w_first == (1.0,) * len(base) else w_first, False, True)
                )
        idx = [i for i, c in enumerate(p.collectives) if c.op == "broadcast" and c.root == root]
        sizes = sorted({p.collectives[i].bytes for i in idx})
        at = {b: j for j, b in enumerate(sizes)}
        w = Winners.empty(len(sizes))
        probe = Collective(op="broadcast", bytes=1, root=root)
        for parts in SCATTER_PARTS:
            for by_rail, weights, root_holds, root_first in shapes:
                choice = scatter_gather_choice(
                    p, probe, "broadcast", parts, weights, by_rail, root_holds, root_first
                )
                for ch in (1, *RAIL_CHANNELS):
                    for k in RAIL_CHUNKS:
                        if time.perf_counter() >= deadline:
                            complete = False
                            break
                        s = Structure("synthesized", ch, k, None, 0)
                        ev.offer_best(
                            w, "broadcast", root, s, np.asarray(sizes, dtype=np.float64), choice
                        )
        improved += _take_winners(p, idx, at, w, scored)
    return improved, complete


def synthesized_best(ev: Evaluator, c: Collective, name: str, syn: Synthesis) -> Scored:
    """The synthesized schedule on the cost model with its best channels, protocol, clock."""
    best: Scored | None = None
    for ch in CHANNELS:
        x = ev.best(c, Structure("synthesized", ch, 1, None, 0), name, syn.choice)
        if best is None or objective_key(ev.p, x) < objective_key(ev.p, best):
            best = x
    assert best is not None
    return best


def synthesize(
    p: CollectiveProblem, c: Collective, name: str, rounds: int, time_limit_s: float
) -> Synthesis | None:
    """The MILP-optimal copy schedule of ``rounds`` rounds for ``c`` (None: the MILP
    found no schedule within ``time_limit_s`` seconds)."""
    t0 = time.perf_counter()
    milp = build_milp(p, c, rounds)
    h = quiet_highs()
    h.passModel(milp.lp)
    h.setOptionValue("time_limit", max(1e-3, time_limit_s - (time.perf_counter() - t0)))
    h.setOptionValue("mip_rel_gap", 1e-6)
    h.run()
    info = h.getInfo()
    if info.primal_solution_status != 2:  # no feasible solution
        return None
    return decode_schedule(
        p,
        c,
        name,
        milp,
        np.asarray(h.getSolution().col_value),
        float(info.objective_function_value),
        float(info.mip_dual_bound),
        h.getModelStatus() == highspy.HighsModelStatus.kOptimal,
        time.perf_counter() - t0,
    )


def run_synthesis(
    p: CollectiveProblem, c: Collective, name: str, time_limit_s: float
) -> Synthesis | None:
    """The MILP schedule of ``c`` (None: too many ranks or no schedule in time)."""
    if p.n > MAX_RANKS:
        return None
    return synthesize(p, c, name, min(ROUNDS, p.n - 1), time_limit_s)


def synthesis_line(p: CollectiveProblem, c: Collective, syn: Synthesis, s: Scored) -> str:
    """What the MILP proved for one collective, and what its schedule costs on the cost
    model against the collective's own bound (the trace's status and gap are the
    count-weighted totals of these, in the report's last lines)."""
    proven = (
        f"proven least among copy schedules of these pieces in at most {syn.max_rounds} rounds"
        if syn.optimal
        else f"not proven least (MILP bound {syn.milp_bound_us:,.2f} us)"
    )
    unit = "J" if p.spec.objective.kind == "energy" else "us"
    got = s.energy_j if unit == "J" else s.time_us
    bound = collective_bound(p, c)
    gap = 100.0 * max(0.0, got - bound) / max(abs(got), 1e-300)
    return (
        f"{s.choice.collective}: MILP synthesis, relaxed time {syn.milp_us:,.2f} us, {proven} "
        f"({syn.wall_s:.2f} s); on the cost model {got:,.4g} {unit}, {gap:.1f} % above "
        f"this collective's bound {bound:,.4g} {unit}"
    )


def solve_synthesis(
    p: CollectiveProblem,
    *,
    time_limit_s: float = 60.0,
    keep_better: bool = False,
    progress: Progress = quiet,
) -> Result[CollectivePlan]:
    """Every collective's MILP schedule (``keep_better``: or the selected candidate
    where that is better), all within ``time_limit_s`` seconds. Selection runs
    first: for ``keep_better`` on a trace whose ``exact.search_size`` is at most
    ``EXACT_MAX_CANDIDATES``, the exhaustive search with all of the limit (every
    candidate, when it finishes); otherwise in half the limit when the MILP can take
    the ranks, else in all of it. Then each distinct collective's MILP gets an equal
    share of what is left. The log ends with each collective's certificate
    (``exact.certificate_lines``). A
    collective the MILP cannot take (more than MAX_RANKS ranks, no schedule within
    its share, or a share under MIN_MILP_S) keeps the selected candidate, and the
    log says so."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    ev = Evaluator(p)
    small = p.n <= MAX_RANKS
    if keep_better and search_size(p) <= EXACT_MAX_CANDIDATES:
        # small enough to search every candidate: the MILP gets what is left
        sel, found = exhaustive(p, ev, deadline, progress)
    else:
        sel = select_all(p, ev, t0 + time_limit_s / 2 if small else deadline, progress)
        found = []
    scored = list(sel.scored)
    log = [*found, *sel.log]
    cut = not sel.complete
    if keep_better and any(applicable(p, c.op) for c in p.collectives):
        # rail-direct schedules (several equal nodes): half of what is left when the
        # MILP takes the ranks too, else all of it
        left = deadline - time.perf_counter()
        improved, done = rail_direct_search(p, ev, scored, deadline - (left / 2 if small else 0.0))
        log.append(
            f"rail-direct schedules: {improved} collectives improved on selection's "
            "(their schedules lie outside the candidate space)"
            + ("" if done else " (cut by the time limit)")
        )
        cut = cut or not done
        progress(log[-1])
    if keep_better and any(c.op == "broadcast" and p.n > 1 for c in p.collectives):
        # scatter-gather broadcasts: half of what is left when the MILP takes the
        # ranks too, else all of it
        left = deadline - time.perf_counter()
        improved, done = scatter_gather_search(
            p, ev, scored, deadline - (left / 2 if small else 0.0)
        )
        log.append(
            f"scatter-gather broadcasts: {improved} collectives improved on the schedules "
            "before (they lie outside the candidate space)"
            + ("" if done else " (cut by the time limit)")
        )
        cut = cut or not done
        progress(log[-1])
    if not small:
        log.insert(
            0,
            f"no MILP synthesis: {p.n} ranks, the MILP takes at most {MAX_RANKS}; "
            "selection for every collective",
        )
    distinct: dict[tuple[str, int, int], list[int]] = {}
    for i, c in enumerate(p.collectives if small else ()):
        distinct.setdefault((c.op, c.bytes, root_key(c.op, c.root)), []).append(i)
    skipped = 0
    for k, idx in enumerate(distinct.values()):
        c, name = p.collectives[idx[0]], p.name_of(idx[0])
        share = (deadline - time.perf_counter()) / (len(distinct) - k)
        if share < MIN_MILP_S:
            skipped += len(idx)
            continue
        syn = synthesize(p, c, name, min(ROUNDS, p.n - 1), share)
        if syn is None:
            log.append(f"{name}: no MILP schedule within its {share:.2f}-s share; selected instead")
            cut = True
            progress(log[-1])
            continue
        s = synthesized_best(ev, c, name, syn)
        kept = not keep_better or objective_key(p, s) < objective_key(p, scored[idx[0]])
        log.append(
            synthesis_line(p, c, syn, s)
            + ("" if kept else f"; selection's schedule kept ({scored[idx[0]].time_us:,.2f} us)")
        )
        cut = cut or not syn.optimal
        progress(log[-1])
        if kept:
            for i in idx:
                ch = s.choice.model_copy(update={"collective": p.name_of(i)})
                scored[i] = Scored(ch, s.time_us, s.energy_j)
    if skipped:
        cut = True
        log.append(
            f"time limit: {skipped} collectives got no MILP (their share of the limit was "
            f"under {MIN_MILP_S:g} s); selected instead"
        )
    algorithm = "selection and MILP synthesis" if keep_better else "time-expanded MILP synthesis"
    if found:
        algorithm = "exhaustive search over the candidate space and MILP synthesis"
    log.extend(certificate_lines(p, scored))
    return plan_result(
        p,
        scored,
        "auto" if keep_better else "milp",
        t0,
        algorithm,
        log,
        Termination.TIME_LIMIT if cut else Termination.HEURISTIC,
    )
