"""The global scheduler: places every request from the plan and GPU state summaries
with table lookups only, and reacts to forecast error between plans.

Per request of workload w (``route``), in order:

1. *Candidates*: the next instance of a precomputed weighted cycle over the
   plan's rates (smooth weighted round robin unrolled into ``SCHEDULE_SLOTS``
   entries when the instances change) and the next one of a plain rotation.
   The cycle's instance takes the request unless it has a queue and the other
   one's expected backlog ``(queued + 1) / capacity`` is smaller (with both
   queues empty the plan's split stands: a faster, boosted instance does not
   draw the load of its slower neighbours).
2. *Risk*: by its rate, when the instance's observed rate (an exponentially
   weighted meter, ``rate_tau_s``) exceeds ``risk_utilization`` x its SLO
   capacity at the GPU's current clock and share; at or above the plan's clock
   also its planned rate (which the plan was verified at), that limit raised by
   the meter's ``risk_z``-sigma Poisson noise there (a rate within the noise of
   the planned rate is the load the plan was made for); also when a fast meter
   of the same arrivals (``fast_tau_s``) exceeds that limit by its own
   ``risk_z``-sigma noise (a burst's onset, seconds sooner). By its queue, when it
   exceeds ``backlog_fraction`` x capacity x TTFT SLO (the requests it can start
   within that part of the SLO), and at least ``queue_floor`` requests.
3. *Reactions*, cheapest first, while at risk:
   a. **clock boost**: ``raise_to`` gives the lowest clock at or above the
      current one at which the slice covers the load (the larger of the two
      meters) plus the backlog's drain rate (the table's load grid rounds up: the
      clock below its answer is checked with its exact capacity); a boost for a
      queue alone goes up at most k x ``queue_boost_steps`` candidate clocks, k
      the queue over its risk level rounded up, once per ``drain_s``; from
      below the plan's clock no higher than the plan's while the rate is within
      the plan's. The GPU's estimated power at that clock (static on-power plus,
      for each open slice, its fixed part and its marginal power per request/s x
      its observed rate) must fit the GPU's cap and
      the node's budget, else the highest clock that fits (bisection over the
      type's clocks). The power limit set with it is that estimate x
      ``limit_margin``, clamped to [type minimum, cap]. Never above the type's
      largest candidate clock.
   b. **share shift** (MPS, one GPU): a co-located instance whose observed rate
      fits a share one level smaller gives that level to the one at risk.
   c. **spill**: up to ``spill_probes`` further instances of w are probed; the
      first not at risk takes the request.
   d. **wake**: when w's observed rate has exceeded its planned rate by
      ``wake_error`` for ``wake_after_s`` while its instances were at risk, a GPU
      the plan left off is switched on with one instance of w on all of it, at
      the lowest clock covering the excess (at most one per ``wake_after_s`` per
      workload). The next plan decides its fate.
4. *Admission*: a request is shed (it misses its SLO; see docs/online.md) when
   the chosen instance already holds ``queue_limit`` waiting requests, the
   number it could start within ``queue_factor`` x its TTFT SLO at its largest
   clock; every queue therefore stays bounded.

``tick`` (after an iteration of an instance, and for the candidates of every
decision) looks at a GPU at most once per ``hold_s``. A boosted GPU returns to
the plan's clock and shares when every instance on it is calm at the plan's
settings: its observed rate within ``calm_utilization / risk_utilization`` of
the larger of its planned rate and ``risk_utilization`` x its capacity at the
plan's clock and share, and its queue below its risk level. Otherwise the GPU
is **harvested**: lowered to the cheapest clock at which every slice covers
its *need*, its observed rate r x (1 + m), m its workload's harvest margin
(``set_margins``: the spread of its observed forecast errors,
``ErrorHeadroom.spread``; ``harvest_margin`` without them), at least the
meter's ``error_z``-sigma noise at r. Per slice: the lowest clock whose
capacity in its share covers the need (``raise_to`` from the type's lowest
clock, then the clock below its answer with the exact capacity), the plan's
clock at most while its rate is within the plan's (plus half the ``risk_z``
noise), except on a boosted GPU that is not calm (no lower than the clock
covering the need); the GPU's clock is the largest of them. With MPS and two or more slices,
one clock lower is tried with the shares re-divided (each slice's cheapest
share covering its need there, ``raise_to`` with nothing used) when they fit the
GPU. A harvest only lowers, never while a queue is at its risk level, and may
go below the plan's clock (the plan was sized for the forecast's peak plus
headroom). Below the plan's clock the rate test of step 2 has no floor at the
planned rate: a harvested slice is raised once its rate uses half its margin
(rate > capacity / (1 + m/2)), to a clock covering r x (1 + m) again (the
hysteresis is half the margin m). A new plan (``set_gpus``) ends a boost only
where it gives the GPU at least the boosted clock or turns it off; otherwise the
boost goes on at its clock until the calm test ends it.

With an ``attainment_target`` (online/attainment.py), every workload's share of
first tokens within its TTFT SLO is counted from the serving engine's reports
(``first_tokens``; a shed request counts as late); where it stays below the
target by more than chance, the workload's risk utilisation is divided by a
factor k > 1 and its harvest need multiplied by k (both for that workload's
instances only), and k falls back to 1 once the misses stop.

Every step is O(1) in the fleet size: a decision touches at most 2 +
``spill_probes`` instances and one GPU (with its co-located instances, at most
the share capacity over the smallest share). ``lookup_budget`` is the most
table lookups a decision makes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from energyopt.control import GpuControl, Refused
from energyopt.online.attainment import AttainmentGuard
from energyopt.online.lookups import OpLookups
from energyopt.online.state import Actuator, GpuInfo, GpuState, InstanceInfo, RateMeter, Slot

SCHEDULE_SLOTS = 64
"""Entries of a workload's weighted cycle."""


