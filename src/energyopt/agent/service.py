"""The agent's operations on one open NVML session, independent of the transport.

Every change goes through the executor (``energyopt.nvml``): a plan is applied by
its ``Transaction`` (checkpoint before the first write, read-back, rollback), an
online clock or power-limit change is one checked ``Action`` written and read
back. Changes to a GPU are serialized by that GPU's lock; an apply, a restore and
the watchdog's fallback hold the locks of every GPU they touch (taken in index
order, so they never deadlock).

Units: clocks in MHz, power limits in W on the wire (mW inside NVML), times in s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from energyopt.agent.policy import Policy
from energyopt.agent.protocol import Refused
from energyopt.agent.state import AgentState, PlanInForce, StateDir
from energyopt.catalog.loader import Catalog
from energyopt.control import check_setting, check_shares
from energyopt.nvml.actions import Action, LockClocks, SetPowerLimit
from energyopt.nvml.errors import ApplyFailed, ExecutorError
from energyopt.nvml.measure import gpu_status, measure
from energyopt.nvml.mps import DEFAULT_BASE_DIR, client_env
from energyopt.nvml.planner import HostPlan, plan_actions
from energyopt.nvml.session import Session
from energyopt.nvml.sim import SimulatedNvml
from energyopt.nvml.transaction import Transaction, earlier_checkpoints, restore
from energyopt.spec.checks import plan_problems
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse
from energyopt.spec.plan import GpuPlan, Plan

_CHANGES = ("heartbeat", "apply", "set_clock", "set_power_limit", "shift_mps")
"""Operations that count as the controller's heartbeat."""

MPS_SHARES = "mps_shares"
"""The kind of an online MPS share shift among the online changes."""

MAX_MEASURE_S = 60.0
"""Longest window a ``measure`` request may ask for (s): it holds its connection."""


@dataclass
class Stats:
    """Counters the metrics endpoint exports (since the agent started)."""

    requests: Counter[str] = field(default_factory=Counter)
    refusals: Counter[tuple[str, str]] = field(default_factory=Counter)
    rollbacks: int = 0
    watchdog_fallbacks: int = 0


def plan_id(data: dict[str, Any]) -> str:
    """A short id of a plan: its instance name and the SHA-256 of its canonical JSON."""
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
    return f"{data.get('instance', 'plan')}@{digest}"


def _pair(value: Any, where: str) -> tuple[float, float]:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        or value[0] > value[1]
    ):
        raise Refused("bad_request", f"{where}: expected [low, high] with low <= high")
    return float(value[0]), float(value[1])


