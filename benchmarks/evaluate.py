"""Trace-driven comparison of every planner on the bundled evaluation specs.

Runs performance-first, consolidation-only, frequency-only, sharing-only and
energyopt's joint planners side by side in one process on the same requests
(instances/evaluate/fleet16-azure.yaml: one hour of the Azure LLM inference
trace 2023; fleet16-diurnal.yaml: a compressed day), prints the evaluation table
and, per spec, the ratios the issue's target is stated in:

* energy saving of each planner against performance-first;
* SLO attainment difference from performance-first (points);
* whether the best energyopt planner saves at least 56 % with attainment within
  2 points of performance-first and uses less energy than every other baseline.

    python benchmarks/evaluate.py                 # both specs, full hour each
    python benchmarks/evaluate.py --duration 900  # shorter
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from energyopt.families.serving.loop import evaluate
from energyopt.families.serving.loop_report import format_table, summary_rows
from energyopt.spec.evaluation import load_evaluation

ROOT = Path(__file__).resolve().parents[1]
SPECS = ("fleet16-azure.yaml", "fleet16-diurnal.yaml")
TARGET_SAVING = 0.56
TARGET_POINTS = 2.0


def one(spec_path: Path, duration: float | None, verbose: bool) -> None:
    ev = load_evaluation(spec_path)
    if duration is not None:
        ev = ev.model_copy(update={"duration_s": duration})
    start = time.perf_counter()
    say = (lambda line: print(f"  {line}", file=sys.stderr)) if verbose else (lambda _: None)
    res = evaluate(ev, spec_path, say=say)
    wall = time.perf_counter() - start
    print("\n".join(format_table(res)))
    rows = {str(r["planner"]): r for r in summary_rows(res)}
    ref = rows.get(ev.reference)
    if ref is None:
        print(f"no {ev.reference} run: no ratios")
        return
    ref_att = float(ref["slo_attainment"] or 0)
    print(f"ratios against {ev.reference} (energy ratio, saving, SLO attainment points):")
    for name, r in rows.items():
        ratio = float(r["energy_j"] or 0) / float(ref["energy_j"] or 1)
        points = 100 * (float(r["slo_attainment"] or 0) - ref_att)
        print(f"  {name:<26} {ratio:6.3f}  {100 * (1 - ratio):5.1f}%  {points:+6.2f}")
    ours = [n for n, r in rows.items() if r["kind"] == "energyopt"]
    others = [n for n, r in rows.items() if r["kind"] not in ("energyopt", "table")]
    if not ours:
        return
    best = min(ours, key=lambda n: float(rows[n]["energy_j"] or 0))
    b = rows[best]
    saving = float(b["saving"] or 0)
    points = 100 * (float(b["slo_attainment"] or 0) - ref_att)
    ahead = all(float(b["energy_j"] or 0) < float(rows[o]["energy_j"] or 0) for o in others)
    met = saving >= TARGET_SAVING and points >= -TARGET_POINTS and ahead
    print(
        f"target ({100 * TARGET_SAVING:.0f}% saving, attainment within {TARGET_POINTS:g} points, "
        f"ahead of every baseline): {best} saves {100 * saving:.1f}%, attainment "
        f"{points:+.2f} points, ahead: {'yes' if ahead else 'no'} -> "
        f"{'met' if met else 'NOT met'}"
    )
    print(f"wall time {wall:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", action="append", help="spec file(s); default: the bundled")
    parser.add_argument("--duration", type=float, default=None, help="override duration (s)")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args()
    specs = (
        [Path(s) for s in args.spec]
        if args.spec
        else [ROOT / "instances" / "evaluate" / name for name in SPECS]
    )
    for spec in specs:
        print(f"== {spec.relative_to(ROOT) if spec.is_relative_to(ROOT) else spec}")
        one(spec, args.duration, args.verbose)
        print()


if __name__ == "__main__":
    main()
