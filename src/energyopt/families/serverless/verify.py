"""Independent checker of serverless provisioning plans and of decode merges.

It reads the file's numbers and the catalog, evaluates each pool on the
performance model *at the rate the plan gives it* (perf/queueing.py ``metrics_at``,
not the solvers' capacity tables), adds the KV transfer over the pool's link
itself, packs every node's slices onto its GPUs, and recomputes the plan's cost.
It shares no arrays or arithmetic with formulations/serverless or the solvers.

A plan is feasible when, in every epoch: each pool uses an offered option, at an
SM clock the GPU supports, and a link its node has; every instance, at
1 / ``load_fraction`` times its load, meets the TTFT SLO at its percentile including
the KV transfer (prefill) or the TBT SLO within its memory and batch limit
(decode); the routes carry each model's demand and match the pools' rates; each
node's slices fit on its GPUs; its network traffic fits its NIC; its power fits
its cap. A merge is valid when no request is lost or duplicated and no target
exceeds its KV memory or batch limit.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from energyopt.catalog.loader import Catalog
from energyopt.families.serverless.spec import Pool, ServerlessFile, ServerlessPlan
from energyopt.perf.clocks import CLOCK_RANGE_FLOOR, spread_clocks_mhz
from energyopt.perf.coldstart import load_time_s
from energyopt.perf.energy import energy_per_request_j
from energyopt.perf.kvtransfer import NETWORK_H100, NVLINK_H100, Link
from energyopt.perf.params import OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.perf.queueing import metrics_at
from energyopt.spec.instance import Options
from energyopt.spec.workload import Workload
from energyopt.verify.violation import Violation

REL_TOL = 1e-6
"""Relative slack of every comparison (solver tolerances and float rounding)."""
PoolKey = tuple[str, str, str, int, int, int, str | None]
"""(model, phase, node, share %, tp, clock MHz, link) of a pool."""
VERIFY_CLOCKS = 3
"""Clocks offered when the file lists none (the file format's rule)."""


@dataclass
class ServerlessEvaluation:
    """A plan's violations and figures (GPU-seconds, joules, counts)."""

    violations: list[Violation] = field(default_factory=list)
    gpu_s: float = 0.0
    energy_j: float = 0.0
    load_gpu_s: float = 0.0
    starts: int = 0
    stops: int = 0
    """Decode instances removed between epochs."""
    drain_gpu_s: float = 0.0
    """GPU-seconds of removed decode instances while they drain."""
    network_bytes: float = 0.0
    cost: float = 0.0


_ENERGY: dict[tuple[object, ...], float] = {}
"""Energy per request of each pool shape met so far (it does not depend on the rate)."""


def _energy_per_request(ops: list[OpSpec]) -> list[float]:
    """Dynamic energy of one request on each op's instance (J, whole TP group)."""

    def key(op: OpSpec) -> tuple[object, ...]:
        wl = op.workload
        return (
            op.gpu.model_dump_json(),
            op.model.model_dump_json(),
            op.phase,
            op.clock_mhz,
            op.sm_fraction,
            op.memory_gb,
            op.tp,
            wl.prompt_tokens.mean,
            wl.output_tokens.mean,
            wl.slo.ttft_ms,
            wl.slo.tbt_ms,
            wl.slo.percentile,
            op.options.max_batch,
        )

    keys = [key(op) for op in ops]
    missing = {k: op for k, op in zip(keys, ops, strict=True) if k not in _ENERGY}
    if missing:
        values = energy_per_request_j(build_params(list(missing.values())))
        for k, v in zip(missing, values, strict=True):
            _ENERGY[k] = float(v)
    return [_ENERGY[k] for k in keys]


def _links(spec: ServerlessFile) -> dict[str, Link]:
    nv, net = spec.links.nvlink, spec.links.network
    return {
        "nvlink": NVLINK_H100
        if nv is None
        else Link(nv.latency_us * 1e-6, nv.bandwidth_gbps * 1e9),
        "network": NETWORK_H100
        if net is None
        else Link(net.latency_us * 1e-6, net.bandwidth_gbps * 1e9),
    }


def _pack(node_gpus: int, slices: Sequence[tuple[int, int]]) -> bool:
    """Whether (share %, tp) slices fit on ``node_gpus`` GPUs: TP groups take whole
    GPUs, shares go first fit decreasing onto GPUs of 100 %."""
    whole = sum(tp for share, tp in slices if tp > 1 or share == 100)
    if whole > node_gpus:
        return False
    room = [100] * (node_gpus - whole)
    for share in sorted((s for s, tp in slices if tp == 1 and s < 100), reverse=True):
        for i, r in enumerate(room):
            if r >= share:
                room[i] = r - share
                break
        else:
            return False
    return True


def evaluate_serverless(
    spec: ServerlessFile, catalog: Catalog, plan: ServerlessPlan
) -> ServerlessEvaluation:
    """Every constraint ``plan`` breaks and its cost, recomputed from ``spec``."""
    ev = ServerlessEvaluation()
    bad = ev.violations
    gpu = catalog.gpu(spec.gpu)
    models = {m.name: m for m in spec.models}
    nodes = {n.name: n for n in spec.nodes}
    links = _links(spec)
    n_t = len(spec.models[0].demand_rps)
    opts = spec.options
    clocks = set(
        opts.clocks_mhz
        if opts.clocks_mhz is not None
        else spread_clocks_mhz(gpu, VERIFY_CLOCKS, CLOCK_RANGE_FLOOR * gpu.max_sm_clock_mhz)
    )
    supported = set(gpu.sm_clocks_mhz())
    by_epoch: dict[int, list[Pool]] = {}
    routes_of: dict[int, list[tuple[str, str, str, float]]] = {}
    for ep in plan.epochs:
        if ep.epoch >= n_t:
            bad.append(Violation("epoch", f"epoch {ep.epoch}", f"the file has {n_t} epochs"))
            continue
        if ep.epoch in by_epoch:
            bad.append(Violation("epoch", f"epoch {ep.epoch}", "planned twice"))
            continue
        by_epoch[ep.epoch] = list(ep.pools)
        routes_of[ep.epoch] = [
            (r.model, r.prefill_node, r.decode_node, r.rate_rps) for r in ep.routes
        ]
    # one performance-model evaluation per distinct (model, pool shape, per-instance rate)
    checks: list[tuple[int, Pool, OpSpec, float]] = []
    shapes: dict[tuple[str, str, int, int, int], OpSpec] = {}
    """One op per pool shape (model, phase, share, tp, clock)."""
    distinct: dict[tuple[tuple[str, str, int, int, int], float], int] = {}
    point: list[int] = []
    """Per check, its (shape, rate per instance) among ``distinct``."""
    perf_options = Options(
        max_batch=opts.max_batch, memory_reserve_fraction=opts.memory_reserve_fraction
    )
    for t in range(n_t):
        for pool in by_epoch.get(t, []):
            where = f"epoch {t} {pool.model}:{pool.phase} on {pool.node}"
            sm = models.get(pool.model)
            if sm is None or pool.node not in nodes:
                what = "model" if sm is None else "node"
                bad.append(Violation(what, where, f"unknown {what}"))
                continue
            if pool.tp not in opts.tp or (pool.tp > 1 and pool.share_pct != 100):
                bad.append(
                    Violation("option", where, f"tp {pool.tp} at {pool.share_pct} % is not offered")
                )
                continue
            if pool.tp == 1 and pool.share_pct not in opts.shares_pct:
                bad.append(Violation("option", where, f"share {pool.share_pct} % is not offered"))
                continue
            if pool.clock_mhz not in supported:
                near = ", ".join(str(c) for c in gpu.nearest_clocks_mhz(pool.clock_mhz))
                bad.append(
                    Violation(
                        "option",
                        where,
                        f"clock {pool.clock_mhz} MHz is not a supported SM clock of {gpu.name} "
                        f"(nearest: {near} MHz)",
                    )
                )
                continue
            if pool.clock_mhz not in clocks:
                bad.append(Violation("option", where, f"clock {pool.clock_mhz} MHz is not offered"))
                continue
            if pool.tp > nodes[pool.node].gpus:
                bad.append(Violation("option", where, f"tp {pool.tp} exceeds the node's GPUs"))
                continue
            if (pool.phase == "prefill") != (pool.link is not None):
                bad.append(Violation("link", where, "prefill pools name a link, decode pools none"))
                continue
            if pool.link == "network" and len(spec.nodes) < 2:
                bad.append(Violation("link", where, "one node: no network link"))
                continue
            if pool.rate_rps > 0 and pool.count == 0:
                bad.append(Violation("capacity", where, f"{pool.rate_rps:g} rps on no instance"))
                continue
            shape = (pool.model, pool.phase, pool.share_pct, pool.tp, pool.clock_mhz)
            op = shapes.get(shape)
            if op is None:
                wl = Workload(
                    name=sm.name,
                    model=sm.model,
                    rate_rps=1.0,
                    prompt_tokens=sm.prompt_tokens,
                    output_tokens=sm.output_tokens,
                    slo=sm.slo,
                )
                memory_gb = (
                    gpu.memory_gb * pool.share_pct / 100.0 * (1.0 - opts.memory_reserve_fraction)
                )
                op = shapes[shape] = OpSpec(
                    gpu=gpu,
                    model=catalog.model(sm.model),
                    workload=wl,
                    phase=pool.phase,
                    clock_mhz=pool.clock_mhz,
                    sm_fraction=pool.share_pct / 100.0,
                    bw_fraction=pool.share_pct / 100.0,
                    memory_gb=memory_gb,
                    tp=pool.tp,
                    options=perf_options,
                )
            per_instance = pool.rate_rps / pool.count / opts.load_fraction if pool.count else 0.0
            checks.append((t, pool, op, per_instance))
            point.append(distinct.setdefault((shape, per_instance), len(distinct)))
    energy: list[float] = []
    if checks:
        # the performance model once per distinct (pool shape, rate per instance)
        ops = [shapes[shape] for shape, _ in distinct]
        params = build_params(ops)
        rates = np.array([rate for _, rate in distinct])
        met = metrics_at(params, rates)
        by_shape = dict(zip(shapes, _energy_per_request(list(shapes.values())), strict=True))
        energy = [
            by_shape[(pool.model, pool.phase, pool.share_pct, pool.tp, pool.clock_mhz)]
            for _, pool, _, _ in checks
        ]
        for (t, pool, op, rate), i in zip(checks, point, strict=True):
            where = f"epoch {t} {pool.model}:{pool.phase} on {pool.node}"
            sm = models[pool.model]
            if rate <= 0:
                continue
            slack = 1.0 + REL_TOL
            if not bool(met.stable[i]):
                bad.append(Violation("capacity", where, f"{rate:g} rps per instance is unstable"))
                continue
            if float(met.memory_bytes[i]) > op.memory_gb * 1e9 * slack:
                bad.append(
                    Violation(
                        "memory",
                        where,
                        f"{met.memory_bytes[i] / 1e9:.3f} GB held per GPU at {rate:g} rps, "
                        f"over the slice's {op.memory_gb:.3f} GB",
                    )
                )
            if pool.phase == "prefill":
                assert pool.link is not None
                kv = op.model.kv_bytes_per_token * sm.prompt_tokens.mean
                link = links[pool.link]
                transfer_ms = 1e3 * (link.latency_s + kv / link.bandwidth_bps)
                ttft = float(met.ttft_ms[i]) + transfer_ms
                if ttft > sm.slo.ttft_ms * slack:
                    bad.append(
                        Violation(
                            "ttft",
                            where,
                            f"p{sm.slo.percentile:g} TTFT {ttft:.2f} ms ({met.ttft_ms[i]:.2f} "
                            f"prefill + {transfer_ms:.2f} KV transfer over {pool.link}) at "
                            f"{rate:g} rps per instance, over the SLO of {sm.slo.ttft_ms:g} ms",
                        )
                    )
            else:
                if float(met.tbt_ms[i]) > sm.slo.tbt_ms * slack:
                    bad.append(
                        Violation(
                            "tbt",
                            where,
                            f"p{sm.slo.percentile:g} TBT {met.tbt_ms[i]:.2f} ms at {rate:g} rps "
                            f"per instance, over the SLO of {sm.slo.tbt_ms:g} ms",
                        )
                    )
                if float(met.batch[i]) > opts.max_batch * slack:
                    bad.append(
                        Violation("batch", where, f"batch {met.batch[i]:.1f} over {opts.max_batch}")
                    )
    _routing(spec, by_epoch, routes_of, bad)
    _nodes(spec, gpu, catalog, by_epoch, routes_of, checks, energy, links, ev)
    _cost(spec, gpu, catalog, by_epoch, checks, energy, ev)
    return ev


def _routing(
    spec: ServerlessFile,
    by_epoch: Mapping[int, list[Pool]],
    routes_of: Mapping[int, list[tuple[str, str, str, float]]],
    bad: list[Violation],
) -> None:
    names = {n.name for n in spec.nodes}
    kinds = ("prefill over nvlink", "prefill over the network", "decode")
    for t in range(len(spec.models[0].demand_rps)):
        # per (model, node, kind): what the pools serve and what the routes need
        got: dict[tuple[str, str, int], float] = defaultdict(float)
        need: dict[tuple[str, str, int], float] = defaultdict(float)
        carried: dict[str, float] = defaultdict(float)
        for pool in by_epoch.get(t, []):
            kind = 2 if pool.phase == "decode" else 0 if pool.link == "nvlink" else 1
            if pool.phase == "prefill" and pool.link is None:
                continue
            got[pool.model, pool.node, kind] += pool.rate_rps
        for model, a, b, rate in routes_of.get(t, []):
            if a not in names or b not in names:
                bad.append(Violation("route", f"epoch {t} {model}", f"unknown node in {a} -> {b}"))
            carried[model] += rate
            need[model, a, 0 if a == b else 1] += rate
            need[model, b, 2] += rate
        tols = {sm.name: REL_TOL * max(1.0, sm.demand_rps[t]) for sm in spec.models}
        for sm in spec.models:
            demand = sm.demand_rps[t]
            if abs(carried[sm.name] - demand) > tols[sm.name]:
                bad.append(
                    Violation(
                        "demand",
                        f"epoch {t} {sm.name}",
                        f"routes carry {carried[sm.name]:g} rps of the {demand:g} rps demand",
                    )
                )
        for key in sorted(set(got) | set(need)):
            model, n, kind = key
            if model not in tols or n not in names:
                continue
            if abs(got[key] - need[key]) > tols[model]:
                bad.append(
                    Violation(
                        "route",
                        f"epoch {t} {model} on {n}",
                        f"{kinds[kind]} pools serve {got[key]:g} rps; the routes need "
                        f"{need[key]:g}",
                    )
                )


def _nodes(
    spec: ServerlessFile,
    gpu: object,
    catalog: Catalog,
    by_epoch: Mapping[int, list[Pool]],
    routes_of: Mapping[int, list[tuple[str, str, str, float]]],
    checks: list[tuple[int, Pool, OpSpec, float]],
    energy: list[float],
    links: Mapping[str, Link],
    ev: ServerlessEvaluation,
) -> None:
    g = catalog.gpu(spec.gpu)
    kv_of = {
        m.name: catalog.model(m.model).kv_bytes_per_token * m.prompt_tokens.mean
        for m in spec.models
    }
    power: dict[tuple[int, str], float] = defaultdict(float)
    on_w: dict[int, float] = {}
    for i, (t, pool, _, _) in enumerate(checks):
        if pool.clock_mhz not in on_w:
            on_w[pool.clock_mhz] = gpu_on_power_w(g, pool.clock_mhz)
        on = on_w[pool.clock_mhz] * pool.share_pct / 100.0 * pool.tp
        power[t, pool.node] += pool.count * on + pool.rate_rps * energy[i]
    for t in range(len(spec.models[0].demand_rps)):
        held: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for p in by_epoch.get(t, []):
            held[p.node].extend([(p.share_pct, p.tp)] * p.count)
        sends: dict[str, float] = defaultdict(float)
        gets: dict[str, float] = defaultdict(float)
        for model, a, b, rate in routes_of.get(t, []):
            if a != b:
                sends[a] += rate * kv_of.get(model, 0.0)
                gets[b] += rate * kv_of.get(model, 0.0)
        for node in spec.nodes:
            slices = held[node.name]
            if not _pack(node.gpus, slices):
                used = sum(s * tp / 100 for s, tp in slices)
                ev.violations.append(
                    Violation(
                        "gpus",
                        f"epoch {t} {node.name}",
                        f"{len(slices)} slices ({used:g} GPUs) do not fit on its {node.gpus} GPUs",
                    )
                )
            out, into = sends[node.name], gets[node.name]
            ev.network_bytes += out * spec.epoch_s
            cap = node.nic_gbps * 1e9
            for what, value in (("sends", out), ("receives", into)):
                if value > cap * (1 + REL_TOL):
                    ev.violations.append(
                        Violation(
                            "network",
                            f"epoch {t} {node.name}",
                            f"{what} {value / 1e9:.3f} GB/s of KV cache, over its "
                            f"{node.nic_gbps:g} GB/s NIC",
                        )
                    )
            if node.power_cap_w is not None and power[t, node.name] > node.power_cap_w * (
                1 + REL_TOL
            ):
                ev.violations.append(
                    Violation(
                        "power",
                        f"epoch {t} {node.name}",
                        f"{power[t, node.name]:,.1f} W, over its cap of {node.power_cap_w:g} W",
                    )
                )


def _cost(
    spec: ServerlessFile,
    gpu: object,
    catalog: Catalog,
    by_epoch: Mapping[int, list[Pool]],
    checks: list[tuple[int, Pool, OpSpec, float]],
    energy: list[float],
    ev: ServerlessEvaluation,
) -> None:
    g = catalog.gpu(spec.gpu)
    dt = spec.epoch_s
    served = {id(pool): energy[i] for i, (_, pool, _, _) in enumerate(checks)}
    weights = {m.name: catalog.model(m.model).weight_bytes for m in spec.models}
    drain = {m.name: m.drain_s for m in spec.models}
    on_w: dict[int, float] = {}

    def on_power_w(clock: int) -> float:
        """On power of one GPU at ``clock``, W."""
        if clock not in on_w:
            on_w[clock] = gpu_on_power_w(g, clock)
        return on_w[clock]

    before: dict[PoolKey, int] = {}
    n_t = len(spec.models[0].demand_rps)
    # the plan starts from no instances and ends with none: after the last epoch
    # every decode instance still held stops and drains
    for t in range(n_t + 1):
        now: dict[PoolKey, int] = defaultdict(int)
        for pool in by_epoch.get(t, []) if t < n_t else []:
            if pool.model not in weights:
                continue
            key: PoolKey = (
                pool.model,
                pool.phase,
                pool.node,
                pool.share_pct,
                pool.tp,
                pool.clock_mhz,
                pool.link,
            )
            now[key] += pool.count
            gpus = pool.share_pct / 100.0 * pool.tp
            on = on_power_w(pool.clock_mhz) * gpus
            ev.gpu_s += pool.count * gpus * dt
            ev.energy_j += pool.count * on * dt + pool.rate_rps * dt * served.get(id(pool), 0.0)
        for key, count in now.items():
            starts = max(0, count - before.get(key, 0))
            if starts:
                model, _, _, share, tp, clock, _ = key
                load = load_time_s(
                    weights[model], tp, spec.cold_start.bandwidth_gbps, spec.cold_start.fixed_s
                )
                gpus = share / 100.0 * tp
                ev.starts += starts
                ev.load_gpu_s += starts * gpus * load
                ev.gpu_s += starts * gpus * load
                ev.energy_j += starts * on_power_w(clock) * gpus * load
        for key, count in before.items():
            stops = max(0, count - now.get(key, 0))
            if stops and key[1] == "decode":
                model, _, _, share, tp, clock, _ = key
                gpus = share / 100.0 * tp
                ev.stops += stops
                ev.drain_gpu_s += stops * gpus * drain[model]
                ev.gpu_s += stops * gpus * drain[model]
                ev.energy_j += stops * on_power_w(clock) * gpus * drain[model]
        before = dict(now)
    obj = spec.objective
    if obj.kind == "gpu_seconds":
        ev.cost = ev.gpu_s
    elif obj.kind == "energy":
        ev.cost = ev.energy_j
    else:
        ev.cost = ev.gpu_s + obj.energy_weight_per_j * ev.energy_j


@dataclass(frozen=True)
class DecodeInstanceState:
    """A decode instance at a merge: its KV memory budget (bytes), batch limit and the
    KV bytes of every request it holds, by request id."""

    name: str
    kv_budget_bytes: float
    max_batch: int
    requests: Mapping[int, float]


def check_merge(
    before: Sequence[DecodeInstanceState], moves: Mapping[int, str], released: Sequence[str]
) -> list[Violation]:
    """Violations of a merge: ``moves`` sends request ids to instances by name and
    ``released`` instances are freed. Every request must end on exactly one kept
    instance, and no kept instance may exceed its KV budget or batch limit."""
    bad: list[Violation] = []
    by_name = {s.name: s for s in before}
    holder: dict[int, str] = {}
    for s in before:
        for rid in s.requests:
            if rid in holder:
                bad.append(
                    Violation("merge", f"request {rid}", f"held by {holder[rid]} and {s.name}")
                )
            holder[rid] = s.name
    for rid, target in moves.items():
        if rid not in holder:
            bad.append(Violation("merge", f"request {rid}", "moved but held by no instance"))
        if target not in by_name or target in released:
            bad.append(
                Violation("merge", f"request {rid}", f"moved to {target}, not a kept instance")
            )
    after: dict[str, dict[int, float]] = {s.name: {} for s in before if s.name not in released}
    for s in before:
        for rid, kv in s.requests.items():
            dest = moves.get(rid, s.name)
            if dest in after:
                after[dest][rid] = kv
            else:
                bad.append(Violation("merge", f"request {rid}", f"lost: {s.name} is released"))
    for name, held in after.items():
        s = by_name[name]
        used = sum(held.values())
        if used > s.kv_budget_bytes * (1 + REL_TOL):
            bad.append(
                Violation(
                    "memory",
                    f"decode instance {name}",
                    f"{used / 1e9:.3f} GB of KV cache after the merge, over its "
                    f"{s.kv_budget_bytes / 1e9:.3f} GB",
                )
            )
        if len(held) > s.max_batch:
            bad.append(
                Violation(
                    "batch", f"decode instance {name}", f"{len(held)} requests, over {s.max_batch}"
                )
            )
    return bad
