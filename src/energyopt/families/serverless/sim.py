"""Request-level simulation of serverless disaggregated serving under a
provisioning plan, with or without online decode merging.

Instances follow the plan's pools epoch by epoch. An instance the plan adds is
started ``load_s`` before its epoch (weights loaded ahead from the forecast) and
billed from then; one it removes is released once idle (prefill) or empty
(decode). With merging, a removed decode instance's requests are migrated into
the instances kept instead, and between epochs (every ``merge_interval_s``) the
merging policy also consolidates under-used decode instances of a model on a node
while the observed arrival rate leaves headroom, starting instances again (cold,
``load_s``) when the rate rises. A policy with ``prefill_headroom`` also scales
prefill inside the epoch to the observed rate, except where the epoch's forecast
announces a surge (``MergePolicy``).

* Prefill: one prompt at a time per instance, first come, first served, on the
  instance that would finish it first (least expected completion time, so long
  prompts go to large slices); the pass time and energy are the performance
  model's (perf/forward.py) for the request's own prompt. TTFT = wait + prefill +
  KV transfer over the instance's link (perf/kvtransfer.py).
* Decode: continuous batching. An instance's step time and energy at batch b are
  the model's decode pass at the model's mean context; between events every
  request in the batch emits one token per step. A request is admitted where its
  KV cache (prompt + output tokens) fits the instance's KV budget and the batch
  limit, the fullest such instance first (best fit); otherwise it waits.
* A migration moves a request's KV cache (prompt + tokens so far) over NVLink
  (same node) or the network; the request emits nothing meanwhile, so its next
  token gap is the migration time plus a step.

The merge decision (which instances to release, where their requests go) is the
policy's (``merge_policy.MergePolicy``, deciding by ``solvers.merge.decide_merge``)
on the model's candidates: the priced greedy, and the merge MILP where the
candidate set is small. It reads each instance's capacity, batch at capacity, KV
budget and holding cost from decode figures: a compiled rate table's
(``families/serverless/tables.py``) when the replay is given one, else the same
figures computed from the performance model (``figures.decode_figures``; pass
times and energies from ``figures.option_tables``). Trace preparation is in
``replay``; events are popped from ``sim.events.EventQueue``.

This module holds the replay itself: ``simulate``, its result
(``ServerlessSimResult``), the instances it runs (``Instance``) and
``ConservationError``.

Every merge decision is checked by ``verify.check_merge`` (no request
lost or duplicated, no target over its KV budget or batch limit) and every
request must finish exactly once (conservation). Times s, energies J.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from energyopt.families.serverless.figures import (
    OptionTables,
    PoolKey,
    decode_figures,
    option_tables,
    plan_targets,
    pool_order,
)
from energyopt.families.serverless.formulations.merge import (
    DecodeFigures,
    MergeDecision,
    MergeRequest,
    Snapshot,
    merge_problem,
    merge_value,
)
from energyopt.families.serverless.formulations.model import LINKS, ServerlessProblem, option_name
from energyopt.families.serverless.merge_policy import MergePolicy, MergeRecord
from energyopt.families.serverless.solvers.merge import pack
from energyopt.families.serverless.spec import ServerlessPlan
from energyopt.families.serverless.verify import DecodeInstanceState, check_merge
from energyopt.perf.kvtransfer import Link
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.events import EventQueue

if TYPE_CHECKING:
    from energyopt.families.serverless.tables import RateTable


class ConservationError(AssertionError):
    """The simulator lost or duplicated a request."""


@dataclass
class Instance:
    """A running (or loading) instance."""

    iid: int
    key: PoolKey
    billed_from: float
    ready_at: float
    released_at: float | None = None
    draining: bool = False
    free_at: float = 0.0
    # decode state: request id -> (finish step, kv bytes); clock in steps
    reqs: dict[int, tuple[float, float]] = field(default_factory=dict)
    kv_used: float = 0.0
    steps: float = 0.0
    t_last: float = 0.0
    version: int = 0


@dataclass
class ServerlessSimResult:
    """Outcome of one replay."""

    requests: int = 0
    finished: int = 0
    gpu_s: float = 0.0
    energy_j: float = 0.0
    ttft_ok: int = 0
    tokens: float = 0.0
    tokens_ok: float = 0.0
    merges: int = 0
    migrated_requests: int = 0
    migrated_bytes: float = 0.0
    starts: int = 0
    waits: int = 0
    decisions: int = 0
    """Merge decisions taken with at least one candidate that could go."""
    released: int = 0
    """Decode instances the merge decisions released (empty ones included; ``merges``
    counts every release that moved requests, forced by the plan or decided)."""
    milp_decisions: int = 0
    """Of those, the ones the merge MILP solved (the set within ``max_pairs``)."""
    milp_taken: int = 0
    """Of those, the ones where the MILP's decision was worth more than the greedy's."""
    value: float = 0.0
    """Sum of the decisions' values (objective's unit)."""
    greedy_value: float = 0.0
    """Sum of the greedy's values on the decisions the MILP solved."""
    milp_value: float = 0.0
    """Sum of the MILP's values on those decisions."""
    milp_bound: float = 0.0
    """Sum of the MILP's proven bounds on those decisions (>= any merge's value)."""
    milp_optimal: int = 0
    """Decisions on which the MILP proved its decision optimal."""
    worst_gap: float = 0.0
    """Largest (bound - greedy value) / bound over the decisions the MILP solved."""

    @property
    def ttft_attainment(self) -> float:
        return self.ttft_ok / max(self.requests, 1)

    @property
    def tbt_attainment(self) -> float:
        return self.tokens_ok / max(self.tokens, 1e-9)


