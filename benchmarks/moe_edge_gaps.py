"""moe-edge exact solver: does it close? Tiny random instances against an exhaustive
optimiser, and the bundled instances' objectives, bounds and gaps, the default
beside the previous one.

Methods:

- ``previous default``: ``milp`` with every configuration refined by HiGHS
  (``enumerate_up_to=0``), which is what ``auto`` ran on these sizes before
  configurations of at most ``ENUMERATE_PLANS`` placements were enumerated; gap
  1e-4 (the family's default);
- ``default``: the family's ``auto`` at its default gap (1e-4); on tiny instances it
  runs ``milp``, which enumerates every configuration there;
- ``milp, gap 1e-9`` (bundled instances only): the HiGHS refinement asked to close.

Tiny instances: ``tests/moe_edge_exhaustive.random_instances`` (2 layers x 4
experts, one or two L4s, tight memory, an expert cache, co-activated pairs, TTFT
limits, the latency objective under a power cap, a TBT limit low among the
instance's own plans, some instances with no plan), with the exhaustive optimiser
written apart from the formulations. Per method: how many end at the exhaustive
optimum with status optimal, how many are proven infeasible where no plan exists,
how many answers are wrong (another objective, a bound above the optimum, an
infeasible instance not proven so, a feasible one called infeasible, 'converged'
or optimal with a gap above the one asked), the largest gap reported and the time.

Bundled instances: instances/moe-edge/*.yaml, time limit 60 s. Every row prints
the 1-minute load average (the machine is shared; times move with it).

Run: python benchmarks/moe_edge_gaps.py [--seeds N] [--skip-bundled]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the tests' generator and exhaustive optimiser

from tests.moe_edge_exhaustive import random_instances, tiny_catalog  # noqa: E402

from energyopt.families import family  # noqa: E402
from energyopt.families.moe_edge.formulations.model import (  # noqa: E402
    MoeEdgeProblem,
    build_problem,
    load_moe_edge,
)
from energyopt.families.moe_edge.solvers.milp import ENUMERATE_PLANS, solve_milp  # noqa: E402
from energyopt.families.moe_edge.spec import MoeEdgeFile, MoeEdgePlan  # noqa: E402
from energyopt.solvers.result import (  # noqa: E402
    INFEASIBLE,
    OPTIMAL,
    Result,
    Termination,
    relative_gap,
)

GAP = 1e-4
"""The family's default relative gap."""
TIME_LIMIT_S = 60.0

Solve = Callable[[MoeEdgeProblem], Result[MoeEdgePlan]]


def previous_default(gap: float) -> Solve:
    def run(p: MoeEdgeProblem) -> Result[MoeEdgePlan]:
        return solve_milp(p, time_limit_s=TIME_LIMIT_S, rel_gap=gap, enumerate_up_to=0)

    return run


def default(p: MoeEdgeProblem) -> Result[MoeEdgePlan]:
    return family("moe-edge").solve(
        p, "auto", time_limit_s=TIME_LIMIT_S, rel_gap=GAP, progress=lambda _: None
    )


@dataclass
class Tally:
    """One method's answers on the tiny instances."""

    optimal: int = 0
    proven_infeasible: int = 0
    wrong: int = 0
    converged_above_gap: int = 0
    largest_gap: float = 0.0
    seconds: float = 0.0
    slowest_s: float = 0.0


def judge(res: Result[MoeEdgePlan], optimum: float | None, tally: Tally) -> str | None:
    """Count ``res`` against the exhaustive ``optimum``; the reason when it is wrong."""
    gap = res.gap or 0.0
    if (res.status == OPTIMAL or res.termination == Termination.CONVERGED) and gap > GAP + 1e-12:
        tally.converged_above_gap += 1
        return f"{res.status}, {res.termination} at gap {gap:.3g}"
    if optimum is None:
        if res.status == INFEASIBLE and res.plan is None:
            tally.proven_infeasible += 1
            return None
        return f"no plan exists; {res.status}"
    if res.objective is None or res.bound is None:
        return f"{res.status} with no plan or no bound"
    tally.largest_gap = max(tally.largest_gap, relative_gap(res.objective, res.bound))
    if res.bound > optimum * (1 + 1e-9):
        return f"bound {res.bound:.9g} above the optimum {optimum:.9g}"
    if res.status != OPTIMAL or res.objective > optimum * (1 + GAP) + 1e-12:
        return f"{res.status} at {res.objective:.9g}, optimum {optimum:.9g}"
    tally.optimal += 1
    return None


