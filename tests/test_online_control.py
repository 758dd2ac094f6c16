"""The online control's GPU changes go through ``GpuControl`` (energyopt/control.py):
in the simulator through its simulated agent, which applies the node agent's checks; a
refused change leaves the scheduler's view of the GPU as it was."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from energyopt.control import Refused, check_shares
from energyopt.online import GlobalScheduler, GpuInfo, InstanceInfo, OnlinePolicy, OpLookups
from energyopt.sim.engine import Simulator
from energyopt.sim.synthetic import poisson_arrivals
from tests.test_online import (
    CAPS,
    LOOKUPS,
    MAX_CLOCK,
    PROBLEM,
    STEP_S,
    TABLES,
    WINDOW_S,
    View,
    low_clock_plan,
    quarter_shares,
    step_arrivals,
)
from tests.test_sim_engine import H100, shared_plan


class Recording:
    """A GpuControl that records every change and refuses those ``refuse`` names."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.refuse = refuse
        self.calls: list[tuple[str, str, object]] = []

    def _call(self, op: str, gpu: str, value: object) -> None:
        if op in self.refuse:
            raise Refused("outside_envelope", f"{gpu}: {op} {value} refused")
        self.calls.append((op, gpu, value))

    def set_clock(self, gpu: str, clock_mhz: int) -> None:
        self._call("set_clock", gpu, clock_mhz)

    def set_power_limit(self, gpu: str, limit_w: float) -> None:
        self._call("set_power_limit", gpu, limit_w)

    def shift_shares(self, gpu: str, shares_pct: Mapping[str, int]) -> None:
        self._call("shift_shares", gpu, dict(shares_pct))


class NoActuator:
    def set_clock(self, gpu: str, clock_mhz: int, power_limit_w: float, now_s: float) -> None:
        raise AssertionError("GPU settings must go through the GPU control")

    def set_share(self, instance: int, share: int, now_s: float) -> None:
        raise AssertionError("GPU settings must go through the GPU control")

    def wake(self, gpu: str, workload: int, clock_mhz: int, now_s: float) -> None:
        return None


def overloaded(control: Recording) -> tuple[GlobalScheduler, View]:
    """Workload a on n0/0 at 990 MHz under twice its capacity, changes through ``control``."""
    ctl = GlobalScheduler(LOOKUPS, NoActuator(), [0.4, 0.6], control=control)
    ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, 990, MAX_CLOCK, 700.0, 200.0)])
    view = View(queued=0)
    ctl.set_instances(0, [InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, 18.0, 0.0, False, view)], 0.0)
    return ctl, view


def test_a_boost_goes_through_the_control_limit_first() -> None:
    control = Recording()
    ctl, _ = overloaded(control)
    now = 0.0
    for _ in range(200):
        now += 0.025
        ctl.route(0, now)
    assert ctl.stats.boosts > 0 and ctl.stats.refused == 0
    ops = [op for op, _, _ in control.calls]
    assert ops[:2] == ["set_power_limit", "set_clock"]
    clock = [v for op, _, v in control.calls if op == "set_clock"][-1]
    assert isinstance(clock, int) and 990 < clock <= MAX_CLOCK
    assert ctl.gpus["n0/0"].clock == clock


@pytest.mark.parametrize("refuse", ["set_clock", "set_power_limit"])
def test_a_refused_boost_leaves_the_schedulers_view(refuse: str) -> None:
    control = Recording(refuse=(refuse,))
    ctl, _ = overloaded(control)
    cap_before = ctl.slots[0].capacity_rps
    now = 0.0
    for _ in range(200):
        now += 0.025
        ctl.route(0, now)
    assert ctl.stats.refused > 0 and ctl.stats.boosts == 0
    assert ctl.refusals[-1].code == "outside_envelope"
    g = ctl.gpus["n0/0"]
    assert g.clock == 990 and not g.boosted
    assert ctl.slots[0].capacity_rps == cap_before
    assert not any(op == "set_clock" for op, _, _ in control.calls)


