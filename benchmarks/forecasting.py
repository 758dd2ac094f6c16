"""Load forecasts side by side on the loads of benchmarks/online.py (issue 45, item 3).

Builds the arrivals of each load (no simulation, no solving: it runs in seconds)
and, for every epoch after the first, makes each method's forecasts
(src/energyopt/sim/forecast.py) at the epoch's start from the arrivals before it,
and compares them with what came in the epoch. Per load and method, over the
(epoch, workload) pairs:

* ``peak/cap p50, p90``: quantiles of (the highest ``window_s`` rate that came in
  the epoch / the capacity forecast, ``raw_rates_rps``): above 1, the plan sized
  for the forecast alone was short;
* ``cap/mean``: mean over-provisioning, capacity forecast / mean rate that came;
* ``need``: the capacity a method needs relative to the load carried once given the
  headroom that covers 90 % of the epochs' peaks (per workload: the 0.9 quantile of
  peak/cap times the mean of cap/mean, ``capacity_score``; then the mean over
  workloads): the error quantile a method leaves, the measure ``auto`` picks by;
* ``MAPE``: mean absolute percentage error of the mean forecast
  (``expected_rates_rps``) against the mean rate that came.

Then how often ``auto`` picked each method, and per load the method with the least
``need`` and whether ``auto`` is within 5 % of it.

Loads (fleet-16, instances/evaluate/fleet16-azure.yaml, ``loads()`` of
benchmarks/online.py): ``conversation`` (the Azure LLM inference trace 2023),
``bursty`` (synthetic Markov-modulated Poisson) and ``diurnal+spikes`` (synthetic;
its day shortened to ``--period`` so several fit, and ``seasonal`` given that
season). Forecast: 30-s windows, history one epoch (``holt``/``seasonal``: all of
the past), ``quantile`` 0.9.

    python benchmarks/forecasting.py                      # 3600 s, epochs 300 s and 60 s
    python benchmarks/forecasting.py --duration 1800 --epochs 300
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from energyopt.catalog import load_problem
from energyopt.families.serving.loop import build_arrivals, resolve_relative
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.forecast import (
    AUTO_MIN_EPOCHS,
    auto_choice,
    capacity_need,
    expected_rates_rps,
    raw_rates_rps,
)
from energyopt.spec.evaluation import DiurnalLoad, Evaluation, Forecast, load_evaluation
from online import loads

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "instances" / "evaluate" / "fleet16-azure.yaml"
METHODS = ("last", "peak", "trend", "holt", "seasonal", "quantile", "auto")
NEED_QUANTILE = 0.9
WITHIN = 0.05


def with_period(name: str, ev: Evaluation, period_s: float) -> Evaluation:
    """The diurnal load with a day of ``period_s`` seconds; other loads unchanged."""
    if isinstance(ev.load, DiurnalLoad):
        return ev.model_copy(update={"load": ev.load.model_copy(update={"period_s": period_s})})
    return ev


def compare(
    arrivals: Arrivals, duration_s: float, epoch_s: float, base: Forecast, season_s: float | None
) -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    """Per method the statistics of the module docs, and how often ``auto`` picked
    each method over the (epoch, workload) pairs."""
    starts = np.arange(epoch_s, duration_s - 1e-9, epoch_s)
    k = len(arrivals.names)
    peaks = np.zeros((len(starts), k))
    means = np.zeros((len(starts), k))
    for j, s in enumerate(starts):
        end = min(s + epoch_s, duration_s)
        peaks[j] = arrivals.window_rates_rps(s, end, base.window_s).max(axis=0)
        means[j] = arrivals.count_between(s, end) / (end - s)
    fc = base.model_copy(update={"season_s": season_s})
    warm = AUTO_MIN_EPOCHS  # auto's first pick is at the start of starts[warm]
    stats: dict[str, dict[str, float]] = {}
    for method in METHODS:
        if method == "seasonal" and season_s is None:
            continue
        one = fc.model_copy(update={"method": method})
        cap = np.zeros_like(peaks)
        mean = np.zeros_like(peaks)
        for j, s in enumerate(starts):
            cap[j] = raw_rates_rps(arrivals, s, epoch_s, one, duration_s)
            mean[j] = expected_rates_rps(arrivals, s, epoch_s, one, duration_s)
        use = means > 0
        ratio = peaks[use] / np.maximum(cap[use], 1e-12)
        _, need = capacity_need(peaks, means, cap, NEED_QUANTILE)
        _, late = capacity_need(peaks[warm:], means[warm:], cap[warm:], NEED_QUANTILE)
        stats[method] = {
            "p50": float(np.quantile(ratio, 0.5)),
            "p90": float(np.quantile(ratio, 0.9)),
            "over": float(np.mean(cap[use] / means[use])),
            "need": float(np.mean(need)),
            "late": float(np.mean(late)),
            "mape": float(np.mean(np.abs(mean[use] - means[use]) / means[use])),
        }
    picks: dict[str, int] = {}
    for s in starts:
        names, pick = auto_choice(arrivals, float(s), epoch_s, fc)
        for i in pick:
            picks[names[int(i)]] = picks.get(names[int(i)], 0) + 1
    return stats, picks


def main(argv: list[str] | None = None) -> int:
    """Print the tables and the verdict line per load and epoch length."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=3600.0, help="length of each load, s")
    ap.add_argument(
        "--epochs", type=float, nargs="+", default=[300.0, 60.0], help="epoch lengths, s"
    )
    ap.add_argument("--period", type=float, default=900.0, help="diurnal day and season, s")
    args = ap.parse_args(argv)
    base = load_evaluation(SPEC)
    t0 = time.perf_counter()
    built: list[tuple[str, Arrivals, float | None]] = []
    for name, ev in loads(base, args.duration):
        ev = with_period(name, ev, args.period)
        problem = load_problem(resolve_relative(SPEC, ev.base))
        season = args.period if isinstance(ev.load, DiurnalLoad) else None
        built.append((name, build_arrivals(ev, problem, SPEC), season))
    fc = base.forecast
    print(
        f"forecasts on fleet-16, {args.duration:g} s per load, {fc.window_s:g}-s windows, "
        f"diurnal day and season {args.period:g} s; epochs after the first"
    )
    verdicts: list[str] = []
    for epoch in args.epochs:
        for name, arrivals, season in built:
            stats, picks = compare(arrivals, args.duration, epoch, fc, season)
            print(f"\n{name}, epoch {epoch:g} s")
            head = (
                f"{'peak/cap p50':>13}{'p90':>7}{'cap/mean':>10}{'need':>7}"
                f"{'after warm-up':>14}{'MAPE':>7}"
            )
            print(f"{'method':<10}{head}")
            for method, st in stats.items():
                print(
                    f"{method:<10}{st['p50']:>13.2f}{st['p90']:>7.2f}{st['over']:>10.2f}"
                    f"{st['need']:>7.3f}{st['late']:>14.3f}{100 * st['mape']:>6.1f}%"
                )
            total = sum(picks.values())
            shares = ", ".join(f"{m} {100 * c / total:.0f} %" for m, c in sorted(picks.items()))
            print(f"auto picked: {shares}")
            fixed = {m: st for m, st in stats.items() if m not in ("auto", "oracle")}
            best = min(fixed, key=lambda m: fixed[m]["need"])
            gap = stats["auto"]["need"] / fixed[best]["need"] - 1.0
            late = min(fixed, key=lambda m: fixed[m]["late"])
            late_gap = stats["auto"]["late"] / fixed[late]["late"] - 1.0
            verdicts.append(
                f"{name}, epoch {epoch:g} s: least need {best} ({fixed[best]['need']:.3f}); "
                f"auto {stats['auto']['need']:.3f} ({100 * gap:+.1f} %), "
                + ("within" if gap <= WITHIN else "NOT within")
                + f" {100 * WITHIN:.0f} %; after warm-up {late} "
                f"({fixed[late]['late']:.3f}), auto {stats['auto']['late']:.3f} "
                f"({100 * late_gap:+.1f} %)"
            )
    print()
    for line in verdicts:
        print(line)
    print(f"\n{time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
