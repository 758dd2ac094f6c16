"""Surprise detection: a workload whose observed rate stays outside its band.

Per workload *k* the plan in force provisions ``planned_rps[k]`` requests/s. Its
band, set at every plan (``set_plan``), is

* upper: ``planned x (1 + upper[k]) + noise_z x sqrt(planned / window_s)`` (only
  when ``upper`` is given; no upper band otherwise);
* lower: ``planned x (1 - lower[k]) - noise_z x sqrt(planned / window_s)`` (only
  when ``lower`` is given; no lower band otherwise),

``upper`` and ``lower`` being fractions (the forecast-error quantiles the caller
allows above and below the plan's rate) and the last term the Poisson noise of a
rate counted over ``window_s`` seconds (its standard deviation at the planned rate)
times ``noise_z``. The caller measures each workload's rate over the last
``window_s`` seconds and hands it to ``update`` as often as it likes; a workload is
*out of band* from the first update that finds it outside until an update finds it
inside again. A **surprise** fires for a workload once it has been out of band for
``surprise_s`` seconds (measured between updates: with updates every second, a
surprise fires at the first update at least ``surprise_s`` after the first one out
of band), and not again for that workload within ``cooldown_s`` seconds of its last
surprise. A new plan (``set_plan``) restarts every workload's out-of-band time;
cooldowns carry over. Each update is O(workloads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from energyopt.perf.params import FloatArray


@dataclass(frozen=True)
class SurpriseConfig:
    """When a surprise fires (module docs). ``surprise_s``: seconds out of band before
    it fires; ``cooldown_s``: least seconds between two surprises of one workload;
    ``window_s``: seconds over which the caller measures the observed rate (it sets
    the noise term); ``noise_z``: standard deviations of that count's Poisson noise
    added to the band (0: none)."""

    surprise_s: float = 3.0
    cooldown_s: float = 60.0
    window_s: float = 5.0
    noise_z: float = 1.28

    def __post_init__(self) -> None:
        for name in ("surprise_s", "cooldown_s", "noise_z"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"SurpriseConfig.{name}: {value} is not a number >= 0")
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"SurpriseConfig.window_s: {self.window_s} is not a number > 0 (s)")


class SurpriseDetector:
    """Per-workload out-of-band timers with a cooldown (module docs)."""

    def __init__(self, workloads: int, config: SurpriseConfig | None = None) -> None:
        if workloads < 0:
            raise ValueError(f"workloads: {workloads} is negative")
        self.config = config or SurpriseConfig()
        self.high = np.full(workloads, np.inf)  # req/s
        self.low = np.full(workloads, -np.inf)  # req/s
        self.since = np.full(workloads, np.nan)  # s: out of band from; nan: in band
        self.last_fired = np.full(workloads, -np.inf)  # s
        self.fired = 0  # surprises so far

    @property
    def workloads(self) -> int:
        """Number of workloads watched."""
        return int(self.high.shape[0])

    def set_plan(
        self,
        planned_rps: Sequence[float] | FloatArray,
        upper: Sequence[float] | FloatArray | None,
        lower: Sequence[float] | FloatArray | None = None,
    ) -> None:
        """The band of a new plan: ``planned_rps`` (req/s per workload), ``upper`` and
        ``lower`` (fractions of it, >= 0; None: no band on that side). Restarts every
        out-of-band time."""
        planned = self._array("planned_rps", planned_rps)
        if (planned < 0).any():
            raise ValueError("planned_rps must be >= 0")
        noise = self.config.noise_z * np.sqrt(planned / self.config.window_s)
        if upper is None:
            self.high = np.full(self.workloads, np.inf)
        else:
            up = self._array("upper", upper)
            if (up < 0).any():
                raise ValueError("upper must be >= 0")
            self.high = planned * (1.0 + up) + noise
        if lower is None:
            self.low = np.full(self.workloads, -np.inf)
        else:
            down = self._array("lower", lower)
            if (down < 0).any():
                raise ValueError("lower must be >= 0")
            self.low = planned * (1.0 - down) - noise
        self.since[:] = np.nan

    def band(self) -> tuple[FloatArray, FloatArray]:
        """(lower, upper) limit of each workload's band (req/s; -inf / inf: no band on
        that side)."""
        return self.low.copy(), self.high.copy()

    def update(self, now_s: float, observed_rps: Sequence[float] | FloatArray) -> list[int]:
        """The workloads whose surprise fires at ``now_s`` (s), given each workload's
        rate over the last ``window_s`` seconds (req/s); in workload order."""
        observed = self._array("observed_rps", observed_rps)
        out = (observed > self.high) | (observed < self.low)
        self.since[~out] = np.nan
        start = out & np.isnan(self.since)
        self.since[start] = now_s
        cfg = self.config
        due = (
            out
            & (now_s - self.since >= cfg.surprise_s - 1e-9)
            & (now_s - self.last_fired >= cfg.cooldown_s - 1e-9)
        )
        fired = np.flatnonzero(due).tolist()
        if fired:
            self.last_fired[due] = now_s
            self.since[due] = np.nan
            self.fired += len(fired)
        return [int(k) for k in fired]

    def _array(self, name: str, values: Sequence[float] | FloatArray) -> FloatArray:
        arr = np.asarray(values, dtype=np.float64)
        if arr.shape != (self.workloads,):
            raise ValueError(
                f"{name}: {arr.shape[0] if arr.ndim else 0} values for {self.workloads} workloads"
            )
        if not np.isfinite(arr).all():
            raise ValueError(f"{name}: values must be finite")
        return arr