_ARRIVE, _JOIN, _LAND, _FINISH, _CONTROL = 0, 1, 2, 3, 4


class _Sim:
    def __init__(
        self,
        p: ServerlessProblem,
        targets: list[dict[PoolKey, int]],
        arrivals: Arrivals,
        merging: MergePolicy | None,
        table: RateTable | None = None,
        record: list[MergeRecord] | None = None,
    ) -> None:
        self.p = p
        self.rate_table = table
        self.record = record
        self.figures: dict[int, dict[int, DecodeFigures]] = {}
        self.targets = targets
        self.arr = arrivals
        self.merging = merging
        self.tables: dict[tuple[int, int], OptionTables] = {}
        self.instances: dict[int, Instance] = {}
        self.by_key: dict[PoolKey, list[int]] = defaultdict(list)
        self.queue: EventQueue[tuple[int, int, int]] = EventQueue()
        self.ids = itertools.count()
        self.res = ServerlessSimResult(requests=len(arrivals))
        self.waiting: dict[int, list[tuple[int, float, int]]] = defaultdict(list)
        self.finished: set[int] = set()
        self.kv_per_token = [llm.kv_bytes_per_token for llm in p.llms]
        self.rate_est = np.zeros(p.n_models)
        self.rate_t = 0.0
        self.epoch = 0
        self.ttft_slo = [sm.slo.ttft_ms / 1e3 for sm in p.spec.models]
        self.tbt_slo = [sm.slo.tbt_ms / 1e3 for sm in p.spec.models]
        self.max_batch = p.spec.options.max_batch
        # TTFT outcomes per model: (time s it is known, request, within the SLO) not
        # yet known (a heap), and those known within the attainment window
        self.ttft_pending: list[list[tuple[float, int, bool]]] = [[] for _ in range(p.n_models)]
        self.ttft_seen: list[deque[tuple[float, bool]]] = [deque() for _ in range(p.n_models)]
        self.ttft_seen_ok = [0] * p.n_models

    def table(self, m: int, o: int) -> OptionTables:
        got = self.tables.get((m, o))
        if got is None:
            got = option_tables(self.p, m, o)
            self.tables[(m, o)] = got
        return got

    def figures_of(self, m: int) -> dict[int, DecodeFigures]:
        """Decode figures of model m by option: the table's, else the model's."""
        got = self.figures.get(m)
        if got is None:
            if self.rate_table is not None:
                names = tuple(option_name(o) for o in self.p.options)
                if self.rate_table.option_names() != names:
                    raise ValueError(
                        f"{self.rate_table.table.path}: options "
                        f"{self.rate_table.option_names()}, the file's are {names}"
                    )
                got = self.rate_table.decode_figures(self.p.spec.models[m].name)
            else:
                got = {o: decode_figures(self.p, m, o) for o in range(self.p.n_options)}
            self.figures[m] = got
        return got

    def push(self, t: float, kind: int, a: int = 0, b: int = 0) -> None:
        self.queue.push(t, (kind, a, b), rank=kind)

    # --- instance lifecycle -------------------------------------------------
    def start(self, key: PoolKey, at: float, ready: float) -> Instance:
        m, _, o, _, _ = key
        inst = Instance(next(self.ids), key, billed_from=at, ready_at=ready, t_last=ready)
        inst.free_at = ready
        self.instances[inst.iid] = inst
        self.by_key[key].append(inst.iid)
        self.res.starts += 1
        self.table(m, o)
        return inst

    def release(self, inst: Instance, t: float) -> None:
        if inst.released_at is not None:
            return
        m, _, o, _, _ = inst.key
        tab = self.table(m, o)
        inst.released_at = max(t, inst.billed_from)
        life = inst.released_at - inst.billed_from
        self.res.gpu_s += tab.gpus * life
        self.res.energy_j += tab.on_w * life
        self.by_key[inst.key].remove(inst.iid)

    def live(self, key: PoolKey) -> list[Instance]:
        return [self.instances[i] for i in self.by_key[key]]

    def apply_epoch(self, t_epoch: int, now: float) -> None:
        """Move every pool to the plan's count of epoch ``t_epoch``."""
        want = self.targets[t_epoch]
        # in a fixed order: the order of starts fixes instance ids and so routing
        for key in sorted(set(want) | {k for k, v in self.by_key.items() if v}, key=pool_order):
            target = want.get(key, 0)
            insts = self.live(key)
            active = [i for i in insts if not i.draining]
            if self.merging is not None and key[3] == "decode" and len(active) < target:
                continue  # merging grows decode pools by need (``consolidate``)
            if self.scales_prefill and key[3] == "prefill" and len(active) < target:
                continue  # grown by need (``scale_prefill``)
            if len(active) < target:
                for inst in [i for i in insts if i.draining][: target - len(active)]:
                    inst.draining = False
                    active.append(inst)
                m, _, o, _, _ = key
                load = self.table(m, o).load_s
                for _ in range(target - len(active)):
                    self.start(key, now - load, now)
            elif len(active) > target:
                self.shrink(key, active, len(active) - target, now)
        if self.merging is not None:
            self.consolidate(now, forecast=True)
        for m in range(self.p.n_models):
            self.admit_waiting(m, now)

    def shrink(self, key: PoolKey, active: list[Instance], count: int, now: float) -> None:
        """Remove ``count`` instances of a pool: the least loaded first."""
        if key[3] == "prefill":
            for inst in sorted(active, key=lambda i: i.free_at)[:count]:
                inst.draining = True
                if inst.free_at <= now:
                    self.release(inst, now)
                else:
                    self.push(inst.free_at, _CONTROL, -1, inst.iid)
            return
        for inst in sorted(active, key=lambda i: len(i.reqs))[:count]:
            inst.draining = True
            if not inst.reqs:
                self.release(inst, now)
            elif self.merging is not None:
                self.merge_away(inst, now)

    # --- decode instances ---------------------------------------------------
    def advance(self, inst: Instance, t: float) -> None:
        m, _, o, _, _ = inst.key
        b = len(inst.reqs)
        if b and t > inst.t_last:
            tab = self.table(m, o)
            step = float(tab.step_s[b])
            n = (t - inst.t_last) / step
            inst.steps += n
            self.res.tokens += b * n
            if step <= self.tbt_slo[m]:
                self.res.tokens_ok += b * n
            self.res.energy_j += n * float(tab.step_j[b])
        inst.t_last = max(inst.t_last, t)

    def reschedule(self, inst: Instance) -> None:
        inst.version += 1
        if not inst.reqs:
            return
        m, _, o, _, _ = inst.key
        step = float(self.table(m, o).step_s[len(inst.reqs)])
        first = min(f for f, _ in inst.reqs.values())
        t = inst.t_last + max(first - inst.steps, 0.0) * step
        self.push(t, _FINISH, inst.iid, inst.version)

    def room(self, inst: Instance, kv: float, extra: int = 1) -> bool:
        m, _, o, _, _ = inst.key
        tab = self.table(m, o)
        used = inst.kv_used
        return len(inst.reqs) + extra <= self.max_batch and used + kv <= tab.kv_budget_bytes

    def decode_candidates(self, m: int, nodes: set[int] | None, now: float) -> list[Instance]:
        out = []
        for key, ids in self.by_key.items():
            if key[0] != m or key[3] != "decode" or (nodes is not None and key[1] not in nodes):
                continue
            for i in ids:
                inst = self.instances[i]
                if not inst.draining and inst.ready_at <= now + 1e-12:
                    out.append(inst)
        return out

    def join(self, rid: int, now: float, nodes: set[int] | None, waited_from: float) -> bool:
        m = int(self.arr.workload[rid])
        kv = self.kv_per_token[m] * float(self.arr.prompt_tokens[rid] + self.arr.output_tokens[rid])
        cands = [i for i in self.decode_candidates(m, nodes, now) if self.room(i, kv)]
        if not cands and nodes is not None:
            cands = [i for i in self.decode_candidates(m, None, now) if self.room(i, kv)]
        if not cands:
            return False
        inst = max(cands, key=lambda i: (len(i.reqs), -i.iid))
        self.advance(inst, now)
        inst.reqs[rid] = (inst.steps + float(self.arr.output_tokens[rid]), kv)
        inst.kv_used += kv
        if now - waited_from > 1e-12:
            step = float(self.table(m, inst.key[2]).step_s[len(inst.reqs)])
            self.res.tokens += 1.0
            if now - waited_from + step <= self.tbt_slo[m]:
                self.res.tokens_ok += 1.0
        self.reschedule(inst)
        return True

    def admit_waiting(self, m: int, now: float) -> None:
        queue = self.waiting[m]
        served = 0
        for rid, since, node in queue:  # first come, first served: the head blocks
            if not self.join(rid, now, {node}, since):
                break
            served += 1
        if served:
            self.waiting[m] = queue[served:]

    def finish(self, inst: Instance, now: float) -> None:
        self.advance(inst, now)
        done = [r for r, (f, _) in inst.reqs.items() if f <= inst.steps + 1e-9]
        for r in done:
            inst.kv_used -= inst.reqs.pop(r)[1]
            if r in self.finished:
                raise ConservationError(f"request {r} finished twice")
            self.finished.add(r)
            self.res.finished += 1
        self.reschedule(inst)
        m = inst.key[0]
        if inst.draining and not inst.reqs:
            self.release(inst, now)
        self.admit_waiting(m, now)

    # --- merging ------------------------------------------------------------
    def state_of(self, inst: Instance) -> DecodeInstanceState:
        m, _, o, _, _ = inst.key
        tab = self.table(m, o)
        return DecodeInstanceState(
            name=str(inst.iid),
            kv_budget_bytes=tab.kv_budget_bytes,
            max_batch=self.max_batch,
            requests={r: kv for r, (_, kv) in inst.reqs.items()},
        )

    def snapshot(self, inst: Instance, now: float) -> Snapshot:
        """The instance as a merge decision sees it: each request's reserved KV and
        the bytes a migration would move now (prompt + tokens so far)."""
        m, node, o, _, _ = inst.key
        self.advance(inst, now)
        reqs = []
        for rid, (finish_step, kv) in sorted(inst.reqs.items()):
            left = max(finish_step - inst.steps, 0.0)
            generated = max(float(self.arr.output_tokens[rid]) - left, 0.0)
            moved = self.kv_per_token[m] * (float(self.arr.prompt_tokens[rid]) + generated)
            reqs.append(MergeRequest(rid, kv, moved))
        return Snapshot(str(inst.iid), node, o, tuple(reqs))

    def merge_terms(self) -> tuple[float, float]:
        pol = self.merging
        assert pol is not None
        return pol.price_per_gb, pol.price_per_stall_s

    def merge_links(self) -> tuple[Link, Link]:
        """Links a merge decision prices migrations over: the table's, else the file's."""
        return self.rate_table.links() if self.rate_table is not None else self.p.links

    def merge_max_batch(self) -> int:
        """Batch limit a merge decision reads: the table's, else the file's."""
        return self.rate_table.max_batch if self.rate_table is not None else self.max_batch

    def remaining_s(self, now: float) -> float:
        return max(0.0, (self.epoch + 1) * self.p.epoch_s - now)

    def apply_merge(self, cands: list[Instance], decision: MergeDecision, now: float) -> None:
        """Carry out a decision on ``cands`` (checked by ``check_merge`` first):
        migrate every request of a released instance to its destination, release it."""
        moves = {rid: str(cands[j].iid) for rid, j in decision.moves.items()}
        released = [str(cands[i].iid) for i in sorted(decision.released)]
        bad = check_merge([self.state_of(i) for i in cands], moves, released)
        if bad:
            raise ConservationError("merge rejected: " + "; ".join(str(v) for v in bad))
        for i in sorted(decision.released):
            source = cands[i]
            m, node, _, _, _ = source.key
            self.advance(source, now)
            held = bool(source.reqs)
            for rid, _ in sorted(source.reqs.items(), key=lambda x: (-x[1][1], x[0])):
                finish_step, kv = source.reqs.pop(rid)
                source.kv_used -= kv
                left = max(finish_step - source.steps, 0.0)
                generated = max(float(self.arr.output_tokens[rid]) - left, 0.0)
                moved = self.kv_per_token[m] * (float(self.arr.prompt_tokens[rid]) + generated)
                self.res.migrated_bytes += moved
                self.res.migrated_requests += 1
                dest = cands[decision.moves[rid]]
                self.advance(dest, now)
                dest.reqs[rid] = (dest.steps + left, kv)
                dest.kv_used += kv
                pause = self.p.links[0 if dest.key[1] == node else 1].transfer_s(moved)
                step = float(self.table(m, dest.key[2]).step_s[len(dest.reqs)])
                self.res.tokens += 1.0
                if pause + step <= self.tbt_slo[m]:
                    self.res.tokens_ok += 1.0
                self.reschedule(dest)
            if held:
                self.res.merges += 1
            source.draining = True
            self.reschedule(source)
            self.release(source, now)

    def merge_away(self, source: Instance, now: float) -> bool:
        """The plan removes ``source``: migrate every request of it into the other
        decode instances of its model (best fit decreasing, own node first, up to the
        batch limit) and release it; False (nothing moved) if they do not all fit."""
        m = source.key[0]
        cands = [source] + [i for i in self.decode_candidates(m, None, now) if i.iid != source.iid]
        price_gb, price_stall = self.merge_terms()
        prob = merge_problem(
            [self.snapshot(i, now) for i in cands],
            self.figures_of(m),
            need_rps=0.0,
            other_capacity_rps=0.0,
            remaining_s=self.remaining_s(now),
            fill=None,
            max_batch=self.merge_max_batch(),
            price_per_gb=price_gb,
            price_per_stall_s=price_stall,
            links=self.merge_links(),
        )
        count = [len(r) for r in prob.requests]
        used = [sum(x.kv_bytes for x in r) for r in prob.requests]
        held = [[(i, x) for x in r] for i, r in enumerate(prob.requests)]
        dest = pack(prob, 0, set(), count, used, held)
        if dest is None:
            return False
        self.apply_merge(cands, MergeDecision(frozenset({0}), dest), now)
        return True

    @property
    def scales_prefill(self) -> bool:
        return self.merging is not None and self.merging.prefill_headroom is not None

    def prefill_capacity(self, inst: Instance) -> float:
        """Planned SLO capacity of a prefill instance (rps, its link's)."""
        m, _, o, _, link = inst.key
        return float(self.p.cap_prefill[m, o, LINKS.index(link or "nvlink")])

    def prefill_of(self, m: int) -> list[Instance]:
        return [
            self.instances[i]
            for k in sorted(self.by_key, key=pool_order)
            if k[0] == m and k[3] == "prefill"
            for i in self.by_key[k]
        ]

    def grow_prefill(self, m: int, short: float, now: float, ahead: bool) -> None:
        """Add ``short`` rps of prefill capacity to model m: instances still up that
        were to go first (at once), then the plan's prefill pools up to their count
        (cold: ready after the load, or loaded ahead at an epoch boundary)."""
        for inst in sorted(
            (i for i in self.prefill_of(m) if i.draining),
            key=lambda i: (-self.prefill_capacity(i), i.iid),
        ):
            if short <= 0:
                return
            inst.draining = False
            short -= self.prefill_capacity(inst)
        want = self.targets[min(self.epoch, self.p.n_epochs - 1)]
        for key in sorted(want, key=pool_order):
            if key[0] != m or key[3] != "prefill":
                continue
            load = self.table(m, key[2]).load_s
            while short > 0 and sum(not i.draining for i in self.live(key)) < want[key]:
                inst = (
                    self.start(key, now - load, now) if ahead else self.start(key, now, now + load)
                )
                short -= self.prefill_capacity(inst)

    def note_ttft(self, rid: int, arrived: float, first_token: float) -> None:
        """Count request ``rid``'s TTFT (arrived and first token sent at these times,
        s) and, for a policy that reads the TTFT attainment, keep its outcome until it
        is known: when the first token is sent, or when the SLO passes without it."""
        m = int(self.arr.workload[rid])
        ok = first_token - arrived <= self.ttft_slo[m] + 1e-12
        if ok:
            self.res.ttft_ok += 1
        pol = self.merging
        if pol is not None and pol.prefill_attainment is not None:
            known = first_token if ok else arrived + self.ttft_slo[m]
            heapq.heappush(self.ttft_pending[m], (known, rid, ok))

    def ttft_share(self, m: int, now: float, window_s: float) -> float | None:
        """Share within the TTFT SLO of model m's prompts whose outcome became known
        in (now - window_s, now] (when the first token was sent, or when the SLO
        passed without it); None if none did."""
        pending, seen = self.ttft_pending[m], self.ttft_seen[m]
        while pending and pending[0][0] <= now:
            done, _, ok = heapq.heappop(pending)
            seen.append((done, ok))
            self.ttft_seen_ok[m] += int(ok)
        while seen and seen[0][0] <= now - window_s:
            self.ttft_seen_ok[m] -= int(seen.popleft()[1])
        return self.ttft_seen_ok[m] / len(seen) if seen else None

    def prefill_scale(self, m: int, now: float) -> float:
        """Prefill capacity kept per unit of need: the load fraction (instances at
        their modelled SLO capacity) while the TTFT attainment observed over the
        policy's window meets ``prefill_attainment``, else 1 (at planned capacity)."""
        pol = self.merging
        assert pol is not None
        if pol.prefill_attainment is None:
            return 1.0
        share = self.ttft_share(m, now, pol.attainment_window_s)
        if share is None or share < pol.prefill_attainment:
            return 1.0
        return float(self.p.spec.options.load_fraction)

    def scale_prefill(self, now: float, forecast: bool) -> None:
        """In-epoch prefill scaling (``MergePolicy.prefill_headroom``), per model."""
        pol = self.merging
        assert pol is not None and pol.prefill_headroom is not None
        t = min(self.epoch, self.p.n_epochs - 1)
        lo = max(0.0, now - pol.prefill_window_s)
        rates = self.arr.count_between(lo, now) / max(now - lo, 1e-9)
        for m in range(self.p.n_models):
            need = float(rates[m]) * (1.0 + pol.prefill_headroom)
            planned = float(self.p.demand[m, t])
            calm = planned <= pol.surge_ratio * need
            scale = self.prefill_scale(m, now)
            need *= scale
            # what a release must leave: the need with the margin; at an epoch
            # boundary with the forecast ceiling, never more than the new epoch's
            # forecast (the rate it bounds), so what a burst that has ended leaves
            # goes at once
            keep = need * (1.0 + pol.prefill_release_margin)
            if pol.forecast_ceiling and forecast:
                need = min(need, planned * scale)
                keep = min(keep, planned * scale)
            if forecast and not calm:
                need = max(need, planned)
            up = [i for i in self.prefill_of(m) if not i.draining]
            cap = sum(self.prefill_capacity(i) for i in up)
            if cap < need:
                self.grow_prefill(m, need - cap, now, ahead=forecast)
                continue
            if not calm:
                continue
            for inst in sorted(up, key=lambda i: (-self.prefill_capacity(i), i.free_at, i.iid)):
                c = self.prefill_capacity(inst)
                if inst.ready_at > now or cap - c < keep:
                    continue
                cap -= c
                inst.draining = True
                if inst.free_at <= now:
                    self.release(inst, now)
                else:
                    self.push(inst.free_at, _CONTROL, -1, inst.iid)

    def observe(self, now: float) -> None:
        if self.merging is None:
            return
        window = self.merging.rate_window_s
        lo = max(0.0, now - window)
        counts = self.arr.count_between(lo, now)
        span = max(now - lo, 1e-9)
        self.rate_est = counts / span

    def consolidate(self, now: float, forecast: bool = False) -> None:
        """The online merge step, per model: the decode instances kept must cover the
        observed rate with headroom (and, at an epoch boundary, the epoch's forecast
        rate, times 1 + headroom where the headroom is negative: a policy that keeps
        decode at its modelled SLO capacity, ``headroom = load_fraction - 1``; with
        ``forecast_ceiling``, never more than the forecast at that capacity). If
        they do not, start instances of the plan's pools again, up to the plan's
        count; otherwise ``decide_merge`` on the instances that are up
        chooses which to release and where their requests go."""
        pol = self.merging
        assert pol is not None
        self.observe(now)
        want = self.targets[min(self.epoch, self.p.n_epochs - 1)]
        for m in range(self.p.n_models):
            figs = self.figures_of(m)
            need = float(self.rate_est[m]) * (1.0 + pol.headroom)
            if forecast:
                # the forecast is exact: a positive headroom (for the observed rate's
                # noise) does not inflate it, a negative one (instances kept at their
                # modelled SLO capacity, above the planned) applies to it too
                planned = float(self.p.demand[m, min(self.epoch, self.p.n_epochs - 1)])
                need = max(need, planned * (1.0 + min(pol.headroom, 0.0)))
            if pol.forecast_ceiling:  # the epoch's forecast bounds its rate
                planned = float(self.p.demand[m, min(self.epoch, self.p.n_epochs - 1)])
                need = min(need, planned * (1.0 + min(pol.headroom, 0.0)))
            active = sorted(self.decode_candidates(m, None, now), key=lambda i: i.iid)
            loading = [
                self.instances[i]
                for k, ids in self.by_key.items()
                if k[0] == m and k[3] == "decode"
                for i in ids
                if self.instances[i].ready_at > now and not self.instances[i].draining
            ]
            other = sum(figs[i.key[2]].capacity_rps for i in loading)
            cap = other + sum(figs[i.key[2]].capacity_rps for i in active)
            if cap < need:
                for key, count in want.items():
                    if key[0] != m or key[3] != "decode":
                        continue
                    while len([i for i in self.live(key) if not i.draining]) < count and cap < need:
                        tab = self.table(m, key[2])
                        if forecast:  # the epoch's forecast: loaded ahead, ready now
                            self.start(key, now - tab.load_s, now)
                        else:
                            self.start(key, now, now + tab.load_s)
                            self.push(now + tab.load_s, _CONTROL, -2, m)
                        cap += figs[key[2]].capacity_rps
                continue
            if not active:
                continue
            if cap - need < min(figs[i.key[2]].capacity_rps for i in active):
                continue  # no instance can go: nothing to decide
            self.decide(m, active, now, need, other)
        if self.scales_prefill:
            self.scale_prefill(now, forecast)

    def decide(self, m: int, active: list[Instance], now: float, need: float, other: float) -> None:
        """One merge decision on model m's ``active`` instances, recorded and applied."""
        pol = self.merging
        assert pol is not None
        snaps = tuple(self.snapshot(i, now) for i in active)
        remaining = self.remaining_s(now)
        prob = pol.problem(
            snaps,
            self.figures_of(m),
            need_rps=need,
            other_capacity_rps=other,
            remaining_s=remaining,
            max_batch=self.merge_max_batch(),
            links=self.merge_links(),
        )
        out = pol.decide(prob)
        res = self.res
        res.decisions += 1
        res.value += out.value
        if out.milp is not None:
            res.milp_decisions += 1
            res.milp_taken += int(out.milp.value > out.greedy_value + 1e-9)
            res.greedy_value += out.greedy_value
            res.milp_value += out.milp.value
            bound = out.milp.bound if out.milp.bound is not None else math.inf
            res.milp_bound += bound
            res.milp_optimal += int(out.milp.optimal)
            if bound > 1e-12:
                res.worst_gap = max(res.worst_gap, (bound - out.greedy_value) / bound)
        if self.record is not None:
            self.record.append(
                MergeRecord(
                    now,
                    m,
                    snaps,
                    need,
                    other,
                    remaining,
                    frozenset(snaps[i].name for i in out.decision.released),
                    {rid: snaps[j].name for rid, j in out.decision.moves.items()},
                    out.method,
                )
            )
        res.released += len(out.decision.released)
        if out.decision.released:
            assert abs(merge_value(prob, out.decision) - out.value) <= 1e-9 * max(
                1.0, abs(out.value)
            )
            self.apply_merge(active, out.decision, now)

    # --- the loop -----------------------------------------------------------
    def route_prefill(self, rid: int, now: float) -> None:
        m = int(self.arr.workload[rid])
        cands = [
            self.instances[i]
            for k, ids in self.by_key.items()
            if k[0] == m and k[3] == "prefill"
            for i in ids
            if not self.instances[i].draining
        ]
        if not cands:
            cands = [
                self.instances[i]
                for k, ids in self.by_key.items()
                if k[0] == m and k[3] == "prefill"
                for i in ids
            ]
        if not cands:
            key = next(
                (
                    k
                    for k in self.targets[min(self.epoch, self.p.n_epochs - 1)]
                    if k[0] == m and k[3] == "prefill"
                ),
                None,
            )
            if key is None:
                key = next(k for e in self.targets for k in e if k[0] == m and k[3] == "prefill")
            tab = self.table(m, key[2])
            cands = [self.start(key, now, now + tab.load_s)]
        prompt = float(self.arr.prompt_tokens[rid])

        def finish_at(i: Instance) -> float:
            tab = self.table(m, i.key[2])
            return max(now, i.free_at, i.ready_at) + float(
                np.interp(prompt, tab.prompt_grid, tab.prefill_s)
            )

        inst = min(cands, key=lambda i: (finish_at(i), i.iid))
        _, node, o, _, link = inst.key
        tab = self.table(m, o)
        begin = max(now, inst.free_at, inst.ready_at)
        pol = self.merging
        if (
            pol is not None
            and pol.prefill_headroom is not None
            and begin > now + pol.prefill_wait_s
        ):
            self.grow_prefill(m, 1e-9, now, ahead=False)  # one more instance, for those behind
        service = float(np.interp(prompt, tab.prompt_grid, tab.prefill_s))
        self.res.energy_j += float(np.interp(prompt, tab.prompt_grid, tab.prefill_j))
        inst.free_at = begin + service
        kv = self.kv_per_token[m] * prompt
        lk = self.p.links[LINKS.index(link or "nvlink")]
        done = inst.free_at + lk.transfer_s(kv)
        self.note_ttft(rid, now, done)
        other = {n for n in range(self.p.n_nodes) if n != node}
        self.push(done, _JOIN, rid, node if link == "nvlink" or not other else -1 - node)
        if inst.draining:
            self.push(inst.free_at, _CONTROL, -1, inst.iid)

    def run(self) -> ServerlessSimResult:
        dt = self.p.epoch_s
        horizon = self.p.n_epochs * dt
        for t in range(self.p.n_epochs):
            self.push(t * dt, _CONTROL, t, 0)
            if self.merging is not None:
                k = 1
                while k * self.merging.merge_interval_s < dt - 1e-9:
                    self.push(t * dt + k * self.merging.merge_interval_s, _CONTROL, -3, 0)
                    k += 1
        for rid in range(len(self.arr)):
            self.push(float(self.arr.time_s[rid]), _ARRIVE, rid, 0)
        while self.queue:
            now, (kind, a, b) = self.queue.pop()
            if kind == _ARRIVE:
                self.route_prefill(a, now)
            elif kind == _JOIN:
                nodes = {b} if b >= 0 else {n for n in range(self.p.n_nodes) if n != -1 - b}
                m = int(self.arr.workload[a])
                if not self.join(a, now, nodes, now):
                    self.res.waits += 1
                    home = b if b >= 0 else min(nodes)
                    self.waiting[m].append((a, now, home))
            elif kind == _FINISH:
                inst = self.instances[a]
                if inst.version == b and inst.released_at is None:
                    self.finish(inst, now)
            elif a >= 0:
                self.epoch = a
                self.apply_epoch(a, now)
            elif a == -1:
                inst = self.instances[b]
                if inst.draining and inst.released_at is None and inst.free_at <= now + 1e-12:
                    self.release(inst, now)
            elif a == -2:
                self.admit_waiting(b, now)
            elif a == -3 and now < horizon:
                self.consolidate(now)
            if not self.queue and any(self.waiting.values()):
                self.drain_waiting(now)
        end = max([horizon] + [i.free_at for i in self.instances.values()])
        for inst in list(self.instances.values()):
            if inst.released_at is None:
                self.release(inst, end)
        if self.res.finished != len(self.arr) or len(self.finished) != len(self.arr):
            raise ConservationError(
                f"{len(self.arr)} requests arrived, {self.res.finished} finished"
            )
        return self.res

    def drain_waiting(self, now: float) -> None:
        """Requests still waiting when nothing else will happen: start an instance of
        their model's last decode pool for them."""
        for m, queue in self.waiting.items():
            if not queue:
                continue
            key = next(
                k for e in reversed(self.targets) for k in e if k[0] == m and k[3] == "decode"
            )
            tab = self.table(m, key[2])
            self.start(key, now, now + tab.load_s)
            self.push(now + tab.load_s, _CONTROL, -2, m)


def simulate(
    p: ServerlessProblem,
    plan: ServerlessPlan,
    arrivals: Arrivals,
    merging: MergePolicy | None = None,
    *,
    table: RateTable | None = None,
    record: list[MergeRecord] | None = None,
) -> ServerlessSimResult:
    """Replay ``arrivals`` (workload index = model index) under ``plan``; with
    ``merging``, the merge decisions read their decode figures from ``table`` (a
    compiled rate table of the same file) when given, and each is appended to
    ``record`` when given."""
    return _Sim(p, plan_targets(p, plan), arrivals, merging, table, record).run()
