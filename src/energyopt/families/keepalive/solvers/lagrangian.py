"""Lagrangian decomposition of the keep-alive MILP on its coupling rows.

Pricing every node's GPU memory, host memory and power per window (y >= 0), each
function's SLO allowance and the cold-start cap, the MILP falls apart by function:
each function's best plan is a shortest path through its states x windows, with
arc costs

    move_j(a, b) (1 + y_pow[n(b), t] / dt)
    + state_j(t, b) (1 + y_pow[n(b), t] / dt) + y_gpu[n(b), t] gpu(b) + y_host[n(b), t] host(b)
    + y_slo lambda_t late(b) + y_cold lambda_t cold(b),

and the dual function L(y) = sum_f shortest path_f(y) - y . budgets is a lower bound
on the optimum for every y >= 0. The prices move by the projected subgradient
with Polyak steps (solvers/subgradient.py); the best L is the certified bound.

Repair: functions in turn (most requested first) take the cheapest path that fits
in what the functions before them left of every node budget, with their SLO kept
exactly by a dynamic programme over late requests; costs are the true energies,
or the energies at the current prices (to leave room where it is scarce); a
cold-start cap is met by a growing penalty on cold requests. Where no repair fits,
the functions' paths are chosen jointly by the path master (solvers/paths.py).
"""

from __future__ import annotations

import time

import numpy as np

from energyopt.families.keepalive.formulations.milp import FORMULATION_NAME
from energyopt.families.keepalive.formulations.model import FloatArray, IntArray, KeepAliveProblem
from energyopt.families.keepalive.solvers.lp_prices import lp_prices
from energyopt.families.keepalive.solvers.paths import (
    PathPool,
    dive,
    price_paths,
    solve_path_master,
)
from energyopt.families.keepalive.solvers.programmes import (
    DENSE_CELLS,
    MAX_LATE_STATES,
    TOL,
    OutOfTime,
    Prices,
    best_moves,
    by_kind,
    one_function,
    priced_costs,
)
from energyopt.families.keepalive.spec import KeepAlivePlan
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import FEASIBLE, NO_SOLUTION, Result, Termination, relative_gap
from energyopt.solvers.subgradient import PolyakControl, projected_step

REPAIR_EVERY = 10
"""Subgradient iterations between repairs."""
FIRST_PASS_CELLS = 10_000_000
"""Cells of dynamic programme (``first_pass_cells`` per pass) the first repair may
take past the time limit, so that a plan comes back from a limit shorter than it;
an instance whose one pass is larger keeps the limit and may have no plan."""
LP_SHARE = 0.5
"""Most of the time limit the LP for the starting prices may take."""


def shortest_paths(p: KeepAliveProblem, y: Prices) -> tuple[FloatArray, IntArray]:
    """Each function's cheapest path at prices ``y``: (F,) priced costs, (F, T) states.
    With few states every pair of states is an arc (a few array operations per
    window); with many, moves between nodes go through ``best_moves``."""
    cost, factor = priced_costs(p, y)
    n_f, n_t, n_s = p.n_functions, p.n_windows, p.n_states
    back = np.zeros((n_t, n_f, n_s), dtype=np.int64)
    f = np.arange(n_f)
    value = p.move_j(f[:, None], p.source_state, np.arange(n_s)[None, :]) * factor[0] + cost[:, 0]
    moves = p.pair_moves_j if n_f * n_s * n_s <= DENSE_CELLS else None
    for t in range(1, n_t):
        if moves is not None:
            total = value[:, :, None] + moves * factor[t][None, None, :]
            back[t] = np.argmin(total, axis=1)
            value = total.min(axis=1) + cost[:, t, :]
            continue
        scale = by_kind(p, factor[t])  # (3, N)
        same = p.same_j[:, :, :, None] * scale[None, None, :, :]
        enter = p.enter_j[:, :, None] * scale[None, :, :]
        best, back[t] = best_moves(p, value, same, enter)
        value = best + cost[:, t, :]
    states = np.zeros((n_f, n_t), dtype=np.int64)
    states[:, -1] = np.argmin(value, axis=1)
    for t in range(n_t - 1, 0, -1):
        states[:, t - 1] = back[t][np.arange(n_f), states[:, t]]
    return value.min(axis=1), states