@dataclass(frozen=True)
class OnlineConfig:
    """Thresholds of the global scheduler (dimensionless unless a unit is named)."""

    rate_tau_s: float = 10.0
    fast_tau_s: float = 2.0  # the fast meter's time constant (burst onsets), s
    risk_utilization: float = 1.0
    calm_utilization: float = 0.85
    backlog_fraction: float = 1.0
    drain_s: float = 2.0  # backlog is to be cleared within this, s
    hold_s: float = 5.0  # least time a boost or shift stays, s
    spill_probes: int = 2
    wake_error: float = 0.15
    wake_after_s: float = 5.0
    wake_tau_s: float = 10.0
    queue_factor: float = 2.0
    limit_margin: float = 1.15
    shift: bool = True
    wake: bool = True
    trim: bool = True  # harvest: lower clocks (and shares) to the observed load
    harvest_margin: float = 0.1  # harvest margin without observed forecast errors
    error_z: float = 1.2816  # rate-meter noise counted in a harvest margin, sigmas
    risk_z: float = 2.3263  # rate-meter noise above the planned rate that is no risk, sigmas
    min_rate_rps: float = 0.05  # rates below this count as this in a harvest, req/s
    queue_floor: int = 2  # a queue up to this is never a risk, requests
    queue_boost_steps: int = 2  # most candidate clocks one boost for a queue raises
    # burst memory: a workload's highest rate (its burst meter, time constant
    # burst_tau_s, s) in the current and the previous burst_memory_s (s; 0: off) is
    # remembered; a boost of a slice at risk covers at least its part of it
    burst_memory_s: float = 0.0
    burst_tau_s: float = 5.0
    # a harvest leaves every slice a capacity that starts at least this many requests
    # within its TTFT SLO (requests; 0: no floor)
    harvest_start_floor: float = 0.0
    # attainment guard (online/attainment.py): per workload, the TTFT attainment aimed
    # at (fraction; 0: off), the time constant of its counts (s), the least time
    # between two changes of its factor (s), the factor's step and its largest value
    attainment_target: float = 0.0
    guard_tau_s: float = 60.0
    guard_hold_s: float = 10.0
    guard_step: float = 0.1
    guard_max_factor: float = 2.0


@dataclass
class OnlineStats:
    """What the global scheduler did."""

    decisions: int = 0
    lookups: int = 0
    max_lookups: int = 0
    boosts: int = 0
    restores: int = 0
    trims: int = 0
    shifts: int = 0
    spills: int = 0
    wakes: int = 0
    shed: int = 0
    capped: int = 0  # boosts held below the wanted clock by a power cap or budget
    refused: int = 0  # changes the GPU control refused (the scheduler's view stays)
    over_budget: int = 0  # decisions that used more lookups than the stated budget
    shed_by_workload: dict[int, int] = field(default_factory=dict)
    risk_rate: int = 0  # decisions whose chosen instance was at risk by its observed rate
    risk_queue: int = 0  # ... by its queue alone
    above_plan_s: float = 0.0  # GPU-seconds at a clock above the plan's (s)
    below_plan_s: float = 0.0  # GPU-seconds at a clock below the plan's (s)
    boost_steps: int = 0  # candidate-clock steps the boosts raised, summed
    harvest_shares: int = 0  # harvests that re-divided the shares of a GPU
    harvest_blocked: int = 0  # harvests not made: a slice's queue at its risk level
    boosts_carried: int = 0  # boosts kept through a new plan (set_gpus)
    guard_raises: int = 0  # attainment-guard factors raised (a workload missed its target)
    guard_lowers: int = 0  # ... lowered again


@dataclass
class _Workload:
    schedule: list[Slot] = field(default_factory=list)
    order: list[Slot] = field(default_factory=list)
    cursor: int = 0
    rotor: int = 0
    planned_rps: float = 0.0
    rate: RateMeter = field(default_factory=lambda: RateMeter(10.0))
    error_since: float = math.inf
    last_wake: float = -math.inf
    burst: RateMeter = field(default_factory=lambda: RateMeter(5.0))
    peak_rps: float = 0.0  # highest burst-meter rate in the current memory window (req/s)
    peak_before_rps: float = 0.0  # ... in the window before it (req/s)
    peak_window: int = 0  # index of the current window (time // burst_memory_s)
    guard: AttainmentGuard = field(default_factory=AttainmentGuard)


def lookup_budget(slots_per_gpu: int, clocks: int) -> int:
    """Most table lookups of one decision with ``slots_per_gpu`` = k slices on a GPU
    and a type of ``clocks`` candidate clocks:

    * one ``tick`` of the other candidate's GPU: a harvest (per slice a ``raise_to``
      and a capacity, then per slice a ``raise_to`` for the share re-division, a
      power estimate of 1 + k, the k new capacities) or a restore (fewer): 5k + 1;
    * a boost: one ``raise_to`` and one capacity, up to ``ceil(log2 clocks) + 1``
      power estimates of 1 + k (the first, then a bisection under the cap), the k
      new capacities;
    * a share shift: one capacity per donor (k - 1) and one for the receiver: k;
    * a wake: a capacity, a ``raise_to``, an on-power and a slice power, then the
      new instance's three capacities (current, plan and highest clock): 7.

    A calm decision makes two ticks and nothing else (10k + 2 at most)."""
    k = slots_per_gpu
    probes = math.ceil(math.log2(max(clocks, 1))) + 1
    tick = 5 * k + 1
    boost = 2 + probes * (1 + k) + k
    return tick + max(boost + k + 7, tick)


