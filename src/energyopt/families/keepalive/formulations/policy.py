"""Keep-alive policies for one function between its requests, and the tepid-aware
policy compiled into a lookup table keyed by the function's idle time so far.

After a function's container goes idle, a policy says which state it holds for
how long: a list of phases (state, seconds) whose last phase lasts until the next
request. Times are s, energies J, powers W.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from energyopt.families.keepalive.spec import Function

Phase = tuple[Literal["warm", "tepid", "cold"], float]

BIN_S = 60.0
"""Width of the idle-time histogram bins, s (Shahrad et al.: one minute)."""
RANGE_BINS = 240
"""Bins of the idle-time histogram (four hours, as Shahrad et al.)."""
FIXED_KEEP_ALIVE_S = 600.0
"""The common default keep-alive: 10 minutes warm, then evicted."""
MIN_SAMPLES = 10
"""Idle times a histogram needs before a histogram policy trusts it."""
TABLE_FINE_S = 1.0
"""Width of the tepid table's bins below ``TABLE_FINE_UNTIL_S``, s: on a busy
function idle times are seconds, and a pause pays back within tens of seconds."""
TABLE_FINE_UNTIL_S = 60.0
"""Where the tepid table's bins widen to ``BIN_S``, s."""
TABLE_EDGES_S: NDArray[np.float64] = np.concatenate(
    [
        np.arange(0.0, TABLE_FINE_UNTIL_S, TABLE_FINE_S),
        np.arange(TABLE_FINE_UNTIL_S, RANGE_BINS * BIN_S + BIN_S / 2, BIN_S),
    ]
)
"""Edges of the tepid table's idle-time bins, s: 1-s bins to one minute, then
``BIN_S`` bins to the histogram's range (four hours); bin i is
[edges[i], edges[i + 1]). Its thresholds lie on these edges."""
TABLE_BINS = len(TABLE_EDGES_S) - 1
"""Bins of the tepid table's grid (299)."""


