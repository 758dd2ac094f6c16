"""The decode-merge decision (families/serverless/formulations/merge.py,
families/serverless/solvers/merge.py): the MILP against brute force over every merge of tiny
candidate sets (optimum and bound), the MILP at least as good as the greedy on
random small sets with every decision a valid, conserving merge, and the
simulator's decisions with a compiled rate table equal to the table-driven
decision function's."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.families import family
from energyopt.families.serverless.formulations.merge import (
    DecodeFigures,
    MergeDecision,
    MergeProblem,
    MergeRequest,
    Snapshot,
    merge_problem,
    merge_value,
    merge_violations,
)
from energyopt.families.serverless.merge_policy import MergePolicy, MergeRecord
from energyopt.families.serverless.sim import simulate
from energyopt.families.serverless.solvers.merge import decide_merge, greedy_merge, milp_merge
from energyopt.families.serverless.tables import RateTable, compile_rate_table
from energyopt.families.serverless.verify import DecodeInstanceState, check_merge
from energyopt.perf.kvtransfer import NETWORK_H100, NVLINK_H100
from energyopt.sim.arrivals import Arrivals
from tests.test_serverless import QUIET, _doc, _problem

FIGURES = {
    0: DecodeFigures(
        capacity_rps=2.0, batch_at_capacity=3.4, kv_budget_bytes=3.0e9, held_per_s=0.5
    ),
    1: DecodeFigures(
        capacity_rps=4.5, batch_at_capacity=5.6, kv_budget_bytes=5.0e9, held_per_s=1.0
    ),
}
"""Two instance sizes with small batch limits (3 and 5 at fill 0.9) and KV budgets
that bind: a request reserves 0.4-1.6 GB."""


def _random_problem(seed: int, n_max: int, per_max: int) -> MergeProblem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, n_max + 1))
    snaps = []
    rid = 0
    for i in range(n):
        o = int(rng.integers(0, 2))
        limit = 3 if o == 0 else 5
        reqs: list[MergeRequest] = []
        used = 0.0
        for _ in range(int(rng.integers(0, min(per_max, limit) + 1))):
            kv = float(rng.uniform(0.4e9, 1.6e9))
            if used + kv > FIGURES[o].kv_budget_bytes - 1e3:
                break
            used += kv
            reqs.append(MergeRequest(rid, kv, kv * float(rng.uniform(0.6, 1.0))))
            rid += 1
        snaps.append(Snapshot(f"d{i}", int(rng.integers(0, 2)), o, tuple(reqs)))
    total = sum(FIGURES[s.option].capacity_rps for s in snaps)
    return merge_problem(
        snaps,
        FIGURES,
        need_rps=float(rng.uniform(0.1, 0.7)) * total,
        other_capacity_rps=float(rng.choice([0.0, 1.0])),
        remaining_s=float(rng.uniform(1.0, 40.0)),
        fill=0.9,
        max_batch=64,
        price_per_gb=float(rng.choice([0.01, 2.0])),
        price_per_stall_s=1.0,
        links=(NVLINK_H100, NETWORK_H100),
    )


def _every_merge(p: MergeProblem) -> list[MergeDecision]:
    """Every decision that is a merge of ``p`` (releases and destinations enumerated)."""
    out = []
    for k in range(p.size + 1):
        for released in itertools.combinations(range(p.size), k):
            kept = [j for j in range(p.size) if j not in released]
            moving = [r.rid for i in released for r in p.requests[i]]
            if moving and not kept:
                continue
            for dest in itertools.product(kept, repeat=len(moving)):
                d = MergeDecision(frozenset(released), dict(zip(moving, dest, strict=True)))
                if not merge_violations(p, d):
                    out.append(d)
    return out


def _conserves(p: MergeProblem, d: MergeDecision) -> None:
    """The verifier's merge check passes, and every request is held exactly once after."""
    states = [
        DecodeInstanceState(
            p.names[i],
            float(p.kv_budget_bytes[i]),
            int(p.batch_limit[i]),
            {r.rid: r.kv_bytes for r in p.requests[i]},
        )
        for i in range(p.size)
    ]
    moves = {rid: p.names[j] for rid, j in d.moves.items()}
    assert check_merge(states, moves, [p.names[i] for i in d.released]) == []
    after = [d.moves.get(r.rid, i) for i in range(p.size) for r in p.requests[i]]
    assert len(after) == p.n_requests and not set(after) & d.released