def usage(
    p: KeepAliveProblem, states: IntArray, functions: IntArray | None = None
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(N, T) GPU memory GB, host memory GB and average power W of the states (rows:
    ``functions``, default all)."""
    n_f, n_t = states.shape
    node = p.node_of()[states]
    fns = np.arange(n_f) if functions is None else functions
    f = np.repeat(fns, n_t).reshape(n_f, n_t)
    t = np.tile(np.arange(n_t), n_f).reshape(n_f, n_t)
    prev = np.concatenate([np.full((n_f, 1), p.source_state), states[:, :-1]], axis=1)
    energy = p.state_j[f, t, states] + p.move_j(f, prev, states)
    out = []
    for value in (p.gpu_gb[f, states], p.host_gb[f, states], energy / p.window_s):
        grid = np.zeros((p.n_nodes, n_t))
        np.add.at(grid, (node, t), value)
        out.append(grid)
    return out[0], out[1], out[2]


def plan_energy(p: KeepAliveProblem, states: IntArray) -> float:
    """Energy of a plan's states over the horizon, J (the solver's own figure)."""
    return p.energy_of(states)


def dual_point(p: KeepAliveProblem, y: Prices) -> tuple[float, IntArray, FloatArray]:
    """L(y), the functions' paths and a subgradient (usage minus budgets)."""
    values, states = shortest_paths(p, y)
    gpu, host, power = usage(p, states)
    slo_on = np.isfinite(p.slo_budget)
    budget = np.where(slo_on, p.slo_budget, 0.0)
    late = (p.arrivals * p.slow[np.arange(p.n_functions)[:, None], states]).sum(axis=1)
    cold_on = np.isfinite(p.cold_cap)
    colds = float((p.arrivals * p.is_cold()[states]).sum())
    cap = p.cold_cap if cold_on else 0.0
    value = float(values.sum())
    value -= float((y.gpu * p.gpu_cap[:, None]).sum() + (y.host * p.host_cap[:, None]).sum())
    value -= float((y.power * p.power_cap[:, None]).sum())
    value -= float((y.slo * budget).sum()) + y.cold * cap
    most, scale = p.covers.most[:, None], p.covers.scale[:, None]
    value -= float((y.cover * scale * most).sum())
    g = np.concatenate(
        [
            (gpu - p.gpu_cap[:, None]).ravel(),
            (host - p.host_cap[:, None]).ravel(),
            (power - p.power_cap[:, None]).ravel(),
            np.where(slo_on, late - budget, 0.0),
            [colds - cap if cold_on else 0.0],
            (scale * (p.covers.held(states) - most)).ravel(),
        ]
    )
    return value, states, g


def repair_orders(p: KeepAliveProblem) -> list[IntArray]:
    """Orders in which the repair places functions: largest warm GPU memory first
    (the hardest to fit), most requested first, and most SLO-bound first (the
    functions with the most requests in states slower than their SLO)."""
    f = np.arange(p.n_functions)
    warm_gb = p.gpu_gb.max(axis=1)
    requests = p.arrivals.sum(axis=1)
    late = np.where(np.isfinite(p.slo_budget), requests * p.slow.any(axis=1) - p.slo_budget, 0.0)
    orders = [
        np.lexsort((f, -requests, -warm_gb)),
        np.lexsort((f, -warm_gb, -requests)),
        np.lexsort((f, -warm_gb, -late)),
    ]
    unique: list[IntArray] = []
    for order in orders:
        if not any(np.array_equal(order, u) for u in unique):
            unique.append(order.astype(np.int64))
    return unique


def repair(
    p: KeepAliveProblem,
    guide: Prices,
    cold_penalty: float,
    order: IntArray,
    deadline: float | None = None,
) -> IntArray | None:
    """A plan within the node budgets and SLOs built function by function, starting
    in ``order``: a function that finds no path that fits moves to the front and
    the placement restarts (at most F times); None if that does not help."""
    current = [int(f) for f in order]
    for _ in range(p.n_functions + 1):
        states, failed = _place(p, guide, cold_penalty, current, deadline)
        if states is not None:
            return states
        assert failed is not None
        if current[0] == failed:
            return None
        current.remove(failed)
        current.insert(0, failed)
    return None


