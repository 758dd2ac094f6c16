"""Keep-alive policies and their discrete-event simulation: requests are conserved,
the energy account equals the integral of the power, and each policy keeps the
states it says."""

from __future__ import annotations

import math
import random

import pytest

from energyopt.formulations.keepalive.policy import (
    BIN_S,
    IdleHistogram,
    always_cold,
    always_warm,
    compile_tepid,
    fixed,
    hybrid_histogram,
)
from energyopt.sim.keepalive import simulate
from energyopt.spec.keepalive import Function

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
        h.add(610.0)  # all in the 11th minute: pre-warm at 0.9 x 11 min, keep to 1.1 x 11 min
    phases = hybrid_histogram(h)
    assert phases[0] == ("cold", pytest.approx(0.9 * 660.0))
    assert phases[1] == ("warm", pytest.approx(1.1 * 660.0 - 0.9 * 660.0))
