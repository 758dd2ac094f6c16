"""The joint prefill/decode provisioning MILP over a range of epochs.

Columns, per epoch t, model m, node n and option o (docs/formulations/serverless.md):

- pool (t, m, n, o, k) for k in {prefill over NVLink, prefill over the network,
  decode}: ``x`` instances (integer), ``y`` requests/s they serve, ``u`` cold
  starts (instances more than in the epoch before);
- route r[t, m, a, b]: requests/s prefilled on node a and decoded on node b.

Rows: the routes carry each model's demand; a node's NVLink prefill pools serve
its routes to itself, its network prefill pools its routes to other nodes, its
decode pools every route into it; y <= capacity x; u >= x - x(t - 1); for decode
v >= x(t - 1) - x, and a decode pool with no successor (the horizon's last epoch
included) pays its stop on x; GPUs per node; the KV bytes a node sends and
receives over the network within its NIC; the node's power within its cap; and
the count cuts (valid for integer counts): a phase needs at least
ceil(demand / largest instance capacity) instances. The objective is the plan's
cost in the file's unit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from energyopt.families.serverless.formulations.model import (
    LINKS,
    NETWORK,
    NVLINK,
    FloatArray,
    IntArray,
    ServerlessProblem,
)
from energyopt.families.serverless.spec import Pool

FORMULATION_NAME = "serverless joint prefill/decode MILP (pools x links x epochs, KV transfer)"
RATE_EPS = 1e-7
"""Rates (rps) below this in a solver's solution are its tolerance, read as 0."""
KINDS = ("prefill-nvlink", "prefill-network", "decode")
PREFILL_NV, PREFILL_NET, DECODE = 0, 1, 2


@dataclass(frozen=True)
class Milp:
    """The program's arrays. Pool p: epoch ``pt[p]``, model ``pm[p]``, node ``pn[p]``,
    option ``po[p]``, kind ``pk[p]``; its x, y, u, v columns are p, P + p, 2P + p,
    3P + p. Route j: column 4P + j, epoch ``rt[j]``, model ``rm[j]``, nodes ``ra[j]`` ->
    ``rb[j]``."""

    cost: FloatArray
    matrix: sp.csc_matrix
    row_lo: FloatArray
    row_hi: FloatArray
    integer: np.ndarray
    pt: IntArray
    pm: IntArray
    pn: IntArray
    po: IntArray
    pk: IntArray
    cap: FloatArray
    rt: IntArray
    rm: IntArray
    ra: IntArray
    rb: IntArray
    first: int
    last: int

    @property
    def n_pools(self) -> int:
        return int(self.pt.shape[0])

    def __len__(self) -> int:
        return int(self.cost.shape[0])


def pool_capacity(p: ServerlessProblem, m: int, o: int, kind: int) -> float:
    """SLO capacity of one instance of a pool kind, rps."""
    if kind == DECODE:
        return float(p.cap_decode[m, o])
    return float(p.cap_prefill[m, o, NVLINK if kind == PREFILL_NV else NETWORK])


def undominated(
    p: ServerlessProblem, m: int, n: int, kind: int, keep: set[int] | frozenset[int] = frozenset()
) -> set[int]:
    """Options of one pool kind on node n that no other option dominates (``keep``
    always stays: instances already running). Option a dominates b when it fits
    the node, holds no more GPUs, serves at least b's capacity and costs no more
    to hold, to start, to stop and per request (and, under a power cap, draws no more);
    dropping b then loses no optimum, as a pool of a does all a pool of b does."""
    phase = "decode" if kind == DECODE else "prefill"
    energy = p.energy_decode[m] if kind == DECODE else p.energy_prefill[m]
    capped = bool(np.isfinite(p.power_cap_w[n]))
    cols = [
        p.gpus_of(),
        -np.array([pool_capacity(p, m, o, kind) for o in range(p.n_options)]),
        p.instance_cost(m),
        p.start_cost(m),
        p.serve_cost(m, phase),
    ]
    if kind == DECODE:
        cols.append(p.stop_cost(m))
    if capped:
        cols += [p.on_w, energy]
    table = np.stack(cols, axis=1)
    usable = [o for o in range(p.n_options) if p.fits[n, o] and -table[o, 1] > 0]
    out: set[int] = set()
    for b in usable:
        dominated = False
        for a in usable:
            if a == b:
                continue
            le = bool(np.all(table[a] <= table[b] + 1e-12))
            strict = bool(np.any(table[a] < table[b] - 1e-12))
            if le and (strict or a < b):
                dominated = True
                break
        if not dominated or b in keep:
            out.add(b)
    return out


