"""Keep-alive MILP with HiGHS: the whole horizon at once (exact), or rolled over
the horizon a few windows at a time (a heuristic for long horizons)."""

from __future__ import annotations

import time

import numpy as np

from energyopt.backends.highs import MipRun, solve_mip
from energyopt.families.keepalive.formulations.milp import (
    FORMULATION_NAME,
    Milp,
    build_milp,
    highs_lp,
    states_of,
)
from energyopt.families.keepalive.formulations.model import IntArray, KeepAliveProblem
from energyopt.families.keepalive.spec import KeepAlivePlan
from energyopt.progress import Progress, quiet
from energyopt.solvers.mip_outcome import mip_outcome
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    Result,
    Status,
    Termination,
)

FORMULATION = FORMULATION_NAME
LOOKAHEAD = 15
"""Windows each of ``rolling``'s MILPs sees."""
STEP = 5
"""Windows ``rolling`` keeps of each MILP before it rolls on."""


def _run(milp: Milp, time_limit_s: float, rel_gap: float) -> MipRun:
    return solve_mip(highs_lp(milp), time_limit_s=max(0.1, time_limit_s), rel_gap=rel_gap)


def solve_milp(
    p: KeepAliveProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
    cuts: bool = True,
) -> Result[KeepAlivePlan]:
    """The whole horizon's MILP: the optimum within ``rel_gap`` or, at the time
    limit, the best plan with HiGHS' bound. Objective in J, or for the throughput
    objective in requests/s (:func:`solve_throughput`). ``cuts``: with the memory
    cover rows (formulations/cuts.py; the same optimum, a stronger LP)."""
    if p.maximises_throughput:
        return solve_throughput(p, time_limit_s=time_limit_s, rel_gap=rel_gap, progress=progress)
    t0 = time.perf_counter()
    milp = build_milp(p, cuts=cuts)
    progress(f"milp: {len(milp):,} columns, {milp.matrix.shape[0]:,} rows")
    run = _run(milp, time_limit_s - (time.perf_counter() - t0), rel_gap)
    wall = time.perf_counter() - t0
    log = [f"HiGHS: {run.highs_status}, {len(milp):,} columns"]
    status, termination, bound = mip_outcome(run)
    values = run.col_value
    if status is INFEASIBLE or values is None:
        return Result(
            status,
            None,
            bound,
            wall,
            None,
            "milp",
            log=log,
            diagnosis=_diagnosis(p) if status is INFEASIBLE else [],
            termination=termination,
            formulation=FORMULATION,
            algorithm="HiGHS branch and cut",
        )
    states = states_of(milp, values, p.n_functions, 0, p.n_windows)
    objective = p.energy_of(states)
    return Result(
        status,
        objective,
        bound,
        wall,
        p.plan_of(states),
        "milp",
        log=log,
        termination=termination,
        formulation=FORMULATION,
        algorithm="HiGHS branch and cut",
    )


def solve_throughput(
    p: KeepAliveProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
) -> Result[KeepAlivePlan]:
    """The throughput objective in two MILPs: the fewest requests starting later
    than their function's limit (its bound gives the throughput bound), then the
    least energy with no more late requests than that. Objective: requests/s
    within the limit over the horizon."""
    t0 = time.perf_counter()
    first = build_milp(p, minimise="late")
    progress(f"milp: throughput, {len(first):,} columns, {first.matrix.shape[0]:,} rows")
    run = _run(first, time_limit_s - (time.perf_counter() - t0), rel_gap)
    log = [f"HiGHS, fewest late requests: {run.highs_status}"]

    def result(
        status: Status,
        objective: float | None,
        bound: float | None,
        plan: KeepAlivePlan | None,
        termination: Termination,
        diagnosis: list[str] | None = None,
    ) -> Result[KeepAlivePlan]:
        return Result(
            status,
            objective,
            bound,
            time.perf_counter() - t0,
            plan,
            "milp",
            log=log,
            diagnosis=diagnosis or [],
            sense="max",
            termination=termination,
            formulation=FORMULATION + "; throughput: fewest late requests, then least energy",
            algorithm="HiGHS branch and cut, two stages",
        )

    status, termination, late_bound = mip_outcome(run)
    if status is INFEASIBLE:
        return result(INFEASIBLE, None, None, None, Termination.INFEASIBLE, _diagnosis(p))
    bound = None if late_bound is None else p.throughput_of(max(0.0, late_bound))
    if run.col_value is None:
        return result(NO_SOLUTION, None, bound, None, termination)
    values = np.round(run.col_value)
    states = states_of(first, values, p.n_functions, 0, p.n_windows)
    fewest = float(first.cost @ values)
    left = time_limit_s - (time.perf_counter() - t0)
    second = build_milp(p, late_cap=fewest * (1 + 1e-9) + 1e-9)
    run2 = _run(second, max(0.1, left), rel_gap)
    log.append(f"HiGHS, least energy at {fewest:g} late: {run2.highs_status}")
    if run2.col_value is not None:
        states = states_of(second, np.round(run2.col_value), p.n_functions, 0, p.n_windows)
    return result(
        status,
        p.throughput_of(p.late_requests(states)),
        bound,
        p.plan_of(states),
        termination,
    )


