"""A burst's onset (energyopt/online/global_scheduler.py, docs/online.md): the fast rate
meter puts a slice at risk seconds before the slow one would, without raising false
alarms at the planned rate; a harvested slice is raised once half its harvest margin is
used, back to a clock covering its rate with the margin; a queue several times its risk
level raises the clock as many times further than a short one."""

from __future__ import annotations

import numpy as np

from energyopt.online import GlobalScheduler, GpuInfo, InstanceInfo, OnlineConfig
from tests.test_online import LOOKUPS, MAX_CLOCK, Recorder, View, scheduler
from tests.test_sim_engine import H100

PLANNED_RPS = 18.0  # the rate test_online.scheduler's instance is planned for, req/s


def arrival_times(
    rng: np.random.Generator, rate_rps: float, start_s: float, end_s: float
) -> list[float]:
    """Poisson arrival times (s) at ``rate_rps`` in [start_s, end_s)."""
    out: list[float] = []
    t = start_s
    while True:
        t += float(rng.exponential(1.0 / rate_rps))
        if t >= end_s:
            return out
        out.append(t)


def onset_detected_s(config: OnlineConfig, seed: int) -> float:
    """Seconds from a 2.5x burst's onset (at 60 s, after 60 s at the planned rate) to
    the first decision at risk by its rate; the harvest is off so that the clock the
    burst meets is the plan's."""
    ctl, _ = scheduler(700.0, [View()], config)
    rng = np.random.default_rng(seed)
    for t in arrival_times(rng, PLANNED_RPS, 0.0, 60.0):
        ctl.route(0, t)
    before = ctl.stats.risk_rate
    for t in arrival_times(rng, 2.5 * PLANNED_RPS, 60.0, 120.0):
        ctl.route(0, t)
        if ctl.stats.risk_rate > before:
            return t - 60.0
    return float("inf")


def test_a_burst_is_at_risk_sooner_by_the_fast_meter() -> None:
    for seed in (1, 2, 3):
        fast = onset_detected_s(OnlineConfig(trim=False), seed)
        slow = onset_detected_s(OnlineConfig(trim=False, fast_tau_s=10.0), seed)
        assert fast < slow
        assert fast <= 2.0


def test_the_fast_meter_raises_few_false_alarms_at_the_planned_rate() -> None:
    """At the planned rate the risk test's threshold sits ``risk_z`` (2.33) sigmas of
    the fast meter's noise above it: at most a few per cent of decisions are at risk
    by their rate, against every one of them in a 2.5x burst."""
    ctl, _ = scheduler(700.0, [View()], OnlineConfig(trim=False))
    rng = np.random.default_rng(7)
    times = arrival_times(rng, PLANNED_RPS, 0.0, 600.0)
    for t in times:
        ctl.route(0, t)
    assert ctl.stats.risk_rate <= 0.03 * len(times)


def at_top_clock(config: OnlineConfig) -> GlobalScheduler:
    """Workload a alone on an H100 planned at its top clock for PLANNED_RPS."""
    ctl = GlobalScheduler(LOOKUPS, Recorder(), [0.4, 0.6], config)
    ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, MAX_CLOCK, MAX_CLOCK, 700.0, 200.0)])
    ctl.set_instances(
        0, [InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, PLANNED_RPS, 0.0, False, View())], 0.0
    )
    return ctl


def test_a_harvested_slice_is_raised_once_half_its_margin_is_used() -> None:
    ctl = at_top_clock(OnlineConfig(harvest_margin=0.3))
    s = ctl.slots[0]
    s.rate.value = s.fast.value = 6.0  # a third of the planned rate
    s.rate.at_s = s.fast.at_s = 10.0
    ctl.tick(0, 10.0)
    g = ctl.gpus["n0/0"]
    assert g.clock < g.plan_clock  # harvested
    m = ctl._margin(s, 6.0)
    cap = s.capacity_rps
    assert cap >= 6.0 * (1.0 + m)
    # below the hysteresis point: no risk; above it (still under capacity): at risk
    for rate, risky in ((cap / (1.0 + 0.6 * m), False), (cap / (1.0 + 0.4 * m), True)):
        s.rate.value = s.fast.value = rate
        s.rate.at_s = s.fast.at_s = 11.0
        assert (ctl._risk(s, 11.0) == 1) is risky
    # the raise covers the rate with its margin again, not the bare rate
    ctl._boost(s, 11.0, 1)
    assert s.capacity_rps >= s.rate.read(11.0) * (1.0 + ctl._margin(s, s.rate.read(11.0))) or (
        g.clock == g.plan_clock
    )


def test_a_long_queue_raises_further_than_a_short_one() -> None:
    steps = {}
    for factor in (1, 3):
        view = View()
        ctl, _ = scheduler(700.0, [view], OnlineConfig(trim=False, queue_boost_steps=1))
        s = ctl.slots[0]
        risk = ctl._queue_risk(s.capacity_rps, s.ttft_s)
        view.queued = int(factor * risk) + 1
        # near capacity, no risk by the rate: the queue alone is, and needs more clock
        s.rate.value = s.fast.value = 0.95 * s.capacity_rps
        s.rate.at_s = s.fast.at_s = 1.0
        assert ctl._risk(s, 1.0) == 2
        clocks = ctl.lk.clocks[ctl.gpus["n0/0"].info.gpu_type]
        before = clocks.index(ctl.gpus["n0/0"].clock)
        ctl._boost(s, 1.0, 2)
        steps[factor] = clocks.index(ctl.gpus["n0/0"].clock) - before
        assert ctl.gpus["n0/0"].clock <= MAX_CLOCK
    assert steps[1] == 1
    assert steps[3] > steps[1]
