"""Co-location benchmark: decomposition vs exact MILP vs static isolated allocation.

Usage: python benchmarks/colocation.py [INSTANCE.yaml ...] [--time-limit S]
       [--exact-time-limit S] [--objective jct|throughput] [--skip-exact-above COLUMNS]

For each instance (default: instances/colocation/colocation-64.yaml and -512.yaml)
it runs, in one process and side by side:

- isolated: the static isolated allocation (whole GPUs, first come first served);
- shadow-price (no pairs): the decomposition with co-location switched off, to
  separate the gain of choosing GPU counts and clocks from the gain of sharing;
- shadow-price: the decomposition with co-location;
- exact: the time-indexed MILP with HiGHS under a time limit (skipped above
  ``--skip-exact-above`` columns, and reported as such).

It prints, per solver, wall time, the planning-model objective, bound and gap,
then the outcome every plan has when checked with the ground-truth interference
(verify/colocation.py): mean JCT, throughput (jobs per hour over the makespan),
SM utilization and GPU time held, with ratios against the isolated baseline.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from energyopt.formulations.colocation.interference import predictor_error
from energyopt.formulations.colocation.model import build_model
from energyopt.formulations.colocation.problem import ColocationProblem, load_colocation
from energyopt.solvers.colocation_exact import solve_exact
from energyopt.solvers.colocation_isolated import solve_isolated
from energyopt.solvers.colocation_result import ColocationResult
from energyopt.solvers.colocation_shadow import solve_shadow
from energyopt.solvers.colocation_solve import exact_columns
from energyopt.verify.colocation import ColocationEvaluation, evaluate_colocation

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [
    ROOT / "instances/colocation/colocation-64.yaml",
    ROOT / "instances/colocation/colocation-512.yaml",
]


def _fmt(value: float | None, spec: str = ",.1f") -> str:
    return "-" if value is None else format(value, spec)


def run_instance(path: Path, args: argparse.Namespace) -> None:
    problem: ColocationProblem = load_colocation(path)
    if args.objective:
        inst = problem.instance.model_copy(
            update={
                "options": problem.instance.options.model_copy(update={"objective": args.objective})
            }
        )
        problem = ColocationProblem(inst, problem.catalog, problem.source)
    t0 = time.perf_counter()
    model = build_model(problem)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    solo_model = build_model(problem, pairs=False)
    solo_build_s = time.perf_counter() - t0
    gpus = sum(p.count for p in problem.instance.cluster.pools)
    print(
        f"\n== {problem.instance.name}: {gpus} GPUs, {len(problem.jobs)} jobs, objective "
        f"{model.objective}, {len(model.table.units):,} unit configurations "
        f"({model.table.pruned} dominated pruned), built in {build_s:.1f} s"
    )
    runs: list[tuple[str, ColocationResult, float]] = []
    runs.append(("isolated", solve_isolated(model), build_s))
    runs.append(
        (
            "shadow-price (no pairs)",
            solve_shadow(solo_model, time_limit_s=args.time_limit),
            solo_build_s,
        )
    )
    runs.append(("shadow-price", solve_shadow(model, time_limit_s=args.time_limit), build_s))
    columns = exact_columns(model)
    if columns <= args.skip_exact_above:
        runs.append(
            ("exact (HiGHS)", solve_exact(model, time_limit_s=args.exact_time_limit), build_s)
        )
    else:
        print(f"exact (HiGHS): skipped, {columns:,} columns > --skip-exact-above")
    evals: list[tuple[str, ColocationResult, ColocationEvaluation]] = []
    unit = "mean JCT s" if model.objective == "jct" else "jobs/h in horizon"
    print(
        f"{'solver':<24} {'time s':>8} {'status':>11} {'objective':>12} {'bound':>12} "
        f"{'gap':>8}   (planning model, {unit})"
    )
    for name, result, build in runs:
        gap = None if result.gap is None else 100 * result.gap
        print(
            f"{name:<24} {result.wall_s + build:>8.1f} {result.status:>11} "
            f"{_fmt(result.objective):>12} {_fmt(result.bound):>12} "
            f"{_fmt(gap, '.2f') + ('%' if gap is not None else ''):>8}"
        )
        if result.plan is not None:
            ev = evaluate_colocation(problem, result.plan)
            assert not ev.violations, (name, ev.violations[:3])
            evals.append((name, result, ev))
    base = next(ev for name, _, ev in evals if name == "isolated")
    print(
        f"{'ground truth':<24} {'mean JCT s':>11} {'JCT ratio':>9} {'jobs/h':>8} "
        f"{'thr ratio':>9} {'SM util':>8} {'GPU held':>8} {'makespan s':>11} {'pairs':>6}"
    )
    for name, result, ev in evals:
        pairs = sum(len(u.jobs) == 2 for u in result.plan.units) if result.plan else 0
        print(
            f"{name:<24} {ev.mean_jct_s:>11,.0f} {base.mean_jct_s / ev.mean_jct_s:>8.2f}x "
            f"{ev.jobs_per_hour:>8.2f} {ev.jobs_per_hour / base.jobs_per_hour:>8.2f}x "
            f"{100 * ev.sm_utilization:>7.1f}% {100 * ev.gpu_allocation:>7.1f}% "
            f"{ev.makespan_s:>11,.0f} {pairs:>6}"
        )
    print("(JCT ratio: isolated / solver, higher is better; thr ratio: solver / isolated)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instances", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--time-limit", type=float, default=60.0, help="decomposition, s")
    ap.add_argument("--exact-time-limit", type=float, default=120.0, help="HiGHS, s")
    ap.add_argument("--objective", choices=["jct", "throughput"], default=None)
    ap.add_argument("--skip-exact-above", type=int, default=200_000, help="MILP columns")
    args = ap.parse_args()
    print(f"interference predictor, held-out pairs: {predictor_error().line()}")
    for path in args.instances:
        run_instance(path, args)


if __name__ == "__main__":
    main()
