"""Rail-direct schedules and the rail exchange (formulations/rail_direct.py): the
verifier accepts them on random equal-node topologies with degraded links and
stragglers, every collective's
bound stays at most their verified time, the rails carry what the weights give them,
and ``auto`` keeps one only where it beats the exhaustive search's candidate."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.families.collective.formulations.costmodel import energy_bound_j, time_bound_us
from energyopt.families.collective.formulations.model import CollectiveProblem, build_problem
from energyopt.families.collective.formulations.rail_direct import (
    RAIL_DIRECT_OPS,
    applicable,
    rail_direct_choice,
    rail_exchange_choice,
    rail_of_pieces,
)
from energyopt.families.collective.formulations.schedules import program_of
from energyopt.families.collective.spec import (
    PROTOCOLS,
    CollectiveFile,
    CollectivePlan,
    Op,
)
from energyopt.families.collective.verify import evaluate_collective, execute

from .spec_docs import collective_doc, random_health

EQUAL_LAYOUTS = ([2, 2], [3, 3], [2, 2, 2], [4, 4])


def _problem(seed: int, layout: list[int], op: Op, size: int) -> CollectiveProblem:
    rng = random.Random(seed)
    doc = collective_doc(
        layout,
        [{"name": "c", "op": op, "bytes": size}],
        health=random_health(rng, layout),
    )
    return build_problem(CollectiveFile.model_validate(doc))


@settings(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    seed=st.integers(0, 10_000),
    layout=st.sampled_from(EQUAL_LAYOUTS),
    op=st.sampled_from(RAIL_DIRECT_OPS),
    log_size=st.integers(8, 27),
    parts=st.integers(1, 3),
    weighted=st.booleans(),
)
def test_rail_direct_schedules_verify_and_stay_above_the_bound(
    seed: int, layout: list[int], op: Op, log_size: int, parts: int, weighted: bool
) -> None:
    p = _problem(seed, layout, op, 1 << log_size)
    c = p.collectives[0]
    rng = random.Random(seed + 7)
    g = layout[0]
    weights = [rng.uniform(0.05, 1.0) for _ in range(g)] if weighted else None
    make = rail_exchange_choice if op == "all_reduce" and rng.random() < 0.5 else rail_direct_choice
    choice = make(p, c, "c", parts, weights).model_copy(
        update={
            "protocol": rng.choice(PROTOCOLS),
            "channels": rng.choice([1, 2, 3]),
            "chunks": rng.choice([1, 2, 3]),
            "clock_mhz": rng.choice(p.clocks_mhz),
        }
    )
    prog = program_of(
        c.op, "synthesized", p.n, p.node_of, p.local_of, 0, choice.channels, None, 0, choice
    )
    assert execute(prog, c) == []
    ev = evaluate_collective(p, CollectivePlan(choices=(choice,)))
    assert ev.violations == []
    assert time_bound_us(p, c) <= ev.time_us["c"] * (1 + 1e-9)
    assert energy_bound_j(p, c) <= ev.energy_j["c"] * (1 + 1e-9)


def test_the_rails_carry_their_weights_and_a_rank_keeps_its_own_rail_first() -> None:
    p = _problem(0, [4, 4], "all_gather", 1 << 20)
    owner, rail = rail_of_pieces(p, 4, [0.4, 0.2, 0.2, 0.2])
    assert len(owner) == p.n * 4
    for k in range(p.n_nodes):
        node = [q for q in range(len(owner)) if p.node_of[owner[q]] == k]
        counts = np.bincount([rail[q] for q in node], minlength=4)
        assert counts.tolist() == [7, 3, 3, 3]  # 16 pieces per node: 6.4, 3.2, 3.2, 3.2
        for q in node:  # rails 1-3 take only their own rank's pieces
            if rail[q] != 0:
                assert p.local_of[owner[q]] == rail[q]
    owner, rail = rail_of_pieces(p, 2, None)
    assert [p.local_of[o] for o in owner] == rail  # equal weights: every piece on its own rail


@pytest.mark.parametrize(
    ("layout", "op"), [([4], "all_gather"), ([2, 1], "all_reduce"), ([2, 2], "broadcast")]
)
def test_a_rail_direct_schedule_needs_equal_nodes_and_its_ops(layout: list[int], op: Op) -> None:
    p = _problem(1, layout, op, 1 << 20)
    assert not applicable(p, op)
    with pytest.raises(ValueError, match="rail-direct schedule needs"):
        rail_direct_choice(p, p.collectives[0], "c", 2)
    with pytest.raises(ValueError, match="rail exchange needs"):
        rail_exchange_choice(p, p.collectives[0], "c", 2)


def test_auto_keeps_a_rail_direct_schedule_only_where_it_is_better() -> None:
    """On 2 x 4 GPUs with a degraded NIC, ``auto``'s all-gather and reduce-scatter
    are at most the exhaustive search's; a rail-direct one it keeps is verified."""
    from energyopt.families import certify, family
    from energyopt.progress import quiet

    fam = family("collective")
    doc = collective_doc(
        [4, 4],
        [
            {"name": "ag", "op": "all_gather", "bytes": 1 << 24},
            {"name": "rs", "op": "reduce_scatter", "bytes": 1 << 24},
        ],
        health={"links": [{"gpu": "n0/1", "link": "nic", "factor": 0.56}]},
    )
    p = build_problem(CollectiveFile.model_validate(doc))
    exact = fam.solve(p, "exact", time_limit_s=60, rel_gap=1e-6, progress=quiet)
    auto = fam.solve(p, "auto", time_limit_s=20, rel_gap=1e-6, progress=quiet)
    certify(fam, p, auto, 1e-6, lambda _: None)
    assert exact.objective is not None and auto.objective is not None and auto.plan is not None
    assert auto.objective <= exact.objective * (1 + 1e-9)
    assert any(line.startswith("rail-direct schedules: ") for line in auto.log)
    kept = [ch for ch in auto.plan.choices if ch.algorithm == "synthesized"]
    assert kept  # the all-gather's one step of NVLink gather and crossing together wins here
