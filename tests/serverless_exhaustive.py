"""Random tiny serverless instances and an exhaustive optimiser written apart from the
formulation, for the differential test of every serverless solver.

The optimiser reads only the file and the performance model's per-option figures
(``ServerlessProblem``: SLO capacities, energy per request, on power, load times,
KV bytes) and follows docs/formulations/serverless.md, not formulations/serverless:
per epoch it enumerates every multiset of instances (node, option, pool kind) whose
slices pack onto each node's GPUs (TP groups whole, shares on single GPUs, tried
exhaustively), solves the routes and rates of each with an LP (scipy), and joins the
epochs by dynamic programming over the counts, paying cold starts when a pool grows,
drains when a decode pool shrinks and after the last epoch, and holding instances
through epochs without demand where that is cheaper. Objective weights: a GPU-second
``a``, a joule ``b`` (``gpu_seconds`` 1, 0; ``energy`` 0, 1; ``weighted`` 1, w).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from energyopt.families.serverless.formulations.model import ServerlessProblem, build_problem
from energyopt.families.serverless.spec import ServerlessFile
from energyopt.spec.errors import SpecError

from .lp_helpers import lp_minimum

NV, NET, DEC = 0, 1, 2
MAX_CONFIGS = 400
"""Instances with more instance multisets than this in an epoch are redrawn."""


@dataclass(frozen=True)
class Optimum:
    """Exhaustive optimum (None: no plan exists) and how many multisets it tried."""

    value: float | None
    configs: int


def _weights(p: ServerlessProblem) -> tuple[float, float]:
    obj = p.spec.objective
    if obj.kind == "gpu_seconds":
        return 1.0, 0.0
    if obj.kind == "energy":
        return 0.0, 1.0
    return 1.0, obj.energy_weight_per_j


def _capacity(p: ServerlessProblem, m: int, o: int, k: int) -> float:
    return float(p.cap_decode[m, o] if k == DEC else p.cap_prefill[m, o, k])


def _packs(gpus: int, slices: list[tuple[int, int]]) -> bool:
    """Whether (share %, tp) slices fit on ``gpus`` GPUs: a TP group (or a 100 %
    share) takes whole GPUs, every other share one GPU; tried exhaustively."""
    whole = sum(tp if tp > 1 else 1 for s, tp in slices if tp > 1 or s == 100)
    if whole > gpus:
        return False
    shares = [s for s, tp in slices if tp == 1 and s < 100]
    room = gpus - whole
    if not shares:
        return True
    if room == 0:
        return False
    for assign in itertools.product(range(room), repeat=len(shares)):
        load = [0] * room
        for s, g in zip(shares, assign, strict=True):
            load[g] += s
        if max(load) <= 100:
            return True
    return False


def _pools(p: ServerlessProblem) -> list[tuple[int, int, int, int]]:
    """(model, node, option, kind) of every pool that could serve: the option fits
    the node and has capacity for the kind (a network prefill needs a second node)."""
    out = []
    for m in range(p.n_models):
        for n in range(p.n_nodes):
            for o, opt in enumerate(p.options):
                if opt.tp > p.node_gpus[n]:
                    continue
                for k in (NV, NET, DEC):
                    if k == NET and p.n_nodes < 2:
                        continue
                    if _capacity(p, m, o, k) > 0:
                        out.append((m, n, o, k))
    return out


def _configs(p: ServerlessProblem, pools: list[tuple[int, int, int, int]]) -> list[tuple[int, ...]]:
    """Every count vector over ``pools`` whose slices pack onto each node."""
    per_node: list[list[dict[int, int]]] = []
    for n in range(p.n_nodes):
        mine = [i for i, pool in enumerate(pools) if pool[1] == n]
        found: list[dict[int, int]] = [{}]
        frontier: list[dict[int, int]] = [{}]
        while frontier:
            grown: list[dict[int, int]] = []
            for counts in frontier:
                last = max(counts) if counts else -1
                for i in mine:
                    if i < last:
                        continue
                    new = dict(counts)
                    new[i] = new.get(i, 0) + 1
                    slices = [
                        (p.options[pools[j][2]].share_pct, p.options[pools[j][2]].tp)
                        for j, c in new.items()
                        for _ in range(c)
                    ]
                    if _packs(int(p.node_gpus[n]), slices):
                        grown.append(new)
            found.extend(grown)
            frontier = grown
        per_node.append(found)
    out = []
    for combo in itertools.product(*per_node):
        vec = [0] * len(pools)
        for counts in combo:
            for i, c in counts.items():
                vec[i] = c
        out.append(tuple(vec))
    return out


def _serve(
    p: ServerlessProblem,
    t: int,
    pools: list[tuple[int, int, int, int]],
    counts: tuple[int, ...],
    b: float,
) -> float | None:
    """Least serving cost (energy of the requests, weighted) of one epoch's
    instances ``counts``, or None when they cannot carry the demand: an LP over the
    pools' rates and the routes (prefill node a -> decode node b) per model."""
    n_n = p.n_nodes
    dt = p.epoch_s
    total = 0.0
    for m in range(p.n_models):
        lam = float(p.demand[m, t])
        mine = [i for i, pool in enumerate(pools) if pool[0] == m and counts[i] > 0]
        if lam <= 0:
            continue
        for phase in ((NV, NET), (DEC,)):
            cap = sum(
                counts[i] * _capacity(p, m, pools[i][2], pools[i][3])
                for i in mine
                if pools[i][3] in phase
            )
            if cap < lam * (1 - 1e-9):
                return None  # too few instances of a phase, whatever the routes
        n_y = len(mine)
        n_r = n_n * n_n
        n_v = n_y + n_r
        a_eq: list[list[float]] = []
        b_eq: list[float] = []
        row = [0.0] * n_y + [1.0] * n_r
        a_eq.append(row)
        b_eq.append(lam)
        for n in range(n_n):
            for k in (NV, NET, DEC):
                row = [0.0] * n_v
                for j, i in enumerate(mine):
                    if pools[i][1] == n and pools[i][3] == k:
                        row[j] = 1.0
                for a in range(n_n):
                    for bb in range(n_n):
                        serves = (
                            (k == NV and a == n and bb == n)
                            or (k == NET and a == n and bb != n)
                            or (k == DEC and bb == n)
                        )
                        if serves:
                            row[n_y + a * n_n + bb] -= 1.0
                a_eq.append(row)
                b_eq.append(0.0)
        a_ub: list[list[float]] = []
        b_ub: list[float] = []
        kv = float(p.kv_request_bytes[m]) / 1e9
        for n in range(n_n):
            if n_n > 1:
                out_row = [0.0] * n_v
                in_row = [0.0] * n_v
                for a in range(n_n):
                    for bb in range(n_n):
                        if a != bb and a == n:
                            out_row[n_y + a * n_n + bb] = kv
                        if a != bb and bb == n:
                            in_row[n_y + a * n_n + bb] = kv
                a_ub += [out_row, in_row]
                b_ub += [float(p.nic_bps[n]) / 1e9] * 2
        bounds = [(0.0, counts[i] * _capacity(p, m, pools[i][2], pools[i][3])) for i in mine]
        bounds += [(0.0, None)] * n_r
        cost = [0.0] * n_v
        energy = [
            float(
                p.energy_decode[m, pools[i][2]]
                if pools[i][3] == DEC
                else p.energy_prefill[m, pools[i][2]]
            )
            for i in mine
        ]
        for j in range(n_y):
            cost[j] = dt * b * energy[j]
        # power caps: on power of every instance on the node plus its requests' energy
        for n in range(n_n):
            cap = float(p.power_cap_w[n])
            if not np.isfinite(cap):
                continue
            held = sum(
                counts[i] * float(p.on_w[pool[2]]) for i, pool in enumerate(pools) if pool[1] == n
            )
            row = [0.0] * n_v
            for j, i in enumerate(mine):
                if pools[i][1] == n:
                    row[j] = energy[j]
            a_ub.append(row)
            b_ub.append(cap - held)
        least = lp_minimum(cost, a_ub, b_ub, a_eq, b_eq, bounds)
        if least is None:
            return None
        total += least
    if p.n_models and all(p.demand[m, t] <= 0 for m in range(p.n_models)):
        for n in range(n_n):  # held instances still draw their on power
            cap = float(p.power_cap_w[n])
            held = sum(
                counts[i] * float(p.on_w[pool[2]]) for i, pool in enumerate(pools) if pool[1] == n
            )
            if np.isfinite(cap) and held > cap:
                return None
    return total


