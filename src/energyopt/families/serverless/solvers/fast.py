"""A fast provisioning algorithm in CELLServe's spirit: size each phase by its
SLO-derived capacity, then couple the phases on the nodes.

Per epoch and model (largest demand first):

1. *Provision by phase.* For each phase the option of least cost per request/s
   of capacity (instance cost over capacity plus serving cost) is the workhorse;
   a rate is covered by whole instances of it and one tail instance, the cheapest
   option whose capacity covers the rest.
2. *Couple.* Prefill and decode of a share of the demand go on one node (KV over
   NVLink), the node with the most free GPUs first, as much as it holds; what no
   node holds whole is split: decode pools where GPUs are free, prefill pools with
   the network-link capacity elsewhere, routed prefill node -> decode node within
   the NICs.

Cold starts are not priced when choosing (the plan's cost, which the verifier
recomputes, includes them). No bound; its gap to the MILP is what the benchmark
reports.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from energyopt.families.serverless.formulations.milp import (
    DECODE,
    PREFILL_NET,
    PREFILL_NV,
    pool_capacity,
)
from energyopt.families.serverless.formulations.model import (
    LINKS,
    NETWORK,
    NVLINK,
    FloatArray,
    ServerlessProblem,
)
from energyopt.families.serverless.solvers.result import serverless_result
from energyopt.families.serverless.spec import Pool, ServerlessPlan
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import FEASIBLE, NO_SOLUTION, Result, Termination

ALGORITHM = "per-phase SLO-capacity provisioning, then prefill/decode coupling on nodes"
SHRINK = 0.97
"""Step by which a node's share of a demand shrinks until its instances fit."""


class _Tables:
    """The problem's per-option figures the algorithm reads in every epoch, taken
    once: GPUs per instance, and per (model, pool kind) the capacity (rps) and the
    cost of an instance serving at it for an epoch; per model the costs of holding,
    starting and stopping an instance and of serving 1 rps per phase. Decode
    capacities are the problem's times ``decode_scale``."""

    def __init__(self, p: ServerlessProblem, decode_scale: float = 1.0) -> None:
        self.gpus = p.gpus_of()
        self.instance = [p.instance_cost(m) for m in range(p.n_models)]
        self.start = [p.start_cost(m) for m in range(p.n_models)]
        self.stop = [p.stop_cost(m) for m in range(p.n_models)]
        self.serve = {
            (m, phase): p.serve_cost(m, phase)
            for m in range(p.n_models)
            for phase in ("prefill", "decode")
        }
        self.caps: dict[tuple[int, int], FloatArray] = {}
        self.per_instance: dict[tuple[int, int], FloatArray] = {}
        for m in range(p.n_models):
            for kind in (PREFILL_NV, PREFILL_NET, DECODE):
                caps = np.array([pool_capacity(p, m, o, kind) for o in range(p.n_options)])
                if kind == DECODE and decode_scale != 1.0:
                    caps = caps * decode_scale
                phase = "decode" if kind == DECODE else "prefill"
                self.caps[m, kind] = caps
                self.per_instance[m, kind] = self.instance[m] + caps * self.serve[m, phase]


def _cover(
    tb: _Tables, m: int, kind: int, rate: float, allowed: np.ndarray
) -> list[tuple[int, int, float]]:
    """(option, count, rate) instances of one phase covering ``rate`` requests/s."""
    if rate <= 1e-12:
        return []
    caps = tb.caps[m, kind]
    ok = allowed & (caps > 0)
    if not ok.any():
        return []
    per_instance = tb.per_instance[m, kind]
    unit = np.where(ok, per_instance / np.where(caps > 0, caps, 1.0), np.inf)
    best = int(np.argmin(unit))
    full = math.floor(rate / caps[best] + 1e-9)
    rest = rate - full * caps[best]
    out: list[tuple[int, int, float]] = []
    if full:
        out.append((best, full, full * caps[best]))
    if rest > 1e-9:
        tail_cost = np.where(ok & (caps >= rest - 1e-12), per_instance, np.inf)
        tail = int(np.argmin(tail_cost))
        if not np.isfinite(tail_cost[tail]):
            return [*out, (best, 1, rest)]
        if tail == best:
            if out:
                out[0] = (best, full + 1, rate)
            else:
                out.append((best, 1, rate))
        else:
            out.append((tail, 1, rest))
    return out


