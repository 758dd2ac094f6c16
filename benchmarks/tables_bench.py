"""Lookup tables: scalar latency, vectorized throughput, and compile parallel efficiency.

    python benchmarks/tables_bench.py [--keys 1000000] [--skip-compile] [--tiers-spec SPEC]

Compares the numpy ``Table`` (``lookup``, the compiled 4-column ``row_getter``
and the one-column ``getter``), the standard-library reader, a Python dict keyed by
grid point, and one online ``solve`` of the base instance, each with the memory it
keeps once built and used (tracemalloc), plus ``lookup`` of all 7 axes of the tiered
operating-point table (in three orders of the key) and the CLI's open-and-look-up
path on it; then compiles a plan spec
with 1 and 2 workers back to back (each a fresh ``energyopt compile`` process),
``--compile-repeats`` times. Targets: median
scalar lookup <= 1 us, >= 10 M vectorized lookups/s, parallel efficiency >= 80 % on
2 workers.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from bisect import bisect_left
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from energyopt.catalog.problem import load_problem
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.tables import compile_table
from energyopt.solvers.presets import load_preset
from energyopt.tables import Table
from energyopt.tables.stdlib_reader import StdlibTable

ROOT = Path(__file__).resolve().parents[1]
OPS_SPEC = ROOT / "instances" / "compile-quickstart-oppoints.yaml"
PLAN_SPEC = ROOT / "instances" / "compile-quickstart.yaml"


def median_ns(fn: Callable[[], Any], calls: int = 200_000, repeats: int = 7) -> float:
    """Median over ``repeats`` batches of the mean time per call (ns)."""
    per_call = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter_ns() - start) / calls)
    return statistics.median(per_call)


def held(make: Callable[[], Any]) -> tuple[Any, int]:
    """``make()`` and the bytes its result and whatever it cached keep (tracemalloc)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    made = make()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return made, kept


