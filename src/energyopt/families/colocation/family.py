"""Co-location (``kind: colocation``): training and offline-inference jobs sharing
GPUs by MPS share, clock and start time, for mean JCT or throughput."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from energyopt.families.colocation.formulations.problem import ColocationProblem, load_colocation
from energyopt.families.colocation.spec import (
    ColocationInstance,
    ColocationPlan,
    PlanUnit,
    TrainingJob,
)
from energyopt.families.contract import SolverEntry, SolverRun, TableFamily
from energyopt.progress import Progress
from energyopt.solvers.result import Result
from energyopt.verify.violation import Violation

ColocationResult = Result[ColocationPlan]


def _runs(name: str) -> SolverRun[ColocationProblem, ColocationPlan]:
    """What runs the co-location solver ``name`` (``solve_colocation`` holds the
    ``auto`` rule and its portfolio, and each solver's default gap)."""

    def run(
        problem: ColocationProblem,
        time_limit_s: float | None,
        rel_gap: float | None,
        progress: Progress,
    ) -> ColocationResult:
        from energyopt.families.colocation.solvers.solve import solve_colocation

        return solve_colocation(
            problem, name, time_limit_s=time_limit_s, rel_gap=rel_gap, progress=progress
        )[1]

    return run


class ColocationFamily(TableFamily[ColocationProblem, ColocationPlan]):
    """Jobs as families of resource-performance configurations (ElastiCo)."""

    kind = "colocation"
    title = "co-location: training and inference jobs sharing GPUs, mean JCT or throughput"
    problem_model: type[BaseModel] = ColocationInstance
    plan_model: type[BaseModel] = ColocationPlan
    instances = ("instances/colocation/*.yaml",)
    names_result_by_request = False

    def load(self, path: str, catalogs: Sequence[str]) -> ColocationProblem:
        return load_colocation(path, catalogs)

    def summary(self, problem: ColocationProblem) -> str:
        inst = problem.instance
        gpus = sum(p.count for p in inst.cluster.pools)
        training = sum(isinstance(j, TrainingJob) for j in inst.jobs)
        return (
            f"co-location: {gpus} GPUs, {training} training and {len(inst.jobs) - training} "
            f"inference jobs, objective {inst.options.objective}"
        )

    def show(self, problem: ColocationProblem) -> list[str]:
        inst = problem.instance
        lines = [self.summary(problem)]
        for pool in inst.cluster.pools:
            # an unnamed pool's GPUs are named after its type (pool.prefix)
            lines.append(f"pool {pool.prefix}: {pool.count}x {pool.type}")
        lines.append(f"{'job':<24} {'kind':<10} {'model':<16} GPUs")
        for job in inst.jobs:
            kind = "training" if isinstance(job, TrainingJob) else "inference"
            lines.append(f"{job.name:<24} {kind:<10} {job.model:<16} {job.min_gpus}-{job.max_gpus}")
        return lines

    def solvers(self) -> list[SolverEntry[ColocationProblem, ColocationPlan]]:
        from energyopt.families.colocation.solvers.solve import (
            EXACT_MAX_COLUMNS,
            PORTFOLIO_MAX_COLUMNS,
        )

        return [
            SolverEntry(
                "auto",
                self.kind,
                "certified bound",
                f"exact up to {EXACT_MAX_COLUMNS:,} MILP columns; up to "
                f"{PORTFOLIO_MAX_COLUMNS:,}, shadow-price and then exact in the time left "
                "(the better plan and bound); else shadow-price",
                run=_runs("auto"),
            ),
            SolverEntry(
                "exact",
                self.kind,
                "exact",
                "time-indexed unit MILP with HiGHS; optimal or best plan and bound at the limit",
                ("time limit", "gap", "export"),
                run=_runs("exact"),
            ),
            SolverEntry(
                "shadow-price",
                self.kind,
                "certified bound",
                "elastic shadow prices per job with a repair; Lagrangian bound and gap",
                ("time limit", "gap"),
                run=_runs("shadow-price"),
            ),
            SolverEntry(
                "isolated",
                self.kind,
                "heuristic",
                "static isolated allocation baseline (whole GPUs, FIFO); no bound",
                run=_runs("isolated"),
            ),
        ]

    def headline(self, problem: ColocationProblem) -> str:
        return f"{problem.source} (co-location, objective {problem.instance.options.objective})"

    def verify(self, problem: ColocationProblem, plan: ColocationPlan) -> list[Violation]:
        from energyopt.families.colocation.verify import evaluate_colocation

        return evaluate_colocation(problem, plan).violations

    def cost(self, problem: ColocationProblem, plan: ColocationPlan) -> float:
        """The planning model's objective (mean JCT s or jobs per hour) of ``plan``,
        recomputed on the verifier's timeline with the interference predictor the
        solvers plan with (the ground-truth outcome is in ``report``)."""
        from energyopt.families.colocation.formulations.interference import default_predictor
        from energyopt.families.colocation.verify import evaluate_colocation

        return evaluate_colocation(problem, plan, default_predictor()).objective

    def sense(self, problem: ColocationProblem) -> Literal["min", "max"]:
        return "min" if problem.instance.options.objective == "jct" else "max"

    def objective_unit(self, problem: ColocationProblem) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""
        if problem.instance.options.objective == "jct":
            return "s mean JCT"
        return "jobs/h within the horizon"

    def report(self, problem: ColocationProblem, result: ColocationResult) -> list[str]:
        from energyopt.families.colocation.verify import evaluate_colocation

        plan = result.plan
        assert plan is not None
        ev = evaluate_colocation(problem, plan)
        objective = problem.instance.options.objective
        lines = [f"plan for {problem.instance.name} ({problem.source}), objective {objective}"]
        lines.append("start s    end s      clock     GPUs                                jobs")
        for unit in plan.units:
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
        if plan.unscheduled:
            lines.append(f"not started within the horizon: {', '.join(plan.unscheduled)}")
        lines.append(
            f"outcome (ground-truth interference): {len(ev.runs)} jobs run, mean JCT "
            f"{ev.mean_jct_s:,.0f} s, makespan {ev.makespan_s:,.0f} s, throughput "
            f"{ev.jobs_per_hour:.2f} jobs/h ({ev.horizon_jobs_per_hour:.2f} within the horizon), "
            f"GPU utilization {100 * ev.sm_utilization:.1f}% of SM time "
            f"({100 * ev.gpu_allocation:.1f}% of GPU time held), peak power "
            f"{ev.peak_power_w:,.0f} W"
        )
        unit_name = "s mean JCT" if objective == "jct" else "jobs/h within the horizon"
        obj = "none" if result.objective is None else f"{result.objective:,.3f}"
        bound = "none (heuristic)" if result.bound is None else f"{result.bound:,.3f}"
        gap = "n/a" if result.gap is None else f"{100 * result.gap:.3f}%"
        kind = "lower" if result.sense == "min" else "upper"
        lines.append(
            f"planning model: objective {obj} {unit_name}, {kind} bound {bound}, gap {gap}, "
            f"status {result.status}"
        )
        pairs = [u for u in plan.units if len(u.jobs) == 2]
        if pairs:
            lines.append(
                f"interference predictor on this plan's pairs: {_pair_error(problem, pairs)}"
            )
        how = f" ({result.algorithm})" if result.algorithm else ""
        lines.append(f"solver {result.solver}{how}, {result.wall_s:.2f} s; {problem.source}")
        return lines

    def program(self, problem: ColocationProblem) -> Any:
        """The exact solver's time-indexed unit MILP (a HiGHS model)."""
        from energyopt.families.colocation.formulations.milp import build_milp
        from energyopt.families.colocation.formulations.model import build_model
        from energyopt.families.colocation.solvers.exact import highs_lp

        return highs_lp(build_milp(build_model(problem)))


def _gpus(unit: PlanUnit) -> str:
    ids = unit.gpus
    shown = ", ".join(ids) if len(ids) <= 2 else f"{ids[0]} .. {ids[-1]}"
    return f"{len(ids)}x {shown}"


def _pair_error(problem: ColocationProblem, pairs: list[PlanUnit]) -> str:
    """Predictor error against the ground truth on the plan's co-located jobs."""
    from energyopt.families.colocation.formulations.configs import pair_features
    from energyopt.families.colocation.formulations.interference import (
        default_predictor,
        prediction_error,
    )
    from energyopt.families.colocation.formulations.rates import JobPoint, evaluate_points

    names = {j.name: i for i, j in enumerate(problem.jobs)}
    points = []
    for u in pairs:
        for uj in u.jobs:
            points.append(
                JobPoint(names[uj.job], u.gpu_type, len(u.gpus), u.clock_mhz, uj.share_pct)
            )
    phys = evaluate_points(problem, points)
    a = np.arange(0, len(points), 2, dtype=np.int64)
    b = a + 1
    both_a = np.concatenate([a, b])
    both_b = np.concatenate([b, a])
    return prediction_error(default_predictor(), pair_features(phys, both_a, both_b)).line()
