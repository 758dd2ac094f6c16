"""Discrete-event simulation of one serverless function's container under a
keep-alive policy, replaying request arrival times.

Each request arriving at an idle container finds it in the state the policy's
phases give at the idle time so far: warm (starts at once), tepid (resumes) or
cold (loads). A request arriving while the container serves or loads joins it
(continuous batching: no queueing) and starts when the container is ready.
Everything that draws power is a segment (start s, end s, W); the simulator
also keeps its own energy account by event, and the two agree (tests). Times s,
energies J, powers W, memory GB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from energyopt.formulations.keepalive.policy import IdleHistogram, Phase
from energyopt.spec.keepalive import Function

Policy = Callable[[IdleHistogram], list[Phase]]


@dataclass
class KeepAliveSim:
    """Outcome of one function's replay."""

    requests: int = 0
    served: int = 0
    warm_starts: int = 0
    tepid_starts: int = 0
    cold_starts: int = 0
    latencies_s: list[float] = field(default_factory=list)
    energy_j: float = 0.0
    """Energy by the event account, J."""
    gpu_gb_s: float = 0.0
    """GPU memory held over time, GB x s."""
    segments: list[tuple[float, float, float]] = field(default_factory=list)
    """(start s, end s, W) of everything that drew power."""

    def power_integral_j(self) -> float:
        """The energy as the integral of the total power over time, J (a sweep over
        the segments' start and end points)."""
        events: list[tuple[float, float]] = []
        for t0, t1, w in self.segments:
            events.append((t0, w))
            events.append((t1, -w))
        events.sort()
        total = 0.0
        power = 0.0
        last = events[0][0] if events else 0.0
        for t, dw in events:
            total += power * (t - last)
            power += dw
            last = t
        return total


def _state_at(phases: Sequence[Phase], idle_s: float) -> str:
    elapsed = 0.0
    for state, length in phases:
        if idle_s < elapsed + length:
            return state
        elapsed += length
    return phases[-1][0]


def _hold(fn: Function, state: str) -> tuple[float, float]:
    """(W, GPU GB) of holding ``state``."""
    if state == "warm":
        return fn.warm.power_w, fn.warm.gpu_memory_gb
    if state == "tepid" and fn.tepid is not None:
        return fn.tepid.power_w, fn.tepid.gpu_memory_gb
    return 0.0, 0.0


def _move(fn: Function, old: str, new: str) -> tuple[float, float]:
    """(J, s) of an idle container's move from ``old`` to ``new``."""
    tep = fn.tepid
    load = (fn.cold_start.energy_j, fn.cold_start.time_s)
    if old == new or new == "cold":
        return 0.0, 0.0
    if tep is None:
        return load if new == "warm" else (0.0, 0.0)
    if old == "warm":
        return tep.enter_j, tep.enter_s
    if old == "tepid":
        return tep.resume_j, tep.resume_s
    if new == "warm":
        return load
    return load[0] + tep.enter_j, load[1] + tep.enter_s


def simulate(
    fn: Function, arrivals_s: Sequence[float], policy: Policy, horizon_s: float
) -> KeepAliveSim:
    """Replay ``arrivals_s`` (sorted, within ``horizon_s``) against ``policy``; the
    container is cold until the first request (every policy starts it on demand)
    and the last idle period runs to the horizon."""
    sim = KeepAliveSim()
    hist = IdleHistogram.empty()
    tep = fn.tepid

    def draw(t0: float, t1: float, watts: float) -> None:
        if t1 > t0 and watts > 0:
            sim.segments.append((t0, t1, watts))
            sim.energy_j += watts * (t1 - t0)

    def impulse(t0: float, joules: float, seconds: float) -> None:
        """A transition of ``joules`` spread over ``seconds`` from ``t0``."""
        if joules <= 0:
            return
        length = seconds if seconds > 0 else 1e-9
        sim.segments.append((t0, t0 + length, joules / length))
        sim.energy_j += joules

    def idle_period(start: float, end: float, phases: list[Phase], before: str) -> str:
        """Hold the phases from ``start`` until ``end``; the state at ``end``."""
        state = before
        t = start
        for phase_state, length in phases:
            if t >= end:
                break
            j, s = _move(fn, state, phase_state)
            impulse(t, j, s)
            state = phase_state
            stop = min(end, t + length) if math.isfinite(length) else end
            watts, gb = _hold(fn, state)
            draw(t, stop, watts)
            sim.gpu_gb_s += gb * (stop - t)
            t = stop
        return state

    phases: list[Phase] = [("cold", math.inf)]  # containers are created on demand
    idle_since = 0.0
    state_before_idle = "cold"
    busy_until = 0.0
    ready_at = 0.0
    first = True
    for a in arrivals_s:
        sim.requests += 1
        if not first and a < busy_until:
            latency = max(0.0, ready_at - a)
            sim.warm_starts += 1
        else:
            if not first:
                hist.add(a - idle_since)
            state = idle_period(idle_since, a, phases, state_before_idle)
            if state == "warm":
                latency = 0.0
                sim.warm_starts += 1
            elif state == "tepid" and tep is not None:
                latency = tep.resume_s
                impulse(a, tep.resume_j, tep.resume_s)
                sim.tepid_starts += 1
            else:
                latency = fn.cold_start.time_s
                impulse(a, fn.cold_start.energy_j, fn.cold_start.time_s)
                sim.cold_starts += 1
            ready_at = a + latency
            busy_until = ready_at
        first = False
        start = a + latency
        end = start + fn.service.time_s
        draw(start, end, fn.service.power_w)
        if end > busy_until:
            # the container holds warm from when it is ready until its last request ends
            hold_from = max(busy_until, ready_at)
            draw(hold_from, end, fn.warm.power_w)
            sim.gpu_gb_s += fn.warm.gpu_memory_gb * (end - hold_from)
            busy_until = end
        sim.latencies_s.append(latency)
        sim.served += 1
        idle_since = busy_until
        state_before_idle = "warm"
        phases = policy(hist)
    if first:
        idle_period(0.0, horizon_s, phases, "cold")
    elif horizon_s > idle_since:
        idle_period(idle_since, horizon_s, phases, state_before_idle)
    return sim


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` (0 when empty)."""
    return float(np.percentile(np.asarray(values), q)) if len(values) else 0.0
