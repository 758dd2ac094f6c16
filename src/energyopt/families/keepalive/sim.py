"""Discrete-event simulation of serverless containers on one node under keep-alive
policies and the node's memory budget, replaying request arrival times.

Each request arriving at an idle container finds it in the state its policy's
phases give at the idle time so far: warm (starts at once), tepid (resumes) or
cold (loads). A request arriving while the container serves or loads joins it
(continuous batching: no queueing) and starts when the container is ready.

The node's GPU and host memory bound what all its containers hold at once (a
loading or serving container holds its warm memory). A request that needs more
than is free first evicts idle containers of other functions, least recently
used first among those that free some of the memory that is short (a container
holding host memory only is not evicted to make room on the GPU): a tepid-aware
policy demotes a warm victim to tepid where its host memory fits, any other
victim goes cold; an evicted container stays down until
its next request (a container waiting for memory may be evicted too). If
evicting every idle container would not free enough, the request waits (first
come, first served) until a container finishes. A policy's move to a state
holding more memory (a pre-warm) happens only into free memory.

Everything that draws power is a segment (start s, end s, W); the simulator
also keeps its own energy account by event, and the two agree (tests). Times s,
energies J, powers W, memory GB.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from energyopt.families.keepalive.formulations.policy import IdleHistogram, Phase
from energyopt.families.keepalive.spec import Function
from energyopt.sim.events import EventQueue

Policy = Callable[[IdleHistogram], list[Phase]]
TimedPolicy = Callable[[float, IdleHistogram], list[Phase]]
"""A policy given the idle period's start, s, and the idle times so far."""

_DONE, _ARRIVE, _PHASE = 0, 1, 2
"""Event kinds in the order they run at one instant: a container that finishes
at a request's arrival time is idle for it; a phase that starts at an arrival
time is not entered."""


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
    evictions: int = 0
    """Times another function's request evicted (or demoted) this idle container."""
    waits: int = 0
    """Requests that found too little free memory and waited for a container to finish."""
    segments: list[tuple[float, float, float]] = field(default_factory=list)
    """(start s, end s, W) of everything that drew power."""
    memory: list[tuple[float, float, float, float]] = field(default_factory=list)
    """(start s, end s, GPU GB, host GB) of what the container held."""

    def power_integral_j(self) -> float:
        """The energy as the integral of the total power over time, J."""
        return _sweep_integral([(t0, t1, w) for t0, t1, w in self.segments])

    def within(self, limit_s: float) -> int:
        """Requests that started within ``limit_s`` of their arrival."""
        return sum(1 for lat in self.latencies_s if lat <= limit_s + 1e-9)


@dataclass(frozen=True)
class NodeBudget:
    """What one node's containers may hold at once, GB (inf: no limit)."""

    gpu_memory_gb: float = math.inf
    host_memory_gb: float = math.inf


@dataclass(frozen=True)
class Tenant:
    """One function on the node, its requests (s, sorted) and its policy."""

    fn: Function
    arrivals_s: Sequence[float]
    policy: Policy
    demote_to_tepid: bool = False
    """When evicted, a warm container of this policy goes tepid (if it fits), not cold."""
    timed: TimedPolicy | None = None
    """A policy that also sees when the idle period starts (s): a plan's states by
    time window; it replaces ``policy`` where given."""


def _sweep_integral(segments: list[tuple[float, float, float]]) -> float:
    events: list[tuple[float, float]] = []
    for t0, t1, w in segments:
        events.append((t0, w))
        events.append((t1, -w))
    events.sort()
    total = 0.0
    level = 0.0
    last = events[0][0] if events else 0.0
    for t, dw in events:
        total += level * (t - last)
        level += dw
        last = t
    return total


def peak_memory_gb(sims: Sequence[KeepAliveSim]) -> tuple[float, float]:
    """Most (GPU GB, host GB) the containers of ``sims`` held at any instant."""
    peaks = []
    for k in (2, 3):
        events: list[tuple[float, int, float]] = []
        for sim in sims:
            for seg in sim.memory:
                if seg[1] > seg[0]:
                    events.append((seg[0], 1, seg[k]))
                    events.append((seg[1], 0, -seg[k]))  # releases first at one instant
        events.sort()
        level, peak = 0.0, 0.0
        for _, _, d in events:
            level += d
            peak = max(peak, level)
        peaks.append(peak)
    return peaks[0], peaks[1]


def _hold(fn: Function, state: str) -> tuple[float, float, float]:
    """(W, GPU GB, host GB) of holding ``state``."""
    if state == "warm":
        return fn.warm.power_w, fn.warm.gpu_memory_gb, fn.warm.host_memory_gb
    if state == "tepid" and fn.tepid is not None:
        return fn.tepid.power_w, fn.tepid.gpu_memory_gb, fn.tepid.host_memory_gb
    return 0.0, 0.0, 0.0


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


@dataclass
class _Tally:
    """GPU and host memory (GB) the node's containers hold, kept up to date on every
    state change so that a look-up does not sum over all containers."""

    gpu_gb: float = 0.0
    host_gb: float = 0.0