def _place(
    p: KeepAliveProblem,
    guide: Prices,
    cold_penalty: float,
    order: list[int],
    deadline: float | None = None,
) -> tuple[IntArray | None, int | None]:
    """(plan, None) placing the functions in ``order`` at the costs ``guide`` gives,
    or (None, the first function that finds no path that fits)."""
    cost_all, factor = priced_costs(
        p, Prices(guide.gpu, guide.host, guide.power, guide.slo * 0, 0.0, guide.cover)
    )
    cold = p.is_cold()
    free_gpu = np.tile(p.gpu_cap[:, None], (1, p.n_windows)).astype(np.float64)
    free_host = np.tile(p.host_cap[:, None], (1, p.n_windows)).astype(np.float64)
    free_power = np.tile(p.power_cap[:, None], (1, p.n_windows)).astype(np.float64)
    states = np.zeros((p.n_functions, p.n_windows), dtype=np.int64)
    late_penalty = float(np.max(p.state_j)) + 1.0
    for f in order:
        if deadline is not None and time.perf_counter() > deadline:
            raise OutOfTime
        cost = cost_all[f] + cold_penalty * p.arrivals[f][:, None] * cold[None, :]
        path = one_function(
            p, int(f), cost, factor, free_gpu, free_host, free_power, late_penalty, deadline
        )
        if path is None:
            return None, int(f)
        states[f] = path
        gpu, host, power = usage(p, path[None, :], np.array([f]))
        free_gpu -= gpu
        free_host -= host
        free_power -= power
    return states, None


def feasible_states(p: KeepAliveProblem, states: IntArray) -> bool:
    """Whether the plan keeps the SLOs and the cold-start cap (the repair keeps the
    node budgets by construction)."""
    f = np.arange(p.n_functions)[:, None]
    late = (p.arrivals * p.slow[f, states]).sum(axis=1)
    if np.any(late > p.slo_budget * (1 + TOL) + TOL):
        return False
    colds = float((p.arrivals * p.is_cold()[states]).sum())
    return colds <= p.cold_cap * (1 + TOL) + TOL


def _mean_move_j(p: KeepAliveProblem) -> float:
    """Mean energy of every possible move of every function (from every offered state
    or the start into every offered state), J; 1 where there is none. Counted by
    kind: a state on another node (or the start) moves in at the entering energy."""
    n_f = p.n_functions
    offered = p.allowed.reshape(n_f, 3, p.n_nodes)
    kinds = np.asarray(offered.any(axis=2), dtype=np.bool_)  # (F, 3) kinds offered
    nodes = offered[:, 0].sum(axis=1)  # permitted nodes (warm is offered on each)
    n_kinds = kinds.sum(axis=1)
    enter_ok = kinds & np.isfinite(p.enter_j)
    entering_from = (1 + (nodes - 1) * n_kinds)[:, None]  # the start, other nodes
    same_ok = kinds[:, :, None] & kinds[:, None, :] & np.isfinite(p.same_j)
    count = nodes[:, None] * (enter_ok * entering_from + same_ok.sum(axis=1))
    total = nodes[:, None] * (
        np.where(enter_ok, p.enter_j, 0.0) * entering_from
        + np.where(same_ok, p.same_j, 0.0).sum(axis=1)
    )
    return float(total.sum() / count.sum()) if count.sum() > 0 else 1.0


def best_repair(p: KeepAliveProblem, y: Prices, deadline: float | None = None) -> IntArray | None:
    """The cheapest feasible plan of the repairs at true and at priced costs, in
    every order of ``repair_orders`` (those done when ``deadline`` passes)."""
    best: IntArray | None = None
    best_cost = np.inf
    base = _mean_move_j(p)
    step = base / max(1.0, float(p.arrivals.mean()))
    guides = [Prices.zero(p)] + ([y] if np.any(y.vector() != 0) else [])  # y = 0 repeats it
    for guide in guides:
        for order in repair_orders(p):
            penalty = y.cold
            for _ in range(16):
                try:
                    states = repair(p, guide, penalty, order, deadline)
                except OutOfTime:
                    return best
                if states is None:
                    break
                if feasible_states(p, states):
                    cost = plan_energy(p, states)
                    if cost < best_cost:
                        best, best_cost = states, cost
                    break
                penalty = max(4.0 * penalty, step)
    return best


