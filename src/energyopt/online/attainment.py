"""Per-workload attainment guard: the online control tightens its own rules for a
workload whose requests miss their TTFT more often than a stated target.

The capacities the online control reads (the operating-point table) are SLO
capacities: the largest rate at which the SLO's percentile of TTFT and TBT meets
the SLO in the queueing model (perf/queueing.py), with every prompt at its
workload's mean length. A workload served exactly at that capacity meets its
percentile and no more: with a 90th-percentile SLO up to one request in ten is
late, and prompts of varying length (a long one takes several chunk passes) make
more of them late than the mean-length model says. Performance-first runs every
GPU at its top clock, far below those capacities, and its attainment is 98-100 %
on most workloads; a control that lowers clocks to the capacity loses points
there that the SLO percentile allows but a user comparing the two does not.

The guard measures the outcome itself. Per workload it keeps two exponentially
decayed counts (time constant ``tau_s``) of first tokens that came within the
TTFT SLO and of those that came late, as the serving engine reports them. At most
once per ``hold_s``, with at least ``min_samples`` decayed outcomes counted:

* while the late count exceeds what the target allows by more than chance, the
  workload's **factor** k (starting at 1) grows by ``1 + step``, up to
  ``max_factor``: late > a n + z sqrt(a n), with n the decayed count of outcomes,
  a = 1 - target the late fraction allowed and z = ``GUARD_Z`` (a one-sided 95 %
  test on the Poisson count; with a = 3 % one late token in 20 is no evidence, 3
  are);
* while the late fraction is below a / 2, k shrinks by the same step, down to 1.

The global scheduler divides its risk utilisation by k for the workload's
instances (a boost starts sooner and covers k times the load) and multiplies a
harvest's need by k (a lowered clock keeps k times the observed rate's
capacity). So the rules tighten only for the workloads that miss, as far as
their misses say, and relax when the misses stop. O(1) per report; no table
lookups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

GUARD_Z = 1.645
"""Sigmas of the late count's Poisson noise above the allowed count that raise a
workload's factor (one-sided 95 %)."""


@dataclass
class AttainmentGuard:
    """One workload's guard (see module docs). ``target`` is the TTFT attainment
    aimed at (fraction of first tokens within the SLO; 0 disables the guard),
    ``tau_s`` the counts' time constant (s), ``hold_s`` the least time between two
    changes of the factor (s)."""

    target: float = 0.0
    tau_s: float = 60.0
    hold_s: float = 10.0
    step: float = 0.1
    max_factor: float = 2.0
    min_samples: float = 20.0
    factor: float = 1.0
    ok: float = 0.0  # decayed count of first tokens within the TTFT SLO
    late: float = 0.0  # decayed count of late first tokens
    at_s: float = 0.0  # time of the counts, s
    changed_s: float = -math.inf  # time of the last change of the factor, s

    def __post_init__(self) -> None:
        if not 0.0 <= self.target < 1.0:
            raise ValueError(f"target: {self.target} is not a fraction in [0, 1)")
        if self.tau_s <= 0.0 or self.hold_s < 0.0 or self.step <= 0.0:
            raise ValueError("tau_s and step must be positive, hold_s not negative")
        if self.max_factor < 1.0:
            raise ValueError(f"max_factor: {self.max_factor} is below 1")

    def late_fraction(self, now_s: float) -> float:
        """Decayed fraction of late first tokens at ``now_s`` (0 without any)."""
        self._decay(now_s)
        total = self.ok + self.late
        return self.late / total if total > 0.0 else 0.0

    def _decay(self, now_s: float) -> None:
        if now_s > self.at_s:
            d = math.exp(-(now_s - self.at_s) / self.tau_s)
            self.ok *= d
            self.late *= d
            self.at_s = now_s

    def observe(self, on_time: int, late: int, now_s: float) -> int:
        """Count ``on_time`` and ``late`` first tokens reported at ``now_s`` (s) and
        adjust the factor: +1 where it rose, -1 where it fell, 0 otherwise."""
        if self.target <= 0.0:
            return 0
        self._decay(now_s)
        self.ok += on_time
        self.late += late
        if now_s - self.changed_s < self.hold_s or self.ok + self.late < self.min_samples:
            return 0
        n = self.ok + self.late
        allowed = 1.0 - self.target
        expected = allowed * n
        if self.late > expected + GUARD_Z * math.sqrt(expected) and self.factor < self.max_factor:
            self.factor = min(self.factor * (1.0 + self.step), self.max_factor)
            change = 1
        elif self.late < 0.5 * expected and self.factor > 1.0:
            self.factor = max(self.factor / (1.0 + self.step), 1.0)
            change = -1
        else:
            return 0
        self.changed_s = now_s
        return change


def plan_reserves(
    workloads: int, tail_reserve: float, guard_reserve: float, factors: Sequence[float] | None
) -> NDArray[np.float64]:
    """Per workload, the fraction of its burst peak (sim/forecast.py:
    ``burst_peak_rps``) the next epoch plan must reach: ``tail_reserve`` for every
    workload, raised to ``guard_reserve`` for those whose attainment-guard factor
    (``factors``, one per workload) is above 1, and for every workload at the
    first plan (``factors`` None: no outcome seen yet).

    The guard can only move clocks, spills and boosts within the plan's
    placements; a workload whose bursts outrun its placements at their top clock
    keeps missing with its factor at the maximum. Its next plan then places
    capacity for the burst, and the harvest keeps the clocks at the observed load
    between bursts. Dimensionless fractions (0: no reserve)."""
    if tail_reserve < 0.0 or guard_reserve < 0.0:
        raise ValueError(f"reserves {tail_reserve}, {guard_reserve}: must not be negative")
    reserve = np.full(workloads, float(tail_reserve))
    if guard_reserve <= 0.0:
        return reserve
    if factors is None:
        raised = np.ones(workloads, dtype=bool)
    else:
        if len(factors) != workloads:
            raise ValueError(f"factors: {len(factors)} for {workloads} workloads")
        raised = np.asarray(factors, dtype=float) > 1.0 + 1e-9
    reserve[raised] = np.maximum(reserve[raised], guard_reserve)
    return reserve
