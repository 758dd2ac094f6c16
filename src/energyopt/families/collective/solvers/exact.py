"""Exhaustive search over the candidate space, with each collective's certificate.

The candidate space of a collective is every structure ``select.structures`` yields
(algorithm x channels x chunks x rank order x rail weights) times every protocol,
times every clock of the file for the energy objective (the max clock for time).
``solve_exhaustive`` scores all of it for every collective (no early stop), so its
plan is the least candidate of every collective: the optimum over that space, which
the tests check against brute force. Over every schedule a plan may hold (any
channel or chunk count, any order, any synthesized schedule) the proof is the
bound: ``select.collective_bound`` (``costmodel.time_bound_us`` and
``energy_bound_j``), valid for every verified plan. A collective whose least
candidate meets its bound is proven optimal over every schedule; for the others the
log states how far above the bound the least candidate is.
"""

from __future__ import annotations

import time

from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.solvers.select import (
    Evaluator,
    Scored,
    Selection,
    collective_bound,
    groups_of,
    plan_result,
    select_all,
    structures,
)
from energyopt.families.collective.spec import PROTOCOLS, Collective, CollectivePlan
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import Result, Termination

PROVEN_TOL = 1e-6
"""Relative gap under which a collective's least candidate counts as meeting its bound."""
EXACT_MAX_CANDIDATES = 20_000
"""Most candidate structures x op/root groups x ranks the default (``auto``) searches
in full whatever the time limit (beyond it, the time limit cuts the search)."""


def candidate_count(p: CollectiveProblem) -> int:
    """Schedules in the candidate space of the whole trace: structures of every
    op/root group x protocols x clocks (the file's for the energy objective)."""
    clocks = len(p.clocks_mhz) if p.spec.objective.kind == "energy" else 1
    total = 0
    for g in groups_of(p):
        c = Collective(op=g.op, bytes=1, root=g.root)
        total += sum(1 for _ in structures(p, c)) * len(PROTOCOLS) * clocks
    return total


def search_size(p: CollectiveProblem) -> int:
    """The candidate structures of every op/root group times the ranks: the measure
    of how long an exhaustive search takes that ``EXACT_MAX_CANDIDATES`` limits."""
    total = 0
    for g in groups_of(p):
        c = Collective(op=g.op, bytes=1, root=g.root)
        total += sum(1 for _ in structures(p, c))
    return total * p.n


def certificate_lines(p: CollectiveProblem, scored: list[Scored]) -> list[str]:
    """Per collective of ``scored`` (the plan's schedules): proven optimal over every
    schedule (its schedule meets the bound), or its gap above the bound."""
    energy = p.spec.objective.kind == "energy"
    unit = "J" if energy else "us"
    proven, open_lines = [], []
    for i, s in enumerate(scored):
        c = p.collectives[i]
        got = s.energy_j if energy else s.time_us
        bound = collective_bound(p, c)
        gap = max(0.0, got - bound) / max(abs(got), 1e-300)
        if gap <= PROVEN_TOL:
            proven.append(p.name_of(i))
        else:
            open_lines.append(
                f"{p.name_of(i)}: its schedule {got:,.4g} {unit}, {100 * gap:.1f} % above "
                f"the bound for every schedule ({bound:,.4g} {unit})"
            )
    head = (
        f"proven optimal over every schedule (the bound is reached): {', '.join(proven)}"
        if proven
        else "no collective's schedule reaches its bound"
    )
    return [head, *open_lines]


def exhaustive(
    p: CollectiveProblem, ev: Evaluator, deadline: float | None, progress: Progress = quiet
) -> tuple[Selection, list[str]]:
    """Every candidate of every collective scored until ``deadline`` (perf_counter
    seconds; None: all of them), and the log lines that say what that proves."""
    sel = select_all(p, ev, deadline, progress)
    if sel.complete:
        lines = [
            f"exhaustive: all {candidate_count(p):,} candidate schedules of the trace's "
            f"{len(sel.groups)} op/root groups scored; each collective has the least of its "
            "candidates (the optimum over the candidate space)"
        ]
    else:
        lines = ["exhaustive search cut by the time limit: the plan is the best found"]
    return sel, lines


def solve_exhaustive(
    p: CollectiveProblem, *, time_limit_s: float | None = None, progress: Progress = quiet
) -> Result[CollectivePlan]:
    """The least candidate of every collective by exhaustive search (within
    ``time_limit_s`` seconds when given), with the bound valid for every schedule and
    each collective's certificate in the log."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    deadline = None if time_limit_s is None else t0 + time_limit_s
    sel, lines = exhaustive(p, ev, deadline, progress)
    log = [*lines, *sel.log, *certificate_lines(p, sel.scored)]
    return plan_result(
        p,
        sel.scored,
        "exact",
        t0,
        "exhaustive search over the candidate space",
        log,
        Termination.CONVERGED if sel.complete else Termination.TIME_LIMIT,
    )
