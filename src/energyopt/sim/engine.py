"""Discrete-event simulation of a GPU fleet serving requests under a changing plan.

Events (the shared ``sim.events.EventQueue``, with the sorted arrival arrays merged in): request
arrivals, iteration ends, GPUs becoming available (after powering on or a clock
change), instances becoming ready (after loading their weights), and planning
epochs. See docs/evaluation.md for the model; in short:

* A plan's placements become serving instances (sim/server.py). A request is
  routed on arrival to an instance of its workload by smooth weighted round
  robin over the planned rates, preferring instances that are ready and not
  draining, then ready draining ones, then loading ones.
* Iteration latencies and energies come from perf/forward.py at the GPU's clock
  and the instance's SM share (sim/passes.py); an iteration that starts while
  other instances of the same GPU are mid-iteration lasts ``1 + s x (their SM
  share)`` times longer (``s`` = ``colocation_slowdown``; same energy).
* Applying a new plan: unchanged placements keep serving; new ones load their
  weights (``startup_s`` + weights / ``load_gbps``) before serving; removed ones
  stop taking requests, hand their unadmitted queue back to the router and
  finish what they admitted (drain). A GPU that goes off is switched off once
  drained; one that comes on draws idle power for ``power_on_s`` first; a clock
  change stops the GPU's instances for ``clock_change_ms``.
* With an online policy (``online``; energyopt/online, docs/online.md) the global
  scheduler routes every new request instead (it may shed it: a miss), re-clocks
  GPUs and shifts MPS shares through a ``SimulatedAgent`` (sim/control.py: the
  ``GpuControl`` interface and checks of the node agent, so the online control's
  reactions take the path they take to a real GPU), wakes GPUs between plans through
  this class's ``wake``; and each co-located instance's local
  scheduler sets its batch limit and prefill chunk every iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.online import GlobalScheduler, GpuInfo, InstanceInfo, LocalScheduler, OnlinePolicy
from energyopt.online.global_scheduler import OnlineStats
from energyopt.perf.oppoints import op_spec, share_options
from energyopt.perf.params import build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.perf.queueing import metrics_at
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.control import SimulatedAgent
from energyopt.sim.events import EventQueue
from energyopt.sim.metrics import WorkloadStats, fleet_attainment
from energyopt.sim.passes import PassTable, PassTables, ShareOption
from energyopt.sim.power import PowerMeter
from energyopt.sim.server import Requests, Server
from energyopt.spec.evaluation import Transitions
from energyopt.spec.hardware import GpuType
from energyopt.spec.plan import GpuPlan, Placement, Plan
from energyopt.tables.local import local_decisions

KV_NEED_FLOOR_BYTES = 1e6
"""Smallest KV need a unit is given when memory is split (bytes)."""
ITER_END = 0
GPU_WAKE = 1
SERVER_WAKE = 2
EPOCH = 3
WATCH = 4

Replan = Callable[[float], Plan | None]


@dataclass
class GpuSim:
    """A simulated GPU."""

    id: str
    gtype: GpuType
    on: bool = False
    clock_mhz: int = 0
    available_s: float = 0.0  # no iteration starts before this
    powered_s: float = 0.0  # powered on (weights can load) from this time
    to_off: bool = False
    power_limit_w: float | None = None  # set by the online policy (not enforced)
    servers: list[Server] = field(default_factory=list)


@dataclass
class SimResult:
    """What one simulation measured."""

    energy_j: float  # static + dynamic energy inside [0, window_s)
    energy_total_j: float  # including the drain after the window
    window_s: float
    end_s: float
    stats: list[WorkloadStats]
    gpus_on: list[tuple[float, int]]  # (time s, GPUs on from then)
    power_w: list[float]  # fleet power per bin
    bin_s: float
    arrived: int
    completed: int
    unfinished: int
    instances_started: int  # instances created after the initial plan (migrations)
    meter: PowerMeter
    shed: int = 0  # requests the online policy refused on arrival (misses)
    online: OnlineStats | None = None
    online_budget: int = 0  # most table lookups one online decision may make
    clock_log: list[tuple[float, str, int, float | None]] = field(default_factory=list)
    """(time s, GPU, clock MHz, power limit W) of every online clock change."""

    @property
    def mean_gpus_on(self) -> float:
        """Time-average number of GPUs on over the window."""
        total = 0.0
        for (t0, count), (t1, _) in zip(
            self.gpus_on, [*self.gpus_on[1:], (self.window_s, 0)], strict=True
        ):
            lo, hi = min(t0, self.window_s), min(t1, self.window_s)
            total += count * max(0.0, hi - lo)
        return total / self.window_s

    @property
    def attainment(self) -> tuple[float, float, float]:
        """(TTFT, TBT, SLO) attainment of the whole fleet (fractions)."""
        return fleet_attainment(self.stats)


def plan_units(plan: Plan) -> list[tuple[list[GpuPlan], Placement]]:
    """Placements of a plan, a tensor-parallel group counted once with all its GPUs."""
    out: list[tuple[list[GpuPlan], Placement]] = []
    groups: dict[str, list[GpuPlan]] = {}
    first: dict[str, Placement] = {}
    for gp in plan.gpus:
        if not gp.on:
            continue
        for pl in gp.placements:
            if pl.tp_group is None:
                out.append(([gp], pl))
            else:
                groups.setdefault(pl.tp_group, []).append(gp)
                first.setdefault(pl.tp_group, pl)
    for gid, members in groups.items():
        out.append((members, first[gid]))
    return out


class Simulator:
    """Replays arrivals against plans; one instance per run."""

    def __init__(
        self,
        problem: Problem,
        arrivals: Arrivals,
        *,
        window_s: float,
        drain_s: float = 120.0,
        transitions: Transitions | None = None,
        colocation_slowdown: float = 0.05,
        bin_s: float = 10.0,
        record: bool = False,
        tables: PassTables | None = None,
        online: OnlinePolicy | None = None,
    ) -> None:
        self.problem = problem
        self.arrivals = arrivals
        self.window_s = window_s
        self.drain_s = drain_s
        self.tr = transitions or Transitions()
        self.slowdown = colocation_slowdown
        self.tables = tables or PassTables(problem)
        opts = problem.instance.options
        self.chunk = opts.chunk_tokens
        self.max_batch = opts.max_batch
        self.usable_frac = 1.0 - opts.memory_reserve_fraction
        names = [w.name for w in problem.instance.workloads]
        if list(arrivals.names) != names:
            raise ValueError(f"arrivals name workloads {arrivals.names}, instance has {names}")
        self.stats = [WorkloadStats(w.name, w.slo) for w in problem.instance.workloads]
        self.req = Requests(
            arrival_s=arrivals.time_s.tolist(),
            workload=arrivals.workload.tolist(),
            prompt=arrivals.prompt_tokens.tolist(),
            output=arrivals.output_tokens.tolist(),
        )
        self.gpus = {g.id: GpuSim(g.id, problem.gpu_type(g.type)) for g in problem.gpus}
        self.meter = PowerMeter(list(self.gpus), window_s, bin_s, record)
        self.events: EventQueue[tuple[int, object]] = EventQueue()
        self.entry: dict[int, list[Server]] = {k: [] for k in range(len(names))}
        self.decoders: dict[int, list[Server]] = {k: [] for k in range(len(names))}
        self.next_sid = 0
        self.slices: dict[int, tuple[ShareOption, int]] = {}
        self.instances_started = 0
        self.gpus_on: list[tuple[float, int]] = []
        self.now = 0.0
        self.completed = 0
        self.shed = 0
        self.policy = online
        self.by_sid: dict[int, Server] = {}
        self.clock_log: list[tuple[float, str, int, float | None]] = []
        self.caps = {
            g.id: g.power_cap_w or problem.gpu_type(g.type).power_limit_max_w for g in problem.gpus
        }
        self.mps = opts.sharing.mode == "mps"
        self.ctl: GlobalScheduler | None = None
        self.agent: SimulatedAgent | None = None
        if online is not None:
            self.agent = SimulatedAgent(self)
            budgets = {
                n.name: n.power_budget_w
                for n in problem.instance.cluster.nodes
                if n.power_budget_w is not None
            }
            self.ctl = GlobalScheduler(
                online.lookups,
                self,
                [w.slo.ttft_ms / 1e3 for w in problem.instance.workloads],
                online.config,
                mps=self.mps,
                node_budget_w=budgets,
                control=self.agent,
            )

    # -- events -----------------------------------------------------------------------

    def _push(self, t: float, code: int, obj: object) -> None:
        self.events.push(t, (code, obj))

    def run(
        self,
        plan: Plan,
        epoch_s: float | None = None,
        replan: Replan | None = None,
        watch: tuple[float, Replan] | None = None,
        epoch_lead_s: float = 0.0,
    ) -> SimResult:
        """Simulate from ``plan`` (in place at time 0); every ``epoch_s`` ask ``replan``,
        ``epoch_lead_s`` seconds before each epoch's boundary k x ``epoch_s`` (k >= 1;
        never before time 0). ``watch``: (every this many seconds, a callback) asked
        between epochs too; a plan it returns is applied at once (a re-plan on
        surprise)."""
        if epoch_lead_s < 0:
            raise ValueError(f"epoch_lead_s {epoch_lead_s} is negative")
        self.apply_plan(plan, 0.0, initial=True)
        if epoch_s is not None and replan is not None:
            k = 1
            while k * epoch_s < self.window_s - 1e-9:
                self._push(max(k * epoch_s - epoch_lead_s, 0.0), EPOCH, None)
                k += 1
        if watch is not None and watch[0] < self.window_s:
            self._push(watch[0], WATCH, 1)
        times = self.req.arrival_s
        workloads = self.req.workload
        n_arr = len(times)
        i = 0
        events = self.events
        stop = self.window_s + self.drain_s
        while True:
            t_arr = times[i] if i < n_arr else math.inf
            t_ev = events.next_time()
            if t_arr <= t_ev:
                if t_arr == math.inf or t_arr > stop:
                    break
                self.now = t_arr
                w = workloads[i]
                self.stats[w].arrived += 1
                if self.ctl is not None:
                    sid = self.ctl.route(w, t_arr)
                    if sid is None:
                        self.stats[w].shed += 1
                        self.shed += 1
                        i += 1
                        continue
                    server = self.by_sid[sid]
                else:
                    server = self._route(self.entry[w], t_arr)
                server.waiting.append(i)
                if not server.busy:
                    self._try_start(server, t_arr)
                i += 1
                continue
            if t_ev > stop:
                break
            t, (code, obj) = events.pop()
            self.now = t
            if code == ITER_END:
                assert isinstance(obj, Server)
                self._iteration_end(obj, t)
            elif code == GPU_WAKE:
                assert isinstance(obj, GpuSim)
                self._gpu_wake(obj, t)
            elif code == SERVER_WAKE:
                assert isinstance(obj, Server)
                if obj.phase != "decode" and not obj.removed:
                    self._sync(obj.workload, t)
                self._try_start(obj, t)
            elif code == EPOCH and replan is not None:
                new = replan(t)
                if new is not None:
                    self.apply_plan(new, t)
            elif code == WATCH and watch is not None:
                assert isinstance(obj, int)
                new = watch[1](t)
                if new is not None:
                    self.apply_plan(new, t)
                if (obj + 1) * watch[0] < self.window_s - 1e-9:
                    self._push((obj + 1) * watch[0], WATCH, obj + 1)
        end = max(self.window_s, self.now)
        self.meter.close(end)
        if self.ctl is not None:
            self.ctl.account(end)
        arrived = sum(s.arrived for s in self.stats)
        return SimResult(
            energy_j=self.meter.window_j,
            energy_total_j=self.meter.total_j,
            window_s=self.window_s,
            end_s=end,
            stats=self.stats,
            gpus_on=self.gpus_on,
            power_w=self.meter.power_series_w(),
            bin_s=self.meter.bin_s,
            arrived=arrived,
            completed=self.completed,
            unfinished=arrived - self.completed - self.shed,
            instances_started=self.instances_started,
            meter=self.meter,
            shed=self.shed,
            online=self.ctl.stats if self.ctl is not None else None,
            online_budget=self.ctl.budget if self.ctl is not None else 0,
            clock_log=self.clock_log,
        )

    # -- serving ----------------------------------------------------------------------

    def _route(self, pool: list[Server], now: float) -> Server:
        """Smooth weighted round robin over the best tier of ``pool``."""
        best: list[Server] = []
        best_tier = 9
        for s in pool:
            ready = now >= s.ready_s
            tier = (0 if ready else 2) + (1 if s.draining else 0)
            if tier < best_tier:
                best_tier = tier
                best = [s]
            elif tier == best_tier:
                best.append(s)
        if not best:
            raise RuntimeError("no instance serves this workload")
        if len(best) == 1:
            return best[0]
        total = 0.0
        chosen = best[0]
        for s in best:
            w = s.weight_rps if s.weight_rps > 0 else 1e-9
            s.wrr += w
            total += w
            if s.wrr > chosen.wrr:
                chosen = s
        chosen.wrr -= total
        return chosen

    def _try_start(self, server: Server, now: float) -> None:
        if server.busy or server.removed or now < server.ready_s:
            return
        busy_share = 0.0
        for gid in server.gpus:
            g = self.gpus[gid]
            if g.available_s > now:
                return
            if len(g.servers) > 1:
                busy = sum(o.share_frac for o in g.servers if o.busy and o is not server)
                busy_share = max(busy_share, busy)
        began = server.begin(now)
        if began is None:
            if server.draining and server.empty():
                self._remove(server, now)
            return
        dur, joules = began
        dur *= 1.0 + self.slowdown * busy_share
        end = now + dur
        for gid in server.gpus:
            self.meter.add_iteration(gid, now, end, joules)
        self._push(end, ITER_END, server)

    def _iteration_end(self, server: Server, now: float) -> None:
        out = server.end(now)
        self.completed += out.completed
        if self.ctl is not None:
            if out.on_time or out.late:
                self.ctl.first_tokens(server.workload, out.on_time, out.late, now)
            self.ctl.tick(server.sid, now)
        for rid in out.handoffs:
            target = self._route(self.decoders[server.workload], now)
            target.joiners.append(rid)
            if not target.busy:
                self._try_start(target, now)
        self._try_start(server, now)

    def _gpu_wake(self, gpu: GpuSim, now: float) -> None:
        if gpu.on and now >= gpu.powered_s and not gpu.to_off:
            self.meter.set_level(gpu.id, now, gpu_on_power_w(gpu.gtype, gpu.clock_mhz))
        for s in list(gpu.servers):
            self._try_start(s, now)

    def _remove(self, server: Server, now: float) -> None:
        if server.removed:
            return
        server.removed = True
        pool = self.decoders if server.phase == "decode" else self.entry
        pool[server.workload].remove(server)
        if server.phase != "decode":
            self._sync(server.workload, now)
        for gid in server.gpus:
            g = self.gpus[gid]
            g.servers.remove(server)
            if g.to_off and not g.servers:
                self._switch_off(g, now)

    def _switch_off(self, gpu: GpuSim, now: float) -> None:
        gpu.on = False
        gpu.to_off = False
        self.meter.set_level(gpu.id, now, self.tr.standby_w)
        self._count_on(now)

    def _count_on(self, now: float) -> None:
        count = sum(1 for g in self.gpus.values() if g.on)
        if self.gpus_on and self.gpus_on[-1][0] == now:
            self.gpus_on[-1] = (now, count)
        else:
            self.gpus_on.append((now, count))

    # -- plans ------------------------------------------------------------------------

    def _share(self, gpu: GpuType, pl: Placement) -> ShareOption:
        if pl.tp_size > 1:
            return (100, None, 1.0, 1.0, gpu.memory_gb * self.usable_frac)
        if pl.mig_profile is not None:
            for option in share_options(self.problem, gpu):
                if option[1] == pl.mig_profile:
                    return option
            raise ValueError(f"unknown MIG profile {pl.mig_profile!r} of {gpu.name}")
        frac = pl.share_pct / 100.0
        return (pl.share_pct, None, frac, frac, gpu.memory_gb * self.usable_frac)

    def _kv_budgets(self, units: list[tuple[list[GpuPlan], Placement]]) -> list[float]:
        """KV-cache tokens of each unit. A MIG instance keeps its own memory; under
        MPS the memory a GPU has left after the weights of every unit on it is split
        in proportion to the KV cache each unit needs at its planned rate (the
        performance model's memory figure, as a deployment would size each serving
        process's memory fraction from the plan)."""
        if not units:
            return []
        specs = []
        for gps, pl in units:
            gtype = self.gpus[gps[0].gpu].gtype
            wl = self.problem.instance.workload(pl.workload)
            clock = gps[0].clock_mhz or gtype.max_sm_clock_mhz
            share = self._share(gtype, pl)
            specs.append(op_spec(self.problem, wl, pl.phase, gtype, clock, share, pl.tp_size))
        params = build_params(specs)
        rates = np.asarray([pl.rate_rps for _, pl in units], dtype=np.float64)
        memory = metrics_at(params, rates).memory_bytes
        weights: dict[str, float] = {}
        needs: dict[str, float] = {}
        need_of: list[float] = []
        for (gps, pl), mem in zip(units, memory, strict=True):
            model = self.problem.model_of(self.problem.instance.workload(pl.workload))
            own = model.weight_bytes / pl.tp_size
            need = float(mem) - own if np.isfinite(mem) else float("inf")
            need = min(max(need, KV_NEED_FLOOR_BYTES), 1e15)
            need_of.append(need)
            for gp in gps:
                weights[gp.gpu] = weights.get(gp.gpu, 0.0) + own
                needs[gp.gpu] = needs.get(gp.gpu, 0.0) + need
        out: list[float] = []
        for (gps, pl), need in zip(units, need_of, strict=True):
            model = self.problem.model_of(self.problem.instance.workload(pl.workload))
            per_token = model.kv_bytes_per_token / pl.tp_size
            free = math.inf
            for gp in gps:
                gtype = self.gpus[gp.gpu].gtype
                if pl.mig_profile is not None:
                    mem_b = self._share(gtype, pl)[4] * 1e9 - model.weight_bytes
                else:
                    usable = gtype.memory_gb * self.usable_frac * 1e9
                    mem_b = (usable - weights[gp.gpu]) * need / needs[gp.gpu]
                free = min(free, mem_b)
            out.append(max(free, 0.0) / per_token)
        return out

    def apply_plan(self, plan: Plan, now: float, initial: bool = False) -> None:
        """Move the fleet to ``plan`` (see module docs for the transitions)."""
        tr = self.tr
        wanted = {gp.gpu: gp for gp in plan.gpus}
        for gid, g in self.gpus.items():
            gp = wanted.get(gid)
            on = gp is not None and gp.on
            clock = (gp.clock_mhz if gp is not None else None) or g.gtype.max_sm_clock_mhz
            if initial:
                g.on = on
                g.clock_mhz = clock
                level = gpu_on_power_w(g.gtype, clock) if on else tr.standby_w
                self.meter.set_level(gid, now, level)
                continue
            if on and not g.on:
                g.on = True
                g.to_off = False
                g.clock_mhz = clock
                g.powered_s = now + tr.power_on_s
                g.available_s = g.powered_s
                self.meter.set_level(gid, now, g.gtype.idle_w)
                self._push(g.powered_s, GPU_WAKE, g)
            elif on:
                g.to_off = False
                if clock != g.clock_mhz:
                    g.clock_mhz = clock
                    g.available_s = max(g.available_s, now + tr.clock_change_ms / 1e3)
                    if now >= g.powered_s:
                        self.meter.set_level(gid, now, gpu_on_power_w(g.gtype, clock))
                    for s in g.servers:
                        s.set_table(self._table(s, g))
                    self._push(g.available_s, GPU_WAKE, g)
            elif g.on:
                g.to_off = True
        units = plan_units(plan)
        budgets = self._kv_budgets(units)
        current = {
            s.key: s
            for pool in (self.entry, self.decoders)
            for ss in pool.values()
            for s in ss
            if not s.draining
        }
        keep: set[int] = set()
        created: list[Server] = []
        for (gps, pl), budget in zip(units, budgets, strict=True):
            ids = tuple(sorted(gp.gpu for gp in gps))
            key = (ids, pl.workload, pl.phase, pl.share_pct, pl.mig_profile, pl.tp_size)
            old = current.get(key)
            if old is not None and old.sid not in keep:
                old.weight_rps = pl.rate_rps
                old.kv_budget = budget
                keep.add(old.sid)
                share = self._share(self.gpus[ids[0]].gtype, pl)
                if self.slices[old.sid][0] != share:  # an online share shift ends
                    self.slices[old.sid] = (share, pl.tp_size)
                    old.share_frac = share[2]
                    old.set_table(self._table(old, self.gpus[ids[0]]))
                continue
            created.append(self._new_server(key, list(ids), pl, budget, now, initial))
        for server in current.values():
            if server.sid not in keep:
                self._drain(server, now)
        for s in created:
            if s.ready_s > now:
                self._push(s.ready_s, SERVER_WAKE, s)
        for pool in (self.entry, self.decoders):
            for servers in pool.values():
                for s in servers:
                    s.wrr = 0.0
        for g in self.gpus.values():
            if g.to_off and not g.servers:
                self._switch_off(g, now)
        self._count_on(now)
        if self.policy is not None:
            self._online_plan(plan, now)

    def _table(self, server: Server, gpu: GpuSim) -> PassTable:
        """The server's latency tables at the GPU's current clock."""
        share, tp = self.slices[server.sid]
        name = self.problem.instance.workloads[server.workload].name
        return self.tables.get(name, server.phase, gpu.gtype, share, tp, gpu.clock_mhz)

    def _new_server(
        self,
        key: tuple[object, ...],
        ids: list[str],
        pl: Placement,
        budget: float,
        now: float,
        initial: bool,
    ) -> Server:
        gpus = [self.gpus[g] for g in ids]
        gtype = gpus[0].gtype
        w = next(
            k for k, wl in enumerate(self.problem.instance.workloads) if wl.name == pl.workload
        )
        model = self.problem.model_of(self.problem.instance.workloads[w])
        share = self._share(gtype, pl)
        table = self.tables.get(pl.workload, pl.phase, gtype, share, pl.tp_size, gpus[0].clock_mhz)
        if initial:
            ready = now
        else:
            load_s = self.tr.instance_start_s(model.weight_bytes / pl.tp_size)
            ready = max(now, *(g.powered_s for g in gpus)) + load_s
            self.instances_started += 1
        server = Server(
            self.next_sid,
            key,
            w,
            pl.phase,
            ids,
            share[2],
            pl.rate_rps,
            table,
            chunk_tokens=self.chunk,
            max_batch=self.max_batch,
            kv_budget_tokens=budget,
            ready_s=ready,
            stats=self.stats[w],
            requests=self.req,
        )
        server.last_end_s = now
        self.slices[server.sid] = (share, pl.tp_size)
        self.by_sid[server.sid] = server
        self.next_sid += 1
        pool = self.decoders if pl.phase == "decode" else self.entry
        pool[w].append(server)
        for g in gpus:
            g.servers.append(server)
        return server

    def _drain(self, server: Server, now: float) -> None:
        server.draining = True
        queued = list(server.waiting) + list(server.joiners)
        server.waiting.clear()
        server.joiners.clear()
        for rid in queued:
            if server.phase == "decode":
                target = self._route(self.decoders[server.workload], now)
                target.joiners.append(rid)
            else:
                target = self._route(self.entry[server.workload], now)
                target.waiting.append(rid)
            if not target.busy:
                self._try_start(target, now)
        if server.empty():
            self._remove(server, now)

    # -- online control ---------------------------------------------------------------

    def _online_plan(self, plan: Plan, now: float) -> None:
        """Hand a new plan to the global scheduler and the local schedulers."""
        assert self.ctl is not None and self.policy is not None
        self.ctl.set_gpus(
            [
                GpuInfo(
                    gid,
                    g.gtype.name,
                    self.problem.gpus[k].node,
                    g.on and not g.to_off,
                    g.clock_mhz,
                    g.gtype.max_sm_clock_mhz,
                    self.caps[gid],
                    g.gtype.power_limit_min_w,
                )
                for k, (gid, g) in enumerate(self.gpus.items())
            ],
            now,
        )
        if self.policy.errors is not None:
            self.ctl.set_margins(self.policy.errors.spread().tolist())
        for g in self.gpus.values():
            g.power_limit_w = None
        for w in self.entry:
            self._sync(w, now)
        if not self.policy.local:
            return
        decisions = local_decisions(self.problem, plan)
        for servers in self.entry.values():
            for s in servers:
                if s.phase != "both" or s.draining:
                    continue
                name = self.problem.instance.workloads[s.workload].name
                d = decisions.get((s.gpus[0], name))
                limit, tokens = (d.batch_limit, d.prefill_tokens) if d else (0, self.chunk)
                self._attach_local(s, limit, tokens)

    def _attach_local(self, server: Server, batch_limit: int, prefill_tokens: int) -> None:
        assert self.policy is not None
        wl = self.problem.instance.workloads[server.workload]
        g = self.gpus[server.gpus[0]]
        server.local = LocalScheduler(
            batch_limit=batch_limit,
            prefill_tokens=prefill_tokens,
            base_chunk=self.chunk,
            max_chunk=self.tables.max_chunk,
            max_batch=self.max_batch,
            ttft_ms=wl.slo.ttft_ms,
            tbt_ms=wl.slo.tbt_ms,
            dynamic_limit_w=self._dynamic_limit_w(g) * server.share_frac,
            config=self.policy.local_config,
        )

    def _dynamic_limit_w(self, g: GpuSim) -> float:
        """Power a GPU's iterations may draw above its static level (W)."""
        limit = g.power_limit_w if g.power_limit_w is not None else self.caps[g.id]
        return max(limit - gpu_on_power_w(g.gtype, g.clock_mhz), 0.0)

    def _sync(self, w: int, now: float) -> None:
        """Tell the global scheduler which instances take requests of workload ``w``."""
        if self.ctl is None:
            return
        name = self.problem.instance.workloads[w].name
        infos = []
        for s in self.entry[w]:
            share, tp = self.slices[s.sid]
            label = name if s.phase == "both" else f"{name}:{s.phase}"
            infos.append(
                InstanceInfo(
                    s.sid,
                    w,
                    label,
                    tuple(s.gpus),
                    share[0],
                    tp,
                    s.weight_rps,
                    s.ready_s,
                    s.draining,
                    s,
                    self.client_name(s),
                )
            )
        self.ctl.set_instances(w, infos, now)

    def client_name(self, server: Server) -> str:
        """``server``'s MPS client name on its GPU (its placement's label and its id)."""
        name = self.problem.instance.workloads[server.workload].name
        label = name if server.phase == "both" else f"{name}:{server.phase}"
        return f"{label}#{server.sid}"

    def mps_clients(self, gpu: str) -> dict[str, tuple[int, int]]:
        """The single-GPU instances on ``gpu``: client name -> (instance id, share %)."""
        return {
            self.client_name(s): (s.sid, self.slices[s.sid][0][0])
            for s in self.gpus[gpu].servers
            if len(s.gpus) == 1 and s.sid in self.slices
        }

    def set_clock(self, gpu: str, clock_mhz: int, power_limit_w: float, now_s: float) -> None:
        """Online action: lock ``gpu`` at ``clock_mhz`` with power limit ``power_limit_w``
        (the instances stop for ``clock_change_ms`` when the clock changes)."""
        self.set_power_limit(gpu, power_limit_w, now_s)
        self.lock_clock(gpu, clock_mhz, now_s)

    def set_power_limit(self, gpu: str, power_limit_w: float, now_s: float) -> None:
        """Online action: set ``gpu``'s power limit (W; the local schedulers' dynamic
        power follows it)."""
        g = self.gpus[gpu]
        g.power_limit_w = power_limit_w
        for s in g.servers:
            if s.local is not None:
                s.local.dynamic_limit_w = self._dynamic_limit_w(g) * s.share_frac

    def lock_clock(self, gpu: str, clock_mhz: int, now_s: float) -> None:
        """Online action: lock ``gpu`` at ``clock_mhz`` (the instances stop for
        ``clock_change_ms`` when the clock changes)."""
        g = self.gpus[gpu]
        if clock_mhz > g.gtype.max_sm_clock_mhz:
            raise ValueError(f"{gpu}: clock {clock_mhz} MHz above the type's maximum")
        self.clock_log.append((now_s, gpu, clock_mhz, g.power_limit_w))
        if clock_mhz != g.clock_mhz:
            g.clock_mhz = clock_mhz
            g.available_s = max(g.available_s, now_s + self.tr.clock_change_ms / 1e3)
            if g.on and now_s >= g.powered_s:
                self.meter.set_level(gpu, now_s, gpu_on_power_w(g.gtype, clock_mhz))
            for s in g.servers:
                s.set_table(self._table(s, g))
            self._push(g.available_s, GPU_WAKE, g)
        for s in g.servers:
            if s.local is not None:
                s.local.dynamic_limit_w = self._dynamic_limit_w(g) * s.share_frac

    def set_share(self, instance: int, share: int, now_s: float) -> None:
        """Online action: give ``instance`` an MPS share of ``share`` percent."""
        s = self.by_sid[instance]
        g = self.gpus[s.gpus[0]]
        old, tp = self.slices[instance]
        frac = share / 100.0
        self.slices[instance] = ((share, None, frac, frac, old[4]), tp)
        s.share_frac = frac
        s.set_table(self._table(s, g))
        if s.local is not None:
            s.local.dynamic_limit_w = self._dynamic_limit_w(g) * frac

    def wake(self, gpu: str, workload: int, clock_mhz: int, now_s: float) -> None:
        """Online action: switch ``gpu`` on at ``clock_mhz`` with one instance of
        ``workload`` on all of it (ready after power-on and loading)."""
        g = self.gpus[gpu]
        if clock_mhz > g.gtype.max_sm_clock_mhz:
            raise ValueError(f"{gpu}: clock {clock_mhz} MHz above the type's maximum")
        self.clock_log.append((now_s, gpu, clock_mhz, None))
        if not g.on:
            g.on = True
            g.to_off = False
            g.clock_mhz = clock_mhz
            g.powered_s = now_s + self.tr.power_on_s
            g.available_s = g.powered_s
            self.meter.set_level(gpu, now_s, g.gtype.idle_w)
            self._push(g.powered_s, GPU_WAKE, g)
            self._count_on(now_s)
        else:
            g.to_off = False
        wl = self.problem.instance.workloads[workload]
        model = self.problem.model_of(wl)
        pl = Placement(workload=wl.name, phase="both", share_pct=100, rate_rps=0.0)
        used = sum(
            self.problem.model_of(self.problem.instance.workloads[s.workload]).weight_bytes
            for s in g.servers
        )
        free = g.gtype.memory_gb * self.usable_frac * 1e9 - used - model.weight_bytes
        budget = max(free, 0.0) / model.kv_bytes_per_token
        key = ((gpu,), wl.name, "both", 100, None, 1)
        server = self._new_server(key, [gpu], pl, budget, now_s, initial=False)
        if g.clock_mhz != clock_mhz:
            self.set_clock(gpu, clock_mhz, self.caps[gpu], now_s)
        if self.policy is not None and self.policy.local:
            self._attach_local(server, 0, self.chunk)
        self._push(server.ready_s, SERVER_WAKE, server)
        self._sync(workload, now_s)
