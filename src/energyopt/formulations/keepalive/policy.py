"""Keep-alive policies for one function between its requests, and the tepid-aware
policy compiled into a lookup table keyed by the function's idle time so far.

After a function's container goes idle, a policy says which state it holds for
how long: a list of phases (state, seconds) whose last phase lasts until the next
request. Times are s, energies J, powers W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from energyopt.spec.keepalive import Function

Phase = tuple[Literal["warm", "tepid", "cold"], float]

BIN_S = 60.0
"""Width of the idle-time histogram bins, s (Shahrad et al.: one minute)."""
RANGE_BINS = 240
"""Bins of the idle-time histogram (four hours, as Shahrad et al.)."""
FIXED_KEEP_ALIVE_S = 600.0
"""The common default keep-alive: 10 minutes warm, then evicted."""
MIN_SAMPLES = 10
"""Idle times a histogram needs before a histogram policy trusts it."""


@dataclass
class IdleHistogram:
    """A function's idle times so far, in ``BIN_S`` bins over ``RANGE_BINS`` bins
    (longer idle times are counted as out of range)."""

    counts: NDArray[np.int64]
    sums_s: NDArray[np.float64]
    """Sum of the idle times in each bin, s (their mean prices a bin's idle time)."""
    out_of_range: int = 0

    @staticmethod
    def empty() -> IdleHistogram:
        return IdleHistogram(np.zeros(RANGE_BINS, dtype=np.int64), np.zeros(RANGE_BINS))

    def add(self, idle_s: float) -> None:
        b = int(idle_s // BIN_S)
        if b >= RANGE_BINS:
            self.out_of_range += 1
        else:
            self.counts[b] += 1
            self.sums_s[b] += idle_s

    def bin_means_s(self) -> NDArray[np.float64]:
        """Mean idle time in each bin, s (the bin's centre where it is empty)."""
        centre = (np.arange(RANGE_BINS) + 0.5) * BIN_S
        filled = self.counts > 0
        mean = np.divide(self.sums_s, np.maximum(self.counts, 1))
        return np.asarray(np.where(filled, mean, centre), dtype=np.float64)

    @property
    def samples(self) -> int:
        return int(self.counts.sum()) + self.out_of_range

    def percentile_s(self, q: float) -> float:
        """The idle time at percentile ``q`` (0..100) of the in-range samples, s
        (the upper edge of its bin)."""
        total = int(self.counts.sum())
        if total == 0:
            return 0.0
        cum = np.cumsum(self.counts)
        b = int(np.searchsorted(cum, q / 100.0 * total))
        return float(min(b + 1, RANGE_BINS) * BIN_S)


def fixed(keep_alive_s: float = FIXED_KEEP_ALIVE_S) -> list[Phase]:
    """Warm for ``keep_alive_s``, then evicted."""
    return [("warm", keep_alive_s), ("cold", math.inf)]


def always_warm() -> list[Phase]:
    return [("warm", math.inf)]


def always_cold() -> list[Phase]:
    return [("cold", math.inf)]


def hybrid_histogram(h: IdleHistogram) -> list[Phase]:
    """Shahrad et al. (ATC'20) hybrid histogram policy, as osukhoroslov/dslab
    implements it: unload, pre-warm at the 5th percentile x 0.9, keep alive until
    the 99th percentile x 1.1; with too few samples, a flat histogram (CV < 2) or
    half the idle times out of range, a fixed keep-alive of the whole range (the
    ARIMA branch for out-of-range idle times is not modelled)."""
    whole = RANGE_BINS * BIN_S
    if h.samples < MIN_SAMPLES or h.out_of_range * 2 >= h.samples:
        return fixed(whole)
    counts = h.counts.astype(np.float64)
    cv = float(counts.std() / counts.mean()) if counts.mean() > 0 else 0.0
    if cv < 2.0:
        return fixed(whole)
    prewarm = h.percentile_s(5) * 0.9
    keep = h.percentile_s(99) * 1.1
    if prewarm < BIN_S:
        return [("warm", keep), ("cold", math.inf)]
    return [("cold", prewarm), ("warm", max(0.0, keep - prewarm)), ("cold", math.inf)]


@dataclass(frozen=True)
class TepidTable:
    """A function's compiled policy: the state to hold at each idle time so far,
    by ``BIN_S`` bins (the last entry holds beyond), and the histogram percentiles
    its thresholds fall at."""

    states: tuple[Literal["warm", "tepid", "cold"], ...]
    warm_until_s: float
    tepid_until_s: float
    warm_percentile: float
    tepid_percentile: float

    def phases(self) -> list[Phase]:
        out: list[Phase] = []
        if self.warm_until_s > 0:
            out.append(("warm", self.warm_until_s))
        if self.tepid_until_s > self.warm_until_s:
            out.append(("tepid", self.tepid_until_s - self.warm_until_s))
        out.append(("cold", math.inf))
        return out

    def lookup(self, idle_s: float) -> Literal["warm", "tepid", "cold"]:
        """The state at ``idle_s`` of idle time (one array index)."""
        return self.states[min(int(idle_s // BIN_S), len(self.states) - 1)]


def compile_tepid(
    fn: Function,
    h: IdleHistogram,
    late_limit_s: float,
    late_share: float,
    cold_share: float,
) -> TepidTable:
    """The (warm-until, tepid-until) thresholds on the bin grid with the least
    expected energy per idle period under the idle times seen so far (each bin's
    idle times at their mean, those out of range at twice the range), such that at
    most ``late_share`` of the next requests start later than ``late_limit_s`` and
    at most ``cold_share`` start cold; warm for the whole range while the histogram
    has too few samples."""
    whole = RANGE_BINS * BIN_S
    if h.samples < MIN_SAMPLES:
        return _table(whole, whole, h)
    seen = np.flatnonzero(h.counts)
    top = min(RANGE_BINS, int(seen[-1]) + 2) if len(seen) else 1
    edges = np.concatenate([np.arange(top + 1) * BIN_S, [whole]])
    idle = h.bin_means_s()
    weight = np.concatenate([h.counts, [h.out_of_range]]).astype(np.float64)
    idle = np.concatenate([idle, [2 * whole]])
    weight /= weight.sum()
    tep = fn.tepid
    warm_w = fn.warm.power_w
    load_j, load_s = fn.cold_start.energy_j, fn.cold_start.time_s
    best: tuple[float, float, float] | None = None
    for i, w_until in enumerate(edges):
        tepid_choices = edges[i:] if tep is not None else edges[i : i + 1]
        for t_until in tepid_choices:
            warm_part = warm_w * np.minimum(idle, w_until)
            in_tepid = (idle >= w_until) & (idle < t_until)
            is_cold = idle >= t_until
            energy = warm_part
            late = np.zeros_like(idle, dtype=bool)
            if tep is not None and t_until > w_until:
                gone = idle >= w_until
                energy = energy + gone * (
                    tep.enter_j + tep.power_w * (np.minimum(idle, t_until) - w_until)
                )
                energy = energy + in_tepid * tep.resume_j
                late |= in_tepid & (tep.resume_s > late_limit_s)
            energy = energy + is_cold * load_j
            late |= is_cold & (load_s > late_limit_s)
            if float(weight @ late) > late_share + 1e-12:
                continue
            if float(weight @ is_cold) > cold_share + 1e-12:
                continue
            expected = float(weight @ energy)
            if best is None or expected < best[0] - 1e-9:
                best = (expected, float(w_until), float(t_until))
    if best is None:
        return _table(whole, whole, h)
    return _table(best[1], best[2], h)


def _table(warm_until: float, tepid_until: float, h: IdleHistogram) -> TepidTable:
    n = RANGE_BINS + 1
    grid = np.arange(n) * BIN_S
    states: tuple[Literal["warm", "tepid", "cold"], ...] = tuple(
        "warm" if g < warm_until else ("tepid" if g < tepid_until else "cold") for g in grid
    )
    total = max(1, h.samples)
    cum = np.concatenate([[0], np.cumsum(h.counts)])
    wb = min(int(warm_until // BIN_S), RANGE_BINS)
    tb = min(int(tepid_until // BIN_S), RANGE_BINS)
    return TepidTable(
        states,
        warm_until,
        tepid_until,
        100.0 * float(cum[wb]) / total,
        100.0 * float(cum[tb]) / total,
    )
