"""The collective energy bound's channel and clock term (``costmodel.channel_capped``,
``energy_bound_j``): a schedule over H channels at clock f moves at most one
channel's copy rate per (sender, receiver, channel) through a link, and draws the
power of f and H; the bound, least over (f, H), must stay below every verified
plan, above the plain bound (least power times the least time), and meets the
direct all-gather of h100-8gpu-energy exactly."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import numpy as np

from energyopt.families.collective.formulations.costmodel import (
    HBM_PJ_PER_BIT,
    ClockChannels,
    _total_needs,
    channel_capped,
    energy_bound_j,
    rank_power_w,
    time_bound_us,
)
from energyopt.families.collective.formulations.model import CollectiveProblem, load_collective
from energyopt.families.collective.spec import (
    OPS,
    PROTOCOLS,
    Choice,
    Collective,
    CollectivePlan,
)
from energyopt.families.collective.verify import evaluate_collective

from .test_collective_bounds import _candidate, _mixed_direct_rounds, _problem, _synthesized

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ([2], [3], [4], [8], [2, 2], [3, 2], [1, 3], [2, 1])


def _plain_bound_j(p: CollectiveProblem, c: Collective) -> float:
    """The bound without the channel and clock term: every rank at the least power
    of any clock on one channel for the least time, plus the least HBM traffic."""
    least = min(rank_power_w(p, 1, f) for f in p.clocks_mhz)
    reduced = (p.n - 1) * float(c.bytes) if c.op in ("all_reduce", "reduce_scatter") else 0.0
    memory = (2.0 * _total_needs(c, p.n) + reduced) * 8.0 * HBM_PJ_PER_BIT * 1e-12
    return p.n * least * time_bound_us(p, c) * 1e-6 + memory


def test_capped_links_carry_pairs_times_channels_times_the_channel_rate() -> None:
    p = load_collective(ROOT / "instances/collective/h100-8gpu-energy.yaml")
    q = channel_capped(p, 990, 1)
    rate = p.rates.channel_gbs * 990 / p.gpu.max_sm_clock_mhz
    # every NVLink port of the 8-GPU node carries the flows of 7 pairs
    assert np.allclose(q.edge_gbs, np.minimum(p.edge_gbs, 7 * rate))
    assert np.allclose(q.port_capacities[0], 7 * rate)
    # four channels at 990 MHz are enough to fill every port: nothing is capped
    assert np.array_equal(channel_capped(p, 990, 4).edge_gbs, p.edge_gbs)
    assert np.array_equal(p.edge_gbs, load_collective(p.source).edge_gbs)  # p is unchanged


def test_the_energy_bound_holds_for_few_channels_at_low_clocks() -> None:
    """Random candidates and synthesized schedules over 1-4 channels at the lowest
    clocks, where the capped links bind: the bound stays below every verified
    energy."""
    above = 0
    for i in range(120):
        rng = random.Random(4_800 + i)
        layout = rng.choice(LAYOUTS)
        op = rng.choice(OPS)
        p = _problem(4_800 + i, layout, op, 1 << rng.randint(10, 26), rng.randint(0, 7))
        c = p.collectives[0]
        choice: Choice = _synthesized(rng, p, c) if rng.random() < 0.5 else _candidate(rng, p, c)
        choice = choice.model_copy(
            update={"channels": rng.randint(1, 4), "clock_mhz": rng.choice(p.clocks_mhz[:2])}
        )
        ev = evaluate_collective(p, CollectivePlan(choices=(choice,)))
        assert ev.violations == [], (i, ev.violations)
        bound = energy_bound_j(p, c)
        assert bound <= ev.energy_j["c"] * (1 + 1e-9), (i, layout, op, c.bytes, choice.algorithm)
        plain = _plain_bound_j(p, c)
        assert bound >= plain * (1 - 1e-12)
        above += bound > plain * (1 + 1e-6)
    assert above > 60  # the term lifts most of the bounds drawn


def test_the_direct_all_gather_meets_the_energy_bound() -> None:
    """h100-8gpu-energy's ag-4m: at 990 MHz the direct all-gather needs 4 channels to
    fill the NVLink ports (3 carry 7 x 3 x 19.35 = 406 GB/s of 425.5), and the bound,
    which charges those 4 channels' power for the least time, meets it: the plan is
    proven least over every schedule; the plain bound stays 1.8 % below."""
    p = load_collective(ROOT / "instances/collective/h100-8gpu-energy.yaml")
    c = next(x for x in p.collectives if x.name == "ag-4m")
    choice = Choice(
        collective="ag-4m",
        algorithm="direct",
        protocol="ll128",
        chunks=1,
        channels=4,
        clock_mhz=990,
    )
    plan = CollectivePlan(choices=(choice,))
    p1 = replace(p, spec=p.spec.model_copy(update={"collectives": (c,)}))
    ev = evaluate_collective(p1, plan)
    assert ev.violations == []
    bound = energy_bound_j(p, c)
    assert abs(bound - ev.energy_j["ag-4m"]) <= 1e-9 * bound
    assert _plain_bound_j(p, c) < 0.985 * bound


def test_the_clock_floor_holds_for_all_reduces_at_low_clocks_over_few_channels() -> None:
    """The copy-and-reduce term at a clock and channel count (``ClockChannels``: a
    reducing flow reduces no faster than one channel's reduction rate at the clock,
    and at most (ranks of the node - 1) x H flows share an NVLink in-port): random
    all-reduces (direct ones that mix reductions and copies in a step with uneven
    bytes per flow, other synthesized schedules, candidates) at the three lowest
    clocks over 1-8 channels, on 1-2 nodes with degraded links and stragglers, stay
    above the time bound for their clock and channels."""
    lifted = 0
    for i in range(60):
        rng = random.Random(6_100 + i)
        layout = rng.choice(([3], [4], [8], [8], [2, 2], [4, 4]))
        p = _problem(6_100 + i, layout, "all_reduce", 1 << rng.randint(12, 27), 0)
        c = p.collectives[0]
        if i % 3 == 0:
            pieces = rng.randint(p.n, 3 * p.n)
            choice = Choice(
                collective="c",
                algorithm="synthesized",
                protocol=rng.choice(PROTOCOLS),
                pieces=pieces,
                transfers=tuple(_mixed_direct_rounds(rng, p.n, pieces, rng.randint(1, 3))),
                clock_mhz=990,
            )
        else:
            choice = _synthesized(rng, p, c) if i % 3 == 1 else _candidate(rng, p, c)
        f, h = rng.choice(p.clocks_mhz[:3]), rng.randint(1, 8)
        choice = choice.model_copy(update={"channels": h, "clock_mhz": f})
        ev = evaluate_collective(p, CollectivePlan(choices=(choice,)))
        assert ev.violations == [], (i, ev.violations)
        at = time_bound_us(channel_capped(p, f, h), c, ClockChannels(f, h))
        assert at <= ev.time_us["c"] * (1 + 1e-9), (i, layout, c.bytes, f, h, choice.algorithm)
        lifted += at > time_bound_us(channel_capped(p, f, h), c) * (1 + 1e-6)
    assert lifted >= 10  # the floor binds on many of them


def test_the_clock_floor_lifts_the_25_mib_all_reduce_at_990_mhz() -> None:
    """h100-8gpu-energy's ar-25m: at 990 MHz one channel reduces at most 55.5 GB/s,
    so over 4 channels 28 reducing flows into a rank reduce at most 1,555 GB/s, and
    the copy-and-reduce mix the plain bound allows (about 54 % of a step's flows
    reducing, so 15 flows, 833 GB/s, below the 1,117 GB/s of memory bandwidth / 3)
    is out of reach: the bound at (990 MHz, 4 channels) rises above the plain one by
    more than 1 us, and the energy bound moves to 5 channels, still below the
    direct plan's energy."""
    p = load_collective(ROOT / "instances/collective/h100-8gpu-energy.yaml")
    c = next(x for x in p.collectives if x.name == "ar-25m")
    plain = time_bound_us(p, c)
    assert time_bound_us(p, c, ClockChannels(990, 4)) > plain + 1.0
    assert time_bound_us(p, c, ClockChannels(990, 64)) == plain  # many flows: no floor
    choice = Choice(
        collective="ar-25m", algorithm="direct", protocol="simple", channels=4, clock_mhz=990
    )
    p1 = replace(p, spec=p.spec.model_copy(update={"collectives": (c,)}))
    ev = evaluate_collective(p1, CollectivePlan(choices=(choice,)))
    assert ev.violations == []
    bound = energy_bound_j(p, c)
    reduced = (p.n - 1) * float(c.bytes)
    memory = (2.0 * _total_needs(c, p.n) + reduced) * 8.0 * HBM_PJ_PER_BIT * 1e-12
    at_4 = p.n * rank_power_w(p, 4, 990) * plain * 1e-6 + memory  # the bound before the floor
    assert at_4 * 1.008 < bound <= ev.energy_j["ar-25m"]