@dataclass
class _Box:
    """One function's container and its bookkeeping."""

    tenant: Tenant
    tally: _Tally = field(default_factory=_Tally)
    sim: KeepAliveSim = field(default_factory=KeepAliveSim)
    hist: IdleHistogram = field(default_factory=IdleHistogram.empty)
    state: str = "cold"
    since: float = 0.0
    """When the held state began, s."""
    power_since: float = 0.0
    """When its holding power began, s (after a load or resume)."""
    busy: bool = False
    busy_until: float = 0.0
    ready_at: float = 0.0
    idle_since: float = 0.0
    phases: list[Phase] = field(default_factory=lambda: [("cold", math.inf)])
    generation: int = 0
    """Bumped whenever scheduled events of the box go stale."""
    down: bool = False
    """Evicted since its last request: its phases only ever release memory."""
    waiting: list[float] = field(default_factory=list)
    first: bool = True

    @property
    def fn(self) -> Function:
        return self.tenant.fn

    def held(self) -> tuple[float, float]:
        _, gpu, host = _hold(self.fn, self.state)
        return gpu, host

    def close(self, t: float) -> None:
        """Account for the held state up to ``t``."""
        watts, gpu, host = _hold(self.fn, self.state)
        p0 = max(self.since, self.power_since)
        if t > p0 and watts > 0:
            self.sim.segments.append((p0, t, watts))
            self.sim.energy_j += watts * (t - p0)
        if t > self.since:
            self.sim.memory.append((self.since, t, gpu, host))
            self.sim.gpu_gb_s += gpu * (t - self.since)
        self.since = max(self.since, t)
        self.power_since = self.since

    def impulse(self, t0: float, joules: float, seconds: float) -> None:
        """A transition of ``joules`` spread over ``seconds`` from ``t0``."""
        if joules <= 0:
            return
        length = seconds if seconds > 0 else 1e-9
        self.sim.segments.append((t0, t0 + length, joules / length))
        self.sim.energy_j += joules

    def become(self, t: float, state: str) -> None:
        """Idle move to ``state`` at ``t``, paying the move."""
        j, s = _move(self.fn, self.state, state)
        self.impulse(t, j, s)
        self.close(t)
        self.set_state(state)

    def set_state(self, state: str) -> None:
        """Hold ``state`` from now, moving the node's memory tally with it."""
        gpu, host = self.held()
        self.state = state
        new_gpu, new_host = self.held()
        self.tally.gpu_gb += new_gpu - gpu
        self.tally.host_gb += new_host - host


