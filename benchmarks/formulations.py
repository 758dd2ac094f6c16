"""Side by side: configuration formulation vs per-GPU vs plain per-GPU MILP.

Usage: python benchmarks/formulations.py [--instances fleet-16 fleet-64] [--gap 0.005]
       [--limit 60] [--baseline-limit 120]

For each instance, each contender runs in this process with the same target gap
and prints its objective, proven bound, gap and wall time; then the speed-up of
the configuration formulation over the plain MILP. A contender that does not
reach the target gap within its limit is reported with the gap it reached.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from energyopt.catalog import load_problem
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import verify_plan
from energyopt.solvers.presets import load_preset

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = [("pattern", "highs-pattern"), ("per-GPU", "highs-per-gpu"), ("plain", "highs-plain")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", nargs="+", default=["fleet-16", "fleet-64"])
    parser.add_argument("--gap", type=float, default=0.005)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds for pattern")
    parser.add_argument("--baseline-limit", type=float, default=120.0)
    parser.add_argument(
        "--contenders",
        nargs="+",
        default=[c for c, _ in CONTENDERS],
        choices=[c for c, _ in CONTENDERS],
    )
    args = parser.parse_args()
    print(
        f"target gap {args.gap:.2%}; limits: pattern {args.limit:g} s, others "
        f"{args.baseline_limit:g} s"
    )
    header = (
        f"{'instance':<10} {'contender':<9} {'status':<9} {'objective':>11} {'bound':>11} "
        f"{'gap':>8} {'time s':>8} {'verified':>8}"
    )
    print(header)
    for name in args.instances:
        problem = load_problem(ROOT / "instances" / f"{name}.yaml")
        rows: dict[str, tuple[float, float | None]] = {}
        for label, preset in CONTENDERS:
            if label not in args.contenders:
                continue
            limit = args.limit if label == "pattern" else args.baseline_limit
            start = time.perf_counter()
            res = solve(problem, load_preset(preset), time_limit_s=limit, rel_gap=args.gap)
            wall = time.perf_counter() - start
            ok = res.plan is not None and not verify_plan(problem, res.plan)
            gap = res.gap
            rows[label] = (wall, gap)
            obj = f"{res.objective:,.1f}" if res.objective is not None else "-"
            bnd = f"{res.bound:,.1f}" if res.bound is not None else "-"
            gtxt = f"{gap:.2%}" if gap is not None else "-"
            print(
                f"{name:<10} {label:<9} {res.status:<9} {obj:>11} {bnd:>11} {gtxt:>8} "
                f"{wall:>8.1f} {ok!s:>8}",
                flush=True,
            )
        if "pattern" not in rows:
            continue
        p_wall, p_gap = rows["pattern"]
        for other in (c for c in ("per-GPU", "plain") if c in rows):
            o_wall, o_gap = rows[other]
            reached = o_gap is not None and o_gap <= args.gap
            p_reached = p_gap is not None and p_gap <= args.gap
            if p_reached:
                speed = f"{o_wall / p_wall:.1f}x" if reached else f">{o_wall / p_wall:.1f}x"
                print(
                    f"{name:<10} time to {args.gap:.2%} gap, {other} / pattern: {speed}"
                    + ("" if reached else f" ({other} stopped at {_pct(o_gap)})")
                )
            else:
                print(
                    f"{name:<10} pattern stopped at {_pct(p_gap)} after {p_wall:.1f} s; "
                    f"{other} at {_pct(o_gap)} after {o_wall:.1f} s"
                )


def _pct(gap: float | None) -> str:
    return "no plan" if gap is None else f"{gap:.2%} gap"


if __name__ == "__main__":
    main()
