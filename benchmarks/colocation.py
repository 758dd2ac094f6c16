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
(families/colocation/verify.py): mean JCT, throughput (jobs per hour over the makespan),
SM utilization and GPU time held, with ratios against the isolated baseline.

``--measured [--data DIR]`` runs the measured-pairs evaluation instead
(docs/formulations/colocation.md, "Measured interference"): Gavel's pairwise
co-location throughputs (DIR/sharing/gavel, default the checkout's data/), the
held-out error of the interference predictor beside its baselines (5-fold over
unordered job-type pairs), and the mean JCT of isolated and predictor-guided
paired schedules of jobs of measured types, scored on the measurements.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from energyopt.families.colocation.formulations.interference import predictor_error
from energyopt.families.colocation.formulations.measured import (
    BASELINES,
    GAVEL_FILE,
    PREDICTOR,
    MeasuredCluster,
    MeasuredPairs,
    MeasuredPlan,
    cross_validate,
    fit_measured,
    held_out_slowdown,
    load_gavel,
    measured_jobs,
)
from energyopt.families.colocation.formulations.model import build_model
from energyopt.families.colocation.formulations.problem import ColocationProblem, load_colocation
from energyopt.families.colocation.solvers.exact import solve_exact
from energyopt.families.colocation.solvers.isolated import solve_isolated
from energyopt.families.colocation.solvers.measured import schedule_isolated, schedule_paired
from energyopt.families.colocation.solvers.result import ColocationResult
from energyopt.families.colocation.solvers.shadow import solve_shadow
from energyopt.families.colocation.solvers.solve import exact_columns
from energyopt.families.colocation.verify import ColocationEvaluation, evaluate_colocation
from energyopt.families.colocation.verify_measured import check_measured_plan

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


MEASURED_CLUSTERS = [((4, 4, 4), 48), ((12, 12, 12), 144)]
"""(GPUs per type K80/P100/V100, jobs) of the measured-pairs runs."""
MEASURED_SEEDS = (1, 2, 3)


def _held_out_table(data: MeasuredPairs) -> None:
    runs = data.runs()
    sigma = data.slowdown()
    upper = np.triu(np.ones(runs.shape[1:], dtype=bool))
    print(
        f"\n== measured pairs: {data.source}\n{len(data.job_types)} job types on "
        f"{', '.join(data.gpu_types)}; {int(runs.sum())} ordered (GPU type, job, co-runner) "
        f"entries measured, {int((~runs).sum())} did not run; both orders of every pair agree"
    )
    for g, name in enumerate(data.gpu_types):
        s = sigma[g][runs[g]]
        print(
            f"  {name}: {int((runs[g] & upper).sum())} unordered pairs, slowdown median "
            f"{np.median(s):.2f}, 10-90 % {np.quantile(s, 0.1):.2f}-{np.quantile(s, 0.9):.2f}, "
            f"max {s.max():.1f}"
        )
    print(
        "held-out error, 5-fold over unordered job-type pairs (a pair left out in both "
        "orders on every GPU type), folds seeded 1 (seed 2 in the last row):"
    )
    names = "  ".join(f"{g:>6}" for g in data.gpu_types)
    print(f"{'model':<46} {'MAPE':>6} {'median':>7} {'RMSE log':>8}   MAPE {names}")
    rows = [(spec, 1) for spec in BASELINES] + [(PREDICTOR, 1)]
    rows += [
        (replace(PREDICTOR, name=f"low rank per GPU type (rank {r})", rank=r), 1) for r in (1, 3)
    ]
    rows += [(replace(PREDICTOR, name=PREDICTOR.name + ", folds seed 2"), 2)]
    for spec, seed in rows:
        e = cross_validate(data, spec, seed=seed)
        per = "  ".join(f"{100 * m:>5.1f}%" for m in e.mape_per_gpu)
        print(
            f"{e.name:<46} {100 * e.mape:>5.1f}% {100 * e.median_ape:>6.1f}% "
            f"{e.rmse_log:>8.3f}        {per}"
        )


def run_measured(data_dir: Path) -> None:
    """The measured-pairs evaluation (see the module docstring)."""
    data = load_gavel(data_dir / GAVEL_FILE)
    _held_out_table(data)
    truth = np.where(data.runs(), data.slowdown(), 1.0)  # ground truth where a pair runs
    tables = {
        "held-out predictor": held_out_slowdown(data),
        "predictor, all pairs": fit_measured(data).slowdown(),
        "measured (oracle)": truth,
    }
    print(
        "\nmean JCT on the measurements (checker): jobs of measured types (25 that fit every "
        "GPU type alone), 0.5-8 h alone on a V100 (log-uniform), all at time 0, one or two "
        "jobs per whole GPU"
    )
    gains: dict[str, list[tuple[float, float]]] = {}
    for counts, n_jobs in MEASURED_CLUSTERS:
        cluster = MeasuredCluster(data.gpu_types, counts)
        label = "+".join(f"{c} {g}" for g, c in zip(data.gpu_types, counts, strict=True))
        print(
            f"\n-- {label}, {n_jobs} jobs\n{'seed':>4} {'scheduler':<36} {'time s':>6} "
            f"{'mean JCT h':>10} {'vs in order':>11} {'vs SPT':>7} {'planned h':>9} "
            f"{'pairs':>5} {'GPU-h held':>10}"
        )
        for seed in MEASURED_SEEDS:
            jobs = measured_jobs(data, n_jobs, seed)
            plans: list[tuple[str, MeasuredPlan, float]] = []
            for shortest in (False, True):
                t0 = time.perf_counter()
                plan = schedule_isolated(data, truth, cluster, jobs, shortest_first=shortest)
                plans.append((plan.solver, plan, time.perf_counter() - t0))
            for name, sigma in tables.items():
                t0 = time.perf_counter()
                plan = schedule_paired(data, sigma, cluster, jobs)
                plans.append((f"paired, {name}", plan, time.perf_counter() - t0))
            outcomes = []
            for name, plan, _ in plans:
                out = check_measured_plan(data, cluster, jobs, plan)
                assert out.ok, (name, out.violations[:3])
                outcomes.append(out)
            in_order, spt = outcomes[0].mean_jct_s, outcomes[1].mean_jct_s
            for (name, plan, wall), out in zip(plans, outcomes, strict=True):
                pairs = sum(len(u.jobs) == 2 for u in plan.units)
                print(
                    f"{seed:>4} {name:<36} {wall:>6.1f} {out.mean_jct_s / 3600:>10.2f} "
                    f"{in_order / out.mean_jct_s:>10.3f}x {spt / out.mean_jct_s:>6.3f}x "
                    f"{plan.objective_s / 3600:>9.2f} {pairs:>5} {out.gpu_time_s / 3600:>10.1f}"
                )
                gains.setdefault(f"{label}: {name}", []).append(
                    (in_order / out.mean_jct_s, spt / out.mean_jct_s)
                )
    print("\nmean over seeds (JCT ratio: baseline / scheduler, higher is better)")
    for key, values in gains.items():
        a = np.mean([v[0] for v in values])
        b = np.mean([v[1] for v in values])
        print(f"  {key:<62} vs isolated in order {a:.3f}x, vs isolated SPT {b:.3f}x")
    print("(planned h: the scheduler's own mean JCT under the table it planned with)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("instances", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--time-limit", type=float, default=60.0, help="decomposition, s")
    ap.add_argument("--exact-time-limit", type=float, default=120.0, help="HiGHS, s")
    ap.add_argument("--objective", choices=["jct", "throughput"], default=None)
    ap.add_argument("--skip-exact-above", type=int, default=200_000, help="MILP columns")
    ap.add_argument("--measured", action="store_true", help="measured-pairs evaluation only")
    ap.add_argument("--data", type=Path, default=ROOT / "data", help="data folder (data/README.md)")
    args = ap.parse_args()
    if args.measured:
        run_measured(args.data)
        return
    print(f"interference predictor, held-out pairs: {predictor_error().line()}")
    for path in args.instances:
        run_instance(path, args)


if __name__ == "__main__":
    main()
