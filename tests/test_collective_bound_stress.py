"""The collective bounds against many random verified plans: random layouts of 1-3
nodes of 1-8 GPUs with degraded links and stragglers, every op, 256 B to 256 MiB,
and per collective a random candidate, a random synthesized schedule (relay copies,
reduction trees, exchanges, direct all-reduces mixing reductions and copies in a
step), a random rail-direct or rail-exchange schedule or, for a broadcast, a random
scatter-gather one. The
time and energy bounds must be at most the verifier's figures for every one.

``ENERGYOPT_BOUND_STRESS`` sets how many collectives (default 200; the stress runs
that collective.md reports used 1,200 to 5,000)."""

from __future__ import annotations

import os
import random

from energyopt.families.collective.formulations.costmodel import energy_bound_j, time_bound_us
from energyopt.families.collective.formulations.rail_direct import (
    applicable,
    rail_direct_choice,
    rail_exchange_choice,
)
from energyopt.families.collective.formulations.scatter_gather import (
    by_rail_applicable,
    scatter_gather_choice,
)
from energyopt.families.collective.spec import OPS, PROTOCOLS, Choice, CollectivePlan
from energyopt.families.collective.verify import evaluate_collective

from .test_collective_bounds import _candidate, _problem, _synthesized

LAYOUTS = (
    [2],
    [3],
    [4],
    [8],
    [2, 2],
    [2, 1],
    [1, 1, 1],
    [3, 2],
    [1, 3],
    [4, 4],
    [2, 2, 2],
    [3, 3],
)


def test_the_bounds_hold_on_many_random_verified_plans() -> None:
    count = int(os.environ.get("ENERGYOPT_BOUND_STRESS", "200"))
    seed0 = 900_000
    kinds = {"candidate": 0, "synthesized": 0, "rail": 0, "scatter": 0}
    for i in range(count):
        rng = random.Random(seed0 + i)
        layout = rng.choice(LAYOUTS)
        op = rng.choice(OPS)
        p = _problem(seed0 + i, layout, op, 1 << rng.randint(8, 28), rng.randint(0, 7))
        c = p.collectives[0]
        kind = rng.randrange(3)
        choice: Choice
        if kind == 2 and applicable(p, c.op):
            g = p.n // p.n_nodes
            weights = [rng.uniform(0.05, 1.0) for _ in range(g)] if rng.random() < 0.5 else None
            exchange = c.op == "all_reduce" and rng.random() < 0.5
            make = rail_exchange_choice if exchange else rail_direct_choice
            choice = make(p, c, "c", rng.randint(1, 3), weights).model_copy(
                update={
                    "protocol": rng.choice(PROTOCOLS),
                    "channels": rng.choice([1, 2, 4, 8]),
                    "chunks": rng.choice([1, 2, 4]),
                    "clock_mhz": rng.choice(p.clocks_mhz),
                }
            )
            kinds["rail"] += 1
        elif kind == 2 and c.op == "broadcast":
            by_rail = by_rail_applicable(p) and rng.random() < 0.5
            g = p.n // p.n_nodes
            weights = [rng.uniform(0.05, 1.0) for _ in range(g)] if by_rail else None
            root_holds = not by_rail and rng.random() < 0.5
            root_first = by_rail and rng.random() < 0.5
            choice = scatter_gather_choice(
                p, c, "c", rng.randint(1, 3), weights, by_rail, root_holds, root_first
            )
            choice = choice.model_copy(
                update={
                    "protocol": rng.choice(PROTOCOLS),
                    "channels": rng.choice([1, 2, 4, 8]),
                    "chunks": rng.choice([1, 2, 4]),
                    "clock_mhz": rng.choice(p.clocks_mhz),
                }
            )
            kinds["scatter"] += 1
        elif kind >= 1:
            choice = _synthesized(rng, p, c)
            kinds["synthesized"] += 1
        else:
            choice = _candidate(rng, p, c)
            kinds["candidate"] += 1
        ev = evaluate_collective(p, CollectivePlan(choices=(choice,)))
        assert ev.violations == [], (seed0 + i, ev.violations)
        where = (seed0 + i, layout, op, c.bytes, choice.algorithm)
        assert time_bound_us(p, c) <= ev.time_us["c"] * (1 + 1e-9), where
        assert energy_bound_j(p, c) <= ev.energy_j["c"] * (1 + 1e-9), where
    assert min(kinds.values()) > 0  # every kind of plan was drawn