def first_pass_cells(p: KeepAliveProblem) -> int:
    """Cells of one greedy pass's dynamic programmes: per function, windows x states
    x the late-request counts its SLO programme tracks (1 where it tracks none)."""
    budget = np.where(np.isfinite(p.slo_budget), p.slo_budget, 0.0)
    width = np.minimum(np.floor(budget + 1e-9), MAX_LATE_STATES) + 1
    return int(width.sum()) * p.n_windows * p.n_states


def first_repair(p: KeepAliveProblem) -> IntArray | None:
    """The repair at true costs in the first order of ``repair_orders`` (a function
    that finds no path moves to the front; a broken cold-start cap raises the
    penalty on cold requests), run whatever the time for at most FIRST_PASS_CELLS
    cells of dynamic programme in all (counted work: the one step of
    ``solve_lagrangian`` that does not stop at its deadline); None where no plan
    comes within that work."""
    passes = FIRST_PASS_CELLS // max(1, first_pass_cells(p))
    order = [int(f) for f in repair_orders(p)[0]]
    step = _mean_move_j(p) / max(1.0, float(p.arrivals.mean()))
    penalty = 0.0
    for _ in range(passes):
        states, failed = _place(p, Prices.zero(p), penalty, order)
        if states is None:
            assert failed is not None
            if order[0] == failed:
                return None
            order.remove(failed)
            order.insert(0, failed)
        elif feasible_states(p, states):
            return states
        else:
            penalty = max(4.0 * penalty, step)
    return None


def _rolling_plan(p: KeepAliveProblem, deadline: float) -> tuple[IntArray | None, str]:
    """The rolling-horizon MILP's plan as states (None without one) and a log line."""
    from energyopt.families.keepalive.formulations.milp import MAX_COLUMNS, milp_columns
    from energyopt.families.keepalive.solvers.milp import LOOKAHEAD, solve_rolling

    left = deadline - time.perf_counter()
    if left < 0.5:
        return None, "rolling-horizon MILP: no time left"
    if milp_columns(p, 0, min(p.n_windows, LOOKAHEAD)) > MAX_COLUMNS:
        return None, "rolling-horizon MILP: too large to build"
    rolled = solve_rolling(p, time_limit_s=left)
    if rolled.plan is None:
        return None, "rolling-horizon MILP: none"
    states = p.states_of(rolled.plan)
    return states, f"rolling-horizon MILP: {plan_energy(p, states):,.0f} J"


