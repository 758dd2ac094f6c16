"""Pick and run a co-location solver by name."""

from __future__ import annotations

import time

from energyopt.families.colocation.formulations.interference import Slowdown
from energyopt.families.colocation.formulations.model import ColocationModel, build_model
from energyopt.families.colocation.formulations.problem import ColocationProblem
from energyopt.families.colocation.solvers.exact import solve_exact
from energyopt.families.colocation.solvers.isolated import solve_isolated
from energyopt.families.colocation.solvers.result import ColocationResult
from energyopt.families.colocation.solvers.shadow import solve_shadow
from energyopt.progress import Progress
from energyopt.solvers.result import FEASIBLE, INFEASIBLE, OPTIMAL
from energyopt.spec.errors import SpecError

SOLVERS = ("auto", "shadow-price", "exact", "isolated")
"""Names; what each guarantees is listed by the co-location family's ``solvers()``."""
EXACT_MAX_COLUMNS = 20_000
"""``auto`` solves the exact MILP alone up to this many columns."""
PORTFOLIO_MAX_COLUMNS = 200_000
"""Above EXACT_MAX_COLUMNS and up to this, ``auto`` runs shadow prices first and then
the exact MILP in the time left, keeping the better plan and the better bound (the
64-job bundled instance, 28,880 columns: shadow prices 4.7 % gap in 1.3 s, the MILP
proves the optimum in 6 s)."""
MIN_EXACT_S = 2.0
"""Least time left (s) for which ``auto`` still starts the exact MILP after shadow prices."""
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_GAP = {"exact": 1e-4, "shadow-price": 1e-3}


def solver_name(name: str) -> str:
    """The family's solver for a ``--solver`` value; SpecError listing valid names."""
    if name not in SOLVERS:
        raise SpecError(
            [f"--solver: unknown co-location solver {name!r}; available: {', '.join(SOLVERS)}"]
        )
    return name


def exact_columns(model: ColocationModel) -> int:
    """Columns the exact MILP would have (unit configurations x start slots, at most)."""
    return len(model.table.units) * model.slots


def solve_colocation(
    problem: ColocationProblem,
    solver: str = "auto",
    *,
    time_limit_s: float | None = None,
    rel_gap: float | None = None,
    progress: Progress | None = None,
    slowdown: Slowdown | None = None,
) -> tuple[ColocationModel, ColocationResult]:
    """The planning model and the chosen solver's result on it."""
    name = solver_name(solver)
    model = build_model(problem, slowdown)
    limit = time_limit_s if time_limit_s is not None else DEFAULT_TIME_LIMIT_S
    if name == "auto":
        columns = exact_columns(model)
        name = "exact" if columns <= EXACT_MAX_COLUMNS else "shadow-price"
        if progress is not None:
            progress(f"solver auto: {name} ({columns:,} MILP columns at most)")
        if name == "shadow-price" and columns <= PORTFOLIO_MAX_COLUMNS:
            return model, _portfolio(model, limit, rel_gap, progress)
    if name == "isolated":
        return model, solve_isolated(model)
    gap = rel_gap if rel_gap is not None else DEFAULT_GAP[name]
    if name == "exact":
        return model, solve_exact(model, time_limit_s=limit, rel_gap=gap, progress=progress)
    return model, solve_shadow(model, time_limit_s=limit, rel_gap=gap, progress=progress)


def _portfolio(
    model: ColocationModel, limit_s: float, rel_gap: float | None, progress: Progress | None
) -> ColocationResult:
    """Shadow prices, then (unless their gap already meets the exact target) the
    exact MILP in the time left: the better plan, and the better of the two bounds
    (both hold for the slotted model every plan here is on)."""
    t0 = time.perf_counter()
    shadow = solve_shadow(
        model,
        time_limit_s=limit_s,
        rel_gap=rel_gap if rel_gap is not None else DEFAULT_GAP["shadow-price"],
        progress=progress,
    )
    target = rel_gap if rel_gap is not None else DEFAULT_GAP["exact"]
    left = limit_s - (time.perf_counter() - t0)
    shadow.solver = "auto"
    if shadow.status is INFEASIBLE or (shadow.gap is not None and shadow.gap <= target):
        shadow.algorithm = "shadow prices (within the exact target gap)"
        return shadow
    if left < MIN_EXACT_S:
        shadow.log.append(f"auto: {left:.1f} s left after shadow prices, exact MILP not run")
        shadow.algorithm = "shadow prices (no time left for the exact MILP)"
        return shadow
    if progress is not None:
        progress(f"solver auto: shadow-price gap above {target:.2%}; exact MILP for {left:.1f} s")
    exact = solve_exact(model, time_limit_s=left, rel_gap=target, progress=progress)
    if exact.status is INFEASIBLE:
        return exact
    better = shadow
    if exact.objective is not None and (
        shadow.objective is None
        or (
            exact.objective < shadow.objective
            if shadow.sense == "min"
            else exact.objective > shadow.objective
        )
    ):
        better = exact
    bounds = [b for b in (shadow.bound, exact.bound) if b is not None]
    if bounds:
        better.bound = max(bounds) if better.sense == "min" else min(bounds)
        if better.objective is not None:
            o = better.objective
            better.bound = min(better.bound, o) if better.sense == "min" else max(better.bound, o)
    if better.objective is not None and better.bound is not None and better.gap is not None:
        # the other solver's bound may close this plan's gap
        better.status = OPTIMAL if better.gap <= target + 1e-12 else FEASIBLE
    better.solver = "auto"
    better.algorithm = (
        "exact MILP after shadow prices" if better is exact else "shadow prices (exact MILP after)"
    )
    better.log = [*shadow.log, *exact.log]
    better.wall_s = time.perf_counter() - t0
    return better