def simulate_node(
    tenants: Sequence[Tenant], horizon_s: float, budget: NodeBudget | None = None
) -> list[KeepAliveSim]:
    """Replay every tenant's requests on one node within ``budget`` (default: no
    limit); containers are cold until their first request (every policy starts
    them on demand) and the last idle period runs to ``horizon_s``. One outcome
    per tenant, in order."""
    cap = budget or NodeBudget()
    for tenant in tenants:
        warm = tenant.fn.warm
        if warm.gpu_memory_gb > cap.gpu_memory_gb or warm.host_memory_gb > cap.host_memory_gb:
            raise ValueError(f"{tenant.fn.name}: its warm container does not fit in the node")
    tally = _Tally()
    boxes = [_Box(t, tally) for t in tenants]
    queue: EventQueue[tuple[int, int, int]] = EventQueue()

    def push(t: float, kind: int, b: int, payload: int) -> None:
        queue.push(t, (kind, b, payload), rank=kind)

    for b, box in enumerate(boxes):
        for i, a in enumerate(box.tenant.arrivals_s):
            push(float(a), _ARRIVE, b, i)
    waitlist: list[int] = []

    def used() -> tuple[float, float]:
        return tally.gpu_gb, tally.host_gb

    def make_room(b: int, t: float, gpu_need: float, host_need: float) -> bool:
        """Free ``gpu_need`` / ``host_need`` GB beyond what is free, evicting idle
        containers of other functions least recently used first; False (nothing
        evicted) if that cannot free enough."""
        gpu_used, host_used = used()
        gpu_free = cap.gpu_memory_gb - gpu_used
        host_free = cap.host_memory_gb - host_used
        if gpu_need <= gpu_free + 1e-9 and host_need <= host_free + 1e-9:
            return True
        victims = sorted(
            (v for v, x in enumerate(boxes) if v != b and not x.busy and x.state != "cold"),
            key=lambda v: boxes[v].idle_since,
        )
        plan: list[tuple[int, str]] = []
        for v in victims:
            gpu_short = gpu_need > gpu_free + 1e-9
            host_short = host_need > host_free + 1e-9
            if not gpu_short and not host_short:
                break
            x = boxes[v]
            gpu, host = x.held()
            to = "cold"
            if x.tenant.demote_to_tepid and x.state == "warm" and x.fn.tepid is not None:
                extra_host = x.fn.tepid.host_memory_gb - host
                if extra_host <= host_free - host_need + 1e-9:
                    to = "tepid"
            _, new_gpu, new_host = _hold(x.fn, to)
            if not (gpu_short and new_gpu < gpu - 1e-12) and not (
                host_short and new_host < host - 1e-12
            ):
                continue  # it frees none of the memory that is short: left as it is
            gpu_free += gpu - new_gpu
            host_free += host - new_host
            plan.append((v, to))
        if gpu_need > gpu_free + 1e-9 or host_need > host_free + 1e-9:
            return False
        for v, to in plan:
            x = boxes[v]
            x.become(t, to)
            x.down = True
            x.sim.evictions += 1
        return True

    def start(b: int, t: float) -> bool:
        """Start box ``b``'s waiting requests at ``t`` if its warm memory fits."""
        box = boxes[b]
        fn = box.fn
        gpu, host = box.held()
        if not make_room(b, t, fn.warm.gpu_memory_gb - gpu, fn.warm.host_memory_gb - host):
            return False
        state = box.state
        tep = fn.tepid
        if state == "warm":
            delay = 0.0
            box.sim.warm_starts += 1
        elif state == "tepid" and tep is not None:
            delay = tep.resume_s
            box.impulse(t, tep.resume_j, tep.resume_s)
            box.sim.tepid_starts += 1
        else:
            delay = fn.cold_start.time_s
            box.impulse(t, fn.cold_start.energy_j, fn.cold_start.time_s)
            box.sim.cold_starts += 1
        box.sim.warm_starts += len(box.waiting) - 1
        box.close(t)
        box.set_state("warm")
        box.busy = True
        box.down = False
        box.generation += 1
        box.ready_at = t + delay
        box.power_since = box.ready_at
        box.busy_until = box.ready_at
        for a in box.waiting:
            serve(box, a, box.ready_at)
        box.waiting = []
        push(box.busy_until, _DONE, b, box.generation)
        return True

    def serve(box: _Box, a: float, at: float) -> None:
        """Request arriving at ``a`` starts at ``at`` (s)."""
        fn = box.fn
        end = at + fn.service.time_s
        if fn.service.power_w > 0:
            box.sim.segments.append((at, end, fn.service.power_w))
            box.sim.energy_j += fn.service.power_w * fn.service.time_s
        box.sim.latencies_s.append(at - a)
        box.sim.served += 1
        box.busy_until = max(box.busy_until, end)

    def enter_phase(b: int, t: float, k: int) -> None:
        box = boxes[b]
        state, length = box.phases[k]
        _, gpu, host = _hold(box.fn, state)
        held_gpu, held_host = box.held()
        if gpu > held_gpu + 1e-12 or host > held_host + 1e-12:
            g_used, h_used = used()
            fits = (
                g_used - held_gpu + gpu <= cap.gpu_memory_gb + 1e-9
                and h_used - held_host + host <= cap.host_memory_gb + 1e-9
            )
            if not box.down and fits:
                box.become(t, state)
        else:
            box.become(t, state)
        if k + 1 < len(box.phases) and math.isfinite(length):
            push(t + length, _PHASE, b, box.generation * 1_000 + k + 1)

    def retry(t: float) -> None:
        while waitlist and start(waitlist[0], t):
            waitlist.pop(0)

    while queue:
        t, (kind, b, payload) = queue.pop()
        box = boxes[b]
        if kind == _ARRIVE:
            box.sim.requests += 1
            if box.busy:
                box.sim.warm_starts += 1
                before = box.busy_until
                serve(box, t, max(t, box.ready_at))
                if box.busy_until > before:
                    box.generation += 1
                    push(box.busy_until, _DONE, b, box.generation)
            elif box.waiting:
                box.waiting.append(t)
            else:
                if not box.first:
                    box.hist.add(t - box.idle_since)
                box.first = False
                box.generation += 1  # the idle phases end here
                box.waiting = [t]
                if not start(b, t):
                    box.sim.waits += 1
                    waitlist.append(b)
        elif kind == _DONE:
            if payload != box.generation:
                continue
            box.busy = False
            box.idle_since = t
            timed = box.tenant.timed
            box.phases = timed(t, box.hist) if timed is not None else box.tenant.policy(box.hist)
            if t < horizon_s:
                enter_phase(b, t, 0)
            retry(t)
        else:
            generation, k = divmod(payload, 1_000)
            if generation != box.generation or box.busy or box.waiting or t >= horizon_s:
                continue
            enter_phase(b, t, k)
            retry(t)
    for box in boxes:
        box.close(max(horizon_s, box.idle_since))
    return [box.sim for box in boxes]


def simulate(
    fn: Function, arrivals_s: Sequence[float], policy: Policy, horizon_s: float
) -> KeepAliveSim:
    """Replay ``arrivals_s`` (sorted, within ``horizon_s``) of one function alone on
    a node with no memory limit."""
    return simulate_node([Tenant(fn, arrivals_s, policy)], horizon_s)[0]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` (0 when empty)."""
    return float(np.percentile(np.asarray(values), q)) if len(values) else 0.0
