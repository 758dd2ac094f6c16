"""Synthetic loads: Poisson arrivals with a diurnal or a bursty rate.

Each workload's rate is its base rate times a fleet-wide multiplier m(t):

* diurnal: ``m(t) = load_scale (1 + a sin(2 pi t / period - pi / 2))`` (starts at
  the trough, peaks at half a period), times ``factor`` inside each spike;
* bursty: a two-state Markov process (exponential burst and gap lengths, means
  ``burst_s`` and ``gap_s``); inside a burst the rate is ``burst_factor`` times the
  rate outside, normalised so the long-run mean multiplier is ``load_scale``.

Arrivals come from thinning a Poisson process at the peak rate. Token counts are
log-normal with the workload's mean, ``sigma`` = ``token_sigma`` (0: every request
has the mean), rounded, at least 1 and at most the workload's ``max``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from energyopt.sim.arrivals import Arrivals, FloatArray, IntArray, merge
from energyopt.spec.evaluation import BurstyLoad, DiurnalLoad
from energyopt.spec.workload import TokenDist, Workload

Multiplier = Callable[[FloatArray], FloatArray]


def token_counts(dist: TokenDist, sigma: float, n: int, rng: np.random.Generator) -> IntArray:
    """``n`` token counts, log-normal with the distribution's mean (see module docs)."""
    if sigma <= 0:
        values = np.full(n, dist.mean)
    else:
        values = dist.mean * np.exp(sigma * rng.standard_normal(n) - 0.5 * sigma**2)
    top = float(dist.max) if dist.max is not None else np.inf
    return np.asarray(np.clip(np.rint(values), 1, top), dtype=np.int64)


def poisson_arrivals(
    workloads: tuple[Workload, ...],
    multiplier: Multiplier,
    peak_multiplier: float,
    duration_s: float,
    token_sigma: float,
    rng: np.random.Generator,
) -> Arrivals:
    """Non-homogeneous Poisson arrivals per workload at ``rate_rps x multiplier(t)``."""
    parts: list[tuple[FloatArray, IntArray, IntArray, IntArray]] = []
    for k, w in enumerate(workloads):
        peak = w.rate_rps * peak_multiplier
        n = rng.poisson(peak * duration_s)
        t = np.sort(rng.random(n) * duration_s)
        keep = rng.random(n) * peak_multiplier < multiplier(t)
        t = t[keep]
        m = t.shape[0]
        parts.append(
            (
                t,
                np.full(m, k, dtype=np.int64),
                token_counts(w.prompt_tokens, token_sigma, m, rng),
                token_counts(w.output_tokens, token_sigma, m, rng),
            )
        )
    return merge(parts, tuple(w.name for w in workloads))


def diurnal_multiplier(load: DiurnalLoad, duration_s: float) -> tuple[Multiplier, float]:
    """m(t) and its maximum."""
    period = load.period_s or duration_s

    def m(t: FloatArray) -> FloatArray:
        wave = np.sin(2.0 * np.pi * t / period - 0.5 * np.pi)
        out = load.load_scale * (1.0 + load.amplitude * wave)
        for spike in load.spikes:
            inside = (t >= spike.at_s) & (t < spike.at_s + spike.duration_s)
            out = np.where(inside, out * spike.factor, out)
        return np.asarray(out)

    top = 1.0  # the largest product of spike factors at any time (changes at starts)
    for a in load.spikes:
        product = 1.0
        for b in load.spikes:
            if b.at_s <= a.at_s < b.at_s + b.duration_s:
                product *= b.factor
        top = max(top, product)
    return m, load.load_scale * (1.0 + load.amplitude) * max(top, 1.0)


def bursty_multiplier(
    load: BurstyLoad, duration_s: float, rng: np.random.Generator
) -> tuple[Multiplier, float]:
    """m(t) (piecewise constant over sampled bursts) and its maximum."""
    burst_share = load.burst_s / (load.burst_s + load.gap_s)
    outside = load.load_scale / (1.0 + (load.burst_factor - 1.0) * burst_share)
    inside = outside * load.burst_factor
    starts: list[float] = []
    ends: list[float] = []
    t = float(rng.exponential(load.gap_s))
    while t < duration_s:
        length = float(rng.exponential(load.burst_s))
        starts.append(t)
        ends.append(t + length)
        t += length + float(rng.exponential(load.gap_s))
    s = np.asarray(starts)
    e = np.asarray(ends)

    def m(times: FloatArray) -> FloatArray:
        if s.size == 0:
            return np.full(times.shape, outside)
        idx = np.searchsorted(s, times, side="right") - 1
        in_burst = (idx >= 0) & (times < e[np.clip(idx, 0, None)])
        return np.where(in_burst, inside, outside)

    return m, inside


def synthetic_arrivals(
    load: DiurnalLoad | BurstyLoad,
    workloads: tuple[Workload, ...],
    duration_s: float,
    seed: int,
) -> Arrivals:
    """Arrivals of a synthetic load over [0, duration_s)."""
    rng = np.random.default_rng(seed)
    if isinstance(load, DiurnalLoad):
        m, top = diurnal_multiplier(load, duration_s)
    else:
        m, top = bursty_multiplier(load, duration_s, rng)
    return poisson_arrivals(workloads, m, top, duration_s, load.token_sigma, rng)
