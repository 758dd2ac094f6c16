"""What every serving solver shares: the backend a preset names, the status of an
objective against its bound, and the plan of a solver's decisions.

Imports no serving solver, so the decompositions (branch-and-price, shadow
prices, POP) and the configuration formulation's solver can use it without
importing ``solvers.serving``, which dispatches to them.
"""

from __future__ import annotations

from typing import Any

import pyomo.environ as pyo

from energyopt.backends.cpsat import solve_cpsat
from energyopt.backends.pyomo_highs import MilpOutcome, solve_milp
from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.assemble import assemble_plan
from energyopt.perf.oppoints import OpTable
from energyopt.progress import Progress
from energyopt.solvers.presets import SolverPreset
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Result,
    Status,
    relative_gap,
    status_at,
)
from energyopt.spec.plan import Plan

ServingResult = Result[Plan]
"""What every serving solver returns: the plan, its cost in the instance's objective
(W for power), a valid lower bound and the gap."""


def bnb_filter(progress: Progress) -> Progress:
    """Forward only HiGHS branch-and-bound table rows (the lines with a gap column)."""

    def sink(line: str) -> None:
        tokens = line.split()
        gaps = [i for i, t in enumerate(tokens) if t.endswith("%") or t in ("inf", "Large")]
        if len(gaps) < 2 or "restarting" in line or not tokens[-1].endswith("s"):
            return
        g = gaps[-1]
        bound, incumbent, gap = tokens[g - 2], tokens[g - 1], tokens[g]
        progress(f"highs: bound {bound}, incumbent {incumbent}, gap {gap}, {tokens[-1]}")

    return sink


def run_backend(
    model: Any,
    preset: SolverPreset,
    *,
    time_limit_s: float,
    rel_gap: float,
    progress: Progress,
    bound: bool = True,
) -> MilpOutcome:
    """Solve a Pyomo model with the preset's backend (``bound`` False: CP-SAT
    spends no time on a bound the caller does not use)."""
    if preset.backend == "cpsat":
        return solve_cpsat(
            model,
            time_limit_s=time_limit_s,
            rel_gap=rel_gap,
            threads=preset.threads,
            progress=progress,
            bound=bound,
        )
    return solve_milp(
        model,
        time_limit_s=time_limit_s,
        rel_gap=rel_gap,
        threads=preset.threads,
        progress=bnb_filter(progress),
    )


def plan_status(
    outcome_status: str, objective: float | None, bound: float | None, gap: float
) -> Status:
    if objective is None:
        return NO_SOLUTION if outcome_status != INFEASIBLE else INFEASIBLE
    if bound is not None:
        return status_at(objective, bound, gap)
    return FEASIBLE


def finish_plan(
    problem: Problem,
    table: OpTable,
    decisions: dict[str, Any],
    status: str,
    objective: float,
    bound: float | None,
    name: str,
) -> Any:
    """The plan of ``decisions``, with the solver's objective, bound and gap."""
    gap = relative_gap(objective, bound) if bound is not None else None
    return assemble_plan(
        problem,
        table,
        decisions,
        solver=name,
        status=status,
        objective=objective,
        bound=bound,
        gap=gap,
    )


def lp_relaxation_bound(model: Any) -> float:
    """Optimal value of the LP relaxation of a Pyomo MILP (HiGHS); a valid lower bound."""
    relaxed = model.clone()
    pyo.TransformationFactory("core.relax_integer_vars").apply_to(relaxed)
    out = solve_milp(relaxed, time_limit_s=60.0)
    if out.status != OPTIMAL or out.objective is None:
        return float("-inf")
    return float(out.objective)
