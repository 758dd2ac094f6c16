"""Synthesis with the time-expanded MILP (formulations/collective/synthesis.py), and
``auto``: the better of selection and synthesis for every collective."""

from __future__ import annotations

import time

import highspy
import numpy as np

from energyopt.backends.highs import quiet_highs
from energyopt.formulations.collective.model import CollectiveProblem
from energyopt.formulations.collective.synthesis import (
    MAX_RANKS,
    Synthesis,
    build_milp,
    decode_schedule,
)
from energyopt.progress import Progress, quiet
from energyopt.solvers.collective_select import (
    CHANNELS,
    Evaluator,
    Scored,
    Structure,
    _key,
    plan_result,
    select_one,
)
from energyopt.solvers.result import Result
from energyopt.spec.collective import Collective, CollectivePlan

ROUNDS = 3
"""Rounds of the time-expanded graph (at most n - 1)."""


def synthesized_best(ev: Evaluator, c: Collective, name: str, syn: Synthesis) -> Scored:
    """The synthesized schedule on the cost model with its best channels, protocol, clock."""
    best: Scored | None = None
    for ch in CHANNELS:
        x = ev.best(c, Structure("synthesized", ch, 1, None, 0), name, syn.choice)
        if best is None or _key(ev.p, x) < _key(ev.p, best):
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
    h.setOptionValue("time_limit", max(0.1, time_limit_s))
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


def solve_synthesis(
    p: CollectiveProblem,
    *,
    time_limit_s: float = 60.0,
    keep_better: bool = False,
    progress: Progress = quiet,
) -> Result[CollectivePlan]:
    """Every collective's MILP schedule (``keep_better``: or the selected candidate
    where that is better). A collective the MILP cannot take (more than MAX_RANKS
    ranks, or no schedule within its share of the time) gets the selected
    candidate, and the log says so."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    scored: list[Scored] = []
    log: list[str] = []
    share = time_limit_s / max(1, len(p.collectives))
    for i, c in enumerate(p.collectives):
        name = p.name_of(i)
        syn = run_synthesis(p, c, name, share)
        chosen = select_one(ev, c, name) if (syn is None or keep_better) else None
        if syn is not None:
            s = synthesized_best(ev, c, name, syn)
            log.append(
                f"{name}: MILP {syn.rounds} rounds, {syn.milp_us:,.2f} us (bound "
                f"{syn.milp_bound_us:,.2f} us, {'optimal' if syn.optimal else 'time limit'}, "
                f"{syn.wall_s:.2f} s); on the cost model {s.time_us:,.2f} us"
            )
            if chosen is None or _key(p, s) < _key(p, chosen):
                chosen = s
        else:
            log.append(
                f"{name}: no MILP schedule ({p.n} ranks, limit {MAX_RANKS}); selected instead"
            )
        assert chosen is not None
        progress(log[-1])
        scored.append(chosen)
    algorithm = "selection and MILP synthesis" if keep_better else "time-expanded MILP synthesis"
    return plan_result(p, scored, "auto" if keep_better else "milp", t0, algorithm, log)
