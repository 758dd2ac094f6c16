"""Keep-alive bounds on every bundled instance: the arc-flow programme before and
after the memory covers (formulations/cuts.py), and the Lagrangian before and
after its LP starting prices and the covers.

Per instance (instances/keepalive/*.yaml) and method it prints the wall time (s),
the plan's energy (J, recomputed from the plan by the verifier), the bound (J),
the gap and the 1-minute load average (os.getloadavg) when the method ended:

- ``LP, previous``: the arc-flow LP without the covers (the old root bound);
- ``LP, covers``: the LP with them;
- ``milp, previous`` / ``milp``: the whole-horizon MILP without / with them;
- ``lagrangian, previous``: the Lagrangian with no covers and no LP prices (the
  subgradient from zero prices, as it ran before; its repairs, master and time
  checks are today's);
- ``lagrangian``: as it runs now;
- ``auto``: the default solver (what ``energyopt solve`` runs with no --solver).

Run: python benchmarks/keepalive_gaps.py [--time-limit S] [INSTANCE ...]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from energyopt.backends.highs import mixed_lp, solve_mip
from energyopt.families.keepalive.family import auto_solver
from energyopt.families.keepalive.formulations.cuts import Covers
from energyopt.families.keepalive.formulations.milp import MAX_COLUMNS, build_milp, milp_columns
from energyopt.families.keepalive.formulations.model import KeepAliveProblem, load_keepalive
from energyopt.families.keepalive.solvers.lagrangian import solve_lagrangian
from energyopt.families.keepalive.solvers.milp import solve_milp
from energyopt.families.keepalive.spec import KeepAlivePlan
from energyopt.families.keepalive.verify import evaluate_keepalive
from energyopt.solvers.result import Result, relative_gap

ROOT = Path(__file__).resolve().parents[1]
Row = tuple[str, float, float | None, float | None, str]


def _without_covers(p: KeepAliveProblem) -> KeepAliveProblem:
    """A copy of ``p`` whose cover list is empty (the programme as it was)."""
    q = load_keepalive(p.source)
    empty = Covers(
        matrix=sp.csr_matrix((0, p.n_functions * p.n_states)),
        most=np.zeros(0),
        node=np.zeros(0, dtype=np.int64),
        scale=np.zeros(0),
    )
    q.__dict__["covers"] = empty  # the cached property's slot
    return q


def _lp(p: KeepAliveProblem, cuts: bool, limit_s: float) -> tuple[float | None, str]:
    """The arc-flow LP's optimum, J (None unless solved), and a note."""
    if milp_columns(p) > MAX_COLUMNS:
        return None, "too large"
    m = build_milp(p, cuts=cuts)
    n = len(m)
    run = solve_mip(
        mixed_lp(
            m.cost, m.matrix, m.row_lo, m.row_hi, np.zeros(n), np.ones(n), np.zeros(n, np.bool_)
        ),
        time_limit_s=limit_s,
        rel_gap=1e-9,
    )
    return (run.dual_bound if run.optimal else None), f"{n:,} columns"


def _timed(run: Callable[[], Result[KeepAlivePlan]], p: KeepAliveProblem) -> Row:
    """Run a solver: (note, wall s, energy J from the verifier, bound J, termination)."""
    t0 = time.perf_counter()
    result = run()
    wall = time.perf_counter() - t0
    energy = None
    if result.plan is not None:
        energy = evaluate_keepalive(p.spec, result.plan).energy_j
    return (str(result.termination or result.status), wall, energy, result.bound, "")


def _methods(
    p: KeepAliveProblem, old: KeepAliveProblem, limit: float
) -> list[tuple[str, Callable[[], Result[KeepAlivePlan]], KeepAliveProblem]]:
    """(label, run, the problem it solves) for every solver method of the table."""
    runs: list[tuple[str, Callable[[], Result[KeepAlivePlan]], KeepAliveProblem]] = []
    if milp_columns(p) <= MAX_COLUMNS:
        runs += [
            ("milp, previous", partial(solve_milp, old, time_limit_s=limit, cuts=False), old),
            ("milp", partial(solve_milp, p, time_limit_s=limit), p),
        ]
    runs += [
        (
            "lagrangian, previous",
            partial(solve_lagrangian, old, time_limit_s=limit, lp_start=False),
            old,
        ),
        ("lagrangian", partial(solve_lagrangian, p, time_limit_s=limit), p),
    ]
    picked = auto_solver(p)
    auto = solve_milp if picked == "milp" else solve_lagrangian
    runs.append((f"auto ({picked})", partial(auto, p, time_limit_s=limit), p))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0, help="per method, s")
    parser.add_argument("instances", nargs="*")
    args = parser.parse_args()
    paths = args.instances or sorted(str(f) for f in (ROOT / "instances/keepalive").glob("*.yaml"))
    limit = float(args.time_limit)
    print(f"time limit {limit:g} s per method; {os.cpu_count()} CPUs")
    header = (
        f"{'instance':<28} {'method':<22} {'time s':>7} {'objective J':>15} "
        f"{'bound J':>15} {'gap':>8} {'load':>5}  end"
    )
    print(header)
    print("-" * len(header))
    for path in paths:
        p = load_keepalive(path)
        old = _without_covers(p)
        name = Path(path).stem
        rows: list[tuple[str, Row]] = []
        for label, cuts in (("LP, previous", False), ("LP, covers", True)):
            t0 = time.perf_counter()
            value, note = _lp(old if not cuts else p, cuts, limit)
            rows.append((label, ("lp", time.perf_counter() - t0, None, value, note)))
            _print(name, label, rows[-1][1])
        for label, run, problem in _methods(p, old, limit):
            row = _timed(run, problem)
            _print(name, label, row)


def _print(name: str, label: str, row: Row) -> None:
    end, wall, energy, bound, note = row
    gap = "" if energy is None or bound is None else f"{100 * relative_gap(energy, bound):.3f}%"
    text_e = "" if energy is None else f"{energy:,.1f}"
    text_b = "" if bound is None else f"{bound:,.1f}"
    load = os.getloadavg()[0]
    print(
        f"{name:<28} {label:<22} {wall:>7.2f} {text_e:>15} {text_b:>15} {gap:>8} {load:>5.2f}  "
        f"{end}{'; ' + note if note else ''}",
        flush=True,
    )


if __name__ == "__main__":
    main()
