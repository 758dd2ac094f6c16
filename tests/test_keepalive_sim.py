"""Keep-alive policies and their discrete-event simulation: requests are conserved,
the energy account equals the integral of the power, and each policy keeps the
states it says."""

from __future__ import annotations

import math
import random

import pytest

from energyopt.families.keepalive.formulations.policy import (
    BIN_S,
    IdleHistogram,
    always_cold,
    always_warm,
    arima_next_s,
    compile_tepid,
    fixed,
    fixed_cold_share,
    hybrid_histogram,
    idle_distribution,
    price_thresholds,
)
from energyopt.families.keepalive.sim import (
    NodeBudget,
    Tenant,
    peak_memory_gb,
    simulate,
    simulate_node,
)
from energyopt.families.keepalive.spec import Function

FN = Function.model_validate(
    {
        "name": "f",
        "warm": {"gpu_memory_gb": 20, "host_memory_gb": 2, "power_w": 20},
        "tepid": {
            "gpu_memory_gb": 0.5,
            "host_memory_gb": 18,
            "power_w": 2,
            "enter_s": 1,
            "enter_j": 100,
            "resume_s": 3,
            "resume_j": 300,
        },
        "cold_start": {"time_s": 5, "energy_j": 900},
        "service": {"time_s": 1, "power_w": 300},
        "arrivals": [1],
    }
)


def _bursty(seed: int, horizon: float = 7200.0) -> list[float]:
    """Poisson bursts separated by idle times of seconds to half an hour."""
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.choice([rng.expovariate(1 / 3), rng.expovariate(1 / 200), rng.uniform(600, 1800)])
        if t >= horizon:
            return out
        out.append(t)


def _tepid(h: IdleHistogram) -> list[tuple[str, float]]:
    return compile_tepid(FN, h, 10.0, 0.01, 0.05).phases()  # type: ignore[return-value]


POLICIES = {
    "fixed": lambda _h: fixed(),
    "hybrid": hybrid_histogram,
    "warm": lambda _h: always_warm(),
    "cold": lambda _h: always_cold(),
    "tepid": _tepid,
}


@pytest.mark.parametrize("name", list(POLICIES))
@pytest.mark.parametrize("seed", range(3))
def test_requests_are_conserved_and_energy_is_the_integral_of_power(name: str, seed: int) -> None:
    arrivals = _bursty(seed)
    sim = simulate(FN, arrivals, POLICIES[name], 7200.0)  # type: ignore[arg-type]
    assert sim.requests == sim.served == len(arrivals) == len(sim.latencies_s)
    assert sim.warm_starts + sim.tepid_starts + sim.cold_starts == len(arrivals)
    assert sim.energy_j == pytest.approx(sim.power_integral_j(), rel=1e-9)
    service = len(arrivals) * FN.service.time_s * FN.service.power_w
    assert sim.energy_j > service
    assert all(t1 <= 7200.0 + 10 for _, t1, _ in sim.segments)


def test_each_policy_keeps_the_states_it_says() -> None:
    # idle gaps: 99 s, 699 s, 9 s after each 1 s request
    arrivals = [0.0, 105.0, 810.0, 825.0]
    warm = simulate(FN, arrivals, lambda _h: always_warm(), 1000.0)
    assert (warm.cold_starts, warm.warm_starts) == (1, 3)
    cold = simulate(FN, arrivals, lambda _h: always_cold(), 1000.0)
    assert cold.cold_starts == 4 and cold.latencies_s == [5.0] * 4
    fixed10 = simulate(FN, arrivals, lambda _h: fixed(), 1000.0)
    assert fixed10.cold_starts == 2  # the first, and after the 699 s gap
    assert warm.energy_j > fixed10.energy_j  # warm also holds the long gap
    # warm for 60 s, then tepid: the 99 s gap resumes from tepid
    tepid = simulate(
        FN, arrivals, lambda _h: [("warm", 60.0), ("tepid", 1e4), ("cold", math.inf)], 1000.0
    )
    assert (tepid.cold_starts, tepid.tepid_starts, tepid.warm_starts) == (1, 2, 1)
    assert tepid.latencies_s[1] == 3.0


