"""Side by side: decompositions (colgen, shadow-price, POP) vs the exact solver.

Usage: python benchmarks/decompositions.py [--instances fleet-64 fleet-256 fleet-1024]
       [--limit 10] [--exact-limit 600] [--exact-on fleet-64 fleet-256] [--gap 0.01]

Every contender runs in this process on the same instance. For each run the
table shows the wall time (s, including the operating-point table), the plan's
objective (W), the bound it certifies itself, its own gap, and its gap to the
best bound any contender proved on that instance. The exact solver
(``highs-exact``, target gap 0.01 %) runs only on the instances named by
``--exact-on``; where it finishes, each decomposition's objective is compared with
its optimum and its time with the exact time (speed-up). The targets checked at
the end: fleet-1024 within 2 % of a certified bound in 10 s or less; fleet-64
within 1 % of the exact optimum and at least 10 times faster than the exact solve.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from energyopt.catalog import load_problem
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import verify_plan
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import relative_gap

ROOT = Path(__file__).resolve().parents[1]
DECOMPOSITIONS = ["colgen", "shadow-price", "pop"]


@dataclass
class Run:
    solver: str
    status: str
    wall_s: float
    objective: float | None
    bound: float | None
    verified: bool


def run(problem_path: Path, solver: str, limit_s: float, gap: float) -> Run:
    problem = load_problem(problem_path)
    start = time.perf_counter()
    res = solve(problem, load_preset(solver), time_limit_s=limit_s, rel_gap=gap)
    wall = time.perf_counter() - start
    ok = res.plan is not None and not verify_plan(problem, res.plan)
    return Run(solver, res.status, wall, res.objective, res.bound, ok)


def fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", nargs="+", default=["fleet-64", "fleet-256", "fleet-1024"])
    parser.add_argument("--limit", type=float, default=10.0, help="seconds per decomposition")
    parser.add_argument(
        "--gap",
        type=float,
        default=None,
        help="decompositions' target gap (default: the instance's target, 1 %% on fleet-64, "
        "2 %% above)",
    )
    parser.add_argument("--exact-limit", type=float, default=600.0)
    parser.add_argument("--exact-on", nargs="*", default=["fleet-64"])
    args = parser.parse_args()
    print(
        f"decompositions: {args.limit:g} s; exact: highs-exact, gap 0.01 %, "
        f"{args.exact_limit:g} s, on {', '.join(args.exact_on) or 'none'}"
    )
    targets: list[str] = []
    for name in args.instances:
        path = ROOT / "instances" / f"{name}.yaml"
        gap = args.gap if args.gap is not None else (0.01 if name == "fleet-64" else 0.02)
        runs = [run(path, s, args.limit, gap) for s in DECOMPOSITIONS]
        exact = run(path, "highs-exact", args.exact_limit, 1e-4) if name in args.exact_on else None
        if exact is not None:
            runs.append(exact)
        best_bound = max((r.bound for r in runs if r.bound is not None), default=None)
        print(f"\n{name}: target gap {gap:.0%}, best certified bound {fmt(best_bound)} W")
        print(
            f"  {'solver':<13} {'status':<9} {'time s':>7} {'objective':>11} {'bound':>11} "
            f"{'own gap':>8} {'vs best':>8} {'vs exact':>9} {'speed-up':>8} verified"
        )
        for r in runs:
            own = relative_gap(r.objective, r.bound) if r.objective and r.bound else None
            vs_best = relative_gap(r.objective, best_bound) if r.objective and best_bound else None
            vs_exact = speed = None
            if exact is not None and exact.objective and r.objective and r is not exact:
                vs_exact = r.objective / exact.objective - 1.0
                speed = exact.wall_s / r.wall_s
            print(
                f"  {r.solver:<13} {r.status:<9} {r.wall_s:7.1f} {fmt(r.objective):>11} "
                f"{fmt(r.bound):>11} {fmt(own, '.2%'):>8} {fmt(vs_best, '.2%'):>8} "
                f"{fmt(vs_exact, '+.2%'):>9} {fmt(speed, '.1f'):>8} {'yes' if r.verified else 'NO'}"
            )
        decomp = [r for r in runs if r.solver in DECOMPOSITIONS and r.objective is not None]
        if name == "fleet-1024" and decomp and best_bound:
            best = min(decomp, key=lambda r: r.objective or float("inf"))
            assert best.objective is not None
            g = relative_gap(best.objective, best_bound)
            met = g <= 0.02 and best.wall_s <= 10.0
            targets.append(
                f"fleet-1024: best decomposition {best.solver} {g:.2%} from the best certified "
                f"bound in {best.wall_s:.1f} s (target <= 2 % in <= 10 s): "
                f"{'met' if met else 'not met'}"
            )
        if name == "fleet-64" and exact is not None and exact.objective and decomp:
            best = min(decomp, key=lambda r: r.objective or float("inf"))
            assert best.objective is not None
            within = best.objective / exact.objective - 1.0
            speed = exact.wall_s / best.wall_s
            met = within <= 0.01 and speed >= 10.0
            targets.append(
                f"fleet-64: best decomposition {best.solver} {within:+.2%} vs the exact optimum, "
                f"{speed:.1f}x faster (target <= 1 %, >= 10x): {'met' if met else 'not met'}"
            )
    if targets:
        print("\n" + "\n".join(targets))


if __name__ == "__main__":
    main()
