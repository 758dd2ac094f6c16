"""Scatter-gather broadcasts (formulations/scatter_gather.py): the verifier accepts
them, flat on any layout and by rail on equal nodes, with degraded links and
stragglers; the broadcast bound stays at most their verified time; and on one
healthy 8-GPU node ``auto`` keeps one, faster than every candidate."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from energyopt.families.collective.formulations.costmodel import energy_bound_j, time_bound_us
from energyopt.families.collective.formulations.model import (
    CollectiveProblem,
    build_problem,
    load_collective,
)
from energyopt.families.collective.formulations.scatter_gather import (
    by_rail_applicable,
    scatter_gather_choice,
)
from energyopt.families.collective.solvers.select import Evaluator, Structure, structures
from energyopt.families.collective.spec import (
    PROTOCOLS,
    Choice,
    Collective,
    CollectiveFile,
    CollectivePlan,
)
from energyopt.families.collective.verify import evaluate_collective

from .spec_docs import collective_doc, random_health

LAYOUTS = ([2], [3], [8], [2, 2], [3, 3], [2, 1], [1, 1, 1], [4, 4])


def accepted_within_bounds(
    p: CollectiveProblem,
    c: Collective,
    choice: Choice,
    rng: random.Random,
    channels: list[int],
) -> None:
    """``choice`` at a random protocol, channel count (of ``channels``), chunk count
    and clock passes the verifier, and the time and energy bounds of ``c`` stay at
    most its verified time (us) and energy (J)."""
    choice = choice.model_copy(
        update={
            "protocol": rng.choice(PROTOCOLS),
            "channels": rng.choice(channels),
            "chunks": rng.choice([1, 2, 4]),
            "clock_mhz": rng.choice(p.clocks_mhz),
        }
    )
    ev = evaluate_collective(p, CollectivePlan(choices=(choice,)))
    assert ev.violations == []
    assert time_bound_us(p, c) <= ev.time_us["c"] * (1 + 1e-9)
    assert energy_bound_j(p, c) <= ev.energy_j["c"] * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(24))
def test_the_verifier_accepts_scatter_gather_broadcasts_and_the_bound_holds(seed: int) -> None:
    rng = random.Random(seed)
    layout = LAYOUTS[seed % len(LAYOUTS)]
    n = sum(layout)
    size = 1 << rng.randint(8, 26)
    doc = collective_doc(
        layout,
        [{"name": "c", "op": "broadcast", "bytes": size, "root": rng.randrange(n)}],
        health=random_health(rng, layout),
    )
    p = build_problem(CollectiveFile.model_validate(doc))
    c = p.collectives[0]
    by_rail = by_rail_applicable(p) and rng.random() < 0.5
    weights = [rng.uniform(0.05, 1.0) for _ in range(p.n // p.n_nodes)] if by_rail else None
    root_holds = not by_rail and rng.random() < 0.5
    root_first = by_rail and rng.random() < 0.5
    choice = scatter_gather_choice(
        p, c, "c", rng.randint(1, 3), weights, by_rail, root_holds, root_first
    )
    accepted_within_bounds(p, c, choice, rng, [1, 2, 4, 8])


def test_by_rail_needs_equal_nodes_and_a_broadcast_is_required() -> None:
    p = build_problem(
        CollectiveFile.model_validate(
            collective_doc([2, 1], [{"name": "c", "op": "broadcast", "bytes": 1 << 20}])
        )
    )
    with pytest.raises(ValueError, match="equal nodes"):
        scatter_gather_choice(p, p.collectives[0], "c", 1, None, True)
    e = build_problem(
        CollectiveFile.model_validate(
            collective_doc([2, 2], [{"name": "c", "op": "broadcast", "bytes": 1 << 20}])
        )
    )
    with pytest.raises(ValueError, match="flat"):
        scatter_gather_choice(e, e.collectives[0], "c", 1, None, True, root_holds=True)
    with pytest.raises(ValueError, match="by-rail"):
        scatter_gather_choice(e, e.collectives[0], "c", 1, None, False, root_first=True)
    q = build_problem(
        CollectiveFile.model_validate(
            collective_doc([2, 2], [{"name": "c", "op": "all_gather", "bytes": 1 << 20}])
        )
    )
    with pytest.raises(ValueError, match="broadcast"):
        scatter_gather_choice(q, q.collectives[0], "c", 1)


def test_the_search_keeps_a_scatter_gather_broadcast_that_beats_every_candidate() -> None:
    """1 MiB from rank 0 of a healthy 8-GPU node: the root sends every other rank an
    eighth, and in the next step every rank, the root too, sends its eighth to the
    others: two steps, each 7/8 of the message through every port, faster than every
    candidate (trees and rings relay it over more steps, the direct broadcast sends
    it seven times) and than the root idle in the second step (a seventh to each,
    then 6/7 through every port). ``auto`` runs this search after the exhaustive
    one; here it starts from the least candidate."""
    from energyopt.families.collective.solvers.select import Scored
    from energyopt.families.collective.solvers.synth import scatter_gather_search

    doc = collective_doc([8], [{"name": "c", "op": "broadcast", "bytes": 1 << 20}])
    p = build_problem(CollectiveFile.model_validate(doc))
    c = p.collectives[0]
    ev = Evaluator(p)
    least = min((ev.best(c, s, "c") for s in structures(p, c)), key=lambda x: x.time_us)
    scored: list[Scored] = [least]
    improved, complete = scatter_gather_search(p, ev, scored, float("inf"))
    assert (improved, complete) == (1, True)
    assert scored[0].choice.algorithm == "synthesized"
    assert scored[0].time_us < least.time_us
    # the root sends in the second step: it holds pieces of its own
    assert any(t.step == 1 and t.src == 0 for t in scored[0].choice.transfers)
    idle = scatter_gather_choice(p, c, "c", 1)
    s = scored[0].choice
    root_idle = ev.best(c, Structure("synthesized", s.channels, s.chunks, None, 0), "c", idle)
    assert scored[0].time_us < root_idle.time_us
    got = evaluate_collective(p, CollectivePlan(choices=(scored[0].choice,)))
    assert got.violations == []
    assert got.time_us["c"] == pytest.approx(scored[0].time_us, rel=1e-9)
    assert time_bound_us(p, c) <= got.time_us["c"]


@pytest.mark.parametrize("seed", range(12))
def test_the_root_first_broadcast_by_rail_is_accepted_and_the_bound_holds(seed: int) -> None:
    """The by-rail broadcast in which the root sends first, on 2-4 equal nodes with
    degraded links and stragglers, any root, weights, parts, protocol, channels,
    chunks and clock: every rank ends with every piece, and the bounds hold."""
    rng = random.Random(500 + seed)
    layout = rng.choice([[2, 2], [3, 3], [2, 2, 2], [4, 4], [2, 2, 2, 2]])
    n = sum(layout)
    doc = collective_doc(
        layout,
        [
            {
                "name": "c",
                "op": "broadcast",
                "bytes": 1 << rng.randint(8, 26),
                "root": rng.randrange(n),
            }
        ],
        health=random_health(rng, layout),
    )
    p = build_problem(CollectiveFile.model_validate(doc))
    c = p.collectives[0]
    weights = [rng.uniform(0.05, 1.0) for _ in range(layout[0])] if rng.random() < 0.7 else None
    choice = scatter_gather_choice(p, c, "c", rng.randint(1, 5), weights, True, False, True)
    # the root's rail crosses in step 0, every other rail in step 1
    lane = p.local_of[c.root]
    for t in choice.transfers:
        if p.node_of[t.src] != p.node_of[t.dst]:
            assert t.step == (0 if p.local_of[t.src] == lane else 1)
    accepted_within_bounds(p, c, choice, rng, [1, 2, 4, 16])


def test_the_search_keeps_the_root_first_broadcast_on_tiny_2x2() -> None:
    """tiny-2x2 bc-1m (2 x 2 H100, b/1's NIC at 0.56): the root sends the whole
    message to a/1 and 7 of 10 pieces to b/0 in step 0, a/1 the other 3 to b/1 in
    step 1, and b/0 and b/1 swap in step 2: 47.12 us at LL128 over 16 channels,
    below the best candidate (hierarchical, 48.39 us) and every other
    scatter-gather shape."""
    from energyopt.families.collective.solvers.select import Scored
    from energyopt.families.collective.solvers.synth import scatter_gather_search

    full = load_collective(
        Path(__file__).resolve().parents[1] / "instances/collective/tiny-2x2.yaml"
    )
    c = next(x for x in full.collectives if x.op == "broadcast")
    p = replace(full, spec=full.spec.model_copy(update={"collectives": (c,)}))
    ev = Evaluator(p)
    least = min((ev.best(c, s, c.name or "") for s in structures(p, c)), key=lambda x: x.time_us)
    assert least.time_us == pytest.approx(48.39, abs=0.01)
    scored: list[Scored] = [least]
    improved, complete = scatter_gather_search(p, ev, scored, float("inf"))
    assert (improved, complete) == (1, True)
    got = evaluate_collective(p, CollectivePlan(choices=(scored[0].choice,)))
    assert got.violations == []
    assert got.time_us[c.name or ""] == pytest.approx(47.12, abs=0.01)
    crossing = [t for t in scored[0].choice.transfers if p.node_of[t.src] != p.node_of[t.dst]]
    assert {t.step for t in crossing} == {0, 1}