def test_the_tepid_table_prices_states_by_the_histogram() -> None:
    h = IdleHistogram.empty()
    for _ in range(50):
        h.add(300.0)  # five minutes idle: warm 6,000 J, tepid 100 + 600 + 300 J, cold 900 J
    # cold is cheapest and within the SLO; with no cold start allowed, tepid
    assert compile_tepid(FN, h, 10.0, 0.01, 1.0).lookup(300.0) == "cold"
    table = compile_tepid(FN, h, 10.0, 0.01, 0.0)
    assert table.lookup(0.0) == "tepid" and table.lookup(300.0) == "tepid"
    assert table.warm_until_s == 0.0 and table.tepid_until_s > 300.0
    # with no late start allowed under a 2 s limit, tepid (3 s) and cold (5 s) are out
    strict = compile_tepid(FN, h, 2.0, 0.0, 0.0)
    assert strict.lookup(300.0) == "warm"
    quick = IdleHistogram.empty()
    for _ in range(50):
        quick.add(5.0)
    assert compile_tepid(FN, quick, 10.0, 0.01, 1.0).lookup(0.0) == "warm"


def test_the_hybrid_policy_follows_shahrad_et_al() -> None:
    h = IdleHistogram.empty()
    assert hybrid_histogram(h) == fixed(240 * BIN_S)  # too few samples
    for _ in range(40):
        h.add(610.0)  # all in bin 10 (the 11th minute): pre-warm at 0.9 x 10 min, keep to 1.1 x 11
    phases = hybrid_histogram(h)
    assert phases[0] == ("cold", pytest.approx(0.9 * 600.0))
    assert phases[1] == ("warm", pytest.approx(1.1 * 660.0 - 0.9 * 600.0))
    flat = IdleHistogram.empty()
    for i in range(480):
        flat.add(60.0 * (i % 240) + 1.0)  # two in every bin: CV 0 < 2, keep alive for the range
    assert hybrid_histogram(flat) == fixed(240 * BIN_S)


def test_the_hybrid_policy_forecasts_idle_times_beyond_its_range_by_arima() -> None:
    assert arima_next_s([5000.0]) == 5000.0
    assert arima_next_s([5000.0, 6000.0]) == pytest.approx(6000.0)  # no AR term from one step
    # differences 1000, 1000, 1000: phi = 1, so the next is 1000 later
    assert arima_next_s([5e3, 6e3, 7e3, 8e3]) == pytest.approx(9e3)
    # alternating differences: phi = -1
    assert arima_next_s([5e3, 6e3, 5e3, 6e3]) == pytest.approx(5e3)
    assert arima_next_s([9e4, 1e3, 1e2]) >= 0.0
    h = IdleHistogram.empty()
    for x in (20_000.0, 30.0, 22_000.0, 24_000.0):  # three of four beyond the 4 h range
        h.add(x)
    forecast = arima_next_s(h.history_s)
    assert hybrid_histogram(h) == [
        ("cold", pytest.approx(0.85 * forecast)),
        ("warm", pytest.approx(0.3 * forecast)),
        ("cold", math.inf),
    ]


def _with_reference(h: IdleHistogram) -> list[tuple[str, float]]:
    return compile_tepid(FN, h, 10.0, 0.01, 1.0, 600.0).phases()  # type: ignore[return-value]


