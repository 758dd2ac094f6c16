"""Latency and SLO accounting of simulated requests.

* TTFT: every request's time from arrival to its first token (kept exactly).
* TBT: every gap between consecutive output tokens, as a histogram (log bins of
  1 %) with exact counts of gaps within the SLO.
* A request *meets its SLO* when its TTFT is within the TTFT SLO and its mean
  time per output token after the first (TPOT) is within the TBT SLO (the
  DistServe definition of SLO attainment). Requests not finished when the
  simulation stops meet nothing; neither do requests the online policy sheds on
  arrival (counted as arrived, never completed).
* A workload *meets its SLO* (the percentile form the planner promises) when the
  SLO's percentile of its TTFTs and of its token gaps are within the SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from energyopt.spec.workload import Slo

HIST_MIN_MS = 0.01
HIST_RATIO = 1.01
HIST_BINS = 2400  # up to 0.01 ms * 1.01**2400 ~ 2.2e8 ms


def _hist_index(ms: float) -> int:
    if ms <= HIST_MIN_MS:
        return 0
    return min(int(math.log(ms / HIST_MIN_MS) / math.log(HIST_RATIO)) + 1, HIST_BINS - 1)


@dataclass
class WorkloadStats:
    """Counters of one workload."""

    name: str
    slo: Slo
    arrived: int = 0
    completed: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    ttft_ok: int = 0
    tbt_gaps: int = 0
    tbt_ok: int = 0
    tbt_hist: list[float] = field(default_factory=lambda: [0.0] * HIST_BINS)
    met_slo: int = 0
    shed: int = 0  # refused on arrival by the online policy's admission rule (misses)

    def first_token(self, ttft_ms: float) -> bool:
        """A request's first token after ``ttft_ms``; True where it met the TTFT SLO."""
        self.ttft_ms.append(ttft_ms)
        on_time = ttft_ms <= self.slo.ttft_ms
        if on_time:
            self.ttft_ok += 1
        return on_time

    def gaps(self, gap_ms: float, count: int) -> None:
        """``count`` token gaps of ``gap_ms`` each."""
        self.tbt_gaps += count
        if gap_ms <= self.slo.tbt_ms:
            self.tbt_ok += count
        self.tbt_hist[_hist_index(gap_ms)] += count

    def finished(self, ttft_ms: float, tpot_ms: float) -> None:
        """A request completes with this TTFT and mean time per later token."""
        self.completed += 1
        if ttft_ms <= self.slo.ttft_ms and tpot_ms <= self.slo.tbt_ms:
            self.met_slo += 1

    def absorb(self, other: WorkloadStats) -> None:
        """Add ``other``'s requests and token gaps to these counters (pooling runs of
        the same workload, e.g. replicate simulations with different seeds)."""
        if other.name != self.name:
            raise ValueError(f"cannot pool workload {other.name!r} into {self.name!r}")
        self.arrived += other.arrived
        self.completed += other.completed
        self.ttft_ms.extend(other.ttft_ms)
        self.ttft_ok += other.ttft_ok
        self.tbt_gaps += other.tbt_gaps
        self.tbt_ok += other.tbt_ok
        self.tbt_hist = [a + b for a, b in zip(self.tbt_hist, other.tbt_hist, strict=True)]
        self.met_slo += other.met_slo
        self.shed += other.shed

    def ttft_percentile_interval_ms(self, q: float, z: float = 1.96) -> tuple[float, float]:
        """Distribution-free confidence interval (ms) of the TTFT at quantile ``q``:
        the order statistics n q -/+ z sqrt(n q (1 - q)) of the sorted TTFTs (z 1.96:
        95 %). (nan, nan) without requests; an end beyond the sample is +/- inf."""
        n = len(self.ttft_ms)
        if n == 0:
            return math.nan, math.nan
        values = np.sort(np.asarray(self.ttft_ms))
        half = z * math.sqrt(n * q * (1.0 - q))
        lo = math.floor(n * q - half) - 1
        hi = math.ceil(n * q + half) - 1
        return (
            float(values[lo]) if lo >= 0 else -math.inf,
            float(values[hi]) if hi < n else math.inf,
        )

    def ttft_percentile_ms(self, q: float) -> float:
        """TTFT at quantile ``q`` (ms) of the requests that got a first token."""
        if not self.ttft_ms:
            return math.nan
        return float(np.quantile(np.asarray(self.ttft_ms), q))

    def tbt_percentile_ms(self, q: float) -> float:
        """TBT at quantile ``q`` (ms), from the histogram (upper edge of the bin)."""
        if self.tbt_gaps == 0:
            return math.nan
        target = q * self.tbt_gaps
        acc = 0.0
        for i, c in enumerate(self.tbt_hist):
            acc += c
            if acc >= target - 1e-9:
                return HIST_MIN_MS * HIST_RATIO**i
        return math.inf

    def meets_percentiles(self) -> bool:
        """The SLO's percentile of TTFTs and of token gaps are within the SLO, and
        every request finished."""
        q = self.slo.quantile
        ttft = self.ttft_percentile_ms(q)
        tbt = self.tbt_percentile_ms(q)
        return (
            self.completed == self.arrived
            and not ttft > self.slo.ttft_ms
            and not tbt > self.slo.tbt_ms
        )

    @property
    def ttft_attainment(self) -> float:
        """Fraction of arrived requests whose TTFT met the SLO."""
        return self.ttft_ok / self.arrived if self.arrived else 1.0

    @property
    def tbt_attainment(self) -> float:
        """Fraction of token gaps within the TBT SLO."""
        return self.tbt_ok / self.tbt_gaps if self.tbt_gaps else 1.0

    @property
    def slo_attainment(self) -> float:
        """Fraction of arrived requests that met both SLOs (see module docs)."""
        return self.met_slo / self.arrived if self.arrived else 1.0


def fleet_attainment(stats: list[WorkloadStats]) -> tuple[float, float, float]:
    """(TTFT, TBT, SLO) attainment over all workloads: requests and gaps pooled."""
    arrived = sum(s.arrived for s in stats)
    gaps = sum(s.tbt_gaps for s in stats)
    ttft = sum(s.ttft_ok for s in stats) / arrived if arrived else 1.0
    tbt = sum(s.tbt_ok for s in stats) / gaps if gaps else 1.0
    slo = sum(s.met_slo for s in stats) / arrived if arrived else 1.0
    return ttft, tbt, slo
