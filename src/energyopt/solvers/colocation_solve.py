"""Pick and run a co-location solver by name."""

from __future__ import annotations

from energyopt.formulations.colocation.interference import Slowdown
from energyopt.formulations.colocation.model import ColocationModel, build_model
from energyopt.formulations.colocation.problem import ColocationProblem
from energyopt.progress import Progress
from energyopt.solvers.colocation_exact import solve_exact
from energyopt.solvers.colocation_isolated import solve_isolated
from energyopt.solvers.colocation_result import ColocationResult
from energyopt.solvers.colocation_shadow import solve_shadow
from energyopt.spec.errors import SpecError

SOLVERS = ("auto", "shadow-price", "exact", "isolated")
"""Names; what each guarantees is listed by the co-location family's ``solvers()``."""
EXACT_MAX_COLUMNS = 20_000
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
        name = "exact" if exact_columns(model) <= EXACT_MAX_COLUMNS else "shadow-price"
        if progress is not None:
            progress(f"solver auto: {name} ({exact_columns(model):,} MILP columns at most)")
    if name == "isolated":
        return model, solve_isolated(model)
    gap = rel_gap if rel_gap is not None else DEFAULT_GAP[name]
    if name == "exact":
        return model, solve_exact(model, time_limit_s=limit, rel_gap=gap, progress=progress)
    return model, solve_shadow(model, time_limit_s=limit, rel_gap=gap, progress=progress)
