"""The serving default (`auto`) against every single preset, side by side in one run.

For each bundled serving instance and each preset, one solve at the same time
limit (``--limit``, default 60 s) in this process, one after another: status,
objective (W, the plan's own cost recomputed by the verifier), certified bound,
gap, wall time, CPU time (s, this process's user and system time with HiGHS'
threads; on a shared machine it varies less with the load than the wall time) and
the machine's 1-minute load average when the solve ended.
Then the targets:

* ``auto`` is never worse than any single preset on any instance (its objective
  at most the best other preset's, to 1e-6 relative; infeasible where another
  preset proves infeasibility);
* on fleet-64, ``auto`` proves its plan within 0.1 % in at most 60 s, with the load
  average and the CPU seconds it took printed beside it;
* ``highs-exact`` (the previous default) is printed beside it on every instance.

The figures rest on the steady-state power model (docs/performance-model.md),
calibrated on the clock sweeps and power measurements in ``../shared/data/``.

Run: python benchmarks/serving_auto.py [--limit 60] [--instances a,b]
[--presets p,q] [--big-presets p,q] (every preset: about 35 minutes on a shared
2-core machine). Instances with more than 256 GPUs are solved only with the
``--big-presets`` (default auto, highs-exact, bnp, colgen): there HiGHS does not
solve the per-GPU and plain MILPs' root LP within the limit (on fleet-64 already),
so those presets return the configuration-formulation plan they start from, and
CP-SAT spends its whole limit on them.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path

from energyopt.families.serving.family import load_instance
from energyopt.families.serving.solvers.solve import solve
from energyopt.solvers.presets import available_presets, load_preset
from energyopt.solvers.result import INFEASIBLE

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = (
    "quickstart",
    "disaggregated",
    "tensor-parallel",
    "mig-a100",
    "hetero-migration",
    "infeasible",
    "fleet-16",
    "fleet-64",
    "fleet-256",
    "fleet-1024",
    "fleet-4096",
)
BIG_GPUS = 256
BIG_PRESETS = ("auto", "highs-exact", "bnp", "colgen")
REL = 1e-6


@dataclass
class Run:
    instance: str
    preset: str
    status: str
    objective: float | None
    bound: float | None
    gap: float | None
    wall_s: float
    cpu_s: float
    load: float
    chose: str


def run(instance: str, preset: str, limit: float) -> Run:
    problem = load_instance(ROOT / "instances" / f"{instance}.yaml")
    t = time.perf_counter()
    c = time.process_time()
    r = solve(problem, load_preset(preset), time_limit_s=limit)
    wall = time.perf_counter() - t
    cpu = time.process_time() - c
    return Run(
        instance,
        preset,
        str(r.status),
        r.objective,
        r.bound,
        r.gap,
        wall,
        cpu,
        os.getloadavg()[0],
        r.solver if preset == "auto" else "",
    )


def fmt(x: float | None, spec: str) -> str:
    """``x`` formatted by ``spec``; a dash of the same width where there is none."""
    width = "".join(c for c in spec.split(",")[0].split(".")[0] if c.isdigit())
    return format("-", f">{width or 1}") if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=float, default=60.0, help="s per solve")
    ap.add_argument("--instances", default=",".join(INSTANCES))
    ap.add_argument("--presets", default=",".join(available_presets()))
    ap.add_argument("--big-presets", default=",".join(BIG_PRESETS))
    args = ap.parse_args()
    presets = args.presets.split(",")
    big = [p for p in args.big_presets.split(",") if p in presets]
    print(f"limit {args.limit:g} s per solve; {os.cpu_count()} CPUs")
    failures: list[str] = []
    for instance in args.instances.split(","):
        gpus = len(load_instance(ROOT / "instances" / f"{instance}.yaml").gpus)
        names = presets if gpus <= BIG_GPUS else big
        print(f"\n{instance} ({gpus} GPUs)")
        print(
            f"{'preset':20s} {'status':10s} {'objective':>12s} {'bound':>12s} "
            f"{'gap':>8s} {'time s':>7s} {'cpu s':>7s} {'load':>5s}"
        )
        runs = []
        for preset in names:
            r = run(instance, preset, args.limit)
            runs.append(r)
            label = r.chose if preset == "auto" else preset
            print(
                f"{label:20s} {r.status:10s} {fmt(r.objective, '12,.3f')} "
                f"{fmt(r.bound, '12,.3f')} {fmt(None if r.gap is None else 100 * r.gap, '7.3f')}"
                f"{'%' if r.gap is not None else ' '} {r.wall_s:7.1f} {r.cpu_s:7.1f} {r.load:5.1f}",
                flush=True,
            )
        auto = next((r for r in runs if r.preset == "auto"), None)
        if auto is None:
            continue
        others = [r for r in runs if r.preset != "auto"]
        best = min((r.objective for r in others if r.objective is not None), default=None)
        if any(r.status == str(INFEASIBLE) for r in others) and auto.status != str(INFEASIBLE):
            failures.append(f"{instance}: another preset proves infeasibility, auto {auto.status}")
        if best is not None and (auto.objective is None or auto.objective > best * (1 + REL)):
            failures.append(f"{instance}: auto {fmt(auto.objective, ',.3f')} > best {best:,.3f}")
        if instance == "fleet-64":
            met = auto.gap is not None and auto.gap <= 1e-3 + 1e-12 and auto.wall_s <= 60.0
            print(
                f"  {'met' if met else 'not met':8s} fleet-64: auto proves "
                f"{fmt(None if auto.gap is None else 100 * auto.gap, '.3f')} % in "
                f"{auto.wall_s:.1f} s ({auto.cpu_s:.1f} CPU-s) at load average {auto.load:.1f} "
                "(target 0.1 % in 60 s)"
            )
    print()
    if failures:
        print("  not met  auto never worse than any single preset:")
        for f in failures:
            print(f"    {f}")
    else:
        print("  met      auto never worse than any single preset on these instances")


if __name__ == "__main__":
    main()
