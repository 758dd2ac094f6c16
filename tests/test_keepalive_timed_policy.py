"""A timed policy (the idle period's start and the idle times so far) replaces the
histogram policy in the keep-alive simulator: a plan's states by window."""

from __future__ import annotations

import math

from energyopt.families.keepalive.formulations.policy import IdleHistogram, Phase, always_cold
from energyopt.families.keepalive.sim import Tenant, simulate_node
from energyopt.families.keepalive.spec import Function

FN = Function.model_validate(
    {
        "name": "f",
        "warm": {"gpu_memory_gb": 0.0, "host_memory_gb": 1.0, "power_w": 2.0},
        "cold_start": {"time_s": 1.0, "energy_j": 100.0},
        "service": {"time_s": 1.0, "power_w": 10.0},
        "arrivals": [1],
    }
)


def warm_until(end_s: float) -> object:
    """Warm from the idle period's start to ``end_s`` (s), cold after."""
    starts: list[float] = []

    def phases(t: float, _h: IdleHistogram) -> list[Phase]:
        starts.append(t)
        return [("warm", max(0.0, end_s - t)), ("cold", math.inf)]

    phases.starts = starts  # type: ignore[attr-defined]
    return phases


def test_timed_policy_sees_the_idle_start_and_replaces_the_policy() -> None:
    timed = warm_until(900.0)
    sim = simulate_node(
        [Tenant(FN, [10.0, 700.0], lambda _h: always_cold(), False, timed)], 1000.0
    )[0]  # type: ignore[arg-type]
    # first request cold (ready 11 s, done 12 s), then warm to 900 s: the second is warm
    assert sim.cold_starts == 1 and sim.warm_starts == 1
    assert timed.starts == [12.0, 701.0]  # type: ignore[attr-defined]
    # one load; warm (2 W) from ready at 11 s to 900 s, serving included; two services
    assert math.isclose(sim.energy_j, 100.0 + 2 * 10.0 + 2.0 * (900.0 - 11.0))


def test_timed_policy_going_cold_before_the_request() -> None:
    sim = simulate_node(
        [Tenant(FN, [10.0, 700.0], lambda _h: [("warm", math.inf)], False, warm_until(600.0))],
        1000.0,
    )[0]  # type: ignore[arg-type]
    assert sim.cold_starts == 2
    # two loads; warm 11-600 s, then only while serving the second (701-702 s)
    assert math.isclose(sim.energy_j, 2 * 100.0 + 2 * 10.0 + 2.0 * (600.0 - 11.0 + 1.0))
