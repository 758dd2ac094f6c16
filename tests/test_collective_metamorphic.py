"""Metamorphic and exhaustive checks of the collective family's exact methods.

Selection is exact over its candidate schedules and the synthesis MILP over copy
schedules of K rounds, so: relaxing a constraint (faster links, lower latency,
a healthier link or GPU, fewer or smaller collectives, a looser time ratio, more
clocks) never raises the optimum, and a plan keeps its cost or gets cheaper on
the relaxed problem; the order of the collectives and of the health entries
changes nothing; scaling every bandwidth and message size together leaves the
time unchanged and scaling every count scales objective and bound. On tiny
instances selection equals the least, over every candidate, of what the
independent verifier charges, and the MILP equals the least makespan over every
copy schedule, enumerated. Every returned plan is verified.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from energyopt.families import certify, family
from energyopt.families.collective.formulations.constants import PROTOCOL_STEP_US
from energyopt.families.collective.formulations.model import CollectiveProblem, build_problem
from energyopt.families.collective.formulations.synthesis import _copy_problem, _edge_rank
from energyopt.families.collective.solvers.select import Evaluator, structures
from energyopt.families.collective.solvers.synth import synthesize
from energyopt.families.collective.spec import PROTOCOLS, CollectiveFile, CollectivePlan
from energyopt.families.collective.verify import evaluate_collective, plan_cost
from energyopt.progress import quiet
from energyopt.solvers.result import Result

FAMILY = family("collective")
Data = dict[str, Any]


def _data(nodes: list[int], collectives: list[Data], objective: str = "time", **extra: Any) -> Data:
    return {
        "kind": "collective",
        "name": "m",
        "topology": {
            "nodes": [{"name": f"n{i}", "gpus": g} for i, g in enumerate(nodes)],
            "nvlink": {"latency_us": 0.5, "bandwidth_gbs": 400.0},
            "network": {"latency_us": 5.0, "bandwidth_gbs": 40.0},
            "channel_gbs": 40.0,
            "reduce_gbs": 110.0,
            "launch_us": 9.0,
        },
        "collectives": collectives,
        "objective": {"kind": objective, "max_time_ratio": 1.15},
        **extra,
    }


def _problem(data: Data) -> CollectiveProblem:
    return build_problem(CollectiveFile.model_validate(data))


def _solve(p: CollectiveProblem) -> Result[CollectivePlan]:
    """Selection with a limit far beyond its need (the optimum over its candidates),
    its plan verified and its figures recomputed."""
    r = FAMILY.solve(p, "select", time_limit_s=600, rel_gap=1e-6, progress=quiet)
    certify(FAMILY, p, r, 1e-6, lambda _: None)
    assert r.plan is not None and FAMILY.verify(p, r.plan) == []
    assert r.objective is not None and r.bound is not None and r.bound <= r.objective
    return r


def _obj(r: Result[CollectivePlan]) -> float:
    assert r.objective is not None
    return r.objective


def _two_nodes(objective: str = "time") -> Data:
    return _data(
        [2, 2],
        [
            {"name": "ar", "op": "all_reduce", "bytes": 3 << 20, "count": 2},
            {"name": "ag", "op": "all_gather", "bytes": 1 << 16},
            {"name": "bc", "op": "broadcast", "bytes": 1 << 22, "root": 3},
        ],
        objective,
        health={
            "links": [
                {"gpu": "n0/1", "link": "nic", "factor": 0.5},
                {"gpu": "n1/0", "link": "nvlink", "factor": 0.6},
            ],
            "stragglers": [{"gpu": "n1/1", "slowdown": 1.8}],
        },
    )


def _one_node(objective: str = "time") -> Data:
    return _data(
        [4],
        [
            {"name": "rs", "op": "reduce_scatter", "bytes": 1 << 24},
            {"name": "a2a", "op": "all_to_all", "bytes": 1 << 18, "count": 3},
        ],
        objective,
        health={"stragglers": [{"gpu": "n0/2", "slowdown": 2.5}]},
    )


def _set(*path: str | int, to: Callable[[Any], Any]) -> Callable[[Data], None]:
    def edit(d: Data) -> None:
        node: Any = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = to(node[path[-1]])

    return edit


RELAXATIONS: list[tuple[str, Callable[[], Data], Callable[[Data], None]]] = [
    ("faster NICs", _two_nodes, _set("topology", "network", "bandwidth_gbs", to=lambda x: 2 * x)),
    ("faster NVLink", _one_node, _set("topology", "nvlink", "bandwidth_gbs", to=lambda x: 3 * x)),
    ("faster channels", _one_node, _set("topology", "channel_gbs", to=lambda x: 1.5 * x)),
    ("faster reduction", _two_nodes, _set("topology", "reduce_gbs", to=lambda x: 4 * x)),
    (
        "lower network latency",
        _two_nodes,
        _set("topology", "network", "latency_us", to=lambda x: x / 5),
    ),
    ("lower launch cost", _one_node, _set("topology", "launch_us", to=lambda x: 0.0)),
    (
        "healthier NVLink port",
        _two_nodes,
        _set("health", "links", 1, "factor", to=lambda x: 1.0),
    ),
    (
        "healthier NIC (rail weights follow it)",
        _two_nodes,
        _set("health", "links", 0, "factor", to=lambda x: 0.9),
    ),
    ("milder straggler", _one_node, _set("health", "stragglers", 0, "slowdown", to=lambda x: 1.2)),
    ("fewer runs", _two_nodes, _set("collectives", 0, "count", to=lambda x: 1)),
    ("smaller message", _one_node, _set("collectives", 0, "bytes", to=lambda x: x // 8)),
    (
        "looser time ratio",
        lambda: _one_node("energy"),
        _set("objective", "max_time_ratio", to=lambda x: 3.0),
    ),
    (
        "more clocks",
        lambda: {**_two_nodes("energy"), "clocks_mhz": [1200, 1980]},
        _set("clocks_mhz", to=lambda x: [900, 1100, 1200, 1500, 1980]),
    ),
]


@pytest.mark.parametrize(
    ("base", "relax"), [(b, r) for _, b, r in RELAXATIONS], ids=[n for n, _, _ in RELAXATIONS]
)
def test_relaxing_a_constraint_never_raises_the_optimum(
    base: Callable[[], Data], relax: Callable[[Data], None]
) -> None:
    """The optimum over the same candidates cannot rise when every schedule gets
    cheaper or more schedules become feasible; the original plan, checked on the
    relaxed problem, verifies and costs no more (time and energy alike)."""
    data = base()
    loose = copy.deepcopy(data)
    relax(loose)
    assert loose != data
    p, q = _problem(data), _problem(loose)
    r, s = _solve(p), _solve(q)
    assert _obj(s) <= _obj(r) * (1 + 1e-9)
    assert r.plan is not None
    again = evaluate_collective(q, r.plan)
    assert again.violations == []
    assert plan_cost(q, r.plan) <= _obj(r) * (1 + 1e-9)


@pytest.mark.parametrize("make", [_two_nodes, lambda: _one_node("energy")], ids=["time", "energy"])
def test_the_order_of_the_input_never_changes_the_optimum(make: Callable[[], Data]) -> None:
    """Collectives and health entries in another order: the same objective and bound,
    and every collective gets the same schedule."""
    data = make()
    p = _problem(data)
    r = _solve(p)
    rng = np.random.default_rng(7)
    for _ in range(2):
        shuffled = copy.deepcopy(data)
        for key in ("collectives",):
            shuffled[key] = [shuffled[key][i] for i in rng.permutation(len(shuffled[key]))]
        for key in ("links", "stragglers"):
            items = shuffled["health"].get(key, [])
            shuffled["health"][key] = [items[i] for i in rng.permutation(len(items))]
        s = _solve(_problem(shuffled))
        assert _obj(s) == pytest.approx(_obj(r), rel=1e-12)
        assert s.bound == pytest.approx(r.bound, rel=1e-12)
        assert r.plan is not None and s.plan is not None
        assert {c.collective: c for c in s.plan.choices} == {
            c.collective: c for c in r.plan.choices
        }


def test_scaling_bandwidth_and_bytes_together_leaves_the_time_unchanged() -> None:
    """Every bandwidth and every message x 2 (time objective; copy collectives, as
    a reduction's HBM rate is the GPU's and does not scale): each schedule takes the
    same time, so the optimum, its bound and the choices stay; every count x 3
    scales objective and bound by 3."""
    data = _two_nodes()
    data["collectives"] = [
        {"name": "ag", "op": "all_gather", "bytes": 3 << 20, "count": 2},
        {"name": "bc", "op": "broadcast", "bytes": 1 << 22, "root": 3},
        {"name": "a2a", "op": "all_to_all", "bytes": 1 << 16},
    ]
    r = _solve(_problem(data))
    scaled = copy.deepcopy(data)
    topo = scaled["topology"]
    for link in ("nvlink", "network"):
        topo[link]["bandwidth_gbs"] *= 2
    topo["channel_gbs"] *= 2
    topo["reduce_gbs"] *= 2
    for c in scaled["collectives"]:
        c["bytes"] *= 2
    s = _solve(_problem(scaled))
    assert _obj(s) == pytest.approx(_obj(r), rel=1e-9)
    assert s.bound == pytest.approx(r.bound, rel=1e-9)
    assert r.plan is not None and s.plan is not None
    strip = {"time_us": None, "energy_j": None}
    assert [c.model_copy(update=strip) for c in s.plan.choices] == [
        c.model_copy(update=strip) for c in r.plan.choices
    ]
    counted = copy.deepcopy(data)
    for c in counted["collectives"]:
        c["count"] = 3 * c.get("count", 1)
    t = _solve(_problem(counted))
    assert _obj(t) == pytest.approx(3 * _obj(r), rel=1e-9)
    assert t.bound == pytest.approx(3 * (r.bound or 0.0), rel=1e-9)


@pytest.mark.parametrize(
    "data",
    [
        _data([3], [{"name": "ar", "op": "all_reduce", "bytes": 1 << 20}]),
        _data(
            [1, 1, 1],
            [{"name": "bc", "op": "broadcast", "bytes": 1 << 21, "root": 2}],
            health={"stragglers": [{"gpu": "n1/0", "slowdown": 2.0}]},
        ),
        _data(
            [2, 2],
            [{"name": "ag", "op": "all_gather", "bytes": 1 << 14}],
            health={"links": [{"gpu": "n0/0", "link": "nic", "factor": 0.3}]},
        ),
    ],
    ids=["ar-3", "bc-1x3", "ag-2x2"],
)
def test_selection_is_the_least_the_verifier_charges_over_every_candidate(data: Data) -> None:
    """Differential, exhaustive: every candidate schedule with every protocol, each
    costed by the independent verifier; selection's objective is their least."""
    p = _problem(data)
    r = _solve(p)
    c = p.collectives[0]
    ev = Evaluator(p)
    best = np.inf
    checked = 0
    for s in structures(p, c):
        for pr in PROTOCOLS:
            choice = ev.score(c, s, pr, p.gpu.max_sm_clock_mhz, p.name_of(0)).choice
            plan = CollectivePlan(choices=(choice,))
            out = evaluate_collective(p, plan)
            assert out.violations == []
            best = min(best, out.total_time_us)
            checked += 1
    assert checked >= 30
    assert _obj(r) == pytest.approx(best, rel=1e-9)


