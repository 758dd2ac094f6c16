"""Serverless provisioning with HiGHS: the whole-horizon MILP (exact), its LP
relaxation (a certified bound, with the relaxation's counts rounded up as a plan),
and the MILP rolled over the epochs one at a time (what an online planner runs)."""

from __future__ import annotations

import time

import numpy as np

from energyopt.backends.highs import MipRun, MipStatus, solve_mip
from energyopt.families.serverless.formulations.milp import (
    DECODE,
    Milp,
    build_milp,
    highs_lp,
    objective_of,
    solution_of,
)
from energyopt.families.serverless.formulations.model import FloatArray, IntArray, ServerlessProblem
from energyopt.families.serverless.solvers.result import serverless_result
from energyopt.families.serverless.spec import Pool, ServerlessPlan
from energyopt.progress import Progress, quiet
from energyopt.solvers.mip_outcome import mip_outcome
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Result,
    Termination,
)

ROUND_TOL = 1e-6
"""A relaxed count within this of an integer is that integer."""
ROLLING = "rolling horizon, one epoch per MILP"


def _run(milp: Milp, time_limit_s: float, rel_gap: float, relax: bool, t0: float) -> MipRun:
    """HiGHS on the program within what is left of ``time_limit_s`` counted from
    ``t0`` (``time.perf_counter``, before the program was built). HiGHS does not stop
    inside its setup and presolve, and the plan is read back after it: on large
    programs these take up to twice as long as building and passing the program
    did (747,520 columns: 4.7 s of setup at a 0.01-s limit on a loaded machine), so
    three times that is held back from its limit."""
    lp = highs_lp(milp, relax=relax)
    spent = time.perf_counter() - t0
    left = time_limit_s - 3.0 * spent
    if left <= 0:  # HiGHS could not even set up within the limit: not started
        return MipRun(
            False, float("nan"), -np.inf, MipStatus.OTHER, "not run: no time left", None, True
        )
    return solve_mip(lp, time_limit_s=left, rel_gap=rel_gap)


def _split(milp: Milp, values: FloatArray) -> tuple[IntArray, FloatArray, FloatArray]:
    n_p = milp.n_pools
    counts = np.round(values[:n_p]).astype(np.int64)
    rates = np.maximum(values[n_p : 2 * n_p], 0.0)
    routes = np.maximum(values[4 * n_p :], 0.0)
    return counts, rates, routes


def _plan(
    p: ServerlessProblem, milp: Milp, counts: IntArray, rates: FloatArray, routes: FloatArray
) -> ServerlessPlan:
    pools, route_list = solution_of(p, milp, counts, rates, routes)
    return p.plan_of(pools, route_list)


def _infeasible(solver: str, wall: float, log: list[str]) -> Result[ServerlessPlan]:
    return serverless_result(
        INFEASIBLE,
        solver,
        wall,
        log=log,
        diagnosis=[
            "the nodes' GPUs, NICs or power caps cannot hold instances enough for some "
            "epoch's demand within the SLOs"
        ],
        termination=Termination.INFEASIBLE,
        algorithm="HiGHS",
    )


def solve_milp(
    p: ServerlessProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
) -> Result[ServerlessPlan]:
    """The whole horizon's MILP: optimal within ``rel_gap`` or, at the time limit,
    HiGHS' best plan and bound. Objective in the file's unit."""
    t0 = time.perf_counter()
    milp = build_milp(p)
    progress(f"milp: {len(milp):,} columns, {milp.matrix.shape[0]:,} rows")
    if len(milp) == 0:  # no demand anywhere: the empty plan
        empty = np.zeros(0)
        return serverless_result(
            OPTIMAL,
            "milp",
            time.perf_counter() - t0,
            objective=0.0,
            bound=0.0,
            plan=_plan(p, milp, empty.astype(np.int64), empty, empty),
            termination=Termination.CONVERGED,
            algorithm="no demand: nothing to run",
        )
    run = _run(milp, time_limit_s, rel_gap, relax=False, t0=t0)
    log = [f"HiGHS: {run.highs_status}, {len(milp):,} columns"]
    wall = time.perf_counter() - t0
    status, termination, bound = mip_outcome(run)
    if status is INFEASIBLE:
        return _infeasible("milp", wall, log)
    objective: float | None = None
    plan: ServerlessPlan | None = None
    if run.col_value is not None:
        counts, rates, routes = _split(milp, run.col_value)
        objective = objective_of(milp, counts, rates)
        plan = _plan(p, milp, counts, rates, routes)
    return serverless_result(
        status,
        "milp",
        wall,
        objective=objective,
        bound=bound,
        plan=plan,
        log=log,
        termination=termination,
        algorithm="HiGHS branch and cut",
    )


