"""Solve a serving problem: build the operating points, pick a formulation, run the
backend, assemble the plan, verify it, and explain infeasibility.
"""

from __future__ import annotations

import time

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.formulations.per_gpu import build_per_gpu
from energyopt.families.serving.pricing_context import pricing_context
from energyopt.families.serving.solvers.backend import (
    ServingResult,
    finish_plan,
    lp_relaxation_bound,
    plan_status,
    run_backend,
)
from energyopt.families.serving.solvers.configurations import solve_configurations
from energyopt.families.serving.solvers.diagnose import diagnose_infeasible, unservable_units
from energyopt.families.serving.verify import evaluate_plan
from energyopt.formulations.errors import BackendFailure, FormulationNotApplicable
from energyopt.perf.oppoints import OpTable, build_op_table
from energyopt.progress import Progress
from energyopt.solvers.presets import SolverPreset, load_preset
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    Result,
    settle,
)
from energyopt.spec.errors import SolverError

FINISH_S_PER_GPU = 2.5e-4
"""Seconds per GPU kept back from the search for assembling and verifying the plan
(fleet-10240 on the shared 2-core machine: 0.4-0.9 s to assemble, 1.9 s to
verify), at most a quarter of the time limit."""


class PlanVerificationError(SolverError):
    """A solver produced a plan the independent verifier rejects (a bug)."""


def _quiet(_: str) -> None:
    return None


AUTO_BNP_GPUS = 64
"""Up to this many GPUs the ``auto`` preset runs branch-and-price. On the bundled
fleets of 16 and 64 GPUs it proved its plan optimal in 15-30 s at a load average of
2-2.5 (with the pruned clock-pool MILPs, 6.5 and 11.2 CPU-s, 9.7 and 16.7 s at a
load average of 6), where the configuration MILP (``highs-exact``) stopped at 0.007 % and 2.98 %;
on fleet-256 it ran into the 60-s limit and its plan varied with the machine's load
(0.26-0.39 % above the bound) where the configuration MILP held 0.33 % in 7-11 s;
on fleet-1024 4.1 % against 0.46 % (``benchmarks/serving_auto.py``). Fleets
between 64 and 256 GPUs were not measured."""

AUTO_EXACT_GAP_GPUS = 16
"""Up to this many GPUs the ``auto`` preset closes the exact presets' gap (its own,
1e-4) rather than branch-and-price's 1e-3: it costs seconds there (quickstart
4.6 s against 1.8 s) and proves the plan optimal instead of within 0.1 %; on
fleet-64 it took 41.6 s against 25.9 s, too close to the 60-s limit on a loaded
machine."""

PER_GPU_INCUMBENT_GPUS = 16
"""Above this many GPUs, where the configuration formulation applies, the per-GPU
MILP first takes a plan from column generation on the configuration formulation
(in ``INCUMBENT_SHARE`` of its time), and keeps the better of that plan and its
own. On fleet-64 (72,320 columns) and fleet-256 HiGHS had not solved the per-GPU
model's root LP when a 60-s limit struck, and ``highs-per-gpu`` and
``highs-plain`` ended with no plan on a feasible instance. Pyomo cannot hand
HiGHS a starting plan, so the two searches run one after the other."""

INCUMBENT_SHARE = 0.25
"""Share of the per-GPU solve's time given to the configuration incumbent."""

AUTO_COLGEN_GPUS = 2048
"""Above this many GPUs the ``auto`` preset runs column generation, which stops on
counted work; on fleet-4096 it found the configuration MILP's plan (both stop at
the time limit there)."""


def auto_choice(problem: Problem, table: OpTable) -> tuple[str, str]:
    """The preset the ``auto`` preset runs on ``problem``, and why.

    Where the configuration formulation applies: branch-and-price (``bnp``) up to
    ``AUTO_BNP_GPUS`` GPUs, the configuration MILP (``highs-exact``) up to
    ``AUTO_COLGEN_GPUS``, column generation (``colgen``) above. Where it does not
    (GPUs with a current state, for example): the exact per-GPU MILP
    (``highs-exact``, which falls back to it). The chosen preset runs with its own
    settings (gap, node limits, iterations) at the ``auto`` preset's time limit, but
    with the ``auto`` preset's own gap up to ``AUTO_EXACT_GAP_GPUS`` GPUs; an
    explicit gap replaces either.
    """
    try:
        pat.check_applicable(problem, table)
    except pat.PatternNotApplicable as exc:
        return "highs-exact", f"the configuration formulation does not apply: {exc}"
    n = len(problem.gpus)
    if n > AUTO_COLGEN_GPUS:
        return "colgen", f"{n:,} GPUs, more than {AUTO_COLGEN_GPUS:,}"
    if n > AUTO_BNP_GPUS:
        return "highs-exact", f"the configuration formulation applies, {n:,} GPUs"
    return "bnp", f"the configuration formulation applies, {n:,} GPUs"


