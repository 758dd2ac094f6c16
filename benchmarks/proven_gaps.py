"""Proven gaps in every family, in one run: one table per family (instance, method,
time, objective, bound, gap, machine load), the default beside the previous
default, and every target printed as met or not met, then gathered at the end.

Each family's own benchmark prints its table; this script runs them one after
another in fresh processes (so one family's HiGHS thread pool or memory does not
carry into the next) and gathers the lines that state a target:

- serving: ``benchmarks/serving_auto.py`` with ``auto`` beside ``highs-exact``
  (the previous default) and ``bnp`` on every bundled instance; targets: fleet-64
  within 0.1 % in 60 s, ``auto`` never worse than either;
- task graphs: ``benchmarks/taskgraph_gaps.py`` (every bundled graph within 2 %,
  the 10,000-task graph within 5 %, in 60 s);
- collectives: ``benchmarks/collective_gaps.py`` (every bundled instance within
  5 %);
- keep-alive: ``benchmarks/keepalive_gaps.py`` (the arc-flow LP and Lagrangian
  before and after the memory covers);
- moe-edge: ``benchmarks/moe_edge_gaps.py`` (every tiny instance optimal or proven
  infeasible; the bundled instances' gaps);
- serverless and co-location, whose defaults did not change: the default on every
  bundled instance, through ``energyopt.solve``, with its certified gap.

Every figure is the plan's own cost recomputed by the family's verifier; bounds
are the solvers' certified bounds. Times move with the machine's load, which
every table prints beside its rows (1-minute load average).

Run: python benchmarks/proven_gaps.py [--time-limit 60] [--families a,b]
[--quick] (about 40 minutes on a shared 2-core machine; --quick: serving only up
to fleet-64, the task graphs without the 10,000-task graph, 2 moe-edge seeds).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
FAMILIES = (
    "serving",
    "taskgraph",
    "collective",
    "keepalive",
    "moe-edge",
    "serverless",
    "colocation",
)
TARGET_LINE = re.compile(r"\b(not met|met)\b")
UNCHANGED = {
    "serverless": sorted((ROOT / "instances" / "serverless").glob("*.yaml")),
    "colocation": sorted((ROOT / "instances" / "colocation").glob("*.yaml")),
}


def family_command(family: str, limit: float, quick: bool) -> list[str]:
    """The command line of ``family``'s own gap benchmark."""
    py = sys.executable
    if family == "serving":
        instances = (
            "quickstart,hetero-migration,infeasible,fleet-16,fleet-64"
            if quick
            else "quickstart,disaggregated,tensor-parallel,mig-a100,hetero-migration,"
            "infeasible,fleet-16,fleet-64,fleet-256,fleet-1024,fleet-4096"
        )
        return [
            py,
            str(BENCH / "serving_auto.py"),
            "--limit",
            f"{limit:g}",
            "--instances",
            instances,
            "--presets",
            "auto,highs-exact,bnp",
            "--big-presets",
            "auto,highs-exact,bnp",
        ]
    if family == "taskgraph":
        cmd = [py, str(BENCH / "taskgraph_gaps.py"), "--time-limit", f"{limit:g}"]
        return [*cmd, "--skip-large"] if quick else cmd
    if family == "collective":
        return [py, str(BENCH / "collective_gaps.py")]
    if family == "keepalive":
        return [py, str(BENCH / "keepalive_gaps.py"), "--time-limit", f"{limit:g}"]
    if family == "moe-edge":
        return [py, str(BENCH / "moe_edge_gaps.py"), "--seeds", "2" if quick else "5"]
    raise ValueError(f"no gap benchmark for family {family!r}")


def run_family(family: str, limit: float, quick: bool) -> list[str]:
    """Run ``family``'s benchmark, echo its output, return its target lines."""
    cmd = family_command(family, limit, quick)
    print(f"$ {' '.join(Path(c).name if c.endswith('.py') else c for c in cmd[1:])}", flush=True)
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    targets: list[str] = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        if TARGET_LINE.search(line):
            targets.append(line.strip())
    if proc.wait() != 0:
        targets.append(f"not met  the benchmark exited with status {proc.returncode}")
    return targets


def run_unchanged(family: str, limit: float) -> list[str]:
    """The default on every bundled instance of a family whose default did not change."""
    import energyopt

    print(
        f"{'instance':<28} {'method':<22} {'time s':>7} {'objective':>16} {'bound':>16} "
        f"{'gap':>8} {'load':>5}"
    )
    lines: list[str] = []
    for path in UNCHANGED[family]:
        problem = energyopt.load(str(path))
        t0 = time.perf_counter()
        r = energyopt.solve(problem, time_limit=limit)
        wall = time.perf_counter() - t0
        gap = "-" if r.gap is None else f"{100 * r.gap:.3f}%"
        obj = "-" if r.objective is None else f"{r.objective:,.3f}"
        bound = "-" if r.bound is None else f"{r.bound:,.3f}"
        method = f"{r.solver} ({r.algorithm})" if r.algorithm else r.solver
        print(
            f"{path.stem:<28} {method[:22]:<22} {wall:>7.1f} {obj:>16} {bound:>16} {gap:>8} "
            f"{os.getloadavg()[0]:>5.1f}",
            flush=True,
        )
        lines.append(f"{path.stem}: default {r.status}, gap {gap} (no target; default unchanged)")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="s per solve")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    wanted = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = sorted(set(wanted) - set(FAMILIES))
    if unknown:
        ap.error(f"--families: unknown {', '.join(unknown)}; choose from {', '.join(FAMILIES)}")
    summary: dict[str, list[str]] = {}
    for family in wanted:
        print(f"\n===== {family} (load average {os.getloadavg()[0]:.1f}) =====", flush=True)
        if family in UNCHANGED:
            summary[family] = run_unchanged(family, args.time_limit)
        else:
            summary[family] = run_family(family, args.time_limit, args.quick)
    print("\n===== targets =====")
    for family, lines in summary.items():
        print(f"{family}:")
        for line in lines or ["(the benchmark printed no target line)"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