class Agent:
    """The node agent's state and operations on ``session`` under ``policy``."""

    def __init__(
        self,
        session: Session,
        policy: Policy,
        state_dir: StateDir,
        catalog: Catalog,
        *,
        mps_dir: str = DEFAULT_BASE_DIR,
        restore_on_stop: bool = True,
        heartbeat_timeout_s: float | None = None,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.session = session
        self.ctx = session.ctx
        self.nvml = session.ctx.nvml
        self.policy = policy
        self.dirs = state_dir
        self.catalog = catalog
        self.mps_dir = mps_dir
        self.restore_on_stop = restore_on_stop
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.say = say
        self.stats = Stats()
        self.state = AgentState()
        self.overrides: dict[tuple[int, str], Any] = {}
        """Online changes in force, (GPU index, action kind) -> value (MHz or mW)."""
        self.covered: set[tuple[str, str]] = set()
        """(UUID, action kind) whose original is in a checkpoint on disk."""
        self.last_heartbeat: float | None = None
        self.watchdog_fired = False
        self.reconcile_notes: list[str] = []
        self._locks = [threading.Lock() for _ in range(self.nvml.device_count())]
        self._state_lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._sim_time = time.monotonic()
        self._parsed: tuple[PlanInForce, Plan] | None = None
        """The plan in force, parsed once (an online change is answered in well under 1 ms)."""

    # locks and persistence -------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, indices: list[int] | None = None) -> Iterator[None]:
        """Hold the locks of GPUs ``indices`` (all when None), in index order."""
        chosen = sorted(set(range(len(self._locks)) if indices is None else indices))
        with contextlib.ExitStack() as stack:
            for i in chosen:
                stack.enter_context(self._locks[i])
            yield

    def _persist_sim(self) -> None:
        """Save the simulated host after a write, as a real GPU keeps its settings when
        the agent dies (nothing for real NVML)."""
        if self.session.sim_state is not None and isinstance(self.nvml, SimulatedNvml):
            with self._io_lock:
                self.nvml.save(self.session.sim_state)

    def _advance_sim(self) -> None:
        """Let simulated time follow real time, so the energy counter advances."""
        if isinstance(self.nvml, SimulatedNvml):
            with self._io_lock:
                now = time.monotonic()
                self.nvml.advance(now - self._sim_time)
                self._sim_time = now

    def _refresh_covered(self) -> None:
        """The settings the newest checkpoint leads back for (it chains the earlier ones)."""
        found = earlier_checkpoints(self.dirs.checkpoints, self.nvml.kind)
        self.covered = {(a.uuid, a.kind) for a, _ in found[0][1]} if found else set()

    # plan in force ---------------------------------------------------------------------
    def _in_force(self) -> tuple[PlanInForce, Plan]:
        pif = self.state.in_force
        if pif is None:
            raise Refused("no_plan", "no plan is in force: apply one first")
        cached = self._parsed
        if cached is None or cached[0] is not pif:
            cached = (pif, Plan.model_validate(pif.plan))
            self._parsed = cached
        return cached

    def _plan_gpu(self, ref: Any) -> tuple[GpuPlan, int, str, PlanInForce]:
        """(plan GPU, NVML index, UUID, plan in force) of a request's ``gpu``: a plan GPU id
        or an NVML index."""
        pif, plan = self._in_force()
        if isinstance(ref, bool) or not isinstance(ref, str | int):
            raise Refused("bad_request", "gpu: expected a plan GPU id or an NVML index")
        for g in plan.gpus:
            uuid = pif.devices.get(g.gpu)
            if uuid is None:
                continue
            index = self.nvml.index_of_uuid(uuid)
            if ref == g.gpu or (isinstance(ref, int) and ref == index):
                return g, index, uuid, pif
        raise Refused(
            "outside_envelope",
            f"gpu: {ref!r} is not a GPU of the plan in force ({pif.plan_id}) on this host",
        )

    # operations ------------------------------------------------------------------------
    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        """Carry out ``op``; Refused with a code and a reason when it cannot be done."""
        self.stats.requests[op] += 1
        if op in _CHANGES:
            self.last_heartbeat = time.monotonic()
            self.watchdog_fired = False
        try:
            if op == "status":
                return self.status()
            if op == "heartbeat":
                return {"watchdog_s": self.heartbeat_timeout_s}
            if op == "apply":
                return self.apply(args)
            if op == "set_clock":
                return self.set_setting(args, "clock_mhz")
            if op == "set_power_limit":
                return self.set_setting(args, "power_limit_w")
            if op == "shift_mps":
                return self.shift_mps(args)
            if op == "measure":
                return self.measure(args)
            if op == "restore":
                return self.restore()
            raise Refused("unknown_op", f"op: {op!r}")
        except Refused as exc:
            self.stats.refusals[(op, exc.code)] += 1
            raise

    def refused(self, op: str, code: str) -> None:
        """Count a refusal made before ``handle`` (authorization, framing)."""
        self.stats.requests[op] += 1
        self.stats.refusals[(op, code)] += 1

    def status(self) -> dict[str, Any]:
        """Every GPU the policy allows: readings, plan settings, envelope, online changes."""
        self._advance_sim()
        pif = self.state.in_force
        plan = Plan.model_validate(pif.plan) if pif else None
        by_uuid = {uuid: gpu for gpu, uuid in (pif.devices.items() if pif else [])}
        overrides = dict(self.overrides)  # a copy: another thread may change it meanwhile
        gpus = []
        for i in range(self.nvml.device_count()):
            uuid = self.nvml.uuid(i)
            if not self.policy.gpu_allowed(i, uuid):
                continue
            row = gpu_status(self.nvml, i)
            entry: dict[str, Any] = {
                "index": i,
                "uuid": uuid,
                "name": row.name,
                "sm_clock_mhz": row.sm_clock_mhz,
                "locked_clocks": self.nvml.get_locked_clocks(i),
                "power_w": row.power_w,
                "power_limit_w": row.power_limit_w,
                "energy_j": row.energy_j,
                "persistence": row.persistence,
                "mig": row.mig,
                "plan_gpu": by_uuid.get(uuid),
                "online": {k: v for (j, k), v in overrides.items() if j == i},
            }
            if plan is not None and pif is not None and uuid in by_uuid:
                g = plan.gpu(by_uuid[uuid])
                entry["plan"] = {
                    "on": g.on,
                    "clock_mhz": g.clock_mhz,
                    "power_limit_w": g.power_limit_w,
                    "predicted_power_w": g.predicted_power_w,
                    "envelope": pif.envelope.get(g.gpu),
                    "placements": [
                        {
                            "workload": p.workload,
                            "phase": p.phase,
                            "share_pct": p.share_pct,
                            "mig": p.mig_profile,
                        }
                        for p in g.placements
                    ],
                }
            gpus.append(entry)
        age = None if self.last_heartbeat is None else time.monotonic() - self.last_heartbeat
        return {
            "backend": self.nvml.kind,
            "plan_id": pif.plan_id if pif else None,
            "gpus": gpus,
            "heartbeat_age_s": age,
            "watchdog_s": self.heartbeat_timeout_s,
            "watchdog_fired": self.watchdog_fired,
            "reconciled": self.reconcile_notes,
        }

    def _envelope(
        self, plan: Plan, host: HostPlan, asked: Any
    ) -> dict[str, dict[str, list[float]]]:
        """Each applied plan GPU's envelope: the policy's ranges, narrowed by ``asked``
        (``{plan_gpu: {"clock_mhz": [lo, hi], "power_limit_w": [lo, hi]}}``), the power
        limit capped at the plan's own; the plan's settings must lie in it."""
        if asked is None:
            asked = {}
        if not isinstance(asked, dict):
            raise Refused("bad_request", "envelope: expected an object {plan_gpu: {...}}")
        unknown = sorted(set(asked) - set(host.devices))
        if unknown:
            raise Refused(
                "bad_request", f"envelope: not GPUs this apply puts on the host: {unknown}"
            )
        out: dict[str, dict[str, list[float]]] = {}
        pol = self.policy
        for g in plan.gpus:
            if g.gpu not in host.devices or not g.on:
                continue
            mine = asked.get(g.gpu, {})
            if not isinstance(mine, dict) or set(mine) - {"clock_mhz", "power_limit_w"}:
                raise Refused(
                    "bad_request", f"envelope.{g.gpu}: expected clock_mhz and/or power_limit_w"
                )
            clock = (pol.clock_mhz.min, pol.clock_mhz.max)
            limit = (pol.power_limit_w.min, pol.power_limit_w.max)
            if "clock_mhz" in mine:
                clock = _pair(mine["clock_mhz"], f"envelope.{g.gpu}.clock_mhz")
            if "power_limit_w" in mine:
                limit = _pair(mine["power_limit_w"], f"envelope.{g.gpu}.power_limit_w")
            elif g.power_limit_w is not None:
                limit = (limit[0], min(limit[1], g.power_limit_w))
            for name, (lo, hi), rng in (
                ("clock_mhz", clock, pol.clock_mhz),
                ("power_limit_w", limit, pol.power_limit_w),
            ):
                if not (rng.holds(lo) and rng.holds(hi)):
                    raise Refused(
                        "outside_policy",
                        f"envelope.{g.gpu}.{name}: [{lo:g}, {hi:g}] is not within the policy's "
                        f"range [{rng.min:g}, {rng.max:g}]",
                    )
            if g.clock_mhz is not None and not clock[0] <= g.clock_mhz <= clock[1]:
                raise Refused(
                    "outside_envelope",
                    f"{g.gpu}: the plan's clock {g.clock_mhz} MHz is outside its envelope "
                    f"[{clock[0]:g}, {clock[1]:g}] MHz",
                )
            if g.power_limit_w is not None and not limit[0] <= g.power_limit_w <= limit[1]:
                raise Refused(
                    "outside_envelope",
                    f"{g.gpu}: the plan's power limit {g.power_limit_w:g} W is outside its "
                    f"envelope [{limit[0]:g}, {limit[1]:g}] W",
                )
            out[g.gpu] = {"clock_mhz": list(clock), "power_limit_w": list(limit)}
        return out

    def _prepare(
        self, data: Any, mapping: Any, envelope: Any
    ) -> tuple[PlanInForce, HostPlan]:
        """Check a plan against the host and the policy, before anything is written."""
        if not isinstance(data, dict):
            raise Refused("bad_request", "plan: expected a plan object (a serving plan's JSON)")
        if mapping is not None and (
            not isinstance(mapping, dict)
            or not all(isinstance(k, str) and isinstance(v, str | int) for k, v in mapping.items())
        ):
            raise Refused("bad_request", "map: expected {plan_gpu: NVML index or UUID}")
        try:
            plan = parse(Plan, data, "plan")
            problems = plan_problems(plan, self.catalog.gpus, "plan")
            if problems:
                raise SpecError(problems)
        except SpecError as exc:
            raise Refused("bad_request", "; ".join(exc.problems)) from None
        try:
            host = plan_actions(
                plan,
                self.nvml,
                self.catalog,
                {k: str(v) for k, v in mapping.items()} if mapping else None,
                self.mps_dir,
            )
        except ExecutorError as exc:
            raise Refused("bad_plan", str(exc)) from None
        self.check_policy(plan, host)
        pif = PlanInForce(
            plan=plan.model_dump(mode="json", exclude_none=True),
            plan_id=plan_id(data),
            devices={gpu: dev.uuid for gpu, dev in host.devices.items()},
            envelope=self._envelope(plan, host, envelope),
            mps_dir=self.mps_dir,
        )
        return pif, host

    def check_policy(self, plan: Plan, host: HostPlan) -> None:
        """Refused (outside_policy) when the plan puts a GPU the policy does not list, or
        a clock or power limit outside its ranges, on this host."""
        for gpu, dev in host.devices.items():
            if not self.policy.gpu_allowed(dev.index, dev.uuid):
                raise Refused(
                    "outside_policy",
                    f"{gpu}: GPU {dev.index} ({dev.uuid}) is not one the policy lets the "
                    "agent change",
                )
            g = plan.gpu(gpu)
            if g.on and g.clock_mhz is not None:
                self.policy.check_clock(gpu, g.clock_mhz)
            if g.on and g.power_limit_w is not None:
                self.policy.check_power_limit(gpu, g.power_limit_w)

    def apply(self, args: dict[str, Any]) -> dict[str, Any]:
        """Apply a plan with the executor's transaction; the online changes of the plan
        before it are returned to that plan's settings first (so the checkpoint chain
        keeps the originals from before the first apply)."""
        unknown = set(args) - {"plan", "map", "envelope"}
        if unknown:
            raise Refused("bad_request", f"args: unknown field(s) {', '.join(sorted(unknown))}")
        pif, host = self._prepare(args.get("plan"), args.get("map"), args.get("envelope"))
        with self._locked():
            self._return_to_plan()
            checkpoint = self.dirs.new_checkpoint("apply")
            with self._state_lock:
                self.state.applying, self.state.applying_checkpoint = pif, str(checkpoint)
                self.dirs.save(self.state)
            try:
                report = Transaction(self.ctx, host.actions, checkpoint, say=self.say).run()
            except ApplyFailed as exc:
                self.stats.rollbacks += 1
                self._finish_apply(None)
                raise Refused("device_error", str(exc)) from None
            except ExecutorError as exc:  # the checkpoint could not be written: no change
                self._finish_apply(None)
                raise Refused("device_error", str(exc)) from None
            self._finish_apply(pif)
            self._refresh_covered()
        self.say(f"applied plan {pif.plan_id}: {len(report.applied)} change(s)")
        return {
            "plan_id": pif.plan_id,
            "applied": [f"{a.where()}: {a.describe()}" for a in report.applied],
            "already_in_place": len(report.skipped),
            "checkpoint": str(report.checkpoint) if report.checkpoint else None,
            "envelope": pif.envelope,
            "mps_client_env": {
                gpu: dict(envs) for gpu, envs in host.client_envs.items()
            },
            "notes": host.notes,
        }

    def _finish_apply(self, pif: PlanInForce | None) -> None:
        """Record the end of an apply: ``pif`` in force (None: the earlier plan stays)."""
        with self._state_lock:
            if pif is not None:
                self.state.in_force = pif
                self.overrides.clear()
            self.state.applying, self.state.applying_checkpoint = None, None
            self.dirs.save(self.state)
        self._persist_sim()

    def set_setting(self, args: dict[str, Any], name: str) -> dict[str, Any]:
        """Lock one GPU's clock (``clock_mhz``) or set its power limit (``power_limit_w``)
        within the envelope of the plan in force and the policy."""
        unknown = set(args) - {"gpu", name}
        if unknown:
            raise Refused("bad_request", f"args: unknown field(s) {', '.join(sorted(unknown))}")
        value = args.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refused("bad_request", f"{name}: missing or not a number")
        g, index, uuid, pif = self._plan_gpu(args.get("gpu"))
        where = f"{g.gpu} (GPU {index})"
        if not g.on:
            raise Refused("outside_envelope", f"{where}: off in the plan in force")
        lo, hi = pif.envelope[g.gpu][name]
        action: Action
        if name == "clock_mhz":
            if g.clock_mhz is None:
                raise Refused(
                    "outside_envelope",
                    f"{where}: the plan in force does not lock this GPU's clocks, so it has "
                    "no setting to return to",
                )
            if value != int(value):
                raise Refused("bad_request", f"clock_mhz: {value} is not a whole number of MHz")
            check_setting(
                where,
                name,
                int(value),
                policy=(self.policy.clock_mhz.min, self.policy.clock_mhz.max),
                envelope=(lo, hi),
                envelope_of=f"plan {pif.plan_id}",
                supported_clocks_mhz=self.nvml.supported_sm_clocks(index),
            )
            action = LockClocks(g.gpu, index, uuid, clock_mhz=int(value))
            planned: Any = [g.clock_mhz, g.clock_mhz]
        else:
            if g.power_limit_w is None:
                raise Refused(
                    "outside_envelope",
                    f"{where}: the plan in force sets no power limit on this GPU, so it has "
                    "no setting to return to",
                )
            cmin, cmax = self.nvml.get_power_limit_constraints(index)
            check_setting(
                where,
                name,
                float(value),
                policy=(self.policy.power_limit_w.min, self.policy.power_limit_w.max),
                envelope=(lo, hi),
                envelope_of=f"plan {pif.plan_id}",
                device_range_w=(cmin / 1000, cmax / 1000),
            )
            action = SetPowerLimit(g.gpu, index, uuid, limit_mw=round(float(value) * 1000))
            planned = round(g.power_limit_w * 1000)
        with self._locked([index]):
            previous = action.read(self.ctx)
            self._write(action, previous)
            key = (index, action.kind)
            if action.target() == planned:
                self.overrides.pop(key, None)
            else:
                self.overrides[key] = action.target()
        self._persist_sim()
        return {"gpu": g.gpu, "index": index, name: value, "previous": previous}

    def shift_mps(self, args: dict[str, Any]) -> dict[str, Any]:
        """Shift the MPS active-thread percentages between the placements of one GPU of the
        plan in force (``shares`` {client: percent}, a client being a placement's
        ``workload`` or ``workload:phase``), never raising the GPU's total above 100 %.

        MPS fixes a client's percentage when the client connects, so nothing is written
        to the GPU or its MPS daemon: the shift is recorded as an online change and the
        answer carries each client's environment, with which the serving system starts
        (or restarts) it. The watchdog, a new apply and a restart return it to the plan."""
        unknown = set(args) - {"gpu", "shares"}
        if unknown:
            raise Refused("bad_request", f"args: unknown field(s) {', '.join(sorted(unknown))}")
        asked = args.get("shares")
        if not isinstance(asked, dict) or not all(isinstance(k, str) for k in asked):
            raise Refused("bad_request", "shares: expected an object {client: percent}")
        g, index, uuid, pif = self._plan_gpu(args.get("gpu"))
        where = f"{g.gpu} (GPU {index})"
        if not g.on:
            raise Refused("outside_envelope", f"{where}: off in the plan in force")
        if any(p.mig_profile is not None for p in g.placements) or not (
            len(g.placements) > 1 or any(p.share_pct < 100 for p in g.placements)
        ):
            raise Refused("outside_envelope", f"{where}: the plan in force runs no MPS on it")
        planned = {_client(p.workload, p.phase): p.share_pct for p in g.placements}
        with self._locked([index]):
            key = (index, MPS_SHARES)
            current = dict(self.overrides.get(key, planned))
            after = check_shares(where, asked, current)
            if after == planned:
                self.overrides.pop(key, None)
            else:
                self.overrides[key] = after
        base = pif.mps_dir or self.mps_dir
        return {
            "gpu": g.gpu,
            "index": index,
            "shares": after,
            "previous": current,
            "client_env": {c: client_env(base, uuid, pct) for c, pct in after.items()},
        }

    def measure(self, args: dict[str, Any]) -> dict[str, Any]:
        """Energy (J) and mean power (W) of every GPU the policy allows over the next
        ``window_s`` seconds (at most ``MAX_MEASURE_S``), from NVML's energy counter."""
        unknown = set(args) - {"window_s"}
        if unknown:
            raise Refused("bad_request", f"args: unknown field(s) {', '.join(sorted(unknown))}")
        window = args.get("window_s")
        if (
            isinstance(window, bool)
            or not isinstance(window, int | float)
            or not 0 < window <= MAX_MEASURE_S
        ):
            raise Refused(
                "bad_request", f"window_s: expected a number of seconds in (0, {MAX_MEASURE_S:g}]"
            )
        self._advance_sim()
        interval = min(0.1, float(window) / 10)
        if isinstance(self.nvml, SimulatedNvml):
            with self._io_lock:  # the simulated clock advances the host itself
                windows, _ = measure(self.nvml, self.session.clock, float(window), None, interval)
        else:
            windows, _ = measure(self.nvml, self.session.clock, float(window), None, interval)
        pif = self.state.in_force
        by_uuid = {uuid: gpu for gpu, uuid in (pif.devices.items() if pif else [])}
        gpus = []
        for w in windows:
            uuid = self.nvml.uuid(w.index)
            if not self.policy.gpu_allowed(w.index, uuid):
                continue
            gpus.append(
                {
                    "index": w.index,
                    "uuid": uuid,
                    "plan_gpu": by_uuid.get(uuid),
                    "seconds": w.seconds,
                    "energy_j": w.energy_j,
                    "avg_power_w": w.avg_power_w,
                    "mean_sm_clock_mhz": w.mean_sm_clock_mhz,
                }
            )
        return {"window_s": float(window), "plan_id": pif.plan_id if pif else None, "gpus": gpus}

    def _write(self, action: Action, previous: Any) -> None:
        """Write one setting and read it back; the first write of a setting no checkpoint
        covers goes through a transaction (a checkpoint first). Refused on failure, with
        the setting put back."""
        if action.is_noop(previous):
            return
        try:
            if (action.uuid, action.kind) not in self.covered:
                Transaction(self.ctx, [action], self.dirs.new_checkpoint("online")).run()
                self._refresh_covered()
                return
            try:
                action.apply(self.ctx)
                action.verify(self.ctx)
            except ExecutorError as exc:
                self.stats.rollbacks += 1
                try:
                    action.undo(self.ctx, previous)
                except ExecutorError as undo_exc:
                    raise Refused(
                        "device_error",
                        f"{exc}; putting back {action.show(previous)} failed too: {undo_exc}",
                    ) from None
                raise Refused(
                    "device_error", f"{exc}; {action.show(previous)} was put back"
                ) from None
        except ApplyFailed as exc:
            self.stats.rollbacks += 1
            raise Refused("device_error", str(exc)) from None
        except ExecutorError as exc:
            raise Refused("device_error", str(exc)) from None

    def _return_to_plan(self) -> list[str]:
        """Put every online change back to the plan in force's setting (caller holds the
        locks). Returns what was written."""
        done: list[str] = []
        pif = self.state.in_force
        if pif is None or not self.overrides:
            self.overrides.clear()
            return done
        plan = Plan.model_validate(pif.plan)
        for (index, kind), _ in sorted(self.overrides.items()):
            uuid = self.nvml.uuid(index)
            gpu = next((p for p, u in pif.devices.items() if u == uuid), None)
            if gpu is None:
                continue
            g = plan.gpu(gpu)
            action: Action
            if kind == LockClocks.kind and g.clock_mhz is not None:
                action = LockClocks(gpu, index, uuid, clock_mhz=g.clock_mhz)
            elif kind == SetPowerLimit.kind and g.power_limit_w is not None:
                action = SetPowerLimit(gpu, index, uuid, limit_mw=round(g.power_limit_w * 1000))
            elif kind == MPS_SHARES:  # nothing on the device: clients start with the plan's
                self.overrides.pop((index, kind), None)
                done.append(f"{gpu} (GPU {index}): MPS shares back to the plan's")
                continue
            else:
                continue
            try:
                if not action.is_noop(action.read(self.ctx)):
                    action.apply(self.ctx)
                    action.verify(self.ctx)
                    done.append(f"{action.where()}: {action.describe()}")
            except ExecutorError as exc:
                self.say(f"returning {action.where()} to the plan failed: {exc}")
                continue
            self.overrides.pop((index, kind), None)
        self._persist_sim()
        return done

    def fallback(self) -> list[str]:
        """Return every GPU to the plan's settings (the watchdog's action)."""
        with self._locked():
            done = self._return_to_plan()
        self.stats.watchdog_fallbacks += 1
        self.watchdog_fired = True
        for line in done:
            self.say(f"watchdog: {line}")
        return done

    def restore(self) -> dict[str, Any]:
        """Put every GPU back as it was before the first apply (the newest checkpoint);
        no plan is in force afterwards."""
        with self._locked():
            found = earlier_checkpoints(self.dirs.checkpoints, self.nvml.kind)
            if not found:
                with self._state_lock:
                    self.state.in_force = None
                    self.state.restoring = False
                    self.overrides.clear()
                    self.dirs.save(self.state)
                return {"checked": 0, "checkpoint": None}
            newest = found[0][0]
            with self._state_lock:
                self.state.restoring = True
                self.dirs.save(self.state)
            try:
                count, errors = restore(self.ctx, newest)
            except ExecutorError as exc:
                raise Refused("device_error", f"restore from {newest}: {exc}") from None
            self._persist_sim()
            if errors:
                raise Refused(
                    "device_error",
                    f"restore from {newest}: {len(errors)} setting(s) still differ: "
                    + "; ".join(errors),
                )
            self.dirs.retire_checkpoints()
            self.covered = set()
            with self._state_lock:
                self.state.in_force = None
                self.state.restoring = False
                self.overrides.clear()
                self.dirs.save(self.state)
        self.say(f"restored {count} setting(s) from {newest}")
        return {"checked": count, "checkpoint": str(newest)}

    # start and stop --------------------------------------------------------------------
    def start(self) -> list[str]:
        """Read the state directory and reconcile the GPUs with it (see ``reconcile``)."""
        from energyopt.agent.reconcile import reconcile

        self.dirs.create()
        self.state = self.dirs.load()
        self.reconcile_notes = reconcile(self)
        self._refresh_covered()
        for line in self.reconcile_notes:
            self.say(f"reconcile: {line}")
        return self.reconcile_notes

    def stop(self) -> None:
        """On stop: put the originals back when configured, else leave the plan in place."""
        if self.restore_on_stop:
            try:
                self.restore()
            except Refused as exc:
                self.say(f"restore on stop: {exc.reason}")
        self._persist_sim()


def _client(workload: str, phase: str) -> str:
    """The name of a placement's MPS client on its GPU: ``workload`` or ``workload:phase``."""
    return workload if phase == "both" else f"{workload}:{phase}"
