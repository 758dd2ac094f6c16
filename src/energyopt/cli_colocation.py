"""``energyopt validate`` / ``energyopt solve`` for co-location files (``kind: colocation``).

``--solver``: ``auto`` (also what the serving default ``highs-exact`` means
here: the exact MILP when it has at most 20,000 columns, else shadow-price),
``shadow-price``, ``exact`` or ``isolated`` (the static baseline).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from energyopt.cli import EXIT_INFEASIBLE, EXIT_OK, EXIT_VIOLATION, _progress
from energyopt.formulations.colocation.configs import pair_features
from energyopt.formulations.colocation.interference import prediction_error
from energyopt.formulations.colocation.model import ColocationModel
from energyopt.formulations.colocation.problem import ColocationProblem, load_colocation
from energyopt.solvers.colocation_result import ColocationResult
from energyopt.solvers.colocation_solve import solve_colocation, solver_name
from energyopt.spec.colocation import PlanUnit, TrainingJob
from energyopt.spec.io import dump
from energyopt.verify.colocation import ColocationEvaluation, evaluate_colocation


def validate_file(path: str, catalogs: list[str]) -> str:
    """One-line summary of a valid co-location file; SpecError otherwise."""
    problem = load_colocation(path, catalogs or ())
    inst = problem.instance
    gpus = sum(p.count for p in inst.cluster.pools)
    training = sum(isinstance(j, TrainingJob) for j in inst.jobs)
    return (
        f"co-location: {gpus} GPUs, {training} training and {len(inst.jobs) - training} "
        f"inference jobs, objective {inst.options.objective}"
    )


def _gpus(unit: PlanUnit) -> str:
    ids = unit.gpus
    shown = ", ".join(ids) if len(ids) <= 2 else f"{ids[0]} .. {ids[-1]}"
    return f"{len(ids)}x {shown}"


def format_plan(
    problem: ColocationProblem, result: ColocationResult, ev: ColocationEvaluation
) -> list[str]:
    """Per-unit lines (start, end, GPUs, clock, jobs with share and slowdown) and totals."""
    assert result.plan is not None
    lines = ["start s    end s      clock     GPUs                                jobs"]
    for unit in result.plan.units:
        runs = [ev.runs.get(uj.job) for uj in unit.jobs]
        start = min((r.start_s for r in runs if r is not None), default=float("nan"))
        end = max((r.end_s for r in runs if r is not None), default=float("nan"))
        jobs = "; ".join(
            f"{uj.job} {uj.share_pct}%"
            + (f" (slowdown {r.slowdown:.3f})" if r is not None and len(unit.jobs) == 2 else "")
            for uj, r in zip(unit.jobs, runs, strict=True)
        )
        lines.append(
            f"{start:<10,.0f} {end:<10,.0f} {unit.clock_mhz:>4} MHz  {_gpus(unit):<35} {jobs}"
        )
    if result.plan.unscheduled:
        lines.append(f"not started within the horizon: {', '.join(result.plan.unscheduled)}")
    return lines


def format_totals(
    model: ColocationModel, result: ColocationResult, ev: ColocationEvaluation
) -> list[str]:
    """Outcome under the ground truth, then the planning model's objective, bound and gap."""
    problem = model.problem
    unit = "s mean JCT" if model.objective == "jct" else "jobs/h within the horizon"
    lines = [
        f"outcome (ground-truth interference): {len(ev.runs)} jobs run, mean JCT "
        f"{ev.mean_jct_s:,.0f} s, makespan {ev.makespan_s:,.0f} s, throughput "
        f"{ev.jobs_per_hour:.2f} jobs/h ({ev.horizon_jobs_per_hour:.2f} within the horizon), "
        f"GPU utilization {100 * ev.sm_utilization:.1f}% of SM time "
        f"({100 * ev.gpu_allocation:.1f}% of GPU time held), peak power {ev.peak_power_w:,.0f} W",
    ]
    obj = "none" if result.objective is None else f"{result.objective:,.3f}"
    bound = "none (heuristic)" if result.bound is None else f"{result.bound:,.3f}"
    gap = "n/a" if result.gap is None else f"{100 * result.gap:.3f}%"
    kind = "lower" if result.sense == "min" else "upper"
    lines.append(
        f"planning model: objective {obj} {unit}, {kind} bound {bound}, gap {gap}, "
        f"status {result.status}"
    )
    pairs = [u for u in (result.plan.units if result.plan else ()) if len(u.jobs) == 2]
    if pairs:
        err = _pair_error(model, pairs)
        lines.append(f"interference predictor on this plan's pairs: {err}")
    lines.append(f"solver {result.solver}, {result.wall_s:.2f} s; {problem.source}")
    return lines


def _pair_error(model: ColocationModel, pairs: list[PlanUnit]) -> str:
    """Predictor error against the ground truth on the plan's co-located jobs."""
    from energyopt.formulations.colocation.interference import default_predictor
    from energyopt.formulations.colocation.rates import JobPoint, evaluate_points

    names = {j.name: i for i, j in enumerate(model.problem.jobs)}
    points = []
    for u in pairs:
        for uj in u.jobs:
            points.append(
                JobPoint(names[uj.job], u.gpu_type, len(u.gpus), u.clock_mhz, uj.share_pct)
            )
    phys = evaluate_points(model.problem, points)
    a = np.arange(0, len(points), 2, dtype=np.int64)
    b = a + 1
    both_a = np.concatenate([a, b])
    both_b = np.concatenate([b, a])
    return prediction_error(default_predictor(), pair_features(phys, both_a, both_b)).line()


def solve_file(args: argparse.Namespace) -> int:
    """Solve, check with the ground truth, print; the exit code."""
    name = solver_name(args.solver)
    problem = load_colocation(args.file, args.catalog or ())
    say = _progress(args.quiet)
    say(f"solving {args.file} (co-location, objective {problem.instance.options.objective})")
    model, result = solve_colocation(
        problem, name, time_limit_s=args.time_limit, rel_gap=args.gap, progress=say
    )
    if result.plan is None:
        print(
            f"{args.file}: no plan ({result.status}) after {result.wall_s:.1f} s", file=sys.stderr
        )
        for line in result.diagnosis:
            print(f"  - {line}", file=sys.stderr)
        return EXIT_INFEASIBLE
    ev = evaluate_colocation(problem, result.plan)
    print(f"plan for {problem.instance.name} ({args.file}), objective {model.objective}")
    print("\n".join(format_plan(problem, result, ev)))
    print("\n".join(format_totals(model, result, ev)))
    if args.output:
        dump(result.plan, args.output)
        print(f"plan written to {args.output}")
    if ev.violations:
        for v in ev.violations:
            print(f"violation: {v}", file=sys.stderr)
        return EXIT_VIOLATION
    return EXIT_OK
