"""The all-reduce's cut term for an element that crosses into (or out of) a node
once (collective.md, section 4, "Once or twice"): such a crossing must carry the
sum of every rank outside, so it starts after a flow landed at its sender, and the
other ranks of the node take the element from its receiver after it lands; an
element that crosses twice costs twice its bytes on the node's NICs. Checked
against verified all-reduces that mix, piece by piece, node sums exchanged by
random leaders (one crossing, gathered before and passed on after) with the
one-step exchange of inputs (every rank to every other: crossings of raw inputs),
on 2-3 nodes with degraded NICs and stragglers."""

from __future__ import annotations

import random
from pathlib import Path

from energyopt.families.collective.formulations.constants import PROTOCOL_STEP_US
from energyopt.families.collective.formulations.costmodel import (
    energy_bound_j,
    protocol_bound_us,
    time_bound_us,
)
from energyopt.families.collective.formulations.model import load_collective
from energyopt.families.collective.spec import PROTOCOLS, Choice, CollectivePlan, Transfer
from energyopt.families.collective.verify import evaluate_collective

from .test_collective_bounds import _problem

ROOT = Path(__file__).resolve().parents[1]


def _mixed(rng: random.Random, node_of: tuple[int, ...], pieces: int) -> list[Transfer]:
    """Per piece, either node sums exchanged between one random leader per node
    (step 0: the others reduce into the leader; step 1: the leaders reduce each
    other's node sums; step 2: each leader copies the sum to its node), or every
    rank's input sent to every other rank in step 0 (reducing)."""
    n = len(node_of)
    nodes = sorted(set(node_of))
    out: list[Transfer] = []
    for q in range(pieces):
        if rng.random() < 0.5:
            out.extend(
                Transfer(step=0, src=a, dst=b, piece=q, reduce=True)
                for a in range(n)
                for b in range(n)
                if a != b
            )
            continue
        lead = {k: rng.choice([r for r in range(n) if node_of[r] == k]) for k in nodes}
        for r in range(n):
            if r != lead[node_of[r]]:
                out.append(Transfer(step=0, src=r, dst=lead[node_of[r]], piece=q, reduce=True))
                out.append(Transfer(step=2, src=lead[node_of[r]], dst=r, piece=q))
        for a in nodes:
            out.extend(
                Transfer(step=1, src=lead[a], dst=lead[b], piece=q, reduce=True)
                for b in nodes
                if b != a
            )
    return out


def test_the_bound_holds_for_mixed_leader_and_raw_exchanges() -> None:
    for i in range(40):
        rng = random.Random(4_400 + i)
        layout = rng.choice([[2, 2], [2, 3], [3, 2], [2, 2, 2], [4, 4], [3, 3]])
        p = _problem(4_400 + i, layout, "all_reduce", 1 << rng.randint(8, 26), 0)
        c = p.collectives[0]
        pieces = rng.randint(1, 6)
        choice = Choice(
            collective="c",
            algorithm="synthesized",
            protocol=rng.choice(PROTOCOLS),
            chunks=rng.choice([1, 2, 3]),
            channels=rng.choice([1, 2, 4, 16]),
            clock_mhz=max(p.clocks_mhz),
            pieces=pieces,
            transfers=tuple(_mixed(rng, p.node_of, pieces)),
        )
        ev = evaluate_collective(p, CollectivePlan(choices=(choice,)))
        assert ev.violations == [], (i, ev.violations)
        where = (i, layout, c.bytes, choice.protocol, choice.channels, choice.chunks)
        assert time_bound_us(p, c) <= ev.time_us["c"] * (1 + 1e-9), where
        assert energy_bound_j(p, c) <= ev.energy_j["c"] * (1 + 1e-9), where


def test_tiny_2x2_all_reduce_bound_is_the_once_or_twice_cut() -> None:
    """tiny-2x2 ar-1m at LL128: node b takes in 1 MiB over its NICs (40 and 22.4
    GB/s at 0.92), after an overhead, plus half of two overheads and two routes
    (the gather before the crossing and the spread after it; the route before is
    the least, 1 us, as is the one inside the node), plus the network route."""
    p = load_collective(ROOT / "instances/collective/tiny-2x2.yaml")
    c = next(x for x in p.collectives if x.op == "all_reduce")
    alpha = PROTOCOL_STEP_US["ll128"]
    nic = 0.92 * (40.0 + 0.56 * 40.0)
    cross = float(p.route_us[0, 2])
    once = c.bytes / nic / 1e3
    expect = alpha + once + min((2 * alpha + 2 * 1.0) / 2, once) + cross
    assert abs(protocol_bound_us(p, c, "ll128") - expect) < 1e-9
    assert abs(time_bound_us(p, c) - (p.rates.launch_us + expect)) < 1e-9
    assert 43.5 < time_bound_us(p, c) < 43.6