class _Kept:
    """``undominated`` memoised: it depends on the node only through which options
    fit it and whether it has a power cap, so nodes alike share one answer."""

    def __init__(self, p: ServerlessProblem) -> None:
        self.p = p
        self.seen: dict[tuple[int, int, bytes, bool, frozenset[int]], set[int]] = {}

    def __call__(self, m: int, n: int, kind: int, keep: frozenset[int] = frozenset()) -> set[int]:
        p = self.p
        key = (m, kind, p.fits[n].tobytes(), bool(np.isfinite(p.power_cap_w[n])), keep)
        if key not in self.seen:
            self.seen[key] = undominated(p, m, n, kind, keep)
        return self.seen[key]


def program_size(p: ServerlessProblem) -> tuple[int, int]:
    """(pools, columns) of the whole-horizon MILP, without building it: pools of
    the options left after dominance in every epoch with demand (lulls add a few
    more), four columns each, and a route column per (epoch, model with demand,
    prefill node, decode node)."""
    busy = (p.demand > 0).sum(axis=1)
    kinds = (PREFILL_NV, DECODE) if p.n_nodes == 1 else (PREFILL_NV, PREFILL_NET, DECODE)
    pools = 0
    kept = _Kept(p)
    for m in range(p.n_models):
        if busy[m]:
            per_epoch = sum(len(kept(m, n, k)) for n in range(p.n_nodes) for k in kinds)
            pools += int(busy[m]) * per_epoch
    routes = int(busy.sum()) * p.n_nodes * p.n_nodes
    return pools, 4 * pools + routes


def _holdable(p: ServerlessProblem, m: int, kind: int) -> FloatArray:
    """(O,): True where holding one idle instance for an epoch costs less than
    stopping it and starting it again (its drain, for decode, and its cold start):
    only then can an instance kept through an epoch without demand be worth it."""
    again = p.start_cost(m) + (p.stop_cost(m) if kind == DECODE else 0.0)
    return np.asarray(p.instance_cost(m) < again - 1e-12)


def _groups(ids: IntArray) -> tuple[IntArray, IntArray]:
    """Distinct non-negative ``ids`` (ascending) and, per entry, its group's index
    (-1 where the id is negative)."""
    keep = ids >= 0
    distinct, inverse = np.unique(ids[keep], return_inverse=True)
    out = np.full(ids.shape, -1, dtype=np.int64)
    out[keep] = inverse
    return distinct, out


