"""Column generation for the configuration master: solve its LP, price every class's
configurations (listed, or by knapsack), add the improving ones, repeat.

The program and its pricing problems are ``formulations.serving.pattern``; the LP
is held warm by ``master_lp.LpSession``. Objective values, bounds and reduced
costs are in the instance's objective units (W for power).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import Duals, price_configs, priced_column
from energyopt.families.serving.formulations.knapsack import (
    COARSE_STEP_GB,
    KnapsackItems,
    best_configuration,
    greedy_configuration,
    repair_and_fill,
)
from energyopt.families.serving.formulations.pattern import (
    PatternProgram,
    column_reduced_cost,
    knapsack_pricing,
)
from energyopt.families.serving.solvers.master_lp import LpSession

RC_TOL = 1e-6
"""A column enters when its reduced cost is below -RC_TOL x max(1, |LP value|)."""
COLUMNS_PER_ROUND = 8
"""Columns added per (class, clock) and round at most."""
MAX_ROUNDS = 500
EXACT = 2
"""Pricing effort whose knapsack is exact (see ``knapsack_price``)."""


def generate_columns(
    prog: PatternProgram,
    log: Callable[[str], None] | None = None,
    deadline: float | None = None,
    *,
    session: LpSession | None = None,
    max_rounds: int = MAX_ROUNDS,
) -> str:
    """Column generation to LP optimality over all configurations
    (``deadline`` a ``time.perf_counter`` value), at most ``max_rounds`` rounds, in
    ``session`` (a new one over the program's columns when None; a given session
    must hold a prefix of ``prog.columns`` and keeps its rows and bounds).

    Sets ``prog.lp`` and ``prog.bound``: the best Lagrangian bound seen (the LP
    value corrected by the most negative reduced cost per class), valid even if
    pricing stopped early. Returns why it stopped: "converged" (no column prices
    out), "rounds" (``max_rounds``) or "time" (``deadline``). Knapsack-priced
    configurations are searched with the coarse DP first; the exact DP runs when
    the coarse one finds nothing (and at the time limit), so every bound reported
    comes from exact pricing.
    """
    if session is None:
        session = LpSession(prog.problem, prog.table, prog.costs, prog.classes, prog.columns)
    for rnd in range(max_rounds):
        if len(session.mp.z_var) < len(prog.columns):
            session.add(prog.columns[len(session.mp.z_var) :])
        prog.lp = session.solve()
        effort = EXACT if prog.enumerated else 0
        added, best, bound = price_round(prog, effort=effort)
        while not added and effort < EXACT:
            effort += 1
            added, best, bound = price_round(prog, effort=effort)
        if bound is not None:
            prog.bound = max(prog.bound, bound)
        prog.rounds = rnd + 1
        if log and (rnd % 5 == 0 or added == 0):
            log(
                f"colgen round {rnd + 1}: LP {prog.lp.objective:,.2f}, "
                f"{len(prog.columns)} columns, best reduced cost {best:,.3f}"
            )
        if added == 0:
            return "converged"
        if deadline is not None and time.perf_counter() > deadline:
            if log:
                log("column generation stopped at the time limit; bound is the Lagrangian one")
            why = "time"
            break
    else:
        why = "rounds"
        if log:
            log(f"column generation stopped after {max_rounds} rounds; bound is Lagrangian")
    session.add(prog.columns[len(session.mp.z_var) :])
    prog.lp = session.solve()
    _, _, bound = price_round(prog, effort=EXACT, add=False)
    if bound is not None:
        prog.bound = max(prog.bound, bound)
    return why


def price_round(
    prog: PatternProgram, *, effort: int, add: bool = True
) -> tuple[int, float, float | None]:
    """Price every class at the current duals: (columns added, best reduced cost,
    Lagrangian bound or None when some pricing was not exact)."""
    assert prog.lp is not None
    table, costs, duals = prog.table, prog.costs, prog.lp.duals
    tol = -RC_TOL * max(1.0, abs(prog.lp.objective))
    added = 0
    best = 0.0
    correction = 0.0
    for cls in prog.classes:
        class_min = 0.0
        for (type_name, clock), cs in prog.configs.items():
            if type_name != cls.type_name or len(cs) == 0:
                continue
            rc = price_configs(cls, cs, table, costs, duals)
            class_min = min(class_min, float(rc.min()))
            for j in np.argsort(rc)[:COLUMNS_PER_ROUND]:
                if rc[j] >= tol:
                    break
                best = min(best, float(rc[j]))
                if add:
                    ops = tuple(int(o) for o in cs.ops(int(j)))
                    added += prog.add(priced_column(cls, table, costs, duals, clock, ops))
        for (type_name, clock), ks in prog.knapsacks.items():
            if type_name != cls.type_name or len(ks) == 0:
                continue
            low, found = knapsack_price(prog, cls, ks, duals, effort=effort)
            class_min = min(class_min, low)
            for ops in found:
                if not ops:
                    continue
                rc_found = float(column_reduced_cost(prog, cls, clock, ops)[0])
                if rc_found < tol:
                    best = min(best, rc_found)
                    if add:
                        added += prog.add(priced_column(cls, table, costs, duals, clock, ops))
        correction += cls.size * class_min
    bound = prog.lp.objective + correction if np.isfinite(correction) else None
    return added, best, bound


def knapsack_price(
    prog: PatternProgram, cls: GpuClass, ks: KnapsackItems, duals: Duals, *, effort: int
) -> tuple[float, list[tuple[int, ...]]]:
    """(lower bound on the class's least reduced cost at this clock, configurations
    worth pricing exactly), from the knapsack pricing problem
    (``pattern.knapsack_pricing``).

    ``effort`` 0 picks up to COLUMNS_PER_ROUND greedy configurations on disjoint
    units, 1 runs the coarse DP (both fast and proving nothing: the first element
    is then -inf), 2 the exact DP that the bound comes from.
    """
    pricing = knapsack_pricing(prog, cls, ks, duals)
    base, values, order = pricing.base, pricing.values, pricing.order
    if effort == 0:
        found: list[tuple[int, ...]] = []
        left = values.copy()
        for _ in range(COLUMNS_PER_ROUND):
            value, chosen = greedy_configuration(ks, left)
            if not chosen or base - value >= 0:
                break
            found.append(repair_and_fill(ks, values, chosen, order, cls.power_cap_w))
            taken = np.isin(ks.units, ks.units[chosen])
            left[taken] = 0.0
        return -np.inf, found
    if effort >= EXACT:
        value, chosen = best_configuration(ks, values)
        low = base - value
    else:
        value, chosen = best_configuration(ks, values, step_gb=COARSE_STEP_GB, feasible=True)
        low = -np.inf
    if effort >= EXACT and not chosen:
        low = min(0.0, base)
    return low, ([repair_and_fill(ks, values, chosen, order, cls.power_cap_w)] if chosen else [])