def solve_rolling(
    p: KeepAliveProblem,
    *,
    lookahead: int = LOOKAHEAD,
    step: int = STEP,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-4,
    progress: Progress = quiet,
) -> Result[KeepAlivePlan]:
    """Rolling horizon: solve ``lookahead`` windows, keep the first ``step``, roll
    on from the kept states with what is left of the SLO and cold-start allowances.
    Each step sees only part of the forecast, so the plan carries no bound. When the
    time limit comes before the last window there is no plan (``no_solution``,
    naming the windows planned)."""
    t0 = time.perf_counter()
    n_t = p.n_windows
    states = np.full((p.n_functions, n_t), -1, dtype=np.int64)
    start: IntArray = np.full(p.n_functions, p.source_state, dtype=np.int64)
    slo_left = p.slo_budget.copy()
    cold_left = p.cold_cap
    cold = p.is_cold()
    first = 0
    steps = 0
    log: list[str] = []

    def no_plan(why: str, termination: Termination) -> Result[KeepAlivePlan]:
        return Result(
            NO_SOLUTION,
            None,
            None,
            time.perf_counter() - t0,
            None,
            "rolling",
            log=log,
            diagnosis=[why],
            termination=termination,
            formulation=FORMULATION,
            algorithm=f"rolling horizon, lookahead {lookahead}, step {step}",
        )

    def out_of_time() -> Result[KeepAlivePlan]:
        log.append(f"time limit after {steps} MILPs")
        return no_plan(
            f"the time limit ({time_limit_s:g} s) came with {first} of {n_t} windows "
            "planned; raise --time-limit, or use lagrangian, which keeps its best plan",
            Termination.TIME_LIMIT,
        )

    while first < n_t:
        last = min(n_t, first + lookahead)
        keep = n_t if last == n_t else min(last, first + step)
        if time.perf_counter() - t0 >= time_limit_s:
            return out_of_time()
        milp = build_milp(p, first, last, start, slo_left, cold_left)
        run = _run(milp, time_limit_s - (time.perf_counter() - t0), rel_gap)
        steps += 1
        if run.col_value is None:
            log.append(f"windows {first}-{last - 1}: no plan ({run.highs_status})")
            if time.perf_counter() - t0 >= time_limit_s:
                return out_of_time()
            return no_plan(
                f"the rolling horizon found no plan for windows {first}-{last - 1} from "
                "the states it had kept; the whole-horizon solver (milp) may",
                Termination.HEURISTIC,
            )
        values = np.round(run.col_value)
        part = states_of(milp, values, p.n_functions, first, last)
        states[:, first:keep] = part[:, : keep - first]
        window = np.arange(first, keep)
        lam = p.arrivals[:, window]
        chosen = states[:, first:keep]
        fidx = np.arange(p.n_functions)[:, None]
        slo_left = slo_left - (lam * p.slow[fidx, chosen]).sum(axis=1)
        cold_left = cold_left - float((lam * cold[chosen]).sum())
        start = states[:, keep - 1].copy()
        progress(f"rolling: windows {first}-{keep - 1} fixed")
        first = keep
    log.append(f"{steps} MILPs of at most {lookahead} windows")
    return Result(
        FEASIBLE,
        p.energy_of(states),
        None,
        time.perf_counter() - t0,
        p.plan_of(states),
        "rolling",
        log=log,
        termination=Termination.HEURISTIC,
        formulation=FORMULATION,
        algorithm=f"rolling horizon, lookahead {lookahead}, step {step}",
    )


def _diagnosis(p: KeepAliveProblem) -> list[str]:
    """Why a keep-alive problem may have no plan, from its numbers."""
    out = []
    fast = ~p.slow & p.allowed
    for f, fn in enumerate(p.spec.functions):
        if np.isfinite(p.slo_budget[f]) and not fast[f].any():
            out.append(
                f"{fn.name}: no state starts requests within its SLO; at most "
                f"{p.slo_budget[f]:g} of its requests may start late"
            )
    if np.isfinite(p.cold_cap):
        out.append(
            f"the cold-start cap allows {p.cold_cap:g} cold starts; functions that fit no "
            "node warm or tepid must start cold"
        )
    out.append(
        "the node budgets cannot hold the warm or tepid states the SLOs and the cold-start "
        "cap require"
    )
    return out