@dataclass
class IdleHistogram:
    """A function's idle times so far, in ``BIN_S`` bins over ``RANGE_BINS`` bins
    (longer idle times are counted as out of range; the hybrid policy's grid), in
    the tepid table's bins on ``TABLE_EDGES_S`` (same range), and in order."""

    counts: NDArray[np.int64]
    sums_s: NDArray[np.float64]
    """Sum of the idle times in each bin, s (their mean prices a bin's idle time)."""
    out_of_range: int = 0
    history_s: list[float] = field(default_factory=list)
    """Every idle time in the order seen, s (the hybrid policy's ARIMA branch)."""
    table_counts: NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(TABLE_BINS, dtype=np.int64)
    )
    """Idle times in each bin of ``TABLE_EDGES_S``."""
    table_sums_s: NDArray[np.float64] = field(default_factory=lambda: np.zeros(TABLE_BINS))
    """Sum of the idle times in each bin of ``TABLE_EDGES_S``, s."""

    @staticmethod
    def empty() -> IdleHistogram:
        return IdleHistogram(np.zeros(RANGE_BINS, dtype=np.int64), np.zeros(RANGE_BINS))

    def add(self, idle_s: float) -> None:
        """Count one idle time, s (>= 0)."""
        if not idle_s >= 0:
            raise ValueError(f"idle_s: an idle time must be >= 0 s, got {idle_s}")
        self.history_s.append(idle_s)
        b = int(idle_s // BIN_S)
        if b >= RANGE_BINS:
            self.out_of_range += 1
        else:
            self.counts[b] += 1
            self.sums_s[b] += idle_s
            t = int(np.searchsorted(TABLE_EDGES_S, idle_s, side="right")) - 1
            self.table_counts[t] += 1
            self.table_sums_s[t] += idle_s

    def table_bin_means_s(self) -> NDArray[np.float64]:
        """Mean idle time in each bin of ``TABLE_EDGES_S``, s (the bin's centre
        where it is empty)."""
        centre = (TABLE_EDGES_S[:-1] + TABLE_EDGES_S[1:]) / 2
        mean = np.divide(self.table_sums_s, np.maximum(self.table_counts, 1))
        return np.asarray(np.where(self.table_counts > 0, mean, centre), dtype=np.float64)

    def bin_means_s(self) -> NDArray[np.float64]:
        """Mean idle time in each bin, s (the bin's centre where it is empty)."""
        centre = (np.arange(RANGE_BINS) + 0.5) * BIN_S
        filled = self.counts > 0
        mean = np.divide(self.sums_s, np.maximum(self.counts, 1))
        return np.asarray(np.where(filled, mean, centre), dtype=np.float64)

    @property
    def samples(self) -> int:
        return int(self.counts.sum()) + self.out_of_range


def fixed(keep_alive_s: float = FIXED_KEEP_ALIVE_S) -> list[Phase]:
    """Warm for ``keep_alive_s``, then evicted."""
    return [("warm", keep_alive_s), ("cold", math.inf)]


def always_warm() -> list[Phase]:
    return [("warm", math.inf)]


def always_cold() -> list[Phase]:
    return [("cold", math.inf)]


HYBRID_MARGIN = 0.10
"""Margin of the hybrid policy's histogram windows (Shahrad et al.; dslab default)."""
ARIMA_MARGIN = 0.15
"""Margin of the hybrid policy's ARIMA windows (Shahrad et al.; dslab default)."""


def bin_of_percentile(h: IdleHistogram, q: float) -> int:
    """The first bin at which the in-range idle times reach percentile ``q`` (0..100)."""
    cum = np.cumsum(h.counts)
    total = int(cum[-1])
    if total == 0:
        return 0
    return min(int(np.searchsorted(cum, q / 100.0 * total)), RANGE_BINS - 1)


def arima_next_s(history_s: list[float]) -> float:
    """One-step forecast of the next idle time, s, by an ARIMA(1, 1, 0) model: an
    AR(1) on the first differences fitted by conditional least squares (with one
    idle time, that idle time; never negative)."""
    x = np.asarray(history_s, dtype=np.float64)
    if len(x) == 1:
        return float(x[0])
    d = np.diff(x)
    phi = 0.0
    if len(d) >= 2:
        den = float(d[:-1] @ d[:-1])
        phi = float(d[1:] @ d[:-1]) / den if den > 0 else 0.0
        phi = max(-1.0, min(1.0, phi))
    return max(0.0, float(x[-1] + phi * d[-1]))


def hybrid_histogram(h: IdleHistogram) -> list[Phase]:
    """Shahrad et al. (ATC'20) hybrid histogram policy, as osukhoroslov/dslab
    implements it: with half or more of the idle times beyond the histogram's range,
    pre-warm at the ARIMA forecast of the next idle time x 0.85 and keep alive for
    the forecast x 0.15 x 2; with too few samples or a flat histogram (CV of the bin
    counts < 2), a fixed keep-alive of the whole range; otherwise unload, pre-warm
    at the 5th percentile's bin x 0.9 and keep alive until the 99th percentile's
    bin end x 1.1."""
    whole = RANGE_BINS * BIN_S
    if h.samples and h.out_of_range * 2 >= h.samples:
        forecast = arima_next_s(h.history_s)
        prewarm = forecast * (1.0 - ARIMA_MARGIN)
        keep = forecast * ARIMA_MARGIN * 2.0
        return [("cold", prewarm), ("warm", keep), ("cold", math.inf)]
    if h.samples < MIN_SAMPLES:
        return fixed(whole)
    counts = h.counts.astype(np.float64)
    cv = float(counts.std(ddof=1) / counts.mean()) if counts.mean() > 0 else 0.0
    if cv < 2.0:
        return fixed(whole)
    prewarm = bin_of_percentile(h, 5) * BIN_S * (1.0 - HYBRID_MARGIN)
    keep = (bin_of_percentile(h, 99) + 1) * BIN_S * (1.0 + HYBRID_MARGIN)
    if prewarm <= 0:
        return [("warm", keep), ("cold", math.inf)]
    return [("cold", prewarm), ("warm", max(0.0, keep - prewarm)), ("cold", math.inf)]


@dataclass(frozen=True)
class TepidTable:
    """A function's compiled policy: the state to hold at each idle time so far,
    by the bins of ``TABLE_EDGES_S`` (the last entry holds beyond the range), and
    the histogram percentiles its thresholds fall at."""

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
        """The state at ``idle_s`` of idle time, s (one binary search on the edges)."""
        i = int(np.searchsorted(TABLE_EDGES_S, idle_s, side="right")) - 1
        return self.states[min(max(i, 0), len(self.states) - 1)]


PRIOR_WEIGHT = 1.0
"""Weight, in idle periods, of the prior the tepid table adds to a histogram: one
idle period spread evenly over the table's in-range bins and the out-of-range one,
so an idle time not seen yet keeps a small probability."""


def idle_distribution(h: IdleHistogram) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(idle time s, probability) of the ``TABLE_BINS`` bins of ``TABLE_EDGES_S``
    and one out-of-range entry: the posterior mean of the bin probabilities under a
    Dirichlet prior of total weight ``PRIOR_WEIGHT``; each bin's idle times at their
    mean (its centre while empty), those out of range at twice the range."""
    whole = float(TABLE_EDGES_S[-1])
    idle = np.concatenate([h.table_bin_means_s(), [2.0 * whole]])
    counts = np.concatenate([h.table_counts, [h.out_of_range]]).astype(np.float64)
    weight = counts + PRIOR_WEIGHT / len(counts)
    return idle, weight / weight.sum()


def fixed_cold_share(h: IdleHistogram, keep_alive_s: float) -> float:
    """Expected cold starts per idle period of a fixed ``keep_alive_s`` keep-alive
    under :func:`idle_distribution` (the idle periods at least that long)."""
    idle, prob = idle_distribution(h)
    return float(prob[idle >= keep_alive_s].sum())


@dataclass(frozen=True)
class ThresholdPrices:
    """Every (warm-until ``edges[i]``, tepid-until ``edges[j]``) pair of a table,
    priced per idle period under one idle-time distribution: (K + 1, K + 1) grids
    for the K bins of ``TABLE_EDGES_S``."""

    edges: NDArray[np.float64]
    """Threshold values, s."""
    energy_j: NDArray[np.float64]
    """Expected energy of the idle period, J."""
    cold: NDArray[np.float64]
    """Probability the next request starts cold."""
    late: NDArray[np.float64]
    """Probability the next request starts later than the limit."""
    usable: NDArray[np.bool_]
    """The pair is a table: tepid-until >= warm-until (equal: no tepid phase)."""
    allowed: NDArray[np.bool_]
    """The pair is a table the compiler may pick: usable, and its pause (if any)
    comes at once (warm-until 0) or no sooner than :func:`pause_break_even_s`."""


def pause_break_even_s(fn: Function) -> float:
    """The idle time, s, after which a pause has paid for itself: (enter J + resume
    J) / (warm W - tepid W); inf without a tepid state or a tepid state drawing at
    least the warm power.

    The tepid table pauses either at once or no sooner than this (the
    deterministic ski-rental rule: for any one idle period, a pause at this time
    costs at most twice the cheaper of staying warm and pausing at once). A pause
    between 0 and this time is what the expected energy picks just past the
    longest idle time seen so far, where the posterior puts almost no mass; the
    next, longer idle time then pays a pause and a resume where holding warm would
    have cost less, and on a busy function with idle times of seconds that repeats
    at every new longest idle time."""
    tep = fn.tepid
    if tep is None or fn.warm.power_w <= tep.power_w:
        return math.inf
    return (tep.enter_j + tep.resume_j) / (fn.warm.power_w - tep.power_w)


def price_thresholds(fn: Function, h: IdleHistogram, late_limit_s: float) -> ThresholdPrices:
    """Every threshold pair priced under :func:`idle_distribution` of ``h``.

    Per idle period of length x, thresholds w <= u cost warm_W min(x, w), plus for
    x >= w the pause and tepid_W (min(x, u) - w), plus a resume for w <= x < u and a
    load for x >= u (u = w: no tepid phase, so no pause). With every bin's idle
    times at one value, each term is a sum over the bins before or past a threshold,
    so all pairs are priced at once from prefix and suffix sums.
    """
    idle, prob = idle_distribution(h)
    k = TABLE_BINS
    edges = TABLE_EDGES_S
    # survival[j] = P(x >= edges[j]); first[j] = E[x; x < edges[j]]; the entry past
    # the range lies beyond every threshold
    survival = np.cumsum(prob[::-1])[::-1]
    first = np.concatenate([[0.0], np.cumsum(prob * idle)[:k]])
    tep = fn.tepid
    w, u = edges[:, None], edges[None, :]
    sw, su = survival[:, None], survival[None, :]
    mw, mu = first[:, None], first[None, :]
    warm_j = fn.warm.power_w * (mw + w * sw)
    load_j, load_s = fn.cold_start.energy_j, fn.cold_start.time_s
    shape = (k + 1, k + 1)
    if tep is not None:
        tepid_share = sw - su
        energy = (
            warm_j
            + tep.enter_j * sw
            + tep.power_w * (mu - mw + u * su - w * sw)
            + tep.resume_j * tepid_share
            + load_j * su
        )
        energy = np.where(u == w, warm_j + load_j * su, energy)
        late = tepid_share * (tep.resume_s > late_limit_s) + su * (load_s > late_limit_s)
        cold = np.broadcast_to(su, shape)
        usable = np.broadcast_to(u >= w, shape)
        allowed = usable & ((u == w) | (w == 0) | (w >= pause_break_even_s(fn) - 1e-9))
    else:
        energy = np.broadcast_to(warm_j + load_j * sw, shape)
        late = np.broadcast_to(sw * (load_s > late_limit_s), shape)
        cold = np.broadcast_to(sw, shape)
        usable = np.broadcast_to(u == w, shape)
        allowed = usable
    return ThresholdPrices(
        np.asarray(edges, dtype=np.float64),
        np.asarray(energy, dtype=np.float64),
        np.asarray(cold, dtype=np.float64),
        np.asarray(late, dtype=np.float64),
        np.asarray(usable, dtype=np.bool_),
        np.asarray(allowed, dtype=np.bool_),
    )


def compile_tepid(
    fn: Function,
    h: IdleHistogram,
    late_limit_s: float,
    late_share: float,
    cold_share: float,
    reference_keep_alive_s: float | None = None,
) -> TepidTable:
    """The (warm-until, tepid-until) thresholds on ``TABLE_EDGES_S`` with the least
    expected energy per idle period under :func:`idle_distribution` of ``h``
    (:func:`price_thresholds`), among those that pause at once or no sooner than
    :func:`pause_break_even_s` (``ThresholdPrices.allowed``), such that at most
    ``late_share`` of the next requests start later than ``late_limit_s`` and at
    most ``cold_share`` start cold, and, with ``reference_keep_alive_s``, no more
    start cold than under a fixed keep-alive of that length on the same
    distribution. Where no thresholds meet the limits, those that exceed them
    least (late plus cold share over the limits), cheapest among them. A function
    without a tepid state has no tepid phase, so only the K + 1 pairs with equal
    thresholds are priced: the same choice as over the whole grid, in O(K) rather
    than O(K^2)."""
    cold_limit = cold_share
    if reference_keep_alive_s is not None:
        cold_limit = min(cold_limit, fixed_cold_share(h, reference_keep_alive_s))
    if fn.tepid is None:
        return _compile_warm_only(fn, h, late_limit_s, late_share, cold_limit)
    prices = price_thresholds(fn, h, late_limit_s)
    excess = np.maximum(prices.late - late_share, 0.0) + np.maximum(prices.cold - cold_limit, 0.0)
    excess = np.where(prices.allowed, excess, np.inf)
    candidates = prices.allowed & (excess <= float(excess.min()) + 1e-12)
    pick = np.where(candidates, prices.energy_j, np.inf)
    i, j = np.unravel_index(int(np.argmin(pick)), pick.shape)
    return _table(float(prices.edges[i]), float(prices.edges[max(i, j)]), h)


def _compile_warm_only(
    fn: Function, h: IdleHistogram, late_limit_s: float, late_share: float, cold_limit: float
) -> TepidTable:
    """:func:`compile_tepid` for a function without a tepid state: the keep-alive
    on the bin grid of least expected energy per idle period (warm W x min(x, w)
    plus a load for x >= w, J) within the late and cold limits, else exceeding them
    least, cheapest among those (the shortest on a tie, as over the whole grid)."""
    idle, prob = idle_distribution(h)
    k = TABLE_BINS
    edges = TABLE_EDGES_S
    survival = np.cumsum(prob[::-1])[::-1]
    first = np.concatenate([[0.0], np.cumsum(prob * idle)[:k]])
    energy = fn.warm.power_w * (first + edges * survival) + fn.cold_start.energy_j * survival
    late = survival * (fn.cold_start.time_s > late_limit_s)
    excess = np.maximum(late - late_share, 0.0) + np.maximum(survival - cold_limit, 0.0)
    pick = np.where(excess <= float(excess.min()) + 1e-12, energy, np.inf)
    i = int(np.argmin(pick))
    return _table(float(edges[i]), float(edges[i]), h)


def _table(warm_until: float, tepid_until: float, h: IdleHistogram) -> TepidTable:
    """The table of thresholds ``warm_until`` <= ``tepid_until`` (s, on
    ``TABLE_EDGES_S``): one state per bin and one beyond the range."""
    grid = TABLE_EDGES_S
    kinds = np.where(grid < warm_until, "warm", np.where(grid < tepid_until, "tepid", "cold"))
    states: tuple[Literal["warm", "tepid", "cold"], ...] = tuple(kinds.tolist())
    total = max(1, h.samples)
    cum = np.concatenate([[0], np.cumsum(h.table_counts)])
    wb = int(np.searchsorted(TABLE_EDGES_S, warm_until, side="left"))
    tb = int(np.searchsorted(TABLE_EDGES_S, tepid_until, side="left"))
    return TepidTable(
        states,
        warm_until,
        tepid_until,
        100.0 * float(cum[wb]) / total,
        100.0 * float(cum[tb]) / total,
    )
