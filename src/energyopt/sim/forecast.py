"""Load forecasts for the next epoch, from the arrivals seen so far.

``last``: mean rate over the history; ``peak``: the highest rate of any
``window_s`` window of the history; ``trend``: the larger of ``peak`` and the
least-squares line through the history's window rates extrapolated to the end
of the coming epoch (a rising load is met before it arrives); ``holt``:
exponential smoothing with a damped additive trend (Gardner-McKenzie) of the
history's window rates; ``seasonal``: Holt-Winters, additive, with a season of
``season_s``; ``quantile``: the ``quantile`` of the history's window rates;
``auto``: per workload, the method whose one-epoch-ahead capacity forecasts of
the past needed the least capacity to cover the ``error_quantile`` of the
epochs' peaks, scaled to cover that share (docs/forecasting.md); ``oracle``: the
highest window rate of the coming epoch and ``lookahead_s`` beyond it (it looks
ahead: a reference, not a deployable rule). The result is
multiplied by ``headroom``, floored at ``floor`` x the base rate and rounded up to
a multiple of ``quantum`` x the base rate. At time 0 there is no history: the
first ``history`` seconds of the load stand in for the traffic that preceded it.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
from numpy.typing import NDArray

from energyopt.sim.arrivals import Arrivals, FloatArray
from energyopt.spec.evaluation import Forecast


def _looked_at(
    now_s: float, epoch_s: float, fc: Forecast, horizon_s: float, lead_s: float = 0.0
) -> tuple[float, float]:
    """The interval of arrivals (s) a forecast at ``now_s`` reads: the coming epoch
    (from ``lead_s`` after now) for ``oracle`` (and its ``lookahead_s`` beyond); else
    the history before now (at time 0, the first one ahead)."""
    history = fc.history_s or epoch_s
    if fc.method == "oracle":
        start = min(now_s + lead_s, horizon_s)
        return start, min(start + epoch_s + fc.lookahead_s, horizon_s)
    if now_s <= 0:
        return 0.0, min(history, horizon_s)
    return max(0.0, now_s - history), now_s


_SMOOTHED = ("holt", "seasonal")
"""Methods that forecast by exponential smoothing of the window rates."""

_ALPHAS = (0.1, 0.2, 0.35, 0.5, 0.7, 0.9)
_BETAS = (0.0, 0.05, 0.15, 0.3)
_PHIS = (0.8, 0.9, 0.98)
_GAMMAS = (0.05, 0.15, 0.4)
"""Smoothing parameters tried (level, trend, damping, season); per workload the
combination with the least squared one-step error over the history is used."""


def _grid(seasonal: bool) -> FloatArray:
    """Parameter combinations, shape (combinations, 4): alpha, beta, phi, gamma."""
    gammas = _GAMMAS if seasonal else (0.0,)
    mesh = np.meshgrid(_ALPHAS, _BETAS, _PHIS, gammas, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=1)


def smoothed_forecast(
    rates: FloatArray, steps: int, season: int = 0
) -> tuple[FloatArray, FloatArray]:
    """Exponential smoothing of a series of window rates (req/s), shape (windows,
    workloads): the forecasts of the next ``steps`` windows, shape (steps,
    workloads), and the one-step-ahead in-sample errors (observed - forecast,
    req/s), shape (windows, workloads), NaN where the start-up has none.

    ``season`` < 2: Holt's linear method with a damped additive trend
    (Gardner-McKenzie): level ``l``, trend ``b``, damping ``phi``; the forecast h
    windows ahead is ``l + (phi + ... + phi^h) b``. ``season`` >= 2 windows:
    Holt-Winters, additive, with that many windows per season, started from the
    first season (level its mean, seasonal terms its deviations, trend 0); with
    less than one season of history it falls back to Holt. Per workload the
    parameters (alpha, beta, phi and gamma for the season) are the combination of
    a fixed grid with the least sum of squared one-step errors."""
    y = np.asarray(rates, dtype=np.float64)
    if y.ndim != 2:
        raise ValueError(f"rates must be (windows, workloads), got shape {y.shape}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    n, k = y.shape
    if n == 0:
        return np.zeros((steps, k)), np.zeros((0, k))
    m = season if season >= 2 and n >= season else 0
    grid = _grid(m > 0)
    alpha, beta, phi, gamma = (grid[:, i : i + 1] for i in range(4))
    combos = grid.shape[0]
    if m:
        first = m
        level = np.tile(y[:m].mean(axis=0), (combos, 1))
        seas = np.tile((y[:m] - y[:m].mean(axis=0))[None], (combos, 1, 1))
    else:
        first = 1
        level = np.tile(y[0], (combos, 1))
        seas = np.zeros((combos, 1, k))
    trend = np.zeros((combos, k))
    fit = np.full((combos, n, k), np.nan)
    for t in range(first, n):
        s_old = seas[:, t % m] if m else 0.0
        fit[:, t] = level + phi * trend + s_old
        new_level = alpha * (y[t] - s_old) + (1 - alpha) * (level + phi * trend)
        trend = beta * (new_level - level) + (1 - beta) * phi * trend
        if m:
            seas[:, t % m] = gamma * (y[t] - new_level) + (1 - gamma) * s_old
        level = new_level
    err = y[None] - fit
    best = np.argmin(np.nansum(err**2, axis=1), axis=0) if n > first else np.zeros(k, int)
    cols = np.arange(k)
    h = np.arange(1, steps + 1)
    damp = np.cumsum(phi ** h[None, :], axis=1)  # (combos, steps)
    out = level[best, cols][None, :] + damp[best].T * trend[best, cols][None, :]
    if m:
        out = out + seas[best, :, cols][:, (n + h - 1) % m].T
    return np.asarray(out), np.asarray(err[best, :, cols].T)


def _smoothing_span(
    now_s: float, epoch_s: float, fc: Forecast, horizon_s: float
) -> tuple[float, float]:
    """The history (s) ``holt`` and ``seasonal`` read: everything before now (the
    last ``history_s`` when given), cut to whole windows that end at now; at time 0
    the first ``history_s`` (one epoch by default) stand in for it."""
    if now_s <= 0:
        start, end = 0.0, min(fc.history_s or epoch_s, horizon_s)
    else:
        start = max(0.0, now_s - fc.history_s) if fc.history_s else 0.0
        end = now_s
    whole = math.floor((end - start) / fc.window_s + 1e-9)
    if whole >= 1:
        start = end - whole * fc.window_s
    return start, end


def _smoothed(
    arrivals: Arrivals,
    now_s: float,
    epoch_s: float,
    fc: Forecast,
    horizon_s: float,
    lead_s: float = 0.0,
) -> tuple[FloatArray, FloatArray]:
    """(capacity, mean) forecasts of ``holt`` / ``seasonal`` per workload (req/s):
    the capacity is the highest forecast window of the coming epoch plus the most a
    window of the last ``history_s`` (one epoch) rose above its one-step forecast;
    the mean is the mean of the coming epoch's forecast windows (never below 0).
    With ``lead_s`` the coming epoch starts that many seconds after now: the
    windows forecast run to its end, the mean is over those that end after its
    start."""
    start, end = _smoothing_span(now_s, epoch_s, fc, horizon_s)
    rates = arrivals.window_rates_rps(start, end, fc.window_s)
    k = len(arrivals.names)
    if rates.shape[0] == 0:
        return np.zeros(k), np.zeros(k)
    span = min(epoch_s + lead_s, horizon_s - now_s) if horizon_s > now_s else epoch_s
    steps = max(1, math.ceil(span / fc.window_s - 1e-9))
    skip = min(steps - 1, math.floor(lead_s / fc.window_s + 1e-9))
    season = 0
    if fc.method == "seasonal" and fc.season_s is not None:
        season = round(fc.season_s / fc.window_s)
    ahead, residual = smoothed_forecast(rates, steps, season)
    ahead = ahead[skip:]
    recent = max(1, round((fc.history_s or epoch_s) / fc.window_s))
    tail = residual[-recent:]
    spread = np.zeros(k)
    seen = ~np.all(np.isnan(tail), axis=0)
    spread[seen] = np.nanmax(tail[:, seen], axis=0)
    capacity = np.maximum(ahead.max(axis=0) + np.maximum(spread, 0.0), 0.0)
    return np.asarray(capacity), np.asarray(np.maximum(ahead.mean(axis=0), 0.0))


def auto_methods(fc: Forecast) -> tuple[str, ...]:
    """The methods ``auto`` chooses among, in order of preference on a tie."""
    seasonal = ("seasonal",) if fc.season_s is not None else ()
    return ("trend", "holt", *seasonal, "quantile", "last")


def capacity_need(
    peaks_rps: FloatArray, means_rps: FloatArray, forecast_rps: FloatArray, quantile: float
) -> tuple[FloatArray, FloatArray]:
    """How capacity forecasts fared, per workload, from per-epoch arrays of shape
    (epochs, workloads): the highest window rate that came, the mean rate that came
    and the capacity forecast (req/s). Returns (``H``, score): ``H`` is the
    ``quantile`` of peak / forecast (the headroom that would have covered that share
    of the epochs' peaks), the score (lower is better) ``H`` x the mean of
    forecast / came mean: the capacity, relative to the load carried, that the
    forecasts need once given that headroom. The score does not change when the
    forecasts are scaled by a constant. Epochs where a workload had no request are
    left out; a workload with none left has ``H`` 1 and score 0 (every method
    ties); forecasts of 0 under a quantile of epochs with requests score inf."""
    peaks = np.asarray(peaks_rps, dtype=np.float64)
    means = np.asarray(means_rps, dtype=np.float64)
    fcst = np.asarray(forecast_rps, dtype=np.float64)
    need = np.ones(peaks.shape[1])
    score = np.zeros(peaks.shape[1])
    for c in range(peaks.shape[1]):
        use = means[:, c] > 0
        if not np.any(use):
            continue
        f = fcst[use, c]
        with np.errstate(divide="ignore"):
            ratio = np.where(f > 0, peaks[use, c] / np.where(f > 0, f, 1.0), np.inf)
        need[c] = float(np.quantile(ratio, quantile, method="higher"))
        finite = math.isfinite(need[c])
        score[c] = need[c] * float(np.mean(f / means[use, c])) if finite else math.inf
    return need, score


AUTO_MIN_EPOCHS = 3
"""Epochs ``auto`` scores before it picks and scales: with fewer, one epoch's
peak / forecast would set the capacity (it uses ``trend`` until then)."""

_MEMO: list[tuple[weakref.ref[Arrivals], dict[tuple[float, float, Forecast], FloatArray]]] = []


def _past_memo(arrivals: Arrivals) -> dict[tuple[float, float, Forecast], FloatArray]:
    """Capacity forecasts ``auto`` already made on ``arrivals``, by (start s, epoch s,
    forecast): a forecast made at a past epoch's start reads only arrivals before it,
    so it is made once per run, not again at every later epoch. One set of arrivals
    is remembered (weakly: the memo never keeps it alive)."""
    if not _MEMO or _MEMO[0][0]() is not arrivals:
        _MEMO[:] = [(weakref.ref(arrivals), {})]
    return _MEMO[0][1]


def auto_scores(
    arrivals: Arrivals, now_s: float, epoch_s: float, fc: Forecast
) -> tuple[tuple[str, ...], FloatArray, FloatArray]:
    """The methods ``auto`` considers, their headroom ``H`` and their scores, each
    of shape (methods, workloads) (``capacity_need``), over the epochs of
    ``epoch_s`` that end at ``now_s``, ``now_s - epoch_s``, ... and begin after
    time 0: each method's capacity forecast made at an epoch's start against the
    rates that came in it. Only arrivals before ``now_s`` are read. Until
    ``AUTO_MIN_EPOCHS`` such epochs have passed every ``H`` is 1 and every score 0
    (so ``auto`` is ``trend``)."""
    methods = auto_methods(fc)
    seen = arrivals.before(now_s)
    starts: list[float] = []
    s = now_s - epoch_s
    while s > 1e-9:
        starts.append(s)
        s -= epoch_s
    k = len(arrivals.names)
    if len(starts) < AUTO_MIN_EPOCHS:
        return methods, np.ones((len(methods), k)), np.zeros((len(methods), k))
    memo = _past_memo(arrivals)
    peaks = np.zeros((len(starts), k))
    means = np.zeros((len(starts), k))
    for j, s in enumerate(starts):
        came = seen.window_rates_rps(s, s + epoch_s, fc.window_s)
        peaks[j] = came.max(axis=0)
        means[j] = seen.count_between(s, s + epoch_s) / epoch_s
    needs = np.ones((len(methods), k))
    scores = np.zeros((len(methods), k))
    for i, method in enumerate(methods):
        one = fc.model_copy(update={"method": method})
        made = np.zeros((len(starts), k))
        for j, s in enumerate(starts):
            key = (s, epoch_s, one)
            if key not in memo:
                # none of the candidates reads arrivals at or after s (s > 0)
                memo[key] = raw_rates_rps(arrivals, s, epoch_s, one, s + epoch_s)
            made[j] = memo[key]
        needs[i], scores[i] = capacity_need(peaks, means, made, fc.error_quantile)
    return methods, needs, scores


def auto_choice(
    arrivals: Arrivals, now_s: float, epoch_s: float, fc: Forecast
) -> tuple[tuple[str, ...], NDArray[np.int64]]:
    """The methods ``auto`` considers and, per workload, the index of the one it
    uses at ``now_s``: the least score of ``auto_scores``, the first of
    ``auto_methods`` on a tie (``trend`` until ``AUTO_MIN_EPOCHS`` are scored)."""
    methods, _, scores = auto_scores(arrivals, now_s, epoch_s, fc)
    return methods, np.asarray(np.argmin(scores, axis=0), dtype=np.int64)


def _auto(
    arrivals: Arrivals,
    now_s: float,
    epoch_s: float,
    fc: Forecast,
    horizon_s: float,
    *,
    capacity: bool,
    lead_s: float = 0.0,
) -> FloatArray:
    """``auto``, per workload, with the method it picks (``auto_choice``): that
    method's capacity forecast times its ``H`` (the quantile of peak / forecast over
    the past epochs, ``auto_scores``), so that whichever method is picked the
    capacity covers the same share of past peaks (``H`` 1 where every method's past
    forecasts were 0 under that share of epochs with requests); or that method's
    mean forecast."""
    methods, needs, scores = auto_scores(arrivals, now_s, epoch_s, fc)
    pick = np.argmin(scores, axis=0)
    out = np.zeros(len(arrivals.names))
    for i, method in enumerate(methods):
        cols = pick == i
        if not np.any(cols):
            continue
        one = fc.model_copy(update={"method": method})
        if capacity:
            scale = np.where(np.isfinite(needs[i]), needs[i], 1.0)
            made = raw_rates_rps(arrivals, now_s, epoch_s, one, horizon_s, lead_s) * scale
        else:
            made = expected_rates_rps(arrivals, now_s, epoch_s, one, horizon_s, lead_s)
        out[cols] = made[cols]
    return out


def raw_rates_rps(
    arrivals: Arrivals,
    now_s: float,
    epoch_s: float,
    fc: Forecast,
    horizon_s: float,
    lead_s: float = 0.0,
) -> FloatArray:
    """Forecast rate per workload (req/s) before headroom and rounding: the capacity
    a plan for the coming epoch is sized for (module docs; docs/forecasting.md).
    ``lead_s``: the epoch the plan serves starts that many seconds after now (a plan
    made ahead of its epoch, ``Evaluation.plan_ahead``): ``trend`` extrapolates to
    its end, ``now + lead_s + epoch_s``; ``oracle`` reads it; the smoothed methods
    forecast its windows; ``last``, ``peak`` and ``quantile`` do not look ahead."""
    if fc.method == "auto":
        return _auto(arrivals, now_s, epoch_s, fc, horizon_s, capacity=True, lead_s=lead_s)
    if fc.method in _SMOOTHED:
        return _smoothed(arrivals, now_s, epoch_s, fc, horizon_s, lead_s)[0]
    start, end = _looked_at(now_s, epoch_s, fc, horizon_s, lead_s)
    if fc.method == "quantile":
        rates = arrivals.window_rates_rps(start, end, fc.window_s)
        if rates.shape[0] == 0:
            return np.zeros(len(arrivals.names))
        return np.asarray(np.quantile(rates, fc.quantile, axis=0))
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
    ahead = intercept + slope * (max(now_s, end) + lead_s + epoch_s)
    return np.asarray(np.maximum(peak, ahead))


def expected_rates_rps(
    arrivals: Arrivals,
    now_s: float,
    epoch_s: float,
    fc: Forecast,
    horizon_s: float,
    lead_s: float = 0.0,
) -> FloatArray:
    """Mean rate per workload (req/s) the coming epoch is expected to carry, from the
    history ``raw_rates_rps`` reads: its mean, or for ``trend`` its linear fit at the
    middle of the coming epoch (never below 0). ``raw_rates_rps`` is a capacity
    forecast (the history's peak, or the trend at the epoch's end if above it) that,
    with headroom, sizes a plan; a plan's expected draw is priced at this rate.
    ``holt`` and ``seasonal``: the mean of their forecasts of the coming epoch's
    windows; ``quantile``: the history's mean (as ``last``); ``auto``: the mean
    forecast of the method it picks for the workload. ``lead_s``: as for
    ``raw_rates_rps`` (``trend``'s middle is ``now + lead_s + epoch_s / 2``)."""
    if fc.method == "auto":
        return _auto(arrivals, now_s, epoch_s, fc, horizon_s, capacity=False, lead_s=lead_s)
    if fc.method in _SMOOTHED:
        return _smoothed(arrivals, now_s, epoch_s, fc, horizon_s, lead_s)[1]
    start, end = _looked_at(now_s, epoch_s, fc, horizon_s, lead_s)
    mean = arrivals.count_between(start, end).astype(np.float64) / max(end - start, 1e-9)
    if fc.method != "trend":
        return np.asarray(mean)
    rates = arrivals.window_rates_rps(start, end, fc.window_s)
    if rates.shape[0] < 2:
        return np.asarray(mean)
    centers = start + (np.arange(rates.shape[0]) + 0.5) * fc.window_s
    slope, intercept = np.polyfit(centers, rates, 1)
    begin = max(now_s, end) + lead_s
    middle = begin + 0.5 * min(epoch_s, max(horizon_s - begin, 0.0))
    return np.asarray(np.maximum(intercept + slope * middle, 0.0))


def burst_peak_rps(
    arrivals: Arrivals,
    now_s: float,
    epoch_s: float,
    fc: Forecast,
    horizon_s: float,
    window_s: float,
    quantile: float,
) -> FloatArray:
    """Per workload, the ``quantile`` of its rate (req/s) over the complete
    ``window_s``-second windows of the history a forecast at ``now_s`` reads (the
    first epoch at time 0): the burst peak a plan's capacity must reach, on a time
    scale shorter than the forecast's ``window_s``. Zeros when the history holds no
    complete window."""
    if window_s <= 0:
        raise ValueError(f"window_s {window_s} is not > 0")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile {quantile} is not in [0, 1]")
    start, end = _looked_at(now_s, epoch_s, fc, horizon_s)
    full = math.floor((end - start) / window_s + 1e-9)
    rates = arrivals.window_rates_rps(start, end, window_s)[:full]
    if rates.shape[0] == 0:
        return np.zeros(len(arrivals.names))
    return np.asarray(np.quantile(rates, quantile, axis=0))


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