def build_milp(
    p: ServerlessProblem,
    first: int = 0,
    last: int | None = None,
    start: dict[tuple[int, int, int, int], int] | None = None,
) -> Milp:
    """The MILP of epochs ``first`` .. ``last - 1`` (default all); ``start`` gives the
    instances (by model, node, option, kind) running before ``first`` (default none).

    Pools exist where the model has demand, and in an epoch without demand that lies
    between two with demand in the range (or after instances given in ``start``) for
    the options whose idle epoch costs less than a stop and a cold start: such an
    instance may be held through the lull (it serves nothing there). Built with
    array operations: linear in pools and routes."""
    stop = p.n_epochs if last is None else last
    init = start or {}
    n_n, n_m, n_o = p.n_nodes, p.n_models, p.n_options
    kinds = (PREFILL_NV, DECODE) if n_n == 1 else (PREFILL_NV, PREFILL_NET, DECODE)
    window = np.arange(first, stop)
    demand = p.demand[:, first:stop] if stop > first else np.zeros((n_m, 0))
    busy = demand > 0
    # epochs without demand between two with demand (or after running instances)
    lull = np.zeros_like(busy)
    for m in range(n_m):
        seen = np.cumsum(busy[m]) > 0
        if any(mm == m and c > 0 for (mm, _, _, _), c in init.items()):
            seen[:] = True
        later = np.cumsum(busy[m][::-1])[::-1] > 0
        lull[m] = ~busy[m] & seen & later
    parts: list[tuple[IntArray, int, int, int, int, bool]] = []
    kept = _Kept(p)
    for m in range(n_m):
        for k in kinds:
            hold = _holdable(p, m, k)
            for n in range(n_n):
                running = frozenset(o for (mm, nn, o, kk) in init if (mm, nn, kk) == (m, n, k))
                for o in sorted(kept(m, n, k, running)):
                    ts = window[busy[m]]
                    if hold[o] and lull[m].any():
                        ts = window[busy[m] | lull[m]]
                    if len(ts):
                        parts.append((ts, m, n, o, k, bool(hold[o])))
    if parts:
        a_pt = np.concatenate([ts for ts, *_ in parts])
        a_pm, a_pn, a_po, a_pk = (
            np.concatenate([np.full(len(ts), v[j], dtype=np.int64) for ts, *v in parts])
            for j in range(4)
        )
    else:
        a_pt = a_pm = a_pn = a_po = a_pk = np.zeros(0, dtype=np.int64)
    # pools in the order (epoch, model, node, option, kind): their keys ascend
    stride = np.array([n_m * n_n * n_o * 3, n_n * n_o * 3, n_o * 3, 3, 1], dtype=np.int64)
    keys = a_pt * stride[0] + a_pm * stride[1] + a_pn * stride[2] + a_po * stride[3] + a_pk
    order = np.argsort(keys, kind="stable")
    a_pt, a_pm, a_pn, a_po, a_pk, keys = (v[order] for v in (a_pt, a_pm, a_pn, a_po, a_pk, keys))
    n_p = len(keys)
    a_busy = demand[a_pm, a_pt - first] > 0 if n_p else np.zeros(0, dtype=bool)
    cap_table = np.stack(
        [p.cap_prefill[:, :, NVLINK], p.cap_prefill[:, :, NETWORK], p.cap_decode], axis=2
    )
    a_cap = np.where(a_busy, cap_table[a_pm, a_po, a_pk], 0.0) if n_p else np.zeros(0)

    # routes: every (epoch, model) with demand, prefill node a -> decode node b
    q_t, q_m = np.nonzero(busy.T)  # (epoch offset, model) pairs, epoch-major
    n_q = len(q_t)
    q_t = q_t + first
    q_of = np.full((n_m, max(stop - first, 0)), -1, dtype=np.int64)
    q_of[q_m, q_t - first] = np.arange(n_q)
    a_rq = np.repeat(np.arange(n_q), n_n * n_n)
    a_ra = np.tile(np.repeat(np.arange(n_n), n_n), n_q)
    a_rb = np.tile(np.arange(n_n), n_q * n_n)
    a_rt, a_rm = q_t[a_rq], q_m[a_rq]
    n_r = len(a_rq)

    n_col = 4 * n_p + n_r
    x0, y0, u0, v0, r0 = 0, n_p, 2 * n_p, 3 * n_p, 4 * n_p
    cost = np.zeros(n_col)
    for m in range(n_m):
        sel = a_pm == m
        o_sel, k_sel = a_po[sel], a_pk[sel]
        is_dec = k_sel == DECODE
        cost[x0:y0][sel] = p.instance_cost(m)[o_sel]
        cost[y0:u0][sel] = np.where(
            is_dec, p.serve_cost(m, "decode")[o_sel], p.serve_cost(m, "prefill")[o_sel]
        )
        cost[u0:v0][sel] = p.start_cost(m)[o_sel]
        cost[v0:r0][sel] = np.where(is_dec, p.stop_cost(m)[o_sel], 0.0)

    rows: list[IntArray] = []
    cols: list[IntArray] = []
    vals: list[FloatArray] = []
    lows: list[FloatArray] = []
    highs: list[FloatArray] = []

    def block(
        row: IntArray, col: IntArray, val: FloatArray | float, lo: FloatArray, hi: FloatArray
    ) -> None:
        """Rows ``lo <= sum <= hi`` whose entries (row within the block, column, value)
        are given; the block's rows follow those before it."""
        base = sum(len(b) for b in lows)
        rows.append(np.asarray(row, dtype=np.int64) + base)
        cols.append(np.asarray(col, dtype=np.int64))
        vals.append(np.broadcast_to(np.asarray(val, dtype=np.float64), (len(row),)).copy())
        lows.append(np.asarray(lo, dtype=np.float64))
        highs.append(np.asarray(hi, dtype=np.float64))

    inf = np.inf
    routes = np.arange(n_r)
    pools = np.arange(n_p)
    # demand: the routes of (t, m) carry its demand
    lam = demand[q_m, q_t - first]
    block(a_rq, r0 + routes, 1.0, lam, lam)
    # routing: per (t, m, node, kind), the pools' rates equal the routes they serve
    p_q = q_of[a_pm, a_pt - first] if n_p else np.zeros(0, dtype=np.int64)
    served = p_q >= 0
    rk = np.where(a_ra == a_rb, PREFILL_NV, PREFILL_NET)
    block(
        np.concatenate(
            [
                (p_q[served] * n_n + a_pn[served]) * 3 + a_pk[served],
                (a_rq * n_n + a_ra) * 3 + rk,
                (a_rq * n_n + a_rb) * 3 + DECODE,
            ]
        ),
        np.concatenate([y0 + pools[served], r0 + routes, r0 + routes]),
        np.concatenate([np.ones(int(served.sum())), -np.ones(2 * n_r)]),
        np.zeros(3 * n_n * n_q),
        np.zeros(3 * n_n * n_q),
    )
    # SLO capacity: y <= C x (C = 0 in a lull: the instance serves nothing)
    block(
        np.concatenate([pools, pools]),
        np.concatenate([y0 + pools, x0 + pools]),
        np.concatenate([np.ones(n_p), -a_cap]),
        np.full(n_p, -inf),
        np.zeros(n_p),
    )
    # count cuts: a phase needs at least ceil(demand / best capacity) instances
    phase = np.where(a_pk == DECODE, 1, 0)
    distinct, g = _groups(np.where(served, p_q * 2 + phase, -1))
    if len(distinct):
        best = np.zeros(len(distinct))
        np.maximum.at(best, g[served], a_cap[served])
        need = np.ceil(lam[distinct // 2] / best - 1e-9)
        block(g[served], x0 + pools[served], 1.0, need, np.full(len(distinct), inf))
    # cold starts u >= x - x(t - 1) and decode stops v >= x(t - 1) - x
    back = keys - stride[0]
    at = np.searchsorted(keys, back)
    found = (at < n_p) & (keys[np.minimum(at, max(n_p - 1, 0))] == back) if n_p else at > 0
    prev = np.where(found, at, -1)
    init_of = np.zeros(n_p)
    for (m, n, o, k), c in init.items():
        want = first * stride[0] + m * stride[1] + n * stride[2] + o * stride[3] + k
        i = int(np.searchsorted(keys, want))
        if i < n_p and keys[i] == want:
            init_of[i] = c
    at_first = a_pt == first
    has_prev = prev >= 0
    block(
        np.concatenate([pools, pools, pools[has_prev]]),
        np.concatenate([u0 + pools, x0 + pools, x0 + prev[has_prev]]),
        np.concatenate([np.ones(n_p), -np.ones(n_p), np.ones(int(has_prev.sum()))]),
        np.where(at_first, -init_of, 0.0),
        np.full(n_p, inf),
    )
    dec = a_pk == DECODE
    with_row = dec & (at_first | has_prev)
    stops = np.flatnonzero(with_row)
    linked = stops[has_prev[stops]]
    local = np.full(n_p, -1, dtype=np.int64)
    local[stops] = np.arange(len(stops))
    block(
        np.concatenate([local[stops], local[stops], local[linked]]),
        np.concatenate([v0 + stops, x0 + stops, x0 + prev[linked]]),
        np.concatenate([np.ones(2 * len(stops)), -np.ones(len(linked))]),
        np.where(at_first[stops], init_of[stops], 0.0),
        np.full(len(stops), inf),
    )
    # a decode pool whose next epoch has no pool in the range, or in the horizon's
    # last epoch, stops whole: its stop cost is on x
    ahead = keys + stride[0]
    at = np.searchsorted(keys, ahead)
    has_next = (at < n_p) & (keys[np.minimum(at, max(n_p - 1, 0))] == ahead) if n_p else at > 0
    ends = dec & (((a_pt + 1 < stop) & ~has_next) | (a_pt + 1 == p.n_epochs))
    cost[x0 + np.flatnonzero(ends)] += cost[v0 + np.flatnonzero(ends)]
    # per epoch and node: GPUs, KV over the NIC each way, power
    gpus = p.gpus_of()
    tn = (a_pt - first) * n_n + a_pn
    distinct, g = _groups(tn)
    block(g, x0 + pools, gpus[a_po], np.full(len(distinct), -inf), p.node_gpus[distinct % n_n])
    if n_n > 1:
        kv = p.kv_request_bytes[a_rm] / 1e9
        for node in (a_ra, a_rb):
            across = a_ra != a_rb
            distinct, g = _groups(np.where(across, (a_rt - first) * n_n + node, -1))
            block(
                g[across],
                r0 + routes[across],
                kv[across],
                np.full(len(distinct), -inf),
                p.nic_bps[distinct % n_n] / 1e9,
            )
    capped = np.isfinite(p.power_cap_w[a_pn]) if n_p else np.zeros(0, dtype=bool)
    if capped.any():
        distinct, g = _groups(np.where(capped, tn, -1))
        e = np.where(dec, p.energy_decode[a_pm, a_po], p.energy_prefill[a_pm, a_po])
        block(
            np.concatenate([g[capped], g[capped]]),
            np.concatenate([x0 + pools[capped], y0 + pools[capped]]),
            np.concatenate([p.on_w[a_po[capped]], e[capped]]),
            np.full(len(distinct), -inf),
            p.power_cap_w[distinct % n_n],
        )
    n_rows = sum(len(b) for b in lows)
    matrix = sp.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
        shape=(n_rows, n_col),
    )
    integer = np.zeros(n_col, dtype=bool)
    integer[:n_p] = True
    return Milp(
        cost=cost,
        matrix=matrix,
        row_lo=np.concatenate(lows),
        row_hi=np.concatenate(highs),
        integer=integer,
        pt=a_pt,
        pm=a_pm,
        pn=a_pn,
        po=a_po,
        pk=a_pk,
        cap=a_cap,
        rt=a_rt,
        rm=a_rm,
        ra=a_ra,
        rb=a_rb,
        first=first,
        last=stop,
    )


def highs_lp(milp: Milp, relax: bool = False) -> highspy.HighsLp:
    """The MILP (``relax``: its LP relaxation) as a HiGHS model; counts are integers
    >= 0, rates and starts continuous >= 0."""
    lp = highspy.HighsLp()
    n = len(milp)
    lp.num_col_ = n
    lp.num_row_ = milp.matrix.shape[0]
    lp.col_cost_ = milp.cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.full(n, highspy.kHighsInf)
    lp.row_lower_ = np.where(np.isfinite(milp.row_lo), milp.row_lo, -highspy.kHighsInf)
    lp.row_upper_ = np.where(np.isfinite(milp.row_hi), milp.row_hi, highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = milp.matrix.indptr.astype(np.int32)
    lp.a_matrix_.index_ = milp.matrix.indices.astype(np.int32)
    lp.a_matrix_.value_ = milp.matrix.data.astype(np.float64)
    if not relax:
        kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
        lp.integrality_ = [kinds[flag] for flag in milp.integer.tolist()]
    return lp


def solution_of(
    p: ServerlessProblem, milp: Milp, counts: IntArray, rates: FloatArray, route_rates: FloatArray
) -> tuple[list[list[Pool]], list[list[tuple[int, int, int, float]]]]:
    """Per-epoch pools and routes (epochs ``milp.first`` .. ``milp.last - 1``, indexed
    from 0) of integer ``counts`` and continuous ``rates`` per pool and ``route_rates``."""
    width = milp.last - milp.first
    pools: list[list[Pool]] = [[] for _ in range(width)]
    routes: list[list[tuple[int, int, int, float]]] = [[] for _ in range(width)]
    names = [n.name for n in p.spec.nodes]
    models = [m.name for m in p.spec.models]
    rates = np.where(rates > RATE_EPS, rates, 0.0)
    route_rates = np.where(route_rates > RATE_EPS, route_rates, 0.0)
    for i in range(milp.n_pools):
        if counts[i] <= 0 and rates[i] <= 0:
            continue
        opt = p.options[int(milp.po[i])]
        kind = int(milp.pk[i])
        pools[int(milp.pt[i]) - milp.first].append(
            Pool(
                model=models[int(milp.pm[i])],
                phase="decode" if kind == DECODE else "prefill",
                node=names[int(milp.pn[i])],
                share_pct=opt.share_pct,
                tp=opt.tp,
                clock_mhz=opt.clock_mhz,
                link=None if kind == DECODE else LINKS[NVLINK if kind == PREFILL_NV else NETWORK],
                count=int(counts[i]),
                rate_rps=float(max(rates[i], 0.0)),
            )
        )
    for j in range(len(milp.rt)):
        if route_rates[j] > 0:
            routes[int(milp.rt[j]) - milp.first].append(
                (int(milp.rm[j]), int(milp.ra[j]), int(milp.rb[j]), float(route_rates[j]))
            )
    return pools, routes


def objective_of(
    milp: Milp,
    counts: IntArray,
    rates: FloatArray,
    start: dict[tuple[int, int, int, int], int] | None = None,
    stop_cost: Callable[[int], FloatArray] | None = None,
) -> float:
    """The program's objective at integer ``counts`` and ``rates``, with the cold
    starts and decode stops they imply (``u = max(0, x - x(t - 1))``, ``v = max(0,
    x(t - 1) - x)``), including the stops of instances before the range that the
    range's first epoch has no pool for."""
    n_p = milp.n_pools
    init = start or {}
    counts = np.asarray(counts, dtype=np.int64)
    before = np.zeros(n_p, dtype=np.int64)
    if n_p:
        dims = tuple(int(v.max()) + 2 for v in (milp.pt, milp.pm, milp.pn, milp.po, milp.pk))
        keys = np.ravel_multi_index((milp.pt, milp.pm, milp.pn, milp.po, milp.pk), dims)
        back = keys - int(np.prod(dims[1:]))  # the same pool one epoch earlier
        order = np.argsort(keys)
        at = np.minimum(np.searchsorted(keys[order], back), n_p - 1)
        found = (keys[order][at] == back) & (milp.pt > milp.first)
        before[found] = counts[order[at[found]]]
        for i in np.flatnonzero(milp.pt == milp.first):
            before[i] = init.get(
                (int(milp.pm[i]), int(milp.pn[i]), int(milp.po[i]), int(milp.pk[i])), 0
            )
    starts = np.maximum(0, counts - before)
    stops = np.maximum(0, before - counts)
    extra = 0.0
    if stop_cost is not None:
        planned = {
            (int(milp.pm[i]), int(milp.pn[i]), int(milp.po[i]), int(milp.pk[i]))
            for i in np.flatnonzero(milp.pt == milp.first)
        }
        for (m, n, o, k), count in init.items():
            if k == DECODE and (m, n, o, k) not in planned:
                extra += count * float(stop_cost(m)[o])
    return float(
        milp.cost[:n_p] @ counts
        + milp.cost[n_p : 2 * n_p] @ rates
        + milp.cost[2 * n_p : 3 * n_p] @ starts
        + milp.cost[3 * n_p : 4 * n_p] @ stops
        + extra
    )
