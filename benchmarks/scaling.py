"""How the serving decompositions grow with the fleet: 256 to 10,240 GPUs.

Usage: python benchmarks/scaling.py [--instances fleet-256 fleet-1024 fleet-4096 fleet-10240]
       [--solvers colgen pop bnp] [--limit-at-max 60] [--limit-min 10]

Each (instance, solver) runs in its own Python process, so runs share no memory
and each peak is its own. Time limit policy: proportional to the GPU count,
``limit-at-max`` seconds at the largest instance and never under ``limit-min``
(default 10, 10, 24 and 60 s at 256, 1024, 4096 and 10,240 GPUs); the presets'
effort limits (iterations, columns, nodes) apply as well. Per run the table shows
the time to load and validate the instance (s), the solve time (s, including the
operating-point table; the time the targets are held to), the peak resident memory
of the process (MiB, ``getrusage`` maxrss) and the part of it above the process
after its imports (what the instance and the solve added), the objective (W,
recomputed from the plan), the bound the solver certifies, its gap, the
termination and whether the independent verifier accepts the plan. Then per
solver the growth exponent between consecutive sizes, log(y2/y1) / log(n2/n1) for
n GPUs: 1 is linear growth, 2 quadratic. Last, the fleet-10240 target of issue 19
item 5 (within 2 % of a certified bound in 60 s or less) as met or not.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _rss_mib() -> float:
    """Peak resident memory of this process so far (MiB; Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def one_run(path: Path, solver: str, limit_s: float) -> dict[str, Any]:
    """Load, solve and verify in this process; the measurements as plain data."""
    from energyopt.catalog import load_problem
    from energyopt.families.serving.solvers.solve import solve
    from energyopt.families.serving.verify import verify_plan
    from energyopt.solvers.presets import load_preset
    from energyopt.solvers.result import relative_gap

    base = _rss_mib()
    start = time.perf_counter()
    problem = load_problem(path)
    loaded = time.perf_counter()
    res = solve(problem, load_preset(solver), time_limit_s=limit_s)
    solved = time.perf_counter()
    ok = res.plan is not None and not verify_plan(problem, res.plan)
    gap = (
        relative_gap(res.objective, res.bound)
        if res.objective is not None and res.bound is not None
        else None
    )
    return {
        "gpus": len(problem.gpus),
        "load_s": loaded - start,
        "solve_s": solved - loaded,
        "peak_mib": _rss_mib(),
        "added_mib": _rss_mib() - base,
        "objective": res.objective,
        "bound": res.bound,
        "gap": gap,
        "termination": str(res.termination) if res.termination is not None else "-",
        "status": str(res.status),
        "verified": ok,
    }


@dataclass
class Row:
    instance: str
    solver: str
    limit_s: float
    data: dict[str, Any]

    def get(self, key: str) -> Any:
        return self.data.get(key)


def spawn(path: Path, solver: str, limit_s: float, timeout_s: float) -> dict[str, Any]:
    """``one_run`` in a fresh interpreter; an ``error`` entry where it fails."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(path), solver, str(limit_s)]
    return run_child(cmd, timeout_s)


def run_child(cmd: list[str], timeout_s: float) -> dict[str, Any]:
    """Run ``cmd`` (a script's ``--one`` mode) for at most ``timeout_s`` seconds and
    return the last JSON object it printed; an ``error`` entry where it fails."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"killed after {timeout_s:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {out.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def growth(n1: float, n2: float, y1: float | None, y2: float | None) -> float | None:
    """log(y2/y1) / log(n2/n1); None where a value is missing or not positive."""
    if y1 is None or y2 is None or y1 <= 0 or y2 <= 0 or n1 == n2:
        return None
    return math.log(y2 / y1) / math.log(n2 / n1)


def fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--instances", nargs="+", default=["fleet-256", "fleet-1024", "fleet-4096", "fleet-10240"]
    )
    parser.add_argument("--solvers", nargs="+", default=["colgen", "pop", "bnp"])
    parser.add_argument("--limit-at-max", type=float, default=60.0, help="s at the largest fleet")
    parser.add_argument("--limit-min", type=float, default=10.0, help="s at least")
    parser.add_argument(
        "--one", nargs=3, metavar=("PATH", "SOLVER", "LIMIT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(Path(args.one[0]), args.one[1], float(args.one[2]))))
        return
    paths = {name: ROOT / "instances" / f"{name}.yaml" for name in args.instances}
    missing = [n for n, p in paths.items() if not p.exists()]
    if missing:
        sys.exit(f"instances not found: {', '.join(missing)}")
    sizes = {name: int(name.rsplit("-", 1)[1]) for name in args.instances}
    largest = max(sizes.values())
    print(
        f"time limit: {args.limit_at_max:g} s x GPUs / {largest:,}, at least {args.limit_min:g} s; "
        "one process per run"
    )
    rows: list[Row] = []
    for name in args.instances:
        limit = max(args.limit_min, args.limit_at_max * sizes[name] / largest)
        for solver in args.solvers:
            data = spawn(paths[name], solver, limit, timeout_s=limit * 2 + 120)
            rows.append(Row(name, solver, limit, data))
            print(f"  ran {name} {solver}: " + data.get("error", "ok"))
            sys.stdout.flush()
    print(
        f"\n{'instance':<12} {'solver':<7} {'limit s':>7} {'load s':>7} {'solve s':>7} "
        f"{'peak MiB':>8} {'added MiB':>9} {'objective W':>12} {'bound W':>12} {'gap':>7} "
        f"{'stopped':<12} verified"
    )
    for r in rows:
        if "error" in r.data:
            print(f"{r.instance:<12} {r.solver:<7} {r.limit_s:7.0f}  {r.data['error']}")
            continue
        print(
            f"{r.instance:<12} {r.solver:<7} {r.limit_s:7.0f} {r.get('load_s'):7.1f} "
            f"{r.get('solve_s'):7.1f} {r.get('peak_mib'):8,.0f} {r.get('added_mib'):9,.0f} "
            f"{fmt(r.get('objective')):>12} {fmt(r.get('bound')):>12} "
            f"{fmt(r.get('gap'), '.2%'):>7} {r.get('termination'):<12} "
            f"{'-' if r.get('objective') is None else 'yes' if r.get('verified') else 'NO'}"
        )
    print("\ngrowth exponents log(y2/y1)/log(n2/n1) (1 = linear in GPUs)")
    print(f"{'solver':<7} {'sizes':<13} {'load':>6} {'solve':>6} {'memory':>7}  at most linear")
    for solver in args.solvers:
        series = [r for r in rows if r.solver == solver and "error" not in r.data]
        for a, b in itertools.pairwise(series):
            n1, n2 = sizes[a.instance], sizes[b.instance]
            g_load = growth(n1, n2, a.get("load_s"), b.get("load_s"))
            g_solve = growth(n1, n2, a.get("solve_s"), b.get("solve_s"))
            g_mem = growth(n1, n2, a.get("added_mib"), b.get("added_mib"))
            linear = all(g is not None and g <= 1.0 for g in (g_solve, g_mem))
            print(
                f"{solver:<7} {f'{n1}->{n2}':<13} {fmt(g_load, '.2f'):>6} "
                f"{fmt(g_solve, '.2f'):>6} {fmt(g_mem, '.2f'):>7}  {'yes' if linear else 'no'}"
            )
    target = "fleet-10240"
    at = [r for r in rows if r.instance == target and r.get("objective") is not None]
    if not at:
        print(f"\n{target} (target <= 2 % in <= 60 s): not run")
        return
    bounds = [r.get("bound") for r in at if r.get("bound") is not None]
    best_bound = max(bounds) if bounds else None
    print()
    for r in at:
        vs = (r.get("objective") - best_bound) / r.get("objective") if best_bound else None
        met = vs is not None and vs <= 0.02 and r.get("solve_s") <= 60.0 and r.get("verified")
        print(
            f"{target}: {r.solver} {fmt(vs, '.2%')} from the best certified bound "
            f"({fmt(best_bound)} W) in {r.get('solve_s'):.1f} s "
            f"(target <= 2 % in <= 60 s): {'met' if met else 'not met'}"
        )


if __name__ == "__main__":
    main()
