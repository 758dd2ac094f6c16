"""Fit the performance model's constants to the shared measured tables; print every target.

Usage: python benchmarks/calibrate.py [--data data] [--no-fit]

1. The error of the shipped constants (models/gpus/*.yaml, perf.forward.CLOCK_RESPONSE)
   on every table: Splitwise and Vidur latency, Splitwise power (max clock), the Perseus
   A100 clock sweep and the H100 NVL clock sweep (ratios to the max clock).
2. The calibration targets, each with its value and whether it is met.
3. Unless --no-fit: a fresh fit (perf.fitting.fit_all), the blocks to put in
   models/gpus/*.yaml and perf/forward.py, and the targets again with the fitted values.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import yaml

from energyopt.catalog import builtin_catalog
from energyopt.perf.calibration import HostBoundRun
from energyopt.perf.fitting import (
    H100NVL_RUN,
    Tables,
    fit_all,
    h100nvl_errors,
    latency_errors,
    perseus_errors,
    perseus_pooled_errors,
    power_errors,
)
from energyopt.perf.forward import CLOCK_RESPONSE, ClockResponse
from energyopt.spec.hardware import GpuType

A100 = "A100-SXM4-80GB"
H100 = "H100-SXM5-80GB"


@dataclass(frozen=True)
class Target:
    """One calibration target: what, the value, the bound, and whether it holds."""

    name: str
    value: float
    bound: float
    unit: str
    info: bool = False  # shown for context, not a target

    @property
    def met(self) -> bool:
        return self.value <= self.bound

    def line(self) -> str:
        if self.unit == "%":
            val, lim = f"{self.value:.1%}", f"{self.bound:.0%}"
        else:
            val, lim = f"{self.value:.0f} {self.unit}", f"{self.bound:.0f} {self.unit}"
        status = "info" if self.info else ("met " if self.met else "MISS")
        return f"  {status}  {self.name:<58} {val:>9}  (<= {lim})"


def targets(
    tables: Tables,
    gpus: dict[str, GpuType],
    clock: ClockResponse,
    run: HostBoundRun,
    stack: dict[str, float] | None = None,
) -> list[Target]:
    """Every calibration target of docs/performance-model.md, evaluated (Splitwise through
    the stack latency ``stack``, default the shipped ``SPLITWISE_STACK_MS``)."""
    catalog = builtin_catalog()
    out: list[Target] = []
    for name in (A100, H100):
        stack_ms = None if stack is None else stack[name]
        for s in latency_errors(catalog, tables, gpus[name], stack_ms):
            if s.table.endswith("all_reduce"):
                out.append(Target(f"{s.table} median APE", s.median_ape, 0.12, "%"))
            elif s.table.startswith("vidur"):
                out.append(Target(f"{s.table} median APE", s.median_ape, 0.12, "%"))
                out.append(Target(f"{s.table} p90 APE", s.p90_ape, 0.25, "%"))
            else:
                out.append(Target(f"{s.table} median APE", s.median_ape, 0.20, "%"))
        for s in power_errors(catalog, tables, gpus[name], stack_ms):
            bound = 0.10 if s.table.endswith("token power") else 0.20
            bound = 0.15 if s.table.endswith("average power") else bound
            out.append(Target(f"{s.table} APE", s.median_ape, bound, "%"))
    t, p, e = perseus_pooled_errors(tables, gpus[A100], clock)
    out.append(Target("perseus A100 time ratio t(f)/t(1410) median APE", t.median_ape, 0.03, "%"))
    out.append(Target("perseus A100 power ratio median APE", p.median_ape, 0.04, "%"))
    out.append(Target("perseus A100 energy ratio median APE", e.median_ape, 0.03, "%"))
    passes = perseus_errors(tables, gpus[A100], clock)
    worst = max(passes, key=lambda s: s.opt_error_mhz)
    out.append(
        Target(
            f"perseus energy-optimal clock, worst of {len(passes)} passes ({worst.name})",
            worst.opt_error_mhz,
            45.0,
            "MHz",
        )
    )
    for kind, bound in (("time", 0.03), ("power", 0.04), ("energy", 0.03)):
        worst_k = max(passes, key=lambda s: getattr(s, kind).median_ape)
        value = getattr(worst_k, kind).median_ape
        label = f"  worst single pass, {kind}: {worst_k.name}"
        out.append(Target(label, value, bound, "%", info=True))
    nvl = h100nvl_errors(tables, gpus[H100], run, clock)
    out.append(Target("H100 NVL time ratio median APE", nvl.time.median_ape, 0.03, "%"))
    out.append(Target("H100 NVL power ratio median APE", nvl.power.median_ape, 0.04, "%"))
    out.append(Target("H100 NVL energy ratio median APE", nvl.energy.median_ape, 0.03, "%"))
    return out


def print_targets(title: str, rows: list[Target]) -> None:
    print(f"== {title}")
    for row in rows:
        print(row.line())
    held = sum(r.met for r in rows if not r.info)
    total = sum(1 for r in rows if not r.info)
    print(f"  {held} of {total} targets met")


def print_sweeps(tables: Tables, gpus: dict[str, GpuType], clock: ClockResponse) -> None:
    print("== clock sweeps, per pass (median APE of ratios; energy-optimal clock)")
    print(f"  {'pass':<38} {'time':>6} {'power':>6} {'energy':>6}  measured  model")
    nvl = h100nvl_errors(tables, gpus[H100], H100NVL_RUN, clock)
    sweeps = [*perseus_errors(tables, gpus[A100], clock), nvl]
    for s in sweeps:
        print(
            f"  {s.name:<38} {s.time.median_ape:6.1%} {s.power.median_ape:6.1%} "
            f"{s.energy.median_ape:6.1%}  {s.measured_opt_mhz:5.0f} MHz {s.model_opt_mhz:5.0f} MHz"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    default = Path(__file__).resolve().parents[1] / "data"  # data/README.md
    parser.add_argument("--data", type=Path, default=default)
    parser.add_argument("--no-fit", action="store_true", help="only evaluate the shipped values")
    args = parser.parse_args()
    tables = Tables(args.data)
    catalog = builtin_catalog()
    shipped = {name: catalog.gpu(name) for name in (A100, H100)}
    print_sweeps(tables, shipped, CLOCK_RESPONSE)
    print_targets(
        "targets, shipped constants", targets(tables, shipped, CLOCK_RESPONSE, H100NVL_RUN)
    )
    if args.no_fit:
        return
    fit = fit_all(catalog, tables)
    for name, gpu in fit.gpus.items():
        print(f"== {name}: fitted (models/gpus)")
        blocks = {"efficiency": gpu.efficiency.model_dump(), "power": gpu.power.model_dump()}
        print(yaml.safe_dump(blocks, sort_keys=False))
    print(f"== fitted clock response (perf/forward.py CLOCK_RESPONSE): {fit.clock}")
    print(f"== fitted H100 NVL run (perf/fitting.py H100NVL_RUN): {fit.h100nvl}")
    stack = fit.splitwise_stack
    print(f"== fitted Splitwise stack (perf/calibration.py SPLITWISE_STACK_MS): {stack}")
    print_targets(
        "targets, fitted constants",
        targets(tables, fit.gpus, fit.clock, fit.h100nvl, fit.splitwise_stack),
    )


if __name__ == "__main__":
    main()