def test_a_table_held_to_the_fixed_keep_alives_cold_rate_goes_cold_no_sooner() -> None:
    h = IdleHistogram.empty()
    for i in range(60):
        h.add(5.0 if i % 10 else 60.0 + 8.0 * i)  # mostly seconds, some one to nine minutes
    free = compile_tepid(FN, h, 10.0, 0.01, 1.0)
    held = compile_tepid(FN, h, 10.0, 0.01, 1.0, 600.0)
    # unconstrained, cold beats tepid (900 J) for long idle times; held, no cold before 10 min
    assert free.tepid_until_s < 600.0
    assert held.tepid_until_s >= 600.0 and held.lookup(599.0) != "cold"
    assert held.lookup(5.0) == "warm"  # a pause (400 J) costs more than 5 s warm (100 J)
    assert fixed_cold_share(h, 600.0) > 0  # the prior: an unseen idle time stays possible
    # the cheapest such table on the same distribution
    prices = price_thresholds(FN, h, 10.0)
    feasible = prices.allowed & (prices.cold <= fixed_cold_share(h, 600.0) + 1e-12)
    at = list(prices.edges)
    mine = prices.energy_j[at.index(held.warm_until_s), at.index(held.tepid_until_s)]
    assert mine == pytest.approx(float(prices.energy_j[feasible].min()), rel=1e-12)


@pytest.mark.parametrize("tepid", [True, False])
def test_threshold_prices_are_the_expected_energy_idle_time_by_idle_time(tepid: bool) -> None:
    fn = FN if tepid else FN.model_copy(update={"tepid": None})
    h = IdleHistogram.empty()
    rng = random.Random(7)
    for _ in range(80):
        h.add(rng.choice([rng.uniform(0, 90), rng.uniform(200, 900), 20_000.0]))
    idle, prob = idle_distribution(h)
    assert float(prob.sum()) == pytest.approx(1.0)
    prices = price_thresholds(fn, h, 4.0)  # tepid (3 s) in time, cold (5 s) late
    for _ in range(200):
        i, j = sorted(rng.randrange(len(prices.edges)) for _ in range(2))
        if not tepid:
            j = i
        w, u = float(prices.edges[i]), float(prices.edges[j])
        energy, cold, late = 0.0, 0.0, 0.0
        for x, p in zip(idle, prob, strict=True):
            e = fn.warm.power_w * min(x, w)
            if x >= w and u > w:
                assert fn.tepid is not None
                e += fn.tepid.enter_j + fn.tepid.power_w * (min(x, u) - w)
                if x < u:
                    e += fn.tepid.resume_j
            if x >= u:
                e += fn.cold_start.energy_j
                cold += p
                late += p
            energy += p * e
        assert prices.usable[i, j]
        assert prices.energy_j[i, j] == pytest.approx(energy, rel=1e-9)
        assert prices.cold[i, j] == pytest.approx(cold, rel=1e-9, abs=1e-15)
        assert prices.late[i, j] == pytest.approx(late, rel=1e-9, abs=1e-15)
    assert not prices.usable[5, 4]


@pytest.mark.parametrize("seed", range(4))
def test_the_held_table_never_has_more_cold_starts_than_fixed_keep_alive(seed: int) -> None:
    arrivals = _bursty(seed)
    fixed10 = simulate(FN, arrivals, lambda _h: fixed(), 7200.0)
    tepid = simulate(FN, arrivals, _with_reference, 7200.0)  # type: ignore[arg-type]
    assert tepid.cold_starts <= fixed10.cold_starts
    assert tepid.energy_j < fixed10.energy_j


SMALL = FN.model_copy(update={"name": "g"})
BIG = FN.model_copy(
    update={"name": "h", "warm": FN.warm.model_copy(update={"gpu_memory_gb": 50.0})}
)


def test_tenants_without_a_memory_limit_replay_as_if_alone() -> None:
    streams = [_bursty(1), _bursty(2)]
    tenants = [Tenant(SMALL, streams[0], _tepid), Tenant(BIG, streams[1], hybrid_histogram)]  # type: ignore[arg-type]
    together = simulate_node(tenants, 7200.0)
    for tenant, sim in zip(tenants, together, strict=True):
        alone = simulate(tenant.fn, tenant.arrivals_s, tenant.policy, 7200.0)
        assert sim.energy_j == pytest.approx(alone.energy_j, rel=1e-12)
        assert sim.latencies_s == alone.latencies_s
        assert sim.evictions == sim.waits == 0


