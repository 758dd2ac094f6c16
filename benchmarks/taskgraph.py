"""Task graphs with per-GPU DVFS against the fastest baseline (HEFT at the maximum clock).

Usage: python benchmarks/taskgraph.py [--cp-time S] [--skip-cp] [--skip-scale] [--quick]

1. For each GPU profile (L40S, L4) and graph family (tiled Cholesky, tiled LU,
   stencil, random layered), the list scheduler for each of the five
   objectives, side by side with HEFT at max clock: energy saving, EDP saving,
   makespan ratio. The mean over the families for ``energy_within`` is the
   figure to hold against a reported 14.8% (L40S) / 4.8% (L4) energy and
   9.9% / 3.7% EDP saving within 1.5% of the fastest makespan.
2. On small graphs: list scheduler vs CP-SAT (objective ratio, CP-SAT status
   and gap), where CP-SAT finishes within ``--cp-time``.
3. Scale: the list scheduler on graphs of about 10,000 tasks (time in s; 60-s limit).

Every schedule is checked by families.taskgraph.verify.check_schedule; a violation stops
the run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from statistics import mean

from energyopt.families.taskgraph.formulations.generators import (
    cholesky,
    layered,
    lu,
    platform,
    stencil,
)
from energyopt.families.taskgraph.formulations.heft import heft_max_clock
from energyopt.families.taskgraph.formulations.loading import build_taskgraph
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule, totals
from energyopt.families.taskgraph.solvers.cpsat import solve_cpsat
from energyopt.families.taskgraph.solvers.heuristic import solve_heuristic
from energyopt.families.taskgraph.spec import OBJECTIVE_KINDS, ObjectiveKind, TaskGraphFile
from energyopt.families.taskgraph.verify import check_schedule

Family = Callable[[str, int], TaskGraphFile]


def families(quick: bool) -> dict[str, Family]:
    """Graph families on ``gpus`` GPUs of one type (medium sizes; --quick: small)."""
    s = 2 if quick else 1
    return {
        "cholesky": lambda t, g: cholesky(8 // s, 4096, platform(t, g)),
        "lu": lambda t, g: lu(6 // s, 4096, platform(t, g)),
        "stencil": lambda t, g: stencil(g, 12 // s, 2**26, platform(t, g)),
        "layered": lambda t, g: layered(10 // s, 12 // s, platform(t, g), seed=1),
    }


def with_objective(spec: TaskGraphFile, kind: ObjectiveKind) -> TaskGraph:
    return build_taskgraph(
        spec.model_copy(update={"objective": spec.objective.model_copy(update={"kind": kind})})
    )


def checked(tg: TaskGraph, s: Schedule | None) -> Schedule:
    assert s is not None, "no schedule"
    check = check_schedule(tg, s)
    if check.violations:
        raise SystemExit(f"{tg.name}: schedule breaks: {check.violations[:3]}")
    return s


def section_savings(quick: bool) -> None:
    print("== 1. list scheduler vs HEFT at max clock (4 GPUs of one type) ==")
    print(
        f"{'GPU':<5} {'graph':<9} {'tasks':>5} {'objective':<14} {'energy saved':>12} "
        f"{'EDP saved':>10} {'makespan x':>10} {'clock chg':>9} {'time s':>7}"
    )
    summary: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for gpu_type in ("L40S", "L4"):
        for fam, make in families(quick).items():
            spec = make(gpu_type, 4)
            for kind in OBJECTIVE_KINDS:
                tg = with_objective(spec, kind)
                base = totals(tg, heft_max_clock(tg))
                t0 = time.perf_counter()
                r = solve_heuristic(tg)
                wall = time.perf_counter() - t0
                tot = totals(tg, checked(tg, r.plan))
                e_save = 1 - tot.energy_j / base.energy_j
                edp_save = 1 - tot.energy_j * tot.makespan / (base.energy_j * base.makespan)
                ratio = tot.makespan / base.makespan
                summary.setdefault((gpu_type, kind), []).append((e_save, edp_save, ratio))
                print(
                    f"{gpu_type:<5} {fam:<9} {tg.n_tasks:>5} {kind:<14} {100 * e_save:>11.1f}% "
                    f"{100 * edp_save:>9.1f}% {ratio:>10.3f} {tot.transitions:>9} {wall:>7.2f}"
                )
    print("mean over the four families:")
    for (gpu_type, kind), rows in summary.items():
        print(
            f"  {gpu_type:<5} {kind:<14} energy saved {100 * mean(r[0] for r in rows):5.1f}%  "
            f"EDP saved {100 * mean(r[1] for r in rows):5.1f}%  makespan x "
            f"{mean(r[2] for r in rows):.3f} (max {max(r[2] for r in rows):.3f})"
        )


def section_exact(cp_time: float) -> None:
    print(f"== 2. list scheduler vs CP-SAT on small graphs (CP-SAT {cp_time:g} s, 2 workers) ==")
    small = {
        "cholesky-3": lambda t: cholesky(3, 4096, platform(t, 2)),
        "lu-3": lambda t: lu(3, 2048, platform(t, 2)),
        "stencil-3x3": lambda t: stencil(3, 3, 2**26, platform(t, 3)),
        "layered-3x4": lambda t: layered(3, 4, platform(t, 2), seed=0),
    }
    print(
        f"{'GPU':<5} {'graph':<12} {'objective':<14} {'heuristic/CP':>12} {'CP status':<9} "
        f"{'CP gap':>8} {'CP s':>6}"
    )
    within: list[float] = []
    for gpu_type in ("L40S", "L4"):
        for name, make in small.items():
            spec = make(gpu_type)
            for kind in OBJECTIVE_KINDS:
                tg = with_objective(spec, kind)
                h = solve_heuristic(tg)
                c = solve_cpsat(tg, time_limit_s=cp_time)
                checked(tg, h.plan)
                checked(tg, c.plan)
                assert h.objective is not None and c.objective is not None
                ratio = h.objective / c.objective
                gap = "n/a" if c.gap is None else f"{100 * c.gap:.2f}%"
                if c.status == "optimal":
                    within.append(ratio)
                print(
                    f"{gpu_type:<5} {name:<12} {kind:<14} {ratio:>12.4f} {c.status:<9} "
                    f"{gap:>8} {c.wall_s:>6.1f}"
                )
    if within:
        print(
            f"where CP-SAT proved optimality ({len(within)} cases): heuristic/optimum mean "
            f"{mean(within):.4f}, worst {max(within):.4f}"
        )


def section_scale() -> None:
    print("== 3. list scheduler on about 10,000 tasks (8 GPUs) ==")
    big = {
        "layered-100x100": lambda: layered(100, 100, platform("L40S", 8), seed=0),
        "cholesky-38": lambda: cholesky(38, 2048, platform("L40S", 8)),
    }
    for name, make in big.items():
        for kind in ("energy_within", "edp"):
            t0 = time.perf_counter()
            tg = with_objective(make(), kind)
            built = time.perf_counter() - t0
            t0 = time.perf_counter()
            r = solve_heuristic(tg, time_limit_s=60.0)
            wall = time.perf_counter() - t0
            tot = totals(tg, checked(tg, r.plan))
            base = totals(tg, heft_max_clock(tg))
            saved = 100 * (1 - tot.energy_j / base.energy_j)
            print(
                f"{name:<16} {tg.n_tasks:>6} tasks {kind:<14} model {built:5.1f} s, "
                f"schedule {wall:5.1f} s; energy saved {saved:.1f}%, certified gap "
                f"{'n/a' if r.gap is None else f'{100 * r.gap:.1f}%'}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cp-time", type=float, default=20.0, help="CP-SAT limit per solve, s")
    ap.add_argument("--skip-cp", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smaller graphs in section 1")
    args = ap.parse_args()
    section_savings(args.quick)
    if not args.skip_cp:
        section_exact(args.cp_time)
    if not args.skip_scale:
        section_scale()


if __name__ == "__main__":
    main()