def exhaustive_optimum(p: ServerlessProblem) -> Optimum:
    """The least cost of any plan (docs/formulations/serverless.md) by enumeration;
    one model (the power rows of ``_serve`` hold one model's requests)."""
    assert p.n_models == 1
    a, b = _weights(p)
    pools = _pools(p)
    configs = _configs(p, pools)
    vecs = np.array(configs, dtype=np.float64).reshape(len(configs), len(pools))
    g = np.array([p.options[o].share_pct / 100 * p.options[o].tp for _, _, o, _ in pools])
    w = np.array([float(p.on_w[o]) for _, _, o, _ in pools])
    held = a * g + b * w  # per instance-second, in the objective's unit
    load = np.array([float(p.load_s[m, o]) for m, _, o, _ in pools])
    drain = np.array(
        [p.spec.models[m].drain_s if k == DEC else 0.0 for m, _, _, k in pools], dtype=np.float64
    )
    start_cost = held * load
    stop_cost = held * drain
    best: NDArray[np.float64] | None = None
    previous = np.zeros((1, len(pools)))
    for t in range(p.n_epochs):
        epoch = np.full(len(configs), np.inf)
        for c, counts in enumerate(configs):
            served = _serve(p, t, pools, counts, b)
            if served is not None:
                epoch[c] = served + float(vecs[c] @ held) * p.epoch_s
        if not np.isfinite(epoch).any():
            return Optimum(None, len(configs))
        grow = np.maximum(vecs[None, :, :] - previous[:, None, :], 0.0) @ start_cost
        shrink = np.maximum(previous[:, None, :] - vecs[None, :, :], 0.0) @ stop_cost
        before = np.zeros(1) if best is None else best
        best = np.min(before[:, None] + grow + shrink, axis=0) + epoch
        previous = vecs
    assert best is not None
    final = best + vecs @ stop_cost  # the plan ends with none: every decode drains
    value = float(np.min(final))
    return Optimum(value if np.isfinite(value) else None, len(configs))


