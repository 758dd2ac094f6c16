"""What the online schedulers see of the fleet: GPU and instance state summaries,
and the actions they may take (implemented by a serving system or the simulator).

A summary holds only what a real serving stack exposes without tracing: per
instance its queue (requests routed and not yet given a first token), its decode
batch, its KV-cache use, the arrivals routed to it (the scheduler counts those
itself), and per GPU its type, clock, SM shares and whether it is on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

FAST_TAU_S = 2.0
"""Default time constant of a slot's fast rate meter (s)."""


class InstanceView(Protocol):
    """Live counters of one serving instance (read at decision time)."""

    @property
    def queued(self) -> int:
        """Requests routed to the instance that have no first token yet."""
        ...

    @property
    def batch(self) -> int:
        """Requests decoding now."""
        ...

    @property
    def kv_fraction(self) -> float:
        """KV-cache reservation in use, as a fraction of the instance's budget."""
        ...


class Actuator(Protocol):
    """The actions of the global scheduler (times in s, clocks in MHz, W)."""

    def set_clock(self, gpu: str, clock_mhz: int, power_limit_w: float, now_s: float) -> None:
        """Lock ``gpu``'s SM clock at ``clock_mhz`` and its power limit at ``power_limit_w``."""
        ...

    def set_share(self, instance: int, share: int, now_s: float) -> None:
        """Give ``instance`` an MPS share of ``share`` percent of its GPU."""
        ...

    def wake(self, gpu: str, workload: int, clock_mhz: int, now_s: float) -> None:
        """Turn ``gpu`` on at ``clock_mhz`` and start one instance of ``workload`` on
        all of it (it serves once powered on and loaded)."""
        ...


@dataclass
class RateMeter:
    """Exponentially weighted arrival rate (requests/s) with time constant ``tau_s``.

    Each arrival adds ``1 / tau_s``; the value decays by ``exp(-dt / tau_s)``; for
    Poisson arrivals of rate r its mean is r. O(1) per update and read."""

    tau_s: float
    value: float = 0.0
    at_s: float = 0.0

    def read(self, now_s: float) -> float:
        """The rate at ``now_s`` (requests/s)."""
        if now_s <= self.at_s:
            return self.value
        return self.value * math.exp((self.at_s - now_s) / self.tau_s)

    def add(self, now_s: float) -> float:
        """Count one arrival at ``now_s``; returns the new rate."""
        self.value = self.read(now_s) + 1.0 / self.tau_s
        self.at_s = max(now_s, self.at_s)
        return self.value


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as a plan leaves it (given to the scheduler at every plan)."""

    id: str
    gpu_type: str
    node: str
    on: bool
    clock_mhz: int  # current (= the plan's) locked clock
    max_clock_mhz: int  # the type's highest clock
    cap_w: float  # the GPU's power cap (its own cap, else the type's largest limit)
    min_limit_w: float  # the type's smallest power limit


@dataclass(frozen=True)
class InstanceInfo:
    """A serving instance that takes new requests of a workload (entry phase)."""

    id: int
    workload: int
    label: str  # unit label of the oppoints table: ``name`` or ``name:prefill``
    gpus: tuple[str, ...]
    share: int  # share units (MPS percent or MIG slices)
    tp: int
    planned_rps: float
    ready_s: float
    draining: bool
    view: InstanceView
    client: str | None = None
    """Its MPS client's name on its GPU for share shifts (``GpuControl.shift_shares``);
    None: ``label`` (the agent names a placement ``workload`` or ``workload:phase``)."""


@dataclass
class GpuState:
    """The scheduler's summary of one GPU."""

    info: GpuInfo
    clock: int
    plan_clock: int
    power_w: float = 0.0  # estimated draw at the current clock and observed loads
    limit_w: float = 0.0  # power limit the scheduler set (0: the plan's)
    changed_s: float = -math.inf  # last clock or share change
    clock_since_s: float = 0.0  # time of the last clock change (or of the plan), s
    boosted: bool = False
    slots: list[Slot] = field(default_factory=list)


@dataclass
class Slot:
    """The scheduler's summary of one instance."""

    info: InstanceInfo
    rate: RateMeter
    share: int
    plan_share: int
    gpu: GpuState | None  # None for tensor-parallel groups (not re-clocked online)
    capacity_rps: float = 0.0  # at the GPU's current clock and this share
    plan_capacity_rps: float = 0.0  # at the plan's clock and share
    ttft_s: float = 1.0
    queue_limit: int = 1
    epoch: int = 0  # the plan its capacities belong to
    fast: RateMeter = field(default_factory=lambda: RateMeter(FAST_TAU_S))
    """The same arrivals on a short time constant: the risk test's early warning."""