def tiny(seeds: int) -> None:
    catalog = tiny_catalog()
    methods: dict[str, Solve] = {"previous default": previous_default(GAP), "default": default}
    tallies = {m: Tally() for m in methods}
    count = feasible = 0
    for seed in range(1, seeds + 1):
        for k, (doc, _, opt) in enumerate(random_instances(seed, 15)):
            count += 1
            feasible += opt.value is not None
            p = build_problem(MoeEdgeFile.model_validate(doc), "<tiny>", catalog)
            for name, solve in methods.items():
                t0 = time.perf_counter()
                res = solve(p)
                wall = time.perf_counter() - t0
                tally = tallies[name]
                tally.seconds += wall
                tally.slowest_s = max(tally.slowest_s, wall)
                why = judge(res, opt.value, tally)
                if why is not None:
                    tally.wrong += 1
                    print(f"  seed {seed} #{k} ({doc['name']}), {name}: {why}")
    print(
        f"tiny instances: {count} (seeds 1..{seeds}, 15 each; {feasible} feasible, "
        f"{count - feasible} with no plan); gap asked {GAP:g}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"  {'method':<18} {'optimal':>7} {'proven inf.':>11} {'wrong':>5} "
        f"{'conv.>gap':>9} {'largest gap':>11} {'mean s':>7} {'max s':>6}"
    )
    for name, t in tallies.items():
        print(
            f"  {name:<18} {t.optimal:>7} {t.proven_infeasible:>11} {t.wrong:>5} "
            f"{t.converged_above_gap:>9} {t.largest_gap:>11.3g} {t.seconds / count:>7.3f} "
            f"{t.slowest_s:>6.2f}"
        )
    d = tallies["default"]
    closed = d.wrong == 0 and d.optimal + d.proven_infeasible == count
    print(
        f"  target: every tiny instance optimal or proven infeasible by the default: "
        f"{'met' if closed else 'not met'} ({d.optimal} optimal, {d.proven_infeasible} "
        f"proven infeasible, {d.wrong} wrong, of {count})"
    )


def bundled() -> None:
    methods: dict[str, Solve] = {
        "previous default": previous_default(GAP),
        "default": default,
        "milp, gap 1e-9": previous_default(1e-9),
    }
    print(f"bundled instances (time limit {TIME_LIMIT_S:g} s):")
    print(
        f"  {'instance':<28} {'method':<17} {'time s':>6} {'objective':>13} {'bound':>13} "
        f"{'gap':>9} {'status':<9} {'stop':<10} {'load':>4}"
    )
    worst = 0.0
    for path in sorted((ROOT / "instances" / "moe-edge").glob("*.yaml")):
        p = load_moe_edge(path)
        for name, solve in methods.items():
            t0 = time.perf_counter()
            res = solve(p)
            wall = time.perf_counter() - t0
            obj = "-" if res.objective is None else f"{res.objective:.9g}"
            bound = "-" if res.bound is None else f"{res.bound:.9g}"
            gap = "-" if res.gap is None else f"{res.gap:.2e}"
            print(
                f"  {path.stem:<28} {name:<17} {wall:>6.2f} {obj:>13} {bound:>13} {gap:>9} "
                f"{res.status:<9} {res.termination:<10} {os.getloadavg()[0]:>4.1f}"
            )
            if name == "default":
                worst = max(worst, res.gap if res.gap is not None else float("inf"))
    print(
        f"  bundled: the default's largest gap {worst:.2e} against its requested {GAP:g}: "
        f"{'met' if worst <= GAP + 1e-12 else 'not met'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5, help="tiny-instance seeds (15 each)")
    ap.add_argument("--skip-bundled", action="store_true")
    args = ap.parse_args()
    print(f"configurations of at most {ENUMERATE_PLANS:,} placements are enumerated")
    tiny(args.seeds)
    if not args.skip_bundled:
        bundled()


if __name__ == "__main__":
    main()