def _gpus(tb: _Tables, cover: list[tuple[int, int, float]]) -> float:
    return float(sum(tb.gpus[o] * c for o, c, _ in cover))


def solve_fast(
    p: ServerlessProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
    decode_load_fraction: float | None = None,
) -> Result[ServerlessPlan]:
    """The fast algorithm's plan (heuristic: no bound).

    ``decode_load_fraction`` sizes decode at that share of the modelled SLO
    capacity instead of the file's ``options.load_fraction`` (prefill keeps the
    file's); ``None`` (the default) plans both phases at the file's. With a larger
    fraction the plan is one of the same instance at that load fraction (the
    verifier of that instance accepts it; prefill pools are then below their
    capacity), not of the file's: the verifier at the file's fraction refuses its
    decode pools. The replay (``sim.simulate``) reads only the instance counts. The
    objective is the plan's cost as the algorithm prices it, cold starts and drains
    included."""
    t0 = time.perf_counter()
    file_fraction = p.spec.options.load_fraction
    if decode_load_fraction is not None and not 0.0 < decode_load_fraction <= 1.0:
        raise ValueError(f"decode_load_fraction must be in (0, 1], not {decode_load_fraction}")
    names = [n.name for n in p.spec.nodes]
    models = [m.name for m in p.spec.models]
    pools: list[list[Pool]] = []
    routes: list[list[tuple[int, int, int, float]]] = []
    total = 0.0
    prev: dict[tuple[int, int, int, int], int] = {}
    deadline = t0 + time_limit_s
    tb = _Tables(p, 1.0 if decode_load_fraction is None else decode_load_fraction / file_fraction)
    for t in range(p.n_epochs):
        if time.perf_counter() > deadline:
            return _out_of_time(t, p.n_epochs, time.perf_counter() - t0)
        free = p.node_gpus.copy()
        nic_out = p.nic_bps.copy()
        nic_in = p.nic_bps.copy()
        epoch_pools: dict[tuple[int, int, int, int], list[float]] = {}
        epoch_routes: list[tuple[int, int, int, float]] = []

        add = _adder(tb.gpus, epoch_pools, free)

        for m in np.argsort(-p.demand[:, t], kind="stable"):
            m = int(m)
            left = float(p.demand[m, t])
            for n in np.argsort(-free, kind="stable"):
                n = int(n)
                if left <= 1e-12 or time.perf_counter() > deadline:
                    break
                rate = left
                for _ in range(400):
                    dec = _cover(tb, m, DECODE, rate, p.fits[n])
                    pre = _cover(tb, m, PREFILL_NV, rate, p.fits[n])
                    if dec and pre and _gpus(tb, dec) + _gpus(tb, pre) <= free[n] + 1e-9:
                        break
                    rate *= SHRINK
                else:
                    continue
                if rate <= 1e-9:
                    continue
                add(m, n, DECODE, dec)
                add(m, n, PREFILL_NV, pre)
                epoch_routes.append((m, n, n, rate))
                left -= rate
            if time.perf_counter() > deadline:
                return _out_of_time(t, p.n_epochs, time.perf_counter() - t0)
            if left > 1e-9 and p.n_nodes > 1:
                left = _split(p, tb, m, left, free, nic_out, nic_in, add, epoch_routes, deadline)
                if time.perf_counter() > deadline:
                    return _out_of_time(t, p.n_epochs, time.perf_counter() - t0)
            if left > 1e-6 * max(1.0, float(p.demand[m, t])):
                return serverless_result(
                    NO_SOLUTION,
                    "fast",
                    time.perf_counter() - t0,
                    log=[f"epoch {t}: {left:.4g} rps of {models[m]} found no room"],
                    termination=Termination.HEURISTIC,
                    algorithm=ALGORITHM,
                    formulation="",
                )
        counts: dict[tuple[int, int, int, int], int] = {}
        epoch_list: list[Pool] = []
        for (m, n, o, kind), (c, r) in epoch_pools.items():
            opt = p.options[o]
            counts[(m, n, o, kind)] = int(c)
            phase = "decode" if kind == DECODE else "prefill"
            epoch_list.append(
                Pool(
                    model=models[m],
                    phase=phase,
                    node=names[n],
                    share_pct=opt.share_pct,
                    tp=opt.tp,
                    clock_mhz=opt.clock_mhz,
                    link=None
                    if kind == DECODE
                    else LINKS[NVLINK if kind == PREFILL_NV else NETWORK],
                    count=int(c),
                    rate_rps=r,
                )
            )
            total += float(c) * float(tb.instance[m][o]) + r * float(tb.serve[m, phase][o])
            total += max(0, int(c) - prev.get((m, n, o, kind), 0)) * float(tb.start[m][o])
        for (m, n, o, kind), c in prev.items():
            if kind == DECODE:
                total += max(0, c - counts.get((m, n, o, kind), 0)) * float(tb.stop[m][o])
        prev = counts
        pools.append(epoch_list)
        routes.append(epoch_routes)
    # after the last epoch every decode instance stops and drains
    for (m, _, o, kind), c in prev.items():
        if kind == DECODE:
            total += c * float(tb.stop[m][o])
    progress(f"fast: {p.n_epochs} epochs provisioned")
    return serverless_result(
        FEASIBLE,
        "fast",
        time.perf_counter() - t0,
        objective=float(total),
        plan=p.plan_of(pools, routes),
        termination=Termination.HEURISTIC,
        algorithm=ALGORITHM,
        formulation="",
    )


