"""Proven gaps of the task-graph default (``energyopt solve FILE --time-limit S``).

Usage: python benchmarks/taskgraph_gaps.py [--time-limit S] [--previous-src DIR]
       [--objectives energy_within,edp] [--skip-bundled] [--skip-large]

For every bundled instance (instances/taskgraph/*.yaml) and a 10,000-task random
layered DAG on 8 L40S (generators.layered(100, 100, seed 0), one file per
objective), the family default runs through ``energyopt.solve`` in a fresh
process with the time limit: instance, method, wall time (s), objective, proven
bound, gap and the 1-minute load average (``os.getloadavg``) when it ended.
``--previous-src`` names the ``src`` folder of another checkout (for example
``git worktree add /tmp/prev COMMIT``); its default then runs on the same files
right after, and its columns are printed beside. The targets (every bundled
graph within 2 %, the 10,000-task graph within 5 % for each objective, both in
the time limit) are printed as met or not met.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_TARGET = 0.02
LARGE_TARGET = 0.05

WORKER = """
import json, sys, time
import energyopt
problem = energyopt.load(sys.argv[1])
t0 = time.perf_counter()
r = energyopt.solve(problem, time_limit=float(sys.argv[2]))
print(json.dumps({"solver": r.solver, "algorithm": r.algorithm, "wall": time.perf_counter() - t0,
                  "objective": r.objective, "bound": r.bound, "gap": r.gap,
                  "status": str(r.status)}))
"""


@dataclass(frozen=True)
class Run:
    """One solve: method, wall time (s), objective and bound (file's unit), gap, load."""

    method: str
    wall_s: float
    objective: float | None
    bound: float | None
    gap: float | None
    load: float


def solve(path: Path, limit: float, src: Path) -> Run:
    """The default of the checkout whose package lies in ``src``, in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(src))
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(path), str(limit)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    load = os.getloadavg()[0]
    if out.returncode != 0:
        raise SystemExit(f"{path}: the solve failed:\n{out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return Run(str(r["solver"]), r["wall"], r["objective"], r["bound"], r["gap"], load)


def large_files(out: Path, objectives: list[str]) -> list[Path]:
    """The 10,000-task layered DAG on 8 L40S, one file per objective."""
    from energyopt.families.taskgraph.formulations.generators import layered, platform
    from energyopt.spec.io import dump

    paths = []
    for kind in objectives:
        spec = layered(100, 100, platform("L40S", 8), seed=0, name=f"layered-100x100-{kind}")
        spec = spec.model_copy(
            update={"objective": spec.objective.model_copy(update={"kind": kind})}
        )
        path = out / f"layered-100x100-l40s-{kind}.yaml"
        dump(spec, path)
        paths.append(path)
    return paths


def cell(r: Run | None) -> str:
    if r is None:
        return ""
    gap = "n/a" if r.gap is None else f"{100 * r.gap:.2f}%"
    obj = "n/a" if r.objective is None else f"{r.objective:.6g}"
    bound = "n/a" if r.bound is None else f"{r.bound:.6g}"
    return f"{r.method:<9} {r.wall_s:>6.1f} {obj:>11} {bound:>11} {gap:>8} {r.load:>5.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="s per solve")
    ap.add_argument("--previous-src", type=Path, help="src/ of the checkout to compare with")
    ap.add_argument("--objectives", default="energy_within,edp", help="for the large graph")
    ap.add_argument("--skip-bundled", action="store_true")
    ap.add_argument("--skip-large", action="store_true")
    args = ap.parse_args()
    bundled = [] if args.skip_bundled else sorted((ROOT / "instances" / "taskgraph").glob("*.yaml"))
    with tempfile.TemporaryDirectory() as tmp:
        large = [] if args.skip_large else large_files(Path(tmp), args.objectives.split(","))
        head = f"{'method':<9} {'time s':>6} {'objective':>11} {'bound':>11} {'gap':>8} {'load':>5}"
        print(f"time limit {args.time_limit:g} s; {os.cpu_count()} CPUs")
        print(f"{'instance':<34} {head}   previous default: {head if args.previous_src else ''}")
        verdicts: list[tuple[str, float, Run]] = []
        for path in [*bundled, *large]:
            now = solve(path, args.time_limit, ROOT / "src")
            before = solve(path, args.time_limit, args.previous_src) if args.previous_src else None
            print(f"{path.stem:<34} {cell(now)}   {cell(before)}", flush=True)
            target = BUNDLED_TARGET if path in bundled else LARGE_TARGET
            verdicts.append((path.stem, target, now))
    print("targets (gap proven within the time limit):")
    for name, target, r in verdicts:
        met = r.gap is not None and r.gap <= target and r.wall_s <= args.time_limit * 1.05
        gap = "n/a" if r.gap is None else f"{100 * r.gap:.2f}%"
        print(f"  {name:<34} <= {100 * target:.0f}%: {'met' if met else 'not met'} ({gap})")


if __name__ == "__main__":
    main()
