"""benchmarks/keepalive.py's clairvoyant yardstick, its split after the last
request, and the hindsight single-table yardstick: what each one is, and that the
clairvoyant one is not a lower bound on the simulator's energy (a policy whose
resume delays a request serves the requests that gather meanwhile in one busy
period, with less warm time than the always-warm timing the yardstick prices)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from energyopt.families.keepalive.formulations import policy as P
from energyopt.families.keepalive.sim import simulate
from energyopt.families.keepalive.spec import Function

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import keepalive
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return keepalive


FN = Function.model_validate(
    {
        "name": "llm",
        "warm": {"gpu_memory_gb": 73.6, "host_memory_gb": 2, "power_w": 69},
        "tepid": {
            "gpu_memory_gb": 0.5,
            "host_memory_gb": 67.6,
            "power_w": 8.2,
            "enter_s": 2.624,
            "enter_j": 459.2,
            "resume_s": 12.466,
            "resume_j": 2181.6,
        },
        "cold_start": {"time_s": 20.592, "energy_j": 3603.6},
        "service": {"time_s": 1.975, "power_w": 380},
        "arrivals": [1],
    }
)
"""Qwen3-32B as instances/keepalive/azure-llm-2nodes.yaml gives it."""


def test_a_policy_can_spend_less_than_the_clairvoyant_yardstick() -> None:
    ka = _bench()
    times = [0.0, 100.0, 101.0, 110.0]
    horizon = 114.6
    paused = simulate(FN, times, lambda _h: [("tepid", math.inf)], horizon)
    # every start but the first (cold under every policy) is within the 15 s SLO
    assert all(lat <= ka.SLO_S for lat in paused.latencies_s[1:])
    # the resume at 100 s delays the requests of 101 and 110 s into one busy period:
    # no warm 7 s gap between them, which the always-warm timing has to pay
    assert paused.energy_j < ka.clairvoyant_j(FN, times) - 200.0
    # holding warm first, the same timing costs more than the yardstick
    warm_first = simulate(FN, times, lambda _h: [("warm", 30.0), ("tepid", math.inf)], horizon)
    assert warm_first.energy_j > ka.clairvoyant_j(FN, times)


def test_the_yardstick_prices_the_always_warm_timing() -> None:
    ka = _bench()
    times = [0.0, 30.0, 31.0, 3300.0]
    # a request within a busy period joins it; 30 - 22.567 s warm (513 J, cheaper than
    # a pause and resume); 3,300 s: the cheapest of holding warm, a load (3,603.6 J)
    # and a pause and resume with the pause at 8.2 W
    first_end = 20.592 + 1.975
    second_end = 31.0 + 1.975
    gap = 3300.0 - second_end
    expected = (
        3603.6
        + 4 * 1.975 * 380.0
        + 69.0 * (first_end - 20.592)
        + 69.0 * (30.0 - first_end)
        + 69.0 * (second_end - 30.0)
        + min(69.0 * gap, 3603.6, 459.2 + 8.2 * gap + 2181.6)
        + 69.0 * 1.975
    )
    assert ka.clairvoyant_j(FN, times) == pytest.approx(expected, rel=1e-12)
    # fixed keep-alive after the last request: warm to the horizon or the keep-alive
    assert ka.last_idle_j(FN, times) == pytest.approx(69.0 * (ka.HORIZON_S - 3300.0 - 1.975))
    assert ka.last_idle_j(FN, [100.0]) == pytest.approx(69.0 * ka.FIXED_KEEP_ALIVE_S)
    assert ka.last_idle_j(FN, []) == 0.0


def test_the_hindsight_table_is_the_cheapest_pair_within_the_limits() -> None:
    ka = _bench()
    times = [10.0 + 45.0 * i for i in range(60)]  # every 45 s: a pause pays back after 42 s
    energy, warm_s, tepid_s = ka.best_single_table_j(FN, times)
    fixed = simulate(FN, times, lambda _h: P.fixed(), ka.HORIZON_S)
    assert energy < fixed.energy_j
    phases: list[P.Phase] = [("warm", warm_s)] if warm_s > 0 else []
    if tepid_s > warm_s:
        phases.append(("tepid", tepid_s - warm_s))
    if math.isfinite(tepid_s):
        phases.append(("cold", math.inf))
    again = simulate(FN, times, lambda _h: list(phases), ka.HORIZON_S)
    assert again.energy_j == pytest.approx(energy)
    assert again.cold_starts <= fixed.cold_starts
    # no pair of the grid within the limits is cheaper
    for w in ka.HINDSIGHT_WARM_S[::4]:
        for t in ka.HINDSIGHT_TEPID_S:
            ph: list[P.Phase] = [("warm", w)] if w > 0 else []
            if t > 0:
                ph.append(("tepid", t))
            if math.isfinite(t):
                ph.append(("cold", math.inf))
            sim = simulate(FN, times, lambda _h, ph=tuple(ph): list(ph), ka.HORIZON_S)
            late = len(sim.latencies_s) - sim.within(ka.SLO_S)
            if sim.cold_starts <= fixed.cold_starts and late <= 1:
                assert sim.energy_j >= energy - 1e-6