def choose_formulation(preset: SolverPreset, problem: Problem, table: OpTable) -> str:
    """The formulation the preset asks for; ``auto`` prefers the pattern one."""
    if preset.formulation != "auto":
        return preset.formulation
    try:
        pat.check_applicable(problem, table)
    except pat.PatternNotApplicable:
        return "per_gpu"
    return "pattern"


def solve(
    problem: Problem,
    preset: SolverPreset,
    *,
    time_limit_s: float | None = None,
    rel_gap: float | None = None,
    progress: Progress | None = None,
    scheduler: str | None = None,
) -> ServingResult:
    """Minimum-objective plan for ``problem``, verified, with its bound and gap.

    ``scheduler``: column generation prices on the Dask cluster there (an address
    such as ``tcp://host:8786``, or ``local:N`` for N local worker processes;
    ``dask_pricing``), with the same plan and bound as in this process."""
    if scheduler is not None:
        with pricing_context(scheduler):
            return solve(
                problem, preset, time_limit_s=time_limit_s, rel_gap=rel_gap, progress=progress
            )
    say = progress or _quiet
    start = time.perf_counter()
    limit = time_limit_s if time_limit_s is not None else preset.time_limit_s
    gap = rel_gap if rel_gap is not None else preset.rel_gap
    log: list[str] = []

    def note(line: str) -> None:
        log.append(line)
        say(line)

    table = build_op_table(problem)
    note(
        f"operating points: {len(table)} with positive SLO capacity "
        f"({time.perf_counter() - start:.1f} s)"
    )
    missing = unservable_units(problem, table)
    if missing:
        return Result(
            INFEASIBLE, None, None, time.perf_counter() - start, None, preset.name, log, missing
        )
    if preset.formulation == "best":
        choice, why = auto_choice(problem, table)
        chosen = load_preset(choice)
        note(f"{preset.name}: runs {choice} ({why})")
        if rel_gap is None and len(problem.gpus) > AUTO_EXACT_GAP_GPUS:
            gap = chosen.rel_gap
        preset = chosen.model_copy(update={"name": f"{preset.name} ({choice})"})
    formulation = choose_formulation(preset, problem, table)
    note(
        f"formulation: {formulation}, backend: {preset.backend}, time limit {limit:g} s, "
        f"gap {gap:g}"
    )
    # The plan's assembly and its verification come after the search: keep them
    # inside the limit too.
    deadline = start + limit - min(0.25 * limit, FINISH_S_PER_GPU * len(problem.gpus))
    try:
        if formulation in ("pattern", "colgen"):
            result = solve_configurations(
                problem, table, preset, deadline, gap, note, exact=formulation == "pattern"
            )
        elif formulation == "shadow_price":
            from energyopt.families.serving.solvers.shadow_price import solve_shadow_price

            result = solve_shadow_price(problem, table, preset, deadline, gap, note)
        elif formulation == "branch_price":
            from energyopt.families.serving.solvers.branch_price import solve_branch_price

            result = solve_branch_price(problem, table, preset, deadline, gap, note)
        elif formulation == "pop":
            from energyopt.families.serving.solvers.pop import solve_pop

            result = solve_pop(problem, table, preset, deadline, gap, note, solve)
        else:
            result = _solve_per_gpu(
                problem, table, preset, deadline, gap, note, strengthen=formulation == "per_gpu"
            )
    except (FormulationNotApplicable, BackendFailure) as exc:
        note(f"{formulation} formulation not used ({exc}); falling back to per-GPU")
        result = _solve_per_gpu(problem, table, preset, deadline, gap, note, strengthen=True)
        result.fallback = f"{formulation} formulation not used ({exc}); solved per-GPU"
        formulation = "per_gpu"
    result.formulation = formulation
    result.algorithm = result.algorithm or preset.backend
    result.log = log + [line for line in result.log if line not in log]
    result.solver = preset.name
    result.wall_s = time.perf_counter() - start
    if result.status == INFEASIBLE and not result.diagnosis:
        result.diagnosis = diagnose_infeasible(problem, table)
    if result.plan is not None:
        certify(problem, result, gap, note)
    return result


def certify(problem: Problem, result: ServingResult, rel_gap: float, note: Progress) -> None:
    """Verify ``result.plan`` and make the reported figures the plan's own (``settle``).

    Raises PlanVerificationError when the plan breaks a constraint.
    """
    assert result.plan is not None
    ev = evaluate_plan(problem, result.plan)
    if ev.violations:
        raise PlanVerificationError(
            "solver plan fails verification:\n" + "\n".join(str(v) for v in ev.violations)
        )
    settle(result, ev.objective, rel_gap, note)
    result.plan = result.plan.model_copy(
        update={
            "objective": result.objective,
            "bound": result.bound,
            "gap": result.gap,
            "status": str(result.status),
            "solver": result.solver,
        }
    )