def _copy_schedules(n: int, owner: int, rounds: int) -> list[list[tuple[int, int, int]]]:
    """Every way one piece held by ``owner`` reaches every other rank exactly once
    within ``rounds`` rounds: lists of (round, sender, receiver), each sender
    holding the piece at the start of its round."""
    others = [v for v in range(n) if v != owner]
    out = []
    for when in itertools.product(range(rounds), repeat=len(others)):
        got = dict(zip(others, when, strict=True))
        senders = [[owner] + [u for u in others if u != v and got[u] < got[v]] for v in others]
        for pick in itertools.product(*senders):
            out.append([(got[v], u, v) for v, u in zip(others, pick, strict=True)])
    return out


def _makespan(
    p: CollectiveProblem, piece_bytes: float, sends: list[tuple[int, int, int]], rounds: int
) -> float:
    """The MILP's relaxed makespan of a copy schedule: per rank and round, the step
    overhead if it sends or receives, plus the longest of its ports' bytes over
    capacity; per rank the sum over rounds; the largest over ranks."""
    alpha = PROTOCOL_STEP_US["simple"]
    owner = _edge_rank(p)
    busy = np.zeros((p.n, rounds), dtype=bool)
    load = np.zeros((rounds, len(p.edge_gbs)))
    for k, u, v in sends:
        busy[u, k] = busy[v, k] = True
        for e in p.routes[u][v]:
            load[k, e] += 1
    t = alpha * busy.astype(float)
    extra = np.zeros((p.n, rounds))
    for k in range(rounds):
        for e in range(len(p.edge_gbs)):
            if load[k, e] and e in owner:
                r = owner[e]
                extra[r, k] = max(extra[r, k], piece_bytes / p.edge_gbs[e] / 1e3 * load[k, e])
    return float((t + extra).sum(axis=1).max())