def test_a_share_shift_is_one_call_naming_both_clients() -> None:
    busy, idle = View(queued=40), View(queued=0)
    control = Recording()
    ctl = GlobalScheduler(OpLookups.build(quarter_shares()), NoActuator(), [0.4, 0.6],
                          control=control)
    ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, MAX_CLOCK, MAX_CLOCK, 700.0, 200.0)])
    ctl.set_instances(0, [InstanceInfo(0, 0, "a", ("n0/0",), 50, 1, 10.0, 0.0, False, busy)], 0.0)
    ctl.set_instances(1, [InstanceInfo(1, 1, "b", ("n0/0",), 50, 1, 1.0, 0.0, False, idle)], 0.0)
    ctl.slots[1].rate.value = 0.0
    ctl.route(0, 1.0)
    assert control.calls == [("shift_shares", "n0/0", {"b": 25, "a": 75})]
    assert (ctl.slots[0].share, ctl.slots[1].share) == (75, 25)


def test_the_simulators_reactions_go_through_its_agent() -> None:
    sim = Simulator(
        PROBLEM, step_arrivals(1.45), window_s=WINDOW_S, tables=TABLES,
        online=OnlinePolicy(LOOKUPS),
    )
    res = sim.run(low_clock_plan())
    assert res.online is not None and res.online.boosts > 0 and res.online.refused == 0
    assert sim.agent is not None
    # each clock change of the log is a power limit and a clock through the agent
    assert sim.agent.changes == 2 * len(res.clock_log)
    assert any(t >= STEP_S and c > 990 for t, _, c, _ in res.clock_log)


def test_the_simulated_agent_refuses_outside_the_type_and_cap() -> None:
    sim = Simulator(
        PROBLEM, step_arrivals(1.0), window_s=WINDOW_S, tables=TABLES,
        online=OnlinePolicy(LOOKUPS),
    )
    sim.apply_plan(low_clock_plan(), 0.0, initial=True)
    agent = sim.agent
    assert agent is not None
    g = sim.gpus["n0/0"]
    for call, code in (
        (lambda: agent.set_clock("n0/0", MAX_CLOCK + 15), "outside_policy"),
        (lambda: agent.set_clock("n0/0", 991), "not_supported"),
        (lambda: agent.set_power_limit("n0/0", CAPS["n0/0"] + 1), "outside_policy"),
        (lambda: agent.set_clock("n9/9", 990), "outside_envelope"),
    ):
        with pytest.raises(Refused) as info:
            call()
        assert info.value.code == code
    assert g.clock_mhz == 990 and g.power_limit_w is None and not sim.clock_log
    agent.set_clock("n0/0", MAX_CLOCK)
    assert g.clock_mhz == MAX_CLOCK


def test_the_simulated_agent_shifts_only_the_gpus_own_instances_within_100_percent() -> None:
    qp = quarter_shares()
    arr = poisson_arrivals(qp.instance.workloads, lambda t: np.ones_like(t), 1.0, 10.0, 0.0,
                           np.random.default_rng(1))
    sim = Simulator(qp, arr, window_s=10.0, online=OnlinePolicy(OpLookups.build(qp)))
    sim.apply_plan(shared_plan(qp), 0.0, initial=True)
    agent = sim.agent
    assert agent is not None
    clients = sim.mps_clients("n0/0")
    assert sorted(pct for _, pct in clients.values()) == [50, 50]
    a, b = sorted(clients)
    with pytest.raises(Refused, match="above 100 %"):
        agent.shift_shares("n0/0", {a: 75})
    with pytest.raises(Refused, match="not an MPS client"):
        agent.shift_shares("n0/0", {"c#9": 25})
    assert sorted(pct for _, pct in sim.mps_clients("n0/0").values()) == [50, 50]
    agent.shift_shares("n0/0", {b: 25, a: 75})
    after = sim.mps_clients("n0/0")
    assert (after[a][1], after[b][1]) == (75, 25)


def test_check_shares_allows_a_shift_that_does_not_raise_an_overfull_total() -> None:
    # a draining instance still holds 50 %: the others may trade, not grow
    current = {"old": 50, "a": 50, "b": 50}
    assert check_shares("g", {"a": 75, "b": 25}, current) == {"old": 50, "a": 75, "b": 25}
    with pytest.raises(Refused, match="175 %"):
        check_shares("g", {"a": 75}, current)
    with pytest.raises(Refused) as info:
        check_shares("g", {"a": 0}, current)
    assert info.value.code == "bad_request"