def solve_lagrangian(
    p: KeepAliveProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-4,
    max_iterations: int = 300,
    progress: Progress = quiet,
    lp_start: bool = True,
) -> Result[KeepAlivePlan]:
    """Projected subgradient on the coupling rows with repairs; the best plan, the
    best dual value as its certified lower bound, J. ``lp_start`` False: from zero
    prices, with no LP solved.

    The prices start at the LP's optimal prices of the strengthened programme
    (solvers/lp_prices.py) where it is small enough, at most ``LP_SHARE`` of the
    time limit; the bound is always L(y) at prices the method evaluated itself.
    The time limit is kept by every step (each dual point, repair and master
    checks it; one dual point always runs, so that there is a bound) except the
    first repair (``first_repair``), which takes at most FIRST_PASS_CELLS of
    counted work, so that a plan comes back even from a limit shorter than that.
    The status then says time limit."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    log: list[str] = []
    control = PolyakControl(theta=1.0, patience=10)
    y = Prices.zero(p)
    if lp_start:
        start, line = lp_prices(p, LP_SHARE * time_limit_s)
        log.append(line)
        progress(f"lagrangian: {line}")
        if start is not None:
            y = start
    prices = y.vector()
    best_bound = -np.inf
    best_plan: IntArray | None = None
    upper = np.inf
    iterations = 0
    termination = Termination.EFFORT_LIMIT
    pool = PathPool(p)
    while iterations < max_iterations:
        if iterations > 0 and time.perf_counter() >= deadline:
            termination = Termination.TIME_LIMIT
            break
        iterations += 1
        value, paths, g = dual_point(p, y)
        pool.offer(paths)
        if control.observe(value):
            best_bound = max(best_bound, value)
        if iterations == 1 or iterations % REPAIR_EVERY == 0:
            states = best_repair(p, y, deadline)
            if states is None and best_plan is None and time.perf_counter() >= deadline:
                states = first_repair(p)
            if states is not None:
                pool.offer(states)
                cost = plan_energy(p, states)
                if cost < upper:
                    upper, best_plan = cost, states
                    progress(f"lagrangian: plan {upper:,.0f} J, bound {best_bound:,.0f} J")
        if np.isfinite(upper) and relative_gap(upper, best_bound) <= rel_gap:
            termination = Termination.CONVERGED
            break
        if time.perf_counter() >= deadline:
            termination = Termination.TIME_LIMIT
            break
        target = upper if np.isfinite(upper) else value + 0.1 * abs(value) + 1.0
        prices, norm2 = projected_step(prices, g, value, target, control.theta)
        if norm2 <= 1e-18:
            # every row holds and every priced row is tight: the paths are feasible
            # and, by complementary slackness, optimal
            cost = plan_energy(p, paths)
            if cost < upper:
                upper, best_plan = cost, paths
            termination = Termination.CONVERGED
            break
        y = Prices.of(p, prices)
    log.append(f"{iterations} subgradient iterations, best dual {best_bound:,.3f} J")
    if (
        best_plan is not None
        and relative_gap(upper, best_bound) > rel_gap
        and time.perf_counter() < deadline
    ):
        # the pooled paths (dual points' and repairs') chosen jointly
        chosen = solve_path_master(p, pool, time_limit_s=deadline - time.perf_counter())
        if chosen is not None and plan_energy(p, chosen) < upper:
            upper, best_plan = plan_energy(p, chosen), chosen
            log.append(f"path master over {pool.size():,} paths: {upper:,.0f} J")
            progress(f"lagrangian: path master {upper:,.0f} J")
        if relative_gap(upper, best_bound) <= rel_gap:
            termination = Termination.CONVERGED
        elif time.perf_counter() >= deadline:
            termination = Termination.TIME_LIMIT
    if best_plan is None and time.perf_counter() >= deadline:
        log.append("the time limit came before any repair found a plan")
    elif best_plan is None:
        # No order of the greedy repair fits: choose the functions' paths jointly.
        priced = price_paths(p, pool, deadline)
        chosen = solve_path_master(p, pool, time_limit_s=deadline - time.perf_counter())
        how = "path master"
        if chosen is None and priced is not None:
            chosen, how = dive(priced, deadline), "path dive"
            # The dive's columns may hold a (cheaper) choice even where it failed.
            left = deadline - time.perf_counter()
            better = solve_path_master(p, pool, time_limit_s=left)
            if better is not None and (
                chosen is None or plan_energy(p, better) < plan_energy(p, chosen)
            ):
                chosen, how = better, "path master after the dive"
        found = "none" if chosen is None else f"{plan_energy(p, chosen):,.0f} J"
        line = f"{how} over {pool.size():,} paths: {found}"
        log.append(line)
        progress(f"lagrangian: {line}")
        if chosen is None:
            # Last resort, with the time left: the rolling-horizon MILP's plan.
            chosen, line = _rolling_plan(p, deadline)
            log.append(line)
            progress(f"lagrangian: {line}")
        if chosen is not None:
            upper, best_plan = plan_energy(p, chosen), chosen
    wall = time.perf_counter() - t0
    bound = float(best_bound) if np.isfinite(best_bound) else None
    if best_plan is None:
        return Result(
            NO_SOLUTION,
            None,
            bound,
            wall,
            None,
            "lagrangian",
            log=log,
            diagnosis=[
                f"the time limit ({time_limit_s:g} s) came before a plan was found; "
                "raise --time-limit"
                if time.perf_counter() >= deadline
                else "neither the repair, the path master nor the rolling-horizon MILP "
                "found a plan within the node budgets, SLOs and cap"
            ],
            termination=termination,
            formulation=FORMULATION_NAME,
            algorithm="Lagrangian on the node budgets, SLOs and cap; shortest paths; repair",
        )
    return Result(
        FEASIBLE,
        upper,
        bound,
        wall,
        p.plan_of(best_plan),
        "lagrangian",
        log=log,
        termination=termination,
        formulation=FORMULATION_NAME,
        algorithm="Lagrangian on the node budgets, SLOs and cap; shortest paths; repair",
    )