class GlobalScheduler:
    """Per-request placement and reactions between plans (see module docs)."""

    def __init__(
        self,
        lookups: OpLookups,
        actuator: Actuator,
        ttft_s: list[float],
        config: OnlineConfig | None = None,
        *,
        mps: bool = True,
        node_budget_w: dict[str, float] | None = None,
        control: GpuControl | None = None,
    ) -> None:
        self.lk = lookups
        self.act = actuator
        self.control: GpuControl = control if control is not None else _ActuatorControl(self)
        """Where clock, power-limit and share changes go (the node agent's client, the
        simulator's simulated agent); without one, the actuator's ``set_clock`` and
        ``set_share``."""
        self.now_s = 0.0  # time of the decision being made, s
        self.refusals: list[Refused] = []  # the last few refusals, newest last
        self.cfg = config or OnlineConfig()
        self.ttft_s = ttft_s
        self.mps = mps
        self.node_budget_w = node_budget_w or {}
        self.stats = OnlineStats()
        self.gpus: dict[str, GpuState] = {}
        self.slots: dict[int, Slot] = {}
        cfg = self.cfg
        self.workloads = [
            _Workload(
                rate=RateMeter(cfg.wake_tau_s),
                burst=RateMeter(cfg.burst_tau_s),
                guard=AttainmentGuard(
                    target=cfg.attainment_target,
                    tau_s=cfg.guard_tau_s,
                    hold_s=cfg.guard_hold_s,
                    step=cfg.guard_step,
                    max_factor=cfg.guard_max_factor,
                ),
            )
            for _ in ttft_s
        ]
        self.node_power_w: dict[str, float] = {}
        self.off: list[str] = []
        self.margins: list[float] = []  # per workload (set_margins); empty: the config's
        self.epoch = 0  # plans seen; a slot of an older plan is refreshed
        caps = [
            max(len(s) for s in lookups.shares.values()) if lookups.shares else 1,
        ]
        smallest = min((min(s) for s in lookups.shares.values() if s), default=100)
        largest = max((max(s) for s in lookups.shares.values() if s), default=100)
        caps.append(max(1, largest // max(smallest, 1)))
        clocks = max((len(c) for c in lookups.clocks.values()), default=1)
        self.budget = lookup_budget(max(caps), clocks)

    # -- state from the plan -----------------------------------------------------------

    def set_gpus(self, gpus: list[GpuInfo], now_s: float | None = None) -> None:
        """The GPUs as a new plan leaves them (clocks, on/off) at ``now_s`` (s; default:
        the last decision's time); the instances given next by ``set_instances`` get
        the new plan's capacities. A GPU that was boosted above the new plan's clock
        and stays on with instances keeps its clock as a boost (the GPU control sets
        it again), and the calm test returns it to the plan's clock: a plan made
        during a burst would otherwise drop the clock the burst needs, and the
        queue would have to build up again before the next boost (ramp+flash, seed
        21: 72 of 113 first tokens late in the 5 s after an epoch's plan). Other
        boosts end."""
        now = self.now_s if now_s is None else now_s
        self.now_s = now
        self.epoch += 1
        self.off = []
        carried: list[tuple[GpuState, int]] = []
        for info in gpus:
            old = self.gpus.get(info.id)
            state = GpuState(info, info.clock_mhz, info.clock_mhz, clock_since_s=now)
            if old is not None:
                self._account(old, now)
                state.slots = [s for s in old.slots if s.info.id in self.slots]
                if old.boosted and old.info.on and info.on and old.clock > info.clock_mhz:
                    carried.append((state, old.clock))
            self.gpus[info.id] = state
            for s in state.slots:
                s.gpu = state
            if not info.on:
                self.off.append(info.id)
        self.node_power_w = {}
        for g in self.gpus.values():
            if g.info.on:
                g.power_w = self._power(g, g.clock)
                self.node_power_w[g.info.node] = self.node_power_w.get(g.info.node, 0.0) + g.power_w
        for g, clock in carried:  # a boost outlives the plan (see docstring)
            power = self._power(g, clock)
            if g.slots and self._fits(g, power) and self._set_clock(g, clock, power, now):
                g.boosted = True
                self.stats.boosts_carried += 1

    def set_instances(self, workload: int, instances: list[InstanceInfo], now_s: float) -> None:
        """The instances that take new requests of ``workload`` (plan applied, an
        instance became ready or went away). Rebuilds that workload's cycles."""
        wl = self.workloads[workload]
        keep: list[Slot] = []
        alive = {i.id for i in instances}
        for sid in [sid for sid, s in self.slots.items() if s.info.workload == workload]:
            if sid not in alive:
                self._drop(self.slots.pop(sid))
        for info in instances:
            slot = self.slots.get(info.id)
            if slot is None:
                slot = self._new_slot(info, now_s)
                self.slots[info.id] = slot
            else:
                slot.info = info
                if slot.epoch != self.epoch:
                    self._refresh(slot)
            keep.append(slot)

        def tier(s: Slot) -> int:
            return (0 if now_s >= s.info.ready_s else 2) + (1 if s.info.draining else 0)

        best = min((tier(s) for s in keep), default=0)
        order = [s for s in keep if tier(s) == best]
        wl.order = order
        wl.planned_rps = sum(s.info.planned_rps for s in keep if not s.info.draining)
        wl.schedule = _weighted_cycle(order)
        wl.cursor = 0
        wl.rotor = 0

    def _new_slot(self, info: InstanceInfo, now_s: float) -> Slot:
        gpu = self.gpus.get(info.gpus[0]) if info.tp == 1 else None
        meter = RateMeter(self.cfg.rate_tau_s, value=info.planned_rps, at_s=now_s)
        slot = Slot(info, meter, info.share, info.share, gpu, ttft_s=self.ttft_s[info.workload])
        slot.fast = RateMeter(self.cfg.fast_tau_s, value=info.planned_rps, at_s=now_s)
        if gpu is not None:
            gpu.slots.append(slot)
        self._refresh(slot)
        return slot

    def _refresh(self, slot: Slot) -> None:
        """The slot's share, capacities and queue bound under the current plan."""
        info = slot.info
        slot.epoch = self.epoch
        slot.share = slot.plan_share = info.share
        gpu = slot.gpu
        if gpu is not None:
            t = gpu.info.gpu_type
            slot.capacity_rps = self.lk.capacity_rps(info.label, t, gpu.clock, info.share)
            slot.plan_capacity_rps = self.lk.capacity_rps(info.label, t, gpu.plan_clock, info.share)
            top = self.lk.capacity_rps(info.label, t, gpu.info.max_clock_mhz, info.share)
        else:
            # a tensor-parallel group is not re-clocked online: its planned rate
            # stands for its capacity
            slot.capacity_rps = slot.plan_capacity_rps = top = max(info.planned_rps, 1e-3)
        slot.queue_limit = max(1, math.ceil(self.cfg.queue_factor * top * slot.ttft_s))

    def _drop(self, slot: Slot) -> None:
        if slot.gpu is not None and slot in slot.gpu.slots:
            slot.gpu.slots.remove(slot)

    # -- decisions ---------------------------------------------------------------------

    def route(self, workload: int, now_s: float) -> int | None:
        """The instance (id) that takes a new request of ``workload``, or None: shed."""
        start = self.lk.counter.count
        st = self.stats
        st.decisions += 1
        wl = self.workloads[workload]
        if not wl.schedule:
            raise RuntimeError(f"no instance serves workload {workload}")
        a = wl.schedule[wl.cursor % len(wl.schedule)]
        wl.cursor += 1
        b = wl.order[wl.rotor % len(wl.order)]
        wl.rotor += 1
        # the weighted cycle's instance unless it has a queue that the other one would
        # start sooner (with both queues empty, the plan's split stands)
        chosen = a if b is a or a.info.view.queued == 0 or _backlog(a) <= _backlog(b) else b
        other = b if chosen is a else a
        w_rate = wl.rate.add(now_s)
        if self.cfg.burst_memory_s > 0.0:
            self._remember_burst(wl, now_s)
        self.tick(other.info.id, now_s)
        chosen.rate.add(now_s)
        chosen.fast.add(now_s)
        cause = self._risk(chosen, now_s)
        risky = cause > 0
        if risky:
            if cause == 1:
                st.risk_rate += 1
            else:
                st.risk_queue += 1
            self._boost(chosen, now_s, cause)
            risky = self._at_risk(chosen, now_s)
            if risky and self.cfg.shift and self.mps:
                self._shift(chosen, now_s)
                risky = self._at_risk(chosen, now_s)
            if risky:
                alt = self._spill(wl, chosen, now_s)
                if alt is not None:
                    _uncount(chosen)
                    alt.rate.add(now_s)
                    alt.fast.add(now_s)
                    chosen = alt
                    st.spills += 1
                    risky = False
        else:
            self.tick(chosen.info.id, now_s)
        self._track_error(workload, wl, w_rate, risky, now_s)
        used = self.lk.counter.count - start
        st.lookups += used
        st.max_lookups = max(st.max_lookups, used)
        if used > self.budget:
            st.over_budget += 1
        if chosen.info.view.queued >= chosen.queue_limit:
            st.shed += 1
            st.shed_by_workload[workload] = st.shed_by_workload.get(workload, 0) + 1
            _uncount(chosen)
            self.first_tokens(workload, 0, 1, now_s)  # a shed request is a miss
            return None
        return chosen.info.id

    def _at_risk(self, s: Slot, now_s: float) -> bool:
        return self._risk(s, now_s) > 0

    def _risk(self, s: Slot, now_s: float) -> int:
        """0: not at risk; 1: at risk by the observed rate; 2: by the queue alone."""
        cap = s.capacity_rps
        limit = self._utilization(s) * cap
        g = s.gpu
        rate = s.rate.read(now_s)
        z = self.cfg.risk_z
        if g is None or g.clock >= g.plan_clock:
            # at the plan's clock or above: not before the rate exceeds the planned rate
            # (the plan was verified at it; over the guard's factor) by more than the
            # meter's noise there
            limit = max(limit, s.info.planned_rps / self._factor(s))
            slow = limit * (1.0 + self._noise(limit, z))
        else:
            # harvested: raised once half the harvest margin is used, before the rate
            # reaches the lowered clock's capacity (a ramp is met with headroom left)
            limit /= 1.0 + 0.5 * self._margin(s, rate)
            slow = limit
        # the fast meter sees a burst's onset seconds sooner; its larger noise is
        # counted at the same confidence
        fast = limit * (1.0 + self._noise(limit, z, self.cfg.fast_tau_s))
        if rate > slow or s.fast.read(now_s) > fast:
            return 1
        if s.info.view.queued > self._queue_risk(cap, s.ttft_s):
            return 2
        return 0

    def _queue_risk(self, capacity_rps: float, ttft_s: float) -> float:
        """Queue above which a slice is at risk: the requests it starts within
        ``backlog_fraction`` x its TTFT SLO at ``capacity_rps``, at least
        ``queue_floor`` (requests that arrived during the iteration in progress wait
        for the next one: a queue that short is no sign of overload)."""
        cfg = self.cfg
        return max(float(cfg.queue_floor), cfg.backlog_fraction * capacity_rps * ttft_s)

    def _factor(self, s: Slot) -> float:
        """Slice ``s``'s workload's attainment-guard factor (1: no misses beyond its
        target)."""
        return self.workloads[s.info.workload].guard.factor

    def _utilization(self, s: Slot) -> float:
        """``risk_utilization`` over slice ``s``'s guard factor (fraction of its
        capacity it may use before it is at risk)."""
        return self.cfg.risk_utilization / self._factor(s)

    def _safe_rps(self, s: Slot) -> float:
        """The rate (req/s) slice ``s`` holds at its plan's settings without risk: the
        larger of ``risk_utilization`` x its plan capacity and its planned rate, over
        its guard factor."""
        return max(self.cfg.risk_utilization * s.plan_capacity_rps, s.info.planned_rps) / (
            self._factor(s)
        )

    def guard_factors(self) -> list[float]:
        """Every workload's attainment-guard factor (1: no misses beyond its target)."""
        return [w.guard.factor for w in self.workloads]

    def first_tokens(self, workload: int, on_time: int, late: int, now_s: float) -> None:
        """The serving engine's report: ``on_time`` first tokens of ``workload`` came
        within its TTFT SLO and ``late`` after it, at ``now_s`` (s). Feeds the
        workload's attainment guard (online/attainment.py); O(1), no lookups."""
        change = self.workloads[workload].guard.observe(on_time, late, now_s)
        if change > 0:
            self.stats.guard_raises += 1
        elif change < 0:
            self.stats.guard_lowers += 1

    def _need_rps(self, s: Slot, now_s: float) -> float:
        """Load the slice must cover: the observed rate plus draining the backlog."""
        load = max(s.rate.read(now_s), s.fast.read(now_s)) / self._utilization(s)
        return load + s.info.view.queued / self.cfg.drain_s

    def _power(self, g: GpuState, clock: int) -> float:
        """Estimated draw of ``g`` at ``clock`` with its slices' observed rates (W): the
        on-power, and each open slice's fixed part plus its marginal part x its rate."""
        t = g.info.gpu_type
        total = self.lk.on_power_w(t, clock)
        for s in g.slots:
            w = self.lk.slice_power_w(s.info.label, t, clock, s.share, s.rate.read(s.rate.at_s))
            if w == w:
                total += w
        return total

    def _fits(self, g: GpuState, power_w: float) -> bool:
        if power_w > g.info.cap_w:
            return False
        budget = self.node_budget_w.get(g.info.node)
        if budget is None:
            return True
        node = self.node_power_w.get(g.info.node, 0.0) - g.power_w + power_w
        return node <= budget

    def _refused(self, exc: Refused) -> bool:
        self.stats.refused += 1
        self.refusals = [*self.refusals[-7:], exc]
        return False

    def _set_clock(self, g: GpuState, clock: int, power_w: float, now_s: float) -> bool:
        """Set ``g``'s power limit (the estimate ``power_w`` x ``limit_margin``, clamped)
        and lock its clock through the GPU control; False (nothing assumed changed) when
        the control refuses."""
        limit = min(g.info.cap_w, max(g.info.min_limit_w, power_w * self.cfg.limit_margin))
        self.now_s = now_s
        try:
            self.control.set_power_limit(g.info.id, limit)
        except Refused as exc:
            return self._refused(exc)
        g.limit_w = limit
        try:
            self.control.set_clock(g.info.id, clock)
        except Refused as exc:
            return self._refused(exc)
        node = g.info.node
        self.node_power_w[node] = self.node_power_w.get(node, 0.0) - g.power_w + power_w
        g.power_w = power_w
        self._account(g, now_s)
        g.clock = clock
        g.changed_s = now_s
        t = g.info.gpu_type
        for s in g.slots:
            s.capacity_rps = self.lk.capacity_rps(s.info.label, t, clock, s.share)
        return True

    def account(self, now_s: float) -> None:
        """Bring ``OnlineStats.above_plan_s`` and ``below_plan_s`` up to ``now_s`` (s)
        for every GPU (at the end of a run)."""
        for g in self.gpus.values():
            self._account(g, now_s)

    def _account(self, g: GpuState, now_s: float) -> None:
        """Add the time since ``g``'s last clock change to the GPU-seconds above or below
        its plan's clock (``OnlineStats.above_plan_s``, ``below_plan_s``)."""
        dt = max(now_s - g.clock_since_s, 0.0)
        if g.clock > g.plan_clock:
            self.stats.above_plan_s += dt
        elif g.clock < g.plan_clock:
            self.stats.below_plan_s += dt
        g.clock_since_s = now_s

    def _set_shares(self, g: GpuState, shares: list[tuple[Slot, int]], now_s: float) -> bool:
        """Give the slices ``shares`` (slice, percent) on ``g`` through the GPU control,
        all at once; False (nothing changed) when the control refuses."""
        self.now_s = now_s
        try:
            self.control.shift_shares(g.info.id, {_client(s): pct for s, pct in shares})
        except Refused as exc:
            return self._refused(exc)
        for s, pct in shares:
            s.share = pct
        return True

    def _boost(self, s: Slot, now_s: float, cause: int = 1) -> None:
        """Raise ``s``'s GPU to cover its load (see module docs); a slice at risk by its
        queue alone (``cause`` 2) raises it by at most ``queue_boost_steps`` candidate
        clocks, once per ``drain_s``, and a harvested GPU at least to the plan's."""
        g = s.gpu
        if g is None or not g.info.on:
            return
        t = g.info.gpu_type
        clocks = self.lk.clocks.get(t, ())
        if not clocks or g.clock >= clocks[-1]:
            return
        harvested = g.clock < g.plan_clock
        if (
            cause == 2
            and not harvested
            and g.boosted
            and now_s - g.changed_s < self.cfg.drain_s
            and self._burst_need(s, now_s) <= s.capacity_rps
        ):
            return
        # share in use by everything but this slice's own share: the answer fits in it
        others = self.lk.share_capacity[t] - s.share
        need = self._need_rps(s, now_s)
        if harvested:  # back up with the harvest margin again, not to the bare rate
            need = max(need, self._need(s, now_s))
        # burst memory: a slice at risk covers its part of the workload's recent peak
        # at once (neither step-limited nor held at the plan's clock)
        burst = self._burst_need(s, now_s)
        to_peak = burst > need
        need = max(need, burst)
        want, _ = self.lk.raise_to(s.info.label, t, g.clock, others, need)
        if want < 0:
            want = clocks[-1]
        want = min(want, clocks[-1], g.info.max_clock_mhz)
        if cause == 2 and harvested:  # a queue on a harvested GPU: the plan's clock at once
            want = max(want, g.plan_clock)
        if want <= g.clock:
            return
        # raise_to answers on the table's load grid (rounded up): the clock below its
        # answer may cover the load already (its exact capacity, one lookup)
        i = _index_at_least(clocks, want)
        below = clocks[i - 1] if i > 0 else g.clock
        if below > g.clock and self.lk.capacity_rps(s.info.label, t, below, s.share) >= need:
            want = below
        if cause == 2 and not to_peak:
            # a queue k times its risk level raises up to k x queue_boost_steps clocks:
            # a short queue is often a long prompt, a long one a burst's onset
            k = math.ceil(s.info.view.queued / self._queue_risk(s.capacity_rps, s.ttft_s))
            step = _index_at_least(clocks, g.clock) + self.cfg.queue_boost_steps * max(k, 1)
            want = min(want, clocks[min(step, len(clocks) - 1)])
            if harvested:  # a queue on a harvested GPU: the plan's clock at once
                want = max(want, g.plan_clock)
        if harvested and want > g.plan_clock and not to_peak:
            # harvested: back to the plan's clock (verified at the planned rate) while
            # the slice's rate is within its plan's
            safe = self._safe_rps(s)
            if s.rate.read(now_s) <= safe * (1.0 + self._noise(safe, self.cfg.risk_z)):
                want = g.plan_clock
        power = self._power(g, want)
        if not self._fits(g, power):
            self.stats.capped += 1
            lo = _index_at_least(clocks, g.clock)
            hi = _index_at_least(clocks, want)
            best = -1
            best_w = 0.0
            while lo < hi:  # the highest clock in (current, want) whose power fits
                mid = (lo + hi + 1) // 2
                w = self._power(g, clocks[mid])
                if self._fits(g, w) and clocks[mid] > g.clock:
                    best, best_w, lo = mid, w, mid
                else:
                    hi = mid - 1
            if best < 0:
                return
            want, power = clocks[best], best_w
        before = g.clock
        if not self._set_clock(g, want, power, now_s):
            return
        g.boosted = True
        self.stats.boosts += 1
        self.stats.boost_steps += _index_at_least(clocks, want) - _index_at_least(clocks, before)

    def _remember_burst(self, wl: _Workload, now_s: float) -> None:
        """Count an arrival on ``wl``'s burst meter and keep the highest rate it has read
        in the current ``burst_memory_s`` window (O(1))."""
        rate = wl.burst.add(now_s)
        self._roll_peak(wl, now_s)
        wl.peak_rps = max(wl.peak_rps, rate)

    def _roll_peak(self, wl: _Workload, now_s: float) -> None:
        """Move ``wl``'s peak windows on to the one holding ``now_s``."""
        index = int(now_s // self.cfg.burst_memory_s)
        if index != wl.peak_window:
            wl.peak_before_rps = wl.peak_rps if index == wl.peak_window + 1 else 0.0
            wl.peak_rps = 0.0
            wl.peak_window = index

    def _peak_rps(self, wl: _Workload, now_s: float) -> float:
        """``wl``'s remembered burst peak at ``now_s`` (req/s): the highest rate of its
        burst meter over the current and the previous ``burst_memory_s`` window, so
        a peak is kept between one and two windows; 0 with the memory off."""
        if self.cfg.burst_memory_s <= 0.0:
            return 0.0
        self._roll_peak(wl, now_s)
        return max(wl.peak_rps, wl.peak_before_rps)

    def _burst_need(self, s: Slot, now_s: float) -> float:
        """Slice ``s``'s part of its workload's remembered burst peak (req/s): the peak
        times the slice's share of the workload's planned rate, plus its backlog
        drained within ``drain_s``; 0 with the memory off or no planned rate."""
        wl = self.workloads[s.info.workload]
        peak = self._peak_rps(wl, now_s)
        if peak <= 0.0 or wl.planned_rps <= 0.0 or s.info.draining:
            return 0.0
        part = peak * min(s.info.planned_rps / wl.planned_rps, 1.0)
        return part / self._utilization(s) + s.info.view.queued / self.cfg.drain_s

    def _shift(self, s: Slot, now_s: float) -> None:
        g = s.gpu
        if g is None or len(g.slots) < 2:
            return
        t = g.info.gpu_type
        levels = self.lk.shares.get(t, ())
        up = _next_level(levels, s.share)
        if up is None:
            return
        gain = up - s.share
        for d in g.slots:
            new_down = d.share - gain
            if d is s or new_down not in levels:
                continue
            cap_d = self.lk.capacity_rps(d.info.label, t, g.clock, new_down)
            if d.rate.read(now_s) > self.cfg.calm_utilization * cap_d or d.info.view.queued > 0:
                continue
            cap_s = self.lk.capacity_rps(s.info.label, t, g.clock, up)
            if cap_s <= s.capacity_rps:
                return
            if not self._set_shares(g, [(d, new_down), (s, up)], now_s):
                return
            d.capacity_rps = cap_d
            s.capacity_rps = cap_s
            g.changed_s = now_s
            g.boosted = True
            self.stats.shifts += 1
            return

    def _spill(self, wl: _Workload, chosen: Slot, now_s: float) -> Slot | None:
        n = len(wl.order)
        for _ in range(min(self.cfg.spill_probes, n)):
            cand = wl.order[wl.rotor % n]
            wl.rotor += 1
            if cand is not chosen and not self._at_risk(cand, now_s):
                return cand
        return None

    def _track_error(
        self, workload: int, wl: _Workload, w_rate: float, risky: bool, now_s: float
    ) -> None:
        """Wake a GPU when the forecast error persists (see module docs)."""
        if not (risky and w_rate > (1.0 + self.cfg.wake_error) * wl.planned_rps):
            wl.error_since = math.inf
            return
        if wl.error_since == math.inf:
            wl.error_since = now_s
        if (
            not self.cfg.wake
            or now_s - wl.error_since < self.cfg.wake_after_s
            or now_s - wl.last_wake < self.cfg.wake_after_s
            or not self.off
        ):
            return
        gid = self.off[-1]
        g = self.gpus[gid]
        t = g.info.gpu_type
        label = wl.order[0].info.label
        if ":" in label:  # a disaggregated workload: woken instances run both phases
            return
        clocks = self.lk.clocks.get(t, ())
        share = max(self.lk.shares.get(t, (0,)))
        if not clocks or self.lk.capacity_rps(label, t, clocks[-1], share) <= 0:
            return
        excess = w_rate - wl.planned_rps
        clock, _ = self.lk.raise_to(label, t, clocks[0], 0, excess)
        if clock < 0:
            clock = clocks[-1]
        clock = min(clock, g.info.max_clock_mhz)
        # the new slice is opened: its fixed part, and its marginal part for the excess
        power = self.lk.on_power_w(t, clock) + self.lk.slice_power_w(label, t, clock, share, excess)
        if power != power or not self._fits(g, power):
            return
        self.off.pop()
        g.info = GpuInfo(
            g.info.id,
            t,
            g.info.node,
            True,
            clock,
            g.info.max_clock_mhz,
            g.info.cap_w,
            g.info.min_limit_w,
        )
        g.clock = g.plan_clock = clock
        g.power_w = power
        self.node_power_w[g.info.node] = self.node_power_w.get(g.info.node, 0.0) + power
        g.limit_w = min(g.info.cap_w, max(g.info.min_limit_w, power * self.cfg.limit_margin))
        wl.last_wake = now_s
        wl.error_since = math.inf
        self.stats.wakes += 1
        self.act.wake(gid, workload, clock, now_s)

    def set_margins(self, margins: list[float]) -> None:
        """Per-workload harvest margins (fractions of the observed rate; the error
        quantile above the median of each workload's recent forecast errors,
        ``ErrorHeadroom.spread``), in force until the next call."""
        if len(margins) != len(self.workloads):
            raise ValueError(f"margins: {len(margins)} values for {len(self.workloads)} workloads")
        for k, m in enumerate(margins):
            if not m >= 0.0:
                raise ValueError(f"margins[{k}]: {m} is not a fraction >= 0")
        self.margins = list(margins)

    def _noise(self, rate_rps: float, z: float | None = None, tau_s: float | None = None) -> float:
        """A rate meter's ``z``-sigma (default ``error_z``) Poisson noise at
        ``rate_rps``, as a fraction of it (the variance of a meter of time constant
        tau at rate r is r / (2 tau); ``tau_s`` default ``rate_tau_s``)."""
        cfg = self.cfg
        sigmas = cfg.error_z if z is None else z
        tau = cfg.rate_tau_s if tau_s is None else tau_s
        return sigmas / math.sqrt(2.0 * max(rate_rps, cfg.min_rate_rps) * tau)

    def _margin(self, o: Slot, rate_rps: float) -> float:
        """Harvest margin of slice ``o`` at observed rate ``rate_rps`` (fraction): its
        workload's margin, at least the meter's noise at that rate."""
        m = self.margins[o.info.workload] if self.margins else self.cfg.harvest_margin
        return max(m, self._noise(rate_rps))

    def _need(self, o: Slot, now_s: float) -> float:
        """Rate (req/s) slice ``o`` must cover below its plan's clock: its observed rate
        r x (1 + its workload's margin, at least the meter's noise at r)."""
        r = o.rate.read(now_s)
        need = max(r, self.cfg.min_rate_rps) * (1.0 + self._margin(o, r))
        need *= self._factor(o)
        return max(need, self.cfg.harvest_start_floor / o.ttft_s)

    def _slice_clock(
        self, g: GpuState, o: Slot, now_s: float, need: float, boost_load: bool = False
    ) -> int:
        """Lowest candidate clock of ``g`` at which slice ``o`` in its share holds the
        SLO for a harvest (-1: none): the plan's clock while o has its plan share and
        its observed rate is within its plan's safe rate (plus half the meter's noise
        there: the rate test of ``_risk`` fires at the full noise); below it, the
        lowest clock whose capacity covers ``need``. ``boost_load``: ``g`` is boosted
        and not calm, and the plan's clock is not taken on that test (at a rate the
        calm test still counts as the boost's load the next queue would boost it
        again; ramp+flash, seed 21: 56 first tokens late after such a harvest), only
        the clock covering ``need``. ``raise_to`` answers on the table's load grid
        (rounded up), so the clock below its answer is checked with the exact
        capacity. Two lookups."""
        t = g.info.gpu_type
        clocks = self.lk.clocks[t]
        used = self.lk.share_capacity[t] - o.share
        c, _ = self.lk.raise_to(o.info.label, t, clocks[0], used, need)
        if (c < 0 or c > g.plan_clock) and o.share == o.plan_share and not boost_load:
            safe = self._safe_rps(o)
            if o.rate.read(now_s) <= safe * (1.0 + 0.5 * self._noise(safe, self.cfg.risk_z)):
                c = g.plan_clock
        if c < 0:
            return c
        i = _index_at_least(clocks, c)
        if i > 0 and self.lk.capacity_rps(o.info.label, t, clocks[i - 1], o.share) >= need:
            c = clocks[i - 1]
        return c

    def tick(self, instance: int, now_s: float) -> None:
        """At most once per ``hold_s`` per GPU: return a boosted GPU of ``instance`` to
        the plan once calm, else harvest (see module docs)."""
        s = self.slots.get(instance)
        if s is None or s.gpu is None:
            return
        g = s.gpu
        if now_s - g.changed_s < self.cfg.hold_s:
            return
        g.changed_s = now_s  # look again after another hold
        if g.boosted and self._restore(g, now_s):
            return
        if self.cfg.trim:
            self._harvest(g, now_s)

    def _calm(self, g: GpuState, now_s: float) -> bool:
        """Every slice on ``g`` is within its plan's safe rate and queue (the larger of
        its planned rate and ``risk_utilization`` x its plan capacity, times
        ``calm_utilization / risk_utilization``)."""
        cfg = self.cfg
        calm = cfg.calm_utilization / cfg.risk_utilization
        for o in g.slots:
            safe = self._safe_rps(o)
            if o.rate.read(now_s) > calm * safe or o.info.view.queued > self._queue_risk(
                o.plan_capacity_rps, o.ttft_s
            ):
                return False
        return True

    def _restore(self, g: GpuState, now_s: float) -> bool:
        """Return boosted ``g`` to the plan's clock and shares when calm. True when it
        did, or tried and the GPU control refused (again after another hold); False
        when it is not calm (or no longer above the plan: a harvest may lower it)."""
        if g.clock <= g.plan_clock and all(o.share == o.plan_share for o in g.slots):
            g.boosted = False  # lowered by a harvest already
            return False
        if not self._calm(g, now_s):
            return False
        back = [(o, o.plan_share) for o in g.slots if o.share != o.plan_share]
        if back and not self._set_shares(g, back, now_s):
            return True
        if g.clock != g.plan_clock:
            if not self._set_clock(g, g.plan_clock, self._power(g, g.plan_clock), now_s):
                return True
        else:
            for o in g.slots:
                o.capacity_rps = o.plan_capacity_rps
        g.boosted = False
        self.stats.restores += 1
        return True

    def _harvest(self, g: GpuState, now_s: float) -> None:
        """Lower ``g`` to the cheapest clock (and, with MPS, shares) at which every slice
        covers ``_need``: per slice the lowest clock covering it in its share
        (``raise_to`` from the type's lowest clock), the largest of them; then, with
        two or more slices, one clock lower with the shares re-divided when every
        slice's cheapest share there covers it and they fit the GPU. Only lowers; not
        while a slice's queue is at its risk level. At most 4k + 1 lookups (k
        slices)."""
        if not g.slots or not g.info.on:
            return
        t = g.info.gpu_type
        clocks = self.lk.clocks.get(t, ())
        if not clocks or g.clock <= clocks[0]:
            return
        units = self.lk.share_capacity[t]
        needs: list[float] = []
        target = clocks[0]
        boost_load = g.boosted  # still boosted after tick's _restore: not calm
        for o in g.slots:
            if o.info.view.queued > self._queue_risk(o.capacity_rps, o.ttft_s):
                self.stats.harvest_blocked += 1
                return
            need = self._need(o, now_s)
            c = self._slice_clock(g, o, now_s, need, boost_load)
            if c < 0:
                return
            needs.append(need)
            target = max(target, c)
        shares: list[tuple[Slot, int]] = []
        i = _index_at_least(clocks, target)
        if self.mps and len(g.slots) > 1 and i > 0 and clocks[i - 1] < g.clock:
            lower = clocks[i - 1]
            total = 0
            for o, need in zip(g.slots, needs, strict=True):
                c, share = self.lk.raise_to(o.info.label, t, lower, 0, need)
                if c != lower:
                    break
                total += share
                shares.append((o, share))
            else:
                if total <= units:
                    target = lower
            if target != lower:
                shares = []
        if target >= g.clock:
            return
        old = [(o, o.share) for o, _ in shares]
        changed = [(o, pct) for o, pct in shares if o.share != pct]
        if changed and not self._set_shares(g, changed, now_s):
            return
        if not self._set_clock(g, target, self._power(g, target), now_s):
            if changed:
                self._set_shares(g, old, now_s)
            return
        if changed:
            self.stats.harvest_shares += 1
        self.stats.trims += 1
        if g.boosted and g.clock <= g.plan_clock and all(o.share == o.plan_share for o in g.slots):
            g.boosted = False
            self.stats.restores += 1  # a boost ended (by a harvest to or below the plan)


def _client(s: Slot) -> str:
    """The name of slice ``s``'s MPS client on its GPU, as the GPU control takes it."""
    return s.info.client if s.info.client is not None else s.info.label


class _ActuatorControl:
    """The GPU control of a scheduler given only an actuator: a power limit is held until
    the clock is set with it (``Actuator.set_clock`` takes both), shares go to the
    actuator's ``set_share`` per instance, at the scheduler's decision time."""

    def __init__(self, owner: GlobalScheduler) -> None:
        self.owner = owner
        self.limit_w: dict[str, float] = {}

    def set_power_limit(self, gpu: str, limit_w: float) -> None:
        self.limit_w[gpu] = limit_w

    def set_clock(self, gpu: str, clock_mhz: int) -> None:
        owner = self.owner
        limit = self.limit_w.get(gpu, owner.gpus[gpu].limit_w)
        owner.act.set_clock(gpu, clock_mhz, limit, owner.now_s)

    def shift_shares(self, gpu: str, shares_pct: Mapping[str, int]) -> None:
        owner = self.owner
        slots = {_client(s): s for s in owner.gpus[gpu].slots}
        for client, pct in shares_pct.items():
            owner.act.set_share(slots[client].info.id, pct, owner.now_s)


def _uncount(s: Slot) -> None:
    """Take back the arrival just counted on ``s``'s meters (spilled or shed)."""
    s.rate.value -= 1.0 / s.rate.tau_s
    s.fast.value -= 1.0 / s.fast.tau_s


def _backlog(s: Slot) -> float:
    """Expected time to start a new request at ``s`` (s): queue over capacity."""
    return (s.info.view.queued + 1) / max(s.capacity_rps, 1e-9)


def _weighted_cycle(order: list[Slot]) -> list[Slot]:
    """Smooth weighted round robin over ``order`` by planned rate, unrolled."""
    if not order:
        return []
    weights = [max(s.info.planned_rps, 1e-9) for s in order]
    total = sum(weights)
    current = [0.0] * len(order)
    out: list[Slot] = []
    for _ in range(max(SCHEDULE_SLOTS, len(order))):
        for i, w in enumerate(weights):
            current[i] += w
        k = max(range(len(order)), key=current.__getitem__)
        current[k] -= total
        out.append(order[k])
    return out


def _index_at_least(values: tuple[int, ...], x: int) -> int:
    for i, v in enumerate(values):
        if v >= x:
            return i
    return len(values) - 1


def _next_level(levels: tuple[int, ...], share: int) -> int | None:
    for v in levels:
        if v > share:
            return v
    return None