def solve_relaxation(
    p: ServerlessProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
) -> Result[ServerlessPlan]:
    """The LP relaxation: its optimum is a lower bound on every plan's cost; its
    counts rounded up (with rates and routes as they are) are a plan when the
    nodes hold them. The caller certifies the plan (and may offer a cheaper one)."""
    t0 = time.perf_counter()
    milp = build_milp(p)
    progress(f"lp relaxation: {len(milp):,} columns, {milp.matrix.shape[0]:,} rows")
    run = _run(milp, time_limit_s, rel_gap, relax=True, t0=t0)
    wall = time.perf_counter() - t0
    log = [f"HiGHS LP: {run.highs_status}"]
    if run.status is MipStatus.INFEASIBLE:
        return _infeasible("lp", wall, log)
    if not run.optimal or run.col_value is None:
        return serverless_result(
            NO_SOLUTION,
            "lp",
            wall,
            log=log,
            termination=Termination.TIME_LIMIT,
            algorithm="HiGHS dual simplex (LP relaxation)",
        )
    bound = run.dual_bound  # the LP optimum
    values = run.col_value
    n_p = milp.n_pools
    counts = np.ceil(values[:n_p] - ROUND_TOL).astype(np.int64)
    _, rates, routes = _split(milp, values)
    gpus = p.gpus_of()
    fits = True
    for t in range(milp.first, milp.last):
        for n in range(p.n_nodes):
            here = (milp.pt == t) & (milp.pn == n)
            if float((counts[here] * gpus[milp.po[here]]).sum()) > p.node_gpus[n] + 1e-9:
                fits = False
    plan = _plan(p, milp, counts, rates, routes) if fits else None
    if plan is None:
        log.append("the relaxation's counts rounded up do not fit the nodes")
    return serverless_result(
        FEASIBLE if plan is not None else NO_SOLUTION,
        "lp",
        wall,
        objective=objective_of(milp, counts, rates) if plan is not None else None,
        bound=bound,
        plan=plan,
        log=log,
        termination=Termination.CONVERGED,
        algorithm="LP relaxation bound, counts rounded up",
    )


def solve_rolling(
    p: ServerlessProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
) -> Result[ServerlessPlan]:
    """One epoch's MILP at a time, from the instances the epoch before kept (each
    step sees one epoch of the forecast, so the plan carries no bound)."""
    t0 = time.perf_counter()
    start: dict[tuple[int, int, int, int], int] = {}
    pools: list[list[Pool]] = []
    routes: list[list[tuple[int, int, int, float]]] = []
    total = 0.0
    for t in range(p.n_epochs):
        began = time.perf_counter()
        left = time_limit_s - (began - t0)
        if left <= 0:
            return serverless_result(
                NO_SOLUTION,
                "rolling",
                time.perf_counter() - t0,
                log=[f"the time limit came before epoch {t} of {p.n_epochs}: no plan"],
                termination=Termination.TIME_LIMIT,
                algorithm=ROLLING,
            )
        milp = build_milp(p, t, t + 1, start)
        if len(milp) == 0:  # no demand in the epoch: nothing runs, decode instances stop
            total += sum(
                c * float(p.stop_cost(m)[o]) for (m, _, o, k), c in start.items() if k == DECODE
            )
            pools.append([])
            routes.append([])
            start = {}
            continue
        run = _run(milp, left, rel_gap, relax=False, t0=began)
        if run.col_value is None:
            ended = "the time limit came" if run.time_limited else "no plan"
            return serverless_result(
                INFEASIBLE if run.status is MipStatus.INFEASIBLE else NO_SOLUTION,
                "rolling",
                time.perf_counter() - t0,
                log=[f"epoch {t} of {p.n_epochs}: {ended} (HiGHS: {run.highs_status})"],
                termination=Termination.TIME_LIMIT if run.time_limited else Termination.HEURISTIC,
                algorithm=ROLLING,
            )
        counts, rates, route_rates = _split(milp, run.col_value)
        total += objective_of(milp, counts, rates, start, p.stop_cost)
        part, part_routes = solution_of(p, milp, counts, rates, route_rates)
        pools.append(part[0])
        routes.append(part_routes[0])
        start = {
            (int(milp.pm[i]), int(milp.pn[i]), int(milp.po[i]), int(milp.pk[i])): int(counts[i])
            for i in range(milp.n_pools)
            if counts[i] > 0
        }
        progress(f"rolling: epoch {t} planned")
    return serverless_result(
        FEASIBLE,
        "rolling",
        time.perf_counter() - t0,
        objective=total,
        plan=p.plan_of(pools, routes),
        termination=Termination.HEURISTIC,
        algorithm=ROLLING,
    )