def _out_of_time(t: int, epochs: int, wall_s: float) -> Result[ServerlessPlan]:
    """No plan: the time limit came in epoch ``t`` of ``epochs``."""
    return serverless_result(
        NO_SOLUTION,
        "fast",
        wall_s,
        log=[f"the time limit came while provisioning epoch {t} of {epochs}: no plan"],
        termination=Termination.TIME_LIMIT,
        algorithm=ALGORITHM,
        formulation="",
    )


def _adder(
    gpus: FloatArray,
    epoch_pools: dict[tuple[int, int, int, int], list[float]],
    free: FloatArray,
) -> Callable[[int, int, int, list[tuple[int, int, float]]], None]:
    """A function that adds instances (option, count, rate) of model m's pool kind
    on node n to ``epoch_pools`` and takes their GPUs (``gpus`` per option) from
    ``free``."""

    def add(m: int, n: int, kind: int, cover: list[tuple[int, int, float]]) -> None:
        for o, c, r in cover:
            slot = epoch_pools.setdefault((m, n, o, kind), [0.0, 0.0])
            slot[0] += c
            slot[1] += r
            free[n] -= gpus[o] * c

    return add


def _split(
    p: ServerlessProblem,
    tb: _Tables,
    m: int,
    left: float,
    free: FloatArray,
    nic_out: FloatArray,
    nic_in: FloatArray,
    add: Callable[[int, int, int, list[tuple[int, int, float]]], None],
    epoch_routes: list[tuple[int, int, int, float]],
    deadline: float = float("inf"),
) -> float:
    """Serve ``left`` rps of model m with decode on one node and prefill (network
    link) on another, pair by pair, until ``deadline`` (``time.perf_counter``);
    returns what is still unserved."""
    kv = float(p.kv_request_bytes[m])
    for b in np.argsort(-free, kind="stable"):
        if left <= 1e-12 or time.perf_counter() > deadline:
            break
        for a in np.argsort(-free, kind="stable"):
            a, b = int(a), int(b)
            if a == b or left <= 1e-12:
                continue
            rate = min(left, nic_out[a] / kv, nic_in[b] / kv) if kv > 0 else left
            for _ in range(400):
                if rate <= 1e-9:
                    break
                dec = _cover(tb, m, DECODE, rate, p.fits[b])
                pre = _cover(tb, m, PREFILL_NET, rate, p.fits[a])
                if (
                    dec
                    and pre
                    and _gpus(tb, dec) <= free[b] + 1e-9
                    and _gpus(tb, pre) <= free[a] + 1e-9
                ):
                    break
                rate *= SHRINK
            else:
                continue
            if rate <= 1e-9:
                continue
            add(m, b, DECODE, dec)
            add(m, a, PREFILL_NET, pre)
            nic_out[a] -= rate * kv
            nic_in[b] -= rate * kv
            epoch_routes.append((m, a, b, rate))
            left -= rate
    return left