SHARES = ([100], [50, 100], [25, 50], [50], [25, 100])
CLOCKS = ([1980], [1980], [1410, 1980], [1200])


def random_doc(rng: random.Random) -> dict[str, Any]:
    """A random tiny serverless file: one or two nodes of one or two GPUs, 1-3
    epochs (some without demand), MPS shares and TP 2, one or two clocks, NIC and
    power caps that bind, a slow or quick cold start, every objective."""
    n_nodes = rng.choice([1, 1, 2])
    gpus = [rng.choice([1, 2]) if n_nodes == 1 else 1 for _ in range(n_nodes)]
    tp = [1, 2] if n_nodes == 1 and gpus[0] == 2 and rng.random() < 0.5 else [1]
    nodes: list[dict[str, Any]] = []
    for i in range(n_nodes):
        node: dict[str, Any] = {"name": f"n{i}", "gpus": gpus[i]}
        if rng.random() < 0.4:
            node["nic_gbps"] = rng.choice([0.5, 1.0, 2.0])
        if rng.random() < 0.3:
            node["power_cap_w"] = rng.choice([250.0, 400.0, 600.0])
        nodes.append(node)
    epochs = rng.choice([1, 2, 2, 3])
    demand = [round(rng.uniform(1.0, 14.0), 2) for _ in range(epochs)]
    if epochs == 3 and rng.random() < 0.5:
        demand[1] = 0.0
    kind = rng.choice(["gpu_seconds", "energy", "weighted"])
    model: dict[str, Any] = {
        "name": "chat",
        "model": "Llama-3.1-8B",
        "prompt_tokens": {"mean": rng.choice([600, 1155])},
        "output_tokens": {"mean": rng.choice([100, 211])},
        "slo": {"ttft_ms": rng.choice([600, 1000]), "tbt_ms": 50, "percentile": 90},
        "demand_rps": demand,
    }
    if rng.random() < 0.3:
        model["decode_drain_s"] = rng.choice([0.0, 30.0])
    return {
        "kind": "serverless",
        "name": "random",
        "gpu": "H100-SXM5-80GB",
        "epoch_s": rng.choice([5.0, 30.0, 60.0]),
        "nodes": nodes,
        "cold_start": {"bandwidth_gbps": 3.62, "fixed_s": rng.choice([0.0, 0.0, 20.0])},
        "options": {
            "shares_pct": rng.choice(SHARES),
            "tp": tp,
            "clocks_mhz": rng.choice(CLOCKS),
            "max_batch": 64,
            "load_fraction": rng.choice([0.85, 1.0]),
        },
        "models": [model],
        "objective": {"kind": kind, "energy_weight_per_j": 1e-3},
    }


def random_problems(
    seed: int, count: int
) -> Iterator[tuple[dict[str, Any], ServerlessProblem, Optimum]]:
    """``count`` random instances (redrawn while too large to enumerate) with their
    exhaustive optima."""
    rng = random.Random(seed)
    made = 0
    while made < count:
        doc = random_doc(rng)
        try:
            p = build_problem(ServerlessFile.model_validate(doc))
        except SpecError:  # an SLO no option meets: draw again
            continue
        if len(_configs(p, _pools(p))) > MAX_CONFIGS:
            continue
        yield doc, p, exhaustive_optimum(p)
        made += 1
