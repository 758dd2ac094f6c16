"""Online control between plans (docs/online.md): a global scheduler that places
every request and reacts to forecast error with table lookups only, a phase-aware
local scheduler per instance, and forecast headroom from observed errors.

Imports only ``tables``, ``perf``, ``spec`` and ``catalog``; the simulator
(``sim``) drives it through the ``Actuator`` and ``InstanceView`` protocols, and its
clock, power-limit and share changes go through ``GpuControl`` (energyopt/control.py):
the node agent's client in production, the simulator's simulated agent in simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from energyopt.control import GpuControl, Refused
from energyopt.online.global_scheduler import (
    GlobalScheduler,
    OnlineConfig,
    OnlineStats,
    lookup_budget,
)
from energyopt.online.headroom import ErrorHeadroom
from energyopt.online.local_scheduler import LocalConfig, LocalScheduler, chunk_ladder
from energyopt.online.lookups import LookupCounter, OpLookups
from energyopt.online.state import Actuator, GpuInfo, InstanceInfo, InstanceView, RateMeter


@dataclass(frozen=True)
class OnlinePolicy:
    """Everything a simulator (or a serving system) needs to run the online control:
    the operating-point lookups, the global scheduler's thresholds, and whether
    (and how) the local scheduler runs; ``max_chunk`` is its largest prefill chunk
    (tokens); ``errors``: the observed forecast errors whose spread
    (``ErrorHeadroom.spread``) sets each workload's harvest margin at every plan
    (None: ``OnlineConfig.harvest_margin``)."""

    lookups: OpLookups
    config: OnlineConfig = field(default_factory=OnlineConfig)
    local: bool = True
    local_config: LocalConfig = field(default_factory=LocalConfig)
    max_chunk: int = 4096
    errors: ErrorHeadroom | None = None


__all__ = [
    "Actuator",
    "ErrorHeadroom",
    "GlobalScheduler",
    "GpuControl",
    "GpuInfo",
    "InstanceInfo",
    "InstanceView",
    "LocalConfig",
    "LocalScheduler",
    "LookupCounter",
    "OnlineConfig",
    "OnlinePolicy",
    "OnlineStats",
    "OpLookups",
    "RateMeter",
    "Refused",
    "chunk_ladder",
    "lookup_budget",
]