def resident_mib() -> float:
    """This process's resident memory now (MiB; /proc, Linux), 0 elsewhere."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return 0.0


def peak_mib() -> float:
    """This process's peak resident memory (MiB; ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument(
        "--tiers-spec",
        type=Path,
        default=ROOT / "instances" / "compile-tiers-oppoints.yaml",
        help="oppoints spec of the 7-axis table whose full-key lookup is timed",
    )
    ap.add_argument("--compile-repeats", type=int, default=2, help="1-vs-2-worker pairs")
    ap.add_argument(
        "--compile-spec",
        type=Path,
        default=ROOT / "instances" / "compile-fleet16.yaml",
        help="plan spec timed with 1 and 2 workers (cells should take seconds each)",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="eot-bench-"))
    try:
        ops = tmp / "ops.eot"
        compile_table(OPS_SPEC, ops)
        tiers = tmp / "tiers.eot"
        compile_table(args.tiers_spec, tiers)
        # Memory first, on fresh tables: what each lookup path keeps once built
        # and used (tracemalloc; the caches of a Table, the getters, the dicts).
        table = Table.open(ops)
        std = StdlibTable(ops)
        wls = table.axes["workload"].values
        gpu = table.axes["gpu_type"].values[0]
        grid = [float(v) for v in table.axes["load"].values]
        best = table.array("best_clock_mhz")
        wl, load = wls[0], 7.3
        as_dict, dict_b = held(
            lambda: {
                (w, gpu, g): int(best[i, 0, k])
                for i, w in enumerate(wls)
                for k, g in enumerate(grid)
            }
        )
        getter, getter_b = held(
            lambda: table.getter("best_clock_mhz", "workload", "gpu_type", "load")
        )
        (columns, row), row_b = held(lambda: table.row_getter("workload", "gpu_type", "load"))
        as_rows, rows_b = held(
            lambda: {
                (w, gpu, g): tuple(table.array(c)[i, 0, k].item() for c in columns)
                for i, w in enumerate(wls)
                for k, g in enumerate(grid)
            }
        )
        _, lookup_b = held(lambda: table.lookup(workload=wl, gpu_type=gpu, load=load))
        _, std_b = held(lambda: std.lookup(workload=wl, gpu_type=gpu, load=load))
        big = Table.open(tiers)
        key7 = {
            "slo_tier": "gold",
            "workload": wls[0],
            "gpu_type": gpu,
            "clock_mhz": big.axes["clock_mhz"].values[-1],
            "share": 50,
            "share_used": 30,
            "load": 4.0,
        }
        _, big_b = held(lambda: big.lookup(**key7))
        orders = [dict(reversed(key7.items())), dict(sorted(key7.items()))]
        _, orders_b = held(lambda: [big.lookup(**k) for k in orders])

        def dict_rows() -> tuple[Any, ...]:
            k = bisect_left(grid, load)
            return as_rows.get((wl, gpu, grid[k]), ()) if k < len(grid) else ()

        def dict_lookup() -> int:
            k = bisect_left(grid, load)
            return as_dict.get((wl, gpu, grid[k]), -1) if k < len(grid) else -1

        assert (
            getter(wl, gpu, load)
            == dict_lookup()
            == table.lookup(workload=wl, gpu_type=gpu, load=load)["best_clock_mhz"]
        )
        assert row(wl, gpu, load)[:-1] == dict_rows()
        assert big.lookup(**key7) == big.lookup_once(**key7) == big.lookup(**orders[0])
        rows = [
            ("dict + bisect (baseline)", median_ns(dict_lookup), dict_b),
            ("dict + bisect, 4 columns", median_ns(dict_rows), rows_b),
            ("Table.getter (1 column)", median_ns(lambda: getter(wl, gpu, load)), getter_b),
            ("Table.row_getter (4 columns)", median_ns(lambda: row(wl, gpu, load)), row_b),
            (
                "Table.lookup (4 columns)",
                median_ns(lambda: table.lookup(workload=wl, gpu_type=gpu, load=load), 100_000),
                lookup_b,
            ),
            (
                "Table.lookup, 7 axes, 13 col.",
                median_ns(lambda: big.lookup(**key7), 100_000),
                big_b,
            ),
            (
                "  + 2 other orders of the key",
                median_ns(lambda: big.lookup(**orders[0]), 100_000),
                orders_b,
            ),
            (
                "StdlibTable.lookup",
                median_ns(lambda: std.lookup(workload=wl, gpu_type=gpu, load=load), 50_000),
                std_b,
            ),
            (
                "open + lookup_once (CLI path)",
                median_ns(lambda: Table.open(tiers).lookup_once(**key7), 20, 5),
                0,
            ),
        ]
        problem = load_problem(ROOT / "instances" / "quickstart.yaml")
        start = time.perf_counter()
        solve(problem, load_preset("highs-exact"))
        rows.append(("online solve (quickstart)", (time.perf_counter() - start) * 1e9, 0))
        base = rows[0][1]
        print("scalar lookup latency (median; target <= 1000 ns) and memory it keeps")
        for name, ns, nbytes in rows:
            kept = f"{nbytes / 1024:>10,.1f} KiB kept" if nbytes else ""
            print(f"  {name:<30} {ns:>14,.0f} ns   x{ns / base:>9,.2f} of dict {kept}")
        print(f"  process resident memory {resident_mib():,.0f} MiB (peak {peak_mib():,.0f} MiB)")
        rng = np.random.default_rng(0)
        n = args.keys
        keys = {
            "workload": rng.integers(0, len(wls), n),
            "gpu_type": np.zeros(n, dtype=np.int64),
            "load": rng.uniform(0, grid[-1] * 1.05, n),
        }
        table.lookup_many(keys)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            table.lookup_many(keys)
            times.append(time.perf_counter() - start)
        vec = n / statistics.median(times)
        one = table.getter("best_clock_mhz")
        start = time.perf_counter()
        col = table.array("best_clock_mhz")
        for _ in range(3):
            idx = table.axis_index("load", keys["load"])
            np.where(idx >= 0, col[keys["workload"], 0, idx], -1)
        single = 3 * n / (time.perf_counter() - start)
        m = 100_000
        start = time.perf_counter()
        for w, x in zip(keys["workload"][:m].tolist(), keys["load"][:m].tolist(), strict=True):
            one(wls[w], gpu, x)
        loop = m / (time.perf_counter() - start)
        print(f"vectorized throughput ({n:,} keys; target >= 10 M/s)")
        print(f"  Table.lookup_many (4 columns)  {vec / 1e6:8.2f} M lookups/s")
        print(f"  one column, axis_index + take  {single / 1e6:8.2f} M lookups/s")
        print(f"  Python loop of getter          {loop / 1e6:8.2f} M lookups/s")
        print(f"  ratio lookup_many / loop       x{vec / loop:,.1f}")
        if not args.skip_compile:
            print(f"compile {args.compile_spec.name} (target efficiency >= 80 %)")
            effs = []
            for rep in range(args.compile_repeats):
                walls = {}
                for workers in (1, 2):
                    out = tmp / f"plans-{rep}-{workers}.eot"
                    # As a user runs it: a fresh `energyopt compile` process each
                    # time (process start and imports count on both sides).
                    cmd = [sys.executable, "-m", "energyopt.cli", "compile"]
                    cmd += [str(args.compile_spec), "-o", str(out), "-q"]
                    start = time.perf_counter()
                    subprocess.run([*cmd, "--workers", str(workers)], check=True)
                    walls[workers] = time.perf_counter() - start
                effs.append(walls[1] / (2 * walls[2]))
                print(
                    f"  pair {rep + 1}: 1 worker {walls[1]:6.2f} s, 2 workers {walls[2]:6.2f} s, "
                    f"speed-up x{walls[1] / walls[2]:.2f}, parallel efficiency "
                    f"{100 * effs[-1]:.0f} %"
                )
            print(f"  median parallel efficiency {100 * statistics.median(effs):.0f} %")
        std.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
