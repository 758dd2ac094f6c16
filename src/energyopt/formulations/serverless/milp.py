"""The joint prefill/decode provisioning MILP over a range of epochs.

Columns, per epoch t, model m, node n and option o (docs/formulations/serverless.md):

- pool (t, m, n, o, k) for k in {prefill over NVLink, prefill over the network,
  decode}: ``x`` instances (integer), ``y`` requests/s they serve, ``u`` cold
  starts (instances more than in the epoch before);
- route r[t, m, a, b]: requests/s prefilled on node a and decoded on node b.

Rows: the routes carry each model's demand; a node's NVLink prefill pools serve
its routes to itself, its network prefill pools its routes to other nodes, its
decode pools every route into it; y <= capacity x; u >= x - x(t - 1); GPUs per
node; the KV bytes a node sends and receives over the network within its NIC; the
node's power within its cap; and the count cuts (valid for integer counts): a
phase needs at least ceil(demand / largest instance capacity) instances. The
objective is the plan's cost in the file's unit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from energyopt.formulations.serverless.model import (
    LINKS,
    NETWORK,
    NVLINK,
    FloatArray,
    IntArray,
    ServerlessProblem,
)
from energyopt.formulations.sparse_rows import SparseRows
from energyopt.spec.serverless import Pool

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


def build_milp(
    p: ServerlessProblem,
    first: int = 0,
    last: int | None = None,
    start: dict[tuple[int, int, int, int], int] | None = None,
) -> Milp:
    """The MILP of epochs ``first`` .. ``last - 1`` (default all); ``start`` gives the
    instances (by model, node, option, kind) running before ``first`` (default none)."""
    stop = p.n_epochs if last is None else last
    init = start or {}
    n_n = p.n_nodes
    kept = {
        (m, n, k): undominated(
            p, m, n, k, {o for (mm, nn, o, kk) in init if (mm, nn, kk) == (m, n, k)}
        )
        for m in range(p.n_models)
        for n in range(n_n)
        for k in (PREFILL_NV, PREFILL_NET, DECODE)
    }
    pt, pm, pn, po, pk, cap = [], [], [], [], [], []
    for t in range(first, stop):
        for m in range(p.n_models):
            if p.demand[m, t] <= 0:
                continue
            for n in range(n_n):
                for o in range(p.n_options):
                    for k in (PREFILL_NV, PREFILL_NET, DECODE):
                        if k == PREFILL_NET and n_n == 1:
                            continue
                        c = pool_capacity(p, m, o, k)
                        if o in kept[m, n, k]:
                            pt.append(t)
                            pm.append(m)
                            pn.append(n)
                            po.append(o)
                            pk.append(k)
                            cap.append(c)
    n_p = len(pt)
    rt, rm, ra, rb = [], [], [], []
    for t in range(first, stop):
        for m in range(p.n_models):
            if p.demand[m, t] <= 0:
                continue
            for a in range(n_n):
                for b in range(n_n):
                    rt.append(t)
                    rm.append(m)
                    ra.append(a)
                    rb.append(b)
    n_r = len(rt)
    a_pt, a_pm, a_pn, a_po, a_pk = (np.asarray(v, dtype=np.int64) for v in (pt, pm, pn, po, pk))
    a_cap = np.asarray(cap, dtype=np.float64)
    a_rt, a_rm, a_ra, a_rb = (np.asarray(v, dtype=np.int64) for v in (rt, rm, ra, rb))
    n_col = 4 * n_p + n_r
    cost = np.zeros(n_col)
    for m in range(p.n_models):
        sel = a_pm == m
        cost[:n_p][sel] = p.instance_cost(m)[a_po[sel]]
        serve = np.where(a_pk[sel] == DECODE, 1.0, 0.0)
        e = (
            serve * p.serve_cost(m, "decode")[a_po[sel]]
            + (1 - serve) * p.serve_cost(m, "prefill")[a_po[sel]]
        )
        cost[n_p : 2 * n_p][sel] = e
        cost[2 * n_p : 3 * n_p][sel] = p.start_cost(m)[a_po[sel]]
        cost[3 * n_p : 4 * n_p][sel] = np.where(a_pk[sel] == DECODE, p.stop_cost(m)[a_po[sel]], 0.0)
    rows = SparseRows()
    row = rows.add

    x0, y0, u0, v0, r0 = 0, n_p, 2 * n_p, 3 * n_p, 4 * n_p
    pools_at: dict[tuple[int, int, int, int], list[int]] = {}
    for i in range(n_p):
        pools_at.setdefault((int(a_pt[i]), int(a_pm[i]), int(a_pn[i]), int(a_pk[i])), []).append(i)
    routes_at: dict[tuple[int, int], list[int]] = {}
    for j in range(n_r):
        routes_at.setdefault((int(a_rt[j]), int(a_rm[j])), []).append(j)
    for (t, m), js in routes_at.items():
        demand = float(p.demand[m, t])
        row([(r0 + j, 1.0) for j in js], demand, demand)
        for n in range(n_n):
            local = [j for j in js if a_ra[j] == n and a_rb[j] == n]
            out = [j for j in js if a_ra[j] == n and a_rb[j] != n]
            into = [j for j in js if a_rb[j] == n]
            for kind, served in ((PREFILL_NV, local), (PREFILL_NET, out), (DECODE, into)):
                ps = pools_at.get((t, m, n, kind), [])
                row([(y0 + i, 1.0) for i in ps] + [(r0 + j, -1.0) for j in served], 0.0, 0.0)
    for i in range(n_p):
        row([(y0 + i, 1.0), (x0 + i, -float(a_cap[i]))], -np.inf, 0.0)
    # count cuts: a phase needs at least ceil(demand / best capacity) instances
    for (t, m), _ in routes_at.items():
        demand = float(p.demand[m, t])
        for kinds in ((PREFILL_NV, PREFILL_NET), (DECODE,)):
            ps = [i for i in range(n_p) if a_pt[i] == t and a_pm[i] == m and a_pk[i] in kinds]
            if ps:
                best = max(float(a_cap[i]) for i in ps)
                need = float(np.ceil(demand / best - 1e-9))
                row([(x0 + i, 1.0) for i in ps], need, np.inf)
    index = {
        (int(a_pt[i]), int(a_pm[i]), int(a_pn[i]), int(a_po[i]), int(a_pk[i])): i
        for i in range(n_p)
    }
    for i in range(n_p):
        t, m, n, o, k = (int(v[i]) for v in (a_pt, a_pm, a_pn, a_po, a_pk))
        entries = [(u0 + i, 1.0), (x0 + i, -1.0)]
        if t == first:
            row(entries, -float(init.get((m, n, o, k), 0)), np.inf)
        else:
            prev = index.get((t - 1, m, n, o, k))
            if prev is not None:
                entries.append((x0 + prev, 1.0))
            row(entries, 0.0, np.inf)
    # stops of decode pools: v >= x(t - 1) - x; a pool with no successor in the
    # range's next epoch stops whole (its stop cost on x)
    for i in range(n_p):
        t, m, n, o, k = (int(v[i]) for v in (a_pt, a_pm, a_pn, a_po, a_pk))
        if k != DECODE:
            continue
        entries = [(v0 + i, 1.0), (x0 + i, 1.0)]
        if t == first:
            row(entries, float(init.get((m, n, o, k), 0)), np.inf)
        else:
            prev = index.get((t - 1, m, n, o, k))
            if prev is not None:
                entries.append((x0 + prev, -1.0))
                row(entries, 0.0, np.inf)
        if t + 1 < stop and (t + 1, m, n, o, k) not in index:
            cost[x0 + i] += cost[v0 + i]
    gpus = p.gpus_of()
    for t in range(first, stop):
        for n in range(n_n):
            here = np.flatnonzero((a_pt == t) & (a_pn == n))
            if len(here):
                row(
                    [(x0 + int(i), float(gpus[a_po[i]])) for i in here],
                    -np.inf,
                    float(p.node_gpus[n]),
                )
            if n_n > 1:
                sends = np.flatnonzero((a_rt == t) & (a_ra == n) & (a_rb != n))
                gets = np.flatnonzero((a_rt == t) & (a_rb == n) & (a_ra != n))
                for group in (sends, gets):
                    if len(group):
                        row(
                            [
                                (r0 + int(j), float(p.kv_request_bytes[a_rm[j]]) / 1e9)
                                for j in group
                            ],
                            -np.inf,
                            float(p.nic_bps[n]) / 1e9,
                        )
            if np.isfinite(p.power_cap_w[n]) and len(here):
                entries = [(x0 + int(q), float(p.on_w[a_po[q]])) for q in here]
                for q in here:
                    e = (
                        p.energy_decode[a_pm[q], a_po[q]]
                        if a_pk[q] == DECODE
                        else p.energy_prefill[a_pm[q], a_po[q]]
                    )
                    entries.append((y0 + int(q), float(e)))
                row(entries, -np.inf, float(p.power_cap_w[n]))
    matrix = rows.matrix(n_col)
    integer = np.zeros(n_col, dtype=bool)
    integer[:n_p] = True
    return Milp(
        cost=cost,
        matrix=matrix,
        row_lo=rows.lower(),
        row_hi=rows.upper(),
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
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if flag else highspy.HighsVarType.kContinuous
            for flag in milp.integer
        ]
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
    index = {
        (int(milp.pt[i]), int(milp.pm[i]), int(milp.pn[i]), int(milp.po[i]), int(milp.pk[i])): i
        for i in range(n_p)
    }
    starts = np.zeros(n_p)
    stops = np.zeros(n_p)
    for i in range(n_p):
        t, m, n, o, k = (int(v[i]) for v in (milp.pt, milp.pm, milp.pn, milp.po, milp.pk))
        if t == milp.first:
            before = init.get((m, n, o, k), 0)
        else:
            prev = index.get((t - 1, m, n, o, k))
            before = 0 if prev is None else int(counts[prev])
        starts[i] = max(0, int(counts[i]) - before)
        stops[i] = max(0, before - int(counts[i]))
    extra = 0.0
    if stop_cost is not None:
        for (m, n, o, k), count in init.items():
            if k == DECODE and (milp.first, m, n, o, k) not in index:
                extra += count * float(stop_cost(m)[o])
    return float(
        milp.cost[:n_p] @ counts
        + milp.cost[n_p : 2 * n_p] @ rates
        + milp.cost[2 * n_p : 3 * n_p] @ starts
        + milp.cost[3 * n_p : 4 * n_p] @ stops
        + extra
    )
