"""A boost across a new plan and a boost's hold against the harvest
(energyopt/online/global_scheduler.py: ``set_gpus``, ``tick``; docs/online.md): a GPU
boosted above its plan's clock keeps that clock through a new plan that leaves it on
at a lower clock, until the calm test returns it; and while its load is not calm, a
harvest lowers it no further than the clock covering its need."""

from __future__ import annotations

import pytest

from energyopt.online import GlobalScheduler, GpuInfo, InstanceInfo, OnlineConfig, OnlinePolicy
from energyopt.sim.engine import Simulator
from energyopt.spec.plan import Plan
from tests.test_online import (
    LOOKUPS,
    MAX_CLOCK,
    PROBLEM,
    TABLES,
    WINDOW_S,
    Recorder,
    View,
    low_clock_plan,
    scheduler,
    step_arrivals,
)
from tests.test_sim_engine import H100

PLANNED_RPS = 18.0  # test_online.scheduler's instance, req/s, planned at 990 MHz


def boosted(config: OnlineConfig | None = None) -> tuple[GlobalScheduler, Recorder]:
    """test_online.scheduler's GPU n0/0, boosted by its slice's rate at twice the plan."""
    ctl, act = scheduler(700.0, [View()], config or OnlineConfig())
    s = ctl.slots[0]
    s.rate.value = s.fast.value = 2.0 * PLANNED_RPS
    s.rate.at_s = s.fast.at_s = 10.0
    ctl._boost(s, 10.0, 1)
    g = ctl.gpus["n0/0"]
    assert g.boosted and g.clock > g.plan_clock == 990
    return ctl, act


def new_plan(ctl: GlobalScheduler, clock: int, on: bool = True, now_s: float = 12.0) -> None:
    """A new plan that leaves n0/0 at ``clock`` (on or off) with the same instance."""
    ctl.set_gpus([GpuInfo("n0/0", H100, "n0", on, clock, MAX_CLOCK, 700.0, 200.0)], now_s)
    if on:
        info = InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, PLANNED_RPS, 0.0, False, View())
        ctl.set_instances(0, [info], now_s)


def test_a_boost_outlives_a_new_plan_at_a_lower_clock_until_calm() -> None:
    ctl, act = boosted()
    clock = ctl.gpus["n0/0"].clock
    new_plan(ctl, 990)
    g = ctl.gpus["n0/0"]
    assert g.boosted and g.clock == clock and g.plan_clock == 990
    assert act.clocks[-1][:2] == ("n0/0", clock)  # set again through the GPU control
    assert ctl.stats.boosts_carried == 1
    s = ctl.slots[0]
    assert s.capacity_rps > s.plan_capacity_rps  # the slice is served at the boost
    # the load falls: the calm test returns it to the new plan's clock
    s.rate.value = s.fast.value = 0.5 * PLANNED_RPS
    s.rate.at_s = s.fast.at_s = 30.0
    ctl.tick(0, 30.0)
    assert not g.boosted and g.clock <= 990


def test_a_plan_at_or_above_the_boosted_clock_or_off_ends_the_boost() -> None:
    for clock, on in ((MAX_CLOCK, True), (990, False)):
        ctl, _ = boosted()
        new_plan(ctl, clock, on)
        g = ctl.gpus["n0/0"]
        assert not g.boosted and g.clock == clock
        assert ctl.stats.boosts_carried == 0


def test_a_boosted_gpu_is_not_harvested_to_its_plan_clock_while_its_load_is_not_calm() -> None:
    """At 95 % of the plan's safe rate the harvest's own rate test would put the GPU
    back at its plan's clock; the calm test (85 %) still counts the rate as the
    boost's load, so a harvest lowers it no further than the clock covering the
    slice's need, above the plan's; at 50 % it is restored."""
    ctl, _ = boosted()
    g, s = ctl.gpus["n0/0"], ctl.slots[0]
    safe = ctl._safe_rps(s)
    s.rate.value = s.fast.value = 0.95 * safe
    s.rate.at_s = s.fast.at_s = 20.0
    assert not ctl._calm(g, 20.0)
    need = ctl._need(s, 20.0)
    assert ctl._slice_clock(g, s, 20.0, need) == g.plan_clock  # the rate test alone
    covering = ctl._slice_clock(g, s, 20.0, need, boost_load=True)
    assert covering > g.plan_clock
    ctl.tick(0, 20.0)
    assert g.boosted and g.clock >= covering > g.plan_clock
    assert s.capacity_rps >= need
    s.rate.value = s.fast.value = 0.5 * safe
    s.rate.at_s = s.fast.at_s = 40.0
    ctl.tick(0, 40.0)
    assert not g.boosted and g.clock <= g.plan_clock


def test_in_the_simulator_a_replan_during_a_step_keeps_the_gpu_boosted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load step to 2x boosts the low-clock plan's GPUs; the same plan applied again
    at 120 s, while the step lasts, leaves every boosted GPU at its boosted clock in
    the simulator as the plan is handed over (its latency tables follow), where
    before it fell back to 990 MHz until the next request's risk test."""
    plan = low_clock_plan(990)
    sim = Simulator(
        PROBLEM, step_arrivals(2.0), window_s=WINDOW_S, tables=TABLES, online=OnlinePolicy(LOOKUPS)
    )
    seen: list[tuple[dict[str, int], dict[str, int]]] = []
    hand_over = Simulator._online_plan

    def recorded(self: Simulator, new: Plan, now: float) -> None:
        before = {g: s.clock_mhz for g, s in self.gpus.items() if s.on}
        hand_over(self, new, now)
        if now > 0.0:
            seen.append((before, {g: s.clock_mhz for g, s in self.gpus.items() if s.on}))

    monkeypatch.setattr(Simulator, "_online_plan", recorded)
    sim.run(plan, 120.0, lambda now: plan)
    assert len(seen) == 1
    # apply_plan has put the plan's clock in before the hand-over; the scheduler
    # sets the boost again
    _, after = seen[0]
    boosted = {g for g, c in after.items() if c > 990}
    assert boosted  # the step's boosts were carried through the re-plan
    assert sim.ctl is not None and sim.ctl.stats.boosts_carried == len(boosted)
    for g in boosted:
        for server in sim.gpus[g].servers:
            assert server.table is sim._table(server, sim.gpus[g])