def _solve_per_gpu(
    problem: Problem,
    table: OpTable,
    preset: SolverPreset,
    deadline: float,
    gap: float,
    note: Progress,
    *,
    strengthen: bool,
) -> ServingResult:
    t0 = time.perf_counter()
    pm = build_per_gpu(problem, table, strengthen=strengthen)
    note(
        f"per-GPU model: {pm.model.nvariables()} variables, {pm.model.nconstraints()} "
        f"constraints ({time.perf_counter() - t0:.1f} s)"
    )
    if pm.unservable:
        reasons = [
            f"{u}: no GPU can serve it at any candidate operating point" for u in pm.unservable
        ]
        return Result(INFEASIBLE, None, None, 0.0, None, preset.name, [], reasons)
    incumbent = _configuration_incumbent(problem, table, preset, deadline, gap, note)
    left = max(1.0, deadline - time.perf_counter())
    out = run_backend(pm.model, preset, time_limit_s=left, rel_gap=gap, progress=note)
    if incumbent is not None:
        own = None if out.objective is None else out.objective - pm.idle_fixed_cost()
        taken = _better_of(incumbent, own, out.bound, gap, note)
        if taken is not None:
            return taken
    bound = out.bound
    if preset.backend == "cpsat" and out.status != INFEASIBLE:
        # CP-SAT's bound is its relaxation's; the LP relaxation may be tighter.
        lp_bound = lp_relaxation_bound(pm.model)
        note(f"LP relaxation bound {lp_bound:,.3f}")
        if lp_bound == float("-inf") and out.objective is None:
            return Result(INFEASIBLE, None, None, out.wall_s, None, preset.name, out.log)
        bound = lp_bound if bound is None else max(bound, lp_bound)
    if out.status == INFEASIBLE:
        return Result(INFEASIBLE, None, bound, out.wall_s, None, preset.name, out.log)
    if out.objective is None:
        return Result(NO_SOLUTION, None, bound, out.wall_s, None, preset.name, out.log)
    decisions = pm.decisions()
    # A slot the solver placed at no rate (a time limit, CP-SAT's rate polish) paid
    # its fixed part in the model; the plan drops it, or keeps it idle at no cost.
    objective = out.objective - pm.idle_fixed_cost()
    status = plan_status(out.status, objective, bound, gap)
    plan = finish_plan(problem, table, decisions, status, objective, bound, preset.name)
    return Result(status, objective, bound, out.wall_s, plan, preset.name, out.log)


def _configuration_incumbent(
    problem: Problem,
    table: OpTable,
    preset: SolverPreset,
    deadline: float,
    gap: float,
    note: Progress,
) -> ServingResult | None:
    """A plan from column generation on the configuration formulation, in
    ``INCUMBENT_SHARE`` of the time to ``deadline``, for a per-GPU solve of more than
    ``PER_GPU_INCUMBENT_GPUS`` GPUs where that formulation applies; None otherwise
    or when it finds none."""
    if len(problem.gpus) <= PER_GPU_INCUMBENT_GPUS:
        return None
    try:
        pat.check_applicable(problem, table)
    except pat.PatternNotApplicable:
        return None
    now = time.perf_counter()
    colgen = load_preset("colgen").model_copy(update={"name": preset.name})
    try:
        found = solve_configurations(
            problem, table, colgen, now + INCUMBENT_SHARE * (deadline - now), gap, note,
            exact=False,
        )
    except (FormulationNotApplicable, BackendFailure) as exc:
        note(f"no configuration incumbent ({exc})")
        return None
    if found.plan is None or found.objective is None:
        note("no configuration incumbent: column generation found no plan")
        return None
    note(
        f"configuration incumbent: {found.objective:,.3f} "
        f"({time.perf_counter() - now:.1f} s); the per-GPU MILP runs in the rest"
    )
    return found


def _better_of(
    incumbent: ServingResult,
    milp_objective: float | None,
    milp_bound: float | None,
    gap: float,
    note: Progress,
) -> ServingResult | None:
    """``incumbent`` with the better of both bounds when the per-GPU MILP found no
    cheaper plan (``milp_objective``, its plan's cost, None without one); None when
    the MILP's plan is kept.

    Both formulations state the same problem, so the larger of their lower bounds
    is valid for either plan."""
    assert incumbent.objective is not None and incumbent.plan is not None
    if milp_objective is not None and milp_objective <= incumbent.objective:
        return None
    bounds = [b for b in (incumbent.bound, milp_bound) if b is not None]
    bound = max(bounds) if bounds else None
    why = (
        "the per-GPU MILP found no plan in its time"
        if milp_objective is None
        else "the per-GPU MILP found no cheaper plan"
    )
    note(f"{why}: keeping the configuration incumbent")
    status = plan_status(FEASIBLE, incumbent.objective, bound, gap)
    plan = incumbent.plan.model_copy(update={"bound": bound, "status": str(status)})
    return Result(
        status,
        incumbent.objective,
        bound,
        incumbent.wall_s,
        plan,
        incumbent.solver,
        incumbent.log,
        fallback=f"{why}; the plan is column generation's on the configuration formulation",
        algorithm="colgen incumbent + " + "per-GPU MILP",
    )