@pytest.mark.parametrize("seed", [3, 4, 17, 24])
def test_the_merge_milp_matches_brute_force_and_bounds_every_merge(seed: int) -> None:
    p = _random_problem(seed, n_max=4, per_max=2)
    merges = _every_merge(p)
    best = max(merge_value(p, d) for d in merges)  # releasing nothing is always one
    got = milp_merge(p)
    assert got.optimal and got.bound is not None
    assert got.value == pytest.approx(best, abs=1e-6)
    assert all(merge_value(p, d) <= got.bound + 1e-6 for d in merges)
    assert merge_value(p, greedy_merge(p)) <= best + 1e-9


def test_brute_force_finds_merges_the_greedy_misses() -> None:
    """The tiny sets above are not trivial: on some the best merge releases something
    and on some the greedy is below it (so the tests can tell the two apart)."""
    values = []
    for seed in range(40):
        p = _random_problem(seed, n_max=4, per_max=2)
        values.append((merge_value(p, greedy_merge(p)), milp_merge(p).value))
    assert any(m > 1e-9 for _, m in values)
    assert any(m > g + 1e-6 for g, m in values)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6))
def test_the_merge_milp_is_at_least_the_greedy_and_conserves_requests(seed: int) -> None:
    p = _random_problem(seed, n_max=5, per_max=4)
    greedy = greedy_merge(p)
    got = milp_merge(p)
    assert merge_violations(p, greedy) == [] and merge_violations(p, got.decision) == []
    g = merge_value(p, greedy)
    assert got.value >= g - 1e-6 * max(1.0, abs(g))  # HiGHS' relative gap 1e-6
    assert got.bound is not None and got.bound >= got.value
    _conserves(p, got.decision)
    out = decide_merge(p)
    assert out.value == pytest.approx(max(got.value, g), abs=1e-9)
    _conserves(p, out.decision)


def test_a_set_over_the_size_limit_takes_the_greedy() -> None:
    p = _random_problem(5, n_max=5, per_max=4)
    out = decide_merge(p, max_pairs=0)
    assert out.milp is None and out.method == "greedy"
    assert out.decision == greedy_merge(p)


def test_the_simulators_merge_decisions_are_the_tables(tmp_path: Path) -> None:
    nodes = [{"name": "n0", "gpus": 2}, {"name": "n1", "gpus": 2}]
    p = _problem(nodes=nodes, models=[dict(_doc()["models"][0], demand_rps=[40.0, 40.0])])
    plan = family("serverless").solve(p, "fast", time_limit_s=10, rel_gap=1e-6, progress=QUIET)
    assert plan.plan is not None
    compile_rate_table(p, [40.0], tmp_path / "rates.tbl")
    table = RateTable.open(tmp_path / "rates.tbl")
    rng = np.random.default_rng(3)
    n = 480
    arrivals = Arrivals(
        time_s=np.sort(rng.uniform(0, 120.0, n)),
        workload=np.zeros(n, dtype=np.int64),
        prompt_tokens=rng.integers(200, 2000, n).astype(np.int64),
        output_tokens=rng.integers(20, 400, n).astype(np.int64),
        names=("chat",),
    )
    policy = MergePolicy(merge_interval_s=5.0)
    record: list[MergeRecord] = []
    with_table = simulate(p, plan.plan, arrivals, policy, table=table, record=record)
    from_model = simulate(p, plan.plan, arrivals, policy)
    assert with_table.finished == with_table.requests == n  # conservation (checked inside too)
    assert any(r.released and r.method == "milp" for r in record)
    assert with_table.milp_decisions > 0 and with_table.merges > 0
    for r in record:
        out = table.merge_decision(
            "chat",
            r.snapshots,
            need_rps=r.need_rps,
            other_capacity_rps=r.other_capacity_rps,
            remaining_s=r.remaining_s,
            policy=policy,
        )
        names = [s.name for s in r.snapshots]
        assert frozenset(names[i] for i in out.decision.released) == r.released
        assert {rid: names[j] for rid, j in out.decision.moves.items()} == r.moves
        assert out.method == r.method
    # the table holds the performance model's figures: the same replay without it
    for field in ("gpu_s", "energy_j", "merges", "migrated_bytes", "decisions", "value"):
        assert getattr(with_table, field) == pytest.approx(getattr(from_model, field), rel=1e-12)
