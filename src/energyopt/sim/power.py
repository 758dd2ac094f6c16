"""Energy accounting of the simulated fleet.

Each GPU draws a *static* power while it is on (its on-power at the locked clock,
perf/power.py ``gpu_on_power_w``; idle power while it powers on; the standby
figure while off) and a *dynamic* energy per iteration (the forward pass's power
times its duration). The meter integrates both: per GPU, into a fleet power time
series of fixed bins, and split at the end of the evaluation window so energy
over the window and energy of the drain after it are reported apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class GpuEnergy:
    """Energy (J) of one GPU, and its static level now."""

    static_j: float = 0.0
    dynamic_j: float = 0.0
    window_j: float = 0.0  # static + dynamic inside [0, window_s)
    window_static_j: float = 0.0  # static alone inside [0, window_s)
    level_w: float = 0.0
    since_s: float = 0.0


@dataclass
class PowerMeter:
    """Integrates static levels and iteration energies of every GPU."""

    gpu_ids: list[str]
    window_s: float
    bin_s: float
    record: bool = False
    """Keep every constant-power segment (tests integrate them independently)."""
    gpus: dict[str, GpuEnergy] = field(init=False)
    bins_j: list[float] = field(init=False)
    segments: list[tuple[str, float, float, float]] = field(init=False)
    """(GPU, start s, end s, W) of every static level and iteration, if ``record``."""

    def __post_init__(self) -> None:
        self.gpus = {g: GpuEnergy() for g in self.gpu_ids}
        self.bins_j = [0.0] * (math.ceil(self.window_s / self.bin_s) + 1)
        self.segments = []

    def _spread(self, gpu: str, t0: float, t1: float, joules: float) -> None:
        """Add ``joules`` spent evenly over [t0, t1] to the window total and the bins."""
        e = self.gpus[gpu]
        if self.record:
            self.segments.append((gpu, t0, t1, joules / (t1 - t0) if t1 > t0 else 0.0))
        if t1 <= t0:
            if t0 < self.window_s:
                e.window_j += joules
                self._bin(int(t0 / self.bin_s), joules)
            return
        if t0 < self.window_s:
            inside = joules * (min(t1, self.window_s) - t0) / (t1 - t0)
            e.window_j += inside
        first = int(t0 / self.bin_s)
        last = int(t1 / self.bin_s)
        if first == last:
            self._bin(first, joules)
            return
        rate = joules / (t1 - t0)
        for b in range(first, last + 1):
            lo = max(t0, b * self.bin_s)
            hi = min(t1, (b + 1) * self.bin_s)
            if hi > lo:
                self._bin(b, rate * (hi - lo))

    def _bin(self, index: int, joules: float) -> None:
        if index >= len(self.bins_j):
            self.bins_j.extend([0.0] * (index + 1 - len(self.bins_j)))
        self.bins_j[index] += joules

    def set_level(self, gpu: str, now_s: float, watts: float) -> None:
        """The GPU's static power becomes ``watts`` from ``now_s`` on."""
        e = self.gpus[gpu]
        if now_s > e.since_s:
            joules = e.level_w * (now_s - e.since_s)
            e.static_j += joules
            e.window_static_j += e.level_w * max(min(now_s, self.window_s) - e.since_s, 0.0)
            self._spread(gpu, e.since_s, now_s, joules)
        e.level_w = watts
        e.since_s = max(now_s, e.since_s)

    def add_iteration(self, gpu: str, start_s: float, end_s: float, joules: float) -> None:
        """Dynamic energy of one iteration on one GPU."""
        self.gpus[gpu].dynamic_j += joules
        self._spread(gpu, start_s, end_s, joules)

    def close(self, end_s: float) -> None:
        """Account the static levels up to ``end_s`` (call once, at the end)."""
        for gpu in self.gpus:
            self.set_level(gpu, end_s, self.gpus[gpu].level_w)

    @property
    def total_j(self) -> float:
        """Static plus dynamic energy of every GPU, whole run (J)."""
        return sum(e.static_j + e.dynamic_j for e in self.gpus.values())

    @property
    def window_j(self) -> float:
        """Energy inside the evaluation window [0, window_s) (J)."""
        return sum(e.window_j for e in self.gpus.values())

    @property
    def window_static_j(self) -> float:
        """Static energy inside the evaluation window (J): on-power, idle while
        powering on, standby while off; the rest of ``window_j`` is iterations."""
        return sum(e.window_static_j for e in self.gpus.values())

    def power_series_w(self) -> list[float]:
        """Mean fleet power per bin (W); bin k covers [k bin_s, (k + 1) bin_s)."""
        return [j / self.bin_s for j in self.bins_j]