@pytest.mark.parametrize("demote", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_a_memory_budget_is_never_exceeded_and_requests_are_conserved(
    demote: bool, seed: int
) -> None:
    rng = random.Random(seed)
    streams = [sorted(rng.uniform(0, 3600) for _ in range(40)) for _ in range(3)]
    fns = [SMALL, BIG, FN.model_copy(update={"name": "k"})]
    tenants = [
        Tenant(fn, s, lambda _h: always_warm(), demote) for fn, s in zip(fns, streams, strict=True)
    ]
    budget = NodeBudget(gpu_memory_gb=60.0, host_memory_gb=40.0)
    sims = simulate_node(tenants, 3600.0, budget)
    gpu, host = peak_memory_gb(sims)
    assert gpu <= 60.0 + 1e-9 and host <= 40.0 + 1e-9
    assert sum(s.evictions for s in sims) > 0
    for sim, s in zip(sims, streams, strict=True):
        assert sim.requests == sim.served == len(s) == len(sim.latencies_s)
        assert sim.warm_starts + sim.tepid_starts + sim.cold_starts == len(s)
        assert sim.energy_j == pytest.approx(sim.power_integral_j(), rel=1e-9)
    if demote:
        assert sum(s.tepid_starts for s in sims) > 0
    else:
        assert sum(s.tepid_starts for s in sims) == 0


def test_a_container_that_frees_none_of_the_short_memory_is_not_evicted() -> None:
    # c (a CPU function: host memory only) is idle since 0, g (20 GB on the GPU) since
    # 10; h (50 GB) arrives at 100 and the 60-GB GPU has 40 free: evicting c, the least
    # recently used, would free no GPU memory, so only g goes, and c's request at 200
    # still finds it warm
    cpu = FN.model_copy(
        update={
            "name": "c",
            "warm": FN.warm.model_copy(update={"gpu_memory_gb": 0.0, "host_memory_gb": 0.5}),
            "tepid": None,
        }
    )
    c, g, h = simulate_node(
        [
            Tenant(cpu, [0.0, 200.0], lambda _h: always_warm()),
            Tenant(SMALL, [10.0], lambda _h: always_warm()),
            Tenant(BIG, [100.0], lambda _h: always_warm()),
        ],
        400.0,
        NodeBudget(gpu_memory_gb=60.0, host_memory_gb=100.0),
    )
    assert (c.evictions, g.evictions, h.waits) == (0, 1, 0)
    assert (c.cold_starts, c.warm_starts) == (1, 1)
    assert c.latencies_s[1] == 0.0
    # short of host memory instead, c is a victim like any other
    c, h = simulate_node(
        [
            Tenant(cpu, [0.0, 200.0], lambda _h: always_warm()),
            Tenant(BIG, [100.0], lambda _h: always_warm()),
        ],
        400.0,
        NodeBudget(gpu_memory_gb=60.0, host_memory_gb=2.2),
    )
    assert (c.evictions, c.cold_starts) == (1, 2)


def test_an_evicted_container_is_demoted_or_evicted_and_a_request_waits_for_memory() -> None:
    # g (20 GB) serves at 0; h (50 GB) arrives at 100 and evicts idle g; g's request at
    # 103 finds h loading (5 s) and serving (1 s) and must wait until 106
    budget = NodeBudget(gpu_memory_gb=60.0)
    for demote, kind in ((False, "cold"), (True, "tepid")):
        g, h = simulate_node(
            [
                Tenant(SMALL, [0.0, 103.0], lambda _h: always_warm(), demote),
                Tenant(BIG, [100.0], lambda _h: always_warm()),
            ],
            400.0,
            budget,
        )
        assert g.evictions == 1 and g.waits == 1 and h.cold_starts == 1
        start = 3.0 if kind == "tepid" else 5.0
        assert g.latencies_s[1] == pytest.approx(106.0 - 103.0 + start)
        assert (g.tepid_starts, g.cold_starts) == ((1, 1) if demote else (0, 2))
