"""Load forecasts for the next epoch, from the arrivals seen so far.

``last``: mean rate over the history; ``peak``: the highest rate of any
``window_s`` window of the history; ``trend``: the larger of ``peak`` and the
least-squares line through the history's window rates extrapolated to the end
of the coming epoch (a rising load is met before it arrives); ``oracle``: the
highest window rate of the coming epoch (it looks ahead: a reference, not a
deployable rule). The result is
multiplied by ``headroom``, floored at ``floor`` x the base rate and rounded up to
a multiple of ``quantum`` x the base rate. At time 0 there is no history: the
first ``history`` seconds of the load stand in for the traffic that preceded it.
"""

from __future__ import annotations

import math

import numpy as np

from energyopt.sim.arrivals import Arrivals, FloatArray
from energyopt.spec.evaluation import Forecast


def _looked_at(
    now_s: float, epoch_s: float, fc: Forecast, horizon_s: float
) -> tuple[float, float]:
    """The interval of arrivals (s) a forecast at ``now_s`` reads: the coming epoch
    for ``oracle``; else the history before now (at time 0, the first one ahead)."""
    history = fc.history_s or epoch_s
    if fc.method == "oracle":
        return now_s, min(now_s + epoch_s, horizon_s)
    if now_s <= 0:
        return 0.0, min(history, horizon_s)
    return max(0.0, now_s - history), now_s


def raw_rates_rps(
    arrivals: Arrivals, now_s: float, epoch_s: float, fc: Forecast, horizon_s: float
) -> FloatArray:
    """Forecast rate per workload (req/s) before headroom and rounding."""
    start, end = _looked_at(now_s, epoch_s, fc, horizon_s)
    if fc.method == "last":
        counts = arrivals.count_between(start, end).astype(np.float64)
        return counts / max(end - start, 1e-9)
    rates = arrivals.window_rates_rps(start, end, fc.window_s)
    if rates.shape[0] == 0:
        return np.zeros(len(arrivals.names))
    peak = np.asarray(rates.max(axis=0))
    if fc.method != "trend" or rates.shape[0] < 2:
        return peak
    centers = start + (np.arange(rates.shape[0]) + 0.5) * fc.window_s
    slope, intercept = np.polyfit(centers, rates, 1)
    ahead = intercept + slope * (max(now_s, end) + epoch_s)
    return np.asarray(np.maximum(peak, ahead))


def expected_rates_rps(
    arrivals: Arrivals, now_s: float, epoch_s: float, fc: Forecast, horizon_s: float
) -> FloatArray:
    """Mean rate per workload (req/s) the coming epoch is expected to carry, from the
    history ``raw_rates_rps`` reads: its mean, or for ``trend`` its linear fit at the
    middle of the coming epoch (never below 0). ``raw_rates_rps`` is a capacity
    forecast (the history's peak, or the trend at the epoch's end if above it) that,
    with headroom, sizes a plan; a plan's expected draw is priced at this rate."""
    start, end = _looked_at(now_s, epoch_s, fc, horizon_s)
    mean = arrivals.count_between(start, end).astype(np.float64) / max(end - start, 1e-9)
    if fc.method != "trend":
        return np.asarray(mean)
    rates = arrivals.window_rates_rps(start, end, fc.window_s)
    if rates.shape[0] < 2:
        return np.asarray(mean)
    centers = start + (np.arange(rates.shape[0]) + 0.5) * fc.window_s
    slope, intercept = np.polyfit(centers, rates, 1)
    middle = max(now_s, end) + 0.5 * min(epoch_s, max(horizon_s - max(now_s, end), 0.0))
    return np.asarray(np.maximum(intercept + slope * middle, 0.0))


def planned_rates_rps(raw: FloatArray, base_rps: FloatArray, fc: Forecast) -> FloatArray:
    """Headroom, floor and rounding up to the quantum (see module docs)."""
    scaled = np.maximum(raw * fc.headroom, fc.floor * base_rps)
    steps = np.ceil(scaled / (fc.quantum * base_rps) - 1e-9)
    return np.asarray(steps * fc.quantum * base_rps)


def peak_rates_rps(arrivals: Arrivals, horizon_s: float, fc: Forecast) -> FloatArray:
    """Highest window rate of each workload over the whole load (sizing for peak)."""
    rates = arrivals.window_rates_rps(0.0, horizon_s, fc.window_s)
    if rates.shape[0] == 0:
        return np.zeros(len(arrivals.names))
    return np.asarray(rates.max(axis=0))


def epochs(horizon_s: float, epoch_s: float) -> int:
    """Number of planning epochs in the window."""
    return max(1, math.ceil(horizon_s / epoch_s - 1e-9))
