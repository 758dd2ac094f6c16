"""Keep-alive policies side by side on the Azure LLM trace split per model.

Replays one hour of the Azure LLM inference trace 2023 (conversation), split into
four model streams as benchmarks/make_keepalive.py does, against five policies per
function, with the function parameters of instances/keepalive/azure-llm-2nodes.yaml
(ServerlessLLM load times, Splitwise powers): fixed 10-minute keep-alive,
Shahrad et al.'s hybrid histogram, always warm, always cold, and the tepid-aware
table (warm, then tepid, then cold at thresholds compiled from the function's
idle-time histogram for least expected energy, p99 start within 15 s, at most 5%
cold). Prints energy, cold-start rate, p99 start latency, GPU memory-time and the
ratios to fixed keep-alive, for the streams as they are and thinned to every 20th
request (a derived load with the longer idle times of typical serverless
functions). No public serverless (Azure Functions) invocation trace is in
../shared/data, so only the LLM trace is replayed.

Run: python benchmarks/keepalive.py [DATA_DIR]
"""

from __future__ import annotations

import csv
import sys
from datetime import datetime
from pathlib import Path

from energyopt.formulations.keepalive.model import load_keepalive
from energyopt.formulations.keepalive.policy import (
    IdleHistogram,
    Phase,
    always_cold,
    always_warm,
    compile_tepid,
    fixed,
    hybrid_histogram,
)
from energyopt.sim.keepalive import Policy, percentile, simulate
from energyopt.spec.keepalive import Function
from make_keepalive import split

ROOT = Path(__file__).resolve().parents[1]
INSTANCE = ROOT / "instances" / "keepalive" / "azure-llm-2nodes.yaml"
HORIZON_S = 3600.0
SLO_S = 15.0
LATE_SHARE = 0.01
COLD_SHARE = 0.05
SPARSE_EVERY = 20
"""Thinning of the second table: longer idle times, as in most serverless functions."""


def arrivals(data: Path) -> dict[str, list[float]]:
    """Arrival times (s from the first request) per function."""
    out: dict[str, list[float]] = {}
    with open(data / "traces" / "azure-llm-2023-conv.csv") as fh:
        rows = list(csv.DictReader(fh))
    t0 = datetime.fromisoformat(rows[0]["TIMESTAMP"][:26])
    for i, row in enumerate(rows):
        name = split(int(row["ContextTokens"]), int(row["GeneratedTokens"]), i)
        if name is None:
            continue
        t = (datetime.fromisoformat(row["TIMESTAMP"][:26]) - t0).total_seconds()
        if t < HORIZON_S:
            out.setdefault(name, []).append(t)
    return out


def policies(fn: Function) -> dict[str, Policy]:
    def tepid(h: IdleHistogram) -> list[Phase]:
        return compile_tepid(fn, h, SLO_S, LATE_SHARE, COLD_SHARE).phases()

    return {
        "fixed-10min": lambda _h: fixed(),
        "hybrid-histogram": hybrid_histogram,
        "always-warm": lambda _h: always_warm(),
        "always-cold": lambda _h: always_cold(),
        "tepid-table": tepid,
    }


def table(title: str, streams: dict[str, list[float]], functions: tuple[Function, ...]) -> None:
    """Replay ``streams`` against every policy and print the totals side by side."""
    totals: dict[str, dict[str, float]] = {}
    latencies: dict[str, list[float]] = {}
    per_function: dict[tuple[str, str], float] = {}
    for fn in functions:
        for name, policy in policies(fn).items():
            sim = simulate(fn, streams.get(fn.name, []), policy, HORIZON_S)
            assert sim.served == sim.requests
            t = totals.setdefault(name, {"energy": 0.0, "requests": 0, "cold": 0, "gb_s": 0.0})
            t["energy"] += sim.energy_j
            t["requests"] += sim.requests
            t["cold"] += sim.cold_starts
            t["gb_s"] += sim.gpu_gb_s
            latencies.setdefault(name, []).extend(sim.latencies_s)
            per_function[fn.name, name] = sim.energy_j
    base = totals["fixed-10min"]
    print(f"{title}: {len(functions)} functions, {int(base['requests'])} requests, one hour")
    print(
        f"{'policy':<18} {'energy kWh':>10} {'x fixed':>8} {'cold %':>7} {'p99 start s':>11} "
        f"{'GPU GB h':>9} {'x fixed':>8}"
    )
    for name, t in totals.items():
        print(
            f"{name:<18} {t['energy'] / 3.6e6:>10.4f} {t['energy'] / base['energy']:>8.3f} "
            f"{100 * t['cold'] / t['requests']:>7.2f} {percentile(latencies[name], 99):>11.2f} "
            f"{t['gb_s'] / 3600:>9.1f} {t['gb_s'] / base['gb_s']:>8.3f}"
        )
    ratios = ", ".join(
        f"{fn.name} {per_function[fn.name, 'tepid-table'] / per_function[fn.name, 'fixed-10min']:.3f}"  # noqa: E501
        for fn in functions
    )
    print(f"tepid-table energy / fixed-10min per function: {ratios}\n")


def main(data: Path) -> None:
    functions = load_keepalive(INSTANCE).spec.functions
    streams = arrivals(data)
    table("Azure LLM trace 2023, split per model", streams, functions)
    sparse = {name: times[::SPARSE_EVERY] for name, times in streams.items()}
    table(f"the same streams thinned to every {SPARSE_EVERY}th request", sparse, functions)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "data")