@pytest.mark.parametrize(
    "data",
    [
        _data([3], [{"name": "ag", "op": "all_gather", "bytes": 1 << 20}]),
        _data(
            [1, 1, 1],
            [{"name": "ar", "op": "all_reduce", "bytes": 1 << 22}],
            health={"links": [{"gpu": "n2/0", "link": "nic", "factor": 0.25}]},
        ),
        _data([3], [{"name": "bc", "op": "broadcast", "bytes": 1 << 18, "root": 1}]),
        _data(
            [2, 1],
            [{"name": "rs", "op": "reduce_scatter", "bytes": 1 << 21}],
            health={"links": [{"gpu": "n0/1", "link": "nvlink", "factor": 0.5}]},
        ),
    ],
    ids=["ag-3", "ar-1x3", "bc-3", "rs-2+1"],
)
def test_the_synthesis_milp_equals_the_least_makespan_of_every_copy_schedule(data: Data) -> None:
    """Exhaustive, on 3 ranks and 2 rounds: every copy schedule of the MILP's pieces,
    its relaxed time by the MILP's own rule; the MILP's optimum is their least (a
    reduce-scatter or all-reduce is the reversed copy schedule, so the same), and
    the schedule it returns verifies and costs no less on the cost model."""
    p = _problem(data)
    c = p.collectives[0]
    rounds = 2
    cp = _copy_problem(p, c)
    assert all(len(need) == p.n - 1 for need in cp.need)  # every other rank, once
    per_piece = [_copy_schedules(p.n, cp.owner[q], rounds) for q in range(cp.pieces)]
    best = min(
        _makespan(p, cp.piece_bytes, [s for piece in combo for s in piece], rounds)
        for combo in itertools.product(*per_piece)
    )
    factor = 2.0 if c.op == "all_reduce" else 1.0
    fixed = p.rates.launch_us + p.least_route_us()
    syn = synthesize(p, c, "x", rounds, 600.0)
    assert syn is not None and syn.optimal
    assert syn.milp_us == pytest.approx(fixed + factor * best, rel=1e-6)
    plan = CollectivePlan(choices=(syn.choice.model_copy(update={"collective": p.name_of(0)}),))
    out = evaluate_collective(p, plan)
    assert out.violations == []
    assert out.total_time_us >= syn.milp_us * (1 - 1e-9)
