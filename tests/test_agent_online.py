"""The online control drives the node agent: the global scheduler's boosts, restores and
share shifts reach an agent on the simulated NVML over its Unix socket through
``AgentClient`` (the same ``GpuControl`` the simulator's simulated agent implements);
the ``shift_mps`` and ``measure`` operations (docs/agent.md)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import pytest

from energyopt.agent import AgentClient, Refused
from energyopt.online import GlobalScheduler, GpuControl, GpuInfo, InstanceInfo, OpLookups
from tests.test_agent import H100, Running, policy_data, run_agent, sock_dir  # noqa: F401
from tests.test_online import LOOKUPS, MAX_CLOCK, View, quarter_shares

PLAN_CLOCK = 990
PLAN_LIMIT_W = 400


def online_plan(shared: bool) -> dict[str, Any]:
    """GPU n0/0 at 990 MHz and 400 W: workload a alone, or a and b at 50 % each (MPS)."""
    placements: list[dict[str, Any]] = [{"workload": "a", "rate_rps": 10.0}]
    if shared:
        placements = [
            {"workload": "a", "share_pct": 50, "rate_rps": 10.0},
            {"workload": "b", "share_pct": 50, "rate_rps": 1.0},
        ]
    return {
        "instance": "online-agent",
        "gpus": [
            {
                "gpu": "n0/0",
                "type": H100,
                "on": True,
                "clock_mhz": PLAN_CLOCK,
                "power_limit_w": PLAN_LIMIT_W,
                "placements": placements,
            },
            {"gpu": "n0/1", "type": H100, "on": False},
        ],
    }


def online_policy(**allow: Any) -> dict[str, Any]:
    me = {"uids": [os.getuid()]}
    data = policy_data(shift_mps=me, measure=me, **allow)
    data["clock_mhz"] = {"min": 800, "max": 1980}
    return data


def start(run_agent: Callable[..., Running], shared: bool) -> tuple[Running, AgentClient]:  # noqa: F811
    running = run_agent(online_policy())
    client = running.client()
    # the online control may raise the limit up to 500 W (the policy's top)
    client.apply(online_plan(shared), envelope={"n0/0": {"power_limit_w": [250, 500]}})
    return running, client


def gpu0(client: AgentClient) -> dict[str, Any]:
    row: dict[str, Any] = next(g for g in client.status()["gpus"] if g["plan_gpu"] == "n0/0")
    return row


def test_boost_and_restore_of_the_global_scheduler_reach_the_agent(
    run_agent: Callable[..., Running],  # noqa: F811
) -> None:
    running, client = start(run_agent, shared=False)
    with client:
        control: GpuControl = client
        ctl = GlobalScheduler(LOOKUPS, _NoActuator(), [0.4, 0.6], control=control)
        ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, PLAN_CLOCK, MAX_CLOCK, 500.0, 250.0)])
        view = View(queued=0)
        info = InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, 18.0, 0.0, False, view)
        ctl.set_instances(0, [info], 0.0)
        now = 0.0
        for _ in range(200):  # 40 req/s: above the capacity at 990 MHz
            now += 0.025
            ctl.route(0, now)
        assert ctl.stats.boosts > 0 and ctl.stats.refused == 0
        g = ctl.gpus["n0/0"]
        assert g.clock > PLAN_CLOCK
        row = gpu0(client)
        assert row["locked_clocks"] == [g.clock, g.clock] == list(
            running.sim.get_locked_clocks(0)
        )
        assert row["power_limit_w"] == pytest.approx(g.limit_w, abs=1e-3)
        assert row["online"]["lock_clocks"] == [g.clock, g.clock]
        # calm: after the hold the scheduler restores the plan's clock, through the agent
        ctl.slots[0].rate.value = 0.0
        ctl.tick(0, now + ctl.cfg.hold_s + 0.1)
        assert ctl.stats.restores == 1 and g.clock == PLAN_CLOCK
        row = gpu0(client)
        assert row["locked_clocks"] == [PLAN_CLOCK, PLAN_CLOCK]
        assert "lock_clocks" not in row["online"]


def test_a_boost_the_policy_refuses_leaves_gpu_and_scheduler_unchanged(
    run_agent: Callable[..., Running],  # noqa: F811
) -> None:
    running = run_agent(policy_data())  # clocks up to 1700 MHz only
    with running.client() as client:
        client.apply(online_plan(False), envelope={"n0/0": {"power_limit_w": [250, 500]}})
        ctl = GlobalScheduler(LOOKUPS, _NoActuator(), [0.4, 0.6], control=client)
        # the scheduler believes the type's top clock (1980 MHz) is available
        ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, PLAN_CLOCK, MAX_CLOCK, 500.0, 250.0)])
        view = View(queued=200)  # a backlog no clock below the top clears
        info = InstanceInfo(0, 0, "a", ("n0/0",), 100, 1, 10.0, 0.0, False, view)
        ctl.set_instances(0, [info], 0.0)
        ctl.route(0, 0.1)
        assert ctl.stats.refused >= 1
        assert ctl.refusals[-1].code == "outside_policy"
        assert ctl.gpus["n0/0"].clock == PLAN_CLOCK
        assert running.sim.get_locked_clocks(0) == (PLAN_CLOCK, PLAN_CLOCK)


def test_a_share_shift_of_the_global_scheduler_reaches_the_agent(
    run_agent: Callable[..., Running],  # noqa: F811
) -> None:
    _, client = start(run_agent, shared=True)
    with client:
        busy, idle = View(queued=40), View(queued=0)
        ctl = GlobalScheduler(OpLookups.build(quarter_shares()), _NoActuator(), [0.4, 0.6],
                              control=client)
        ctl.set_gpus([GpuInfo("n0/0", H100, "n0", True, MAX_CLOCK, MAX_CLOCK, 500.0, 250.0)])
        ctl.set_instances(0, [InstanceInfo(0, 0, "a", ("n0/0",), 50, 1, 10.0, 0.0, False, busy)],
                          0.0)
        ctl.set_instances(1, [InstanceInfo(1, 1, "b", ("n0/0",), 50, 1, 1.0, 0.0, False, idle)],
                          0.0)
        ctl.slots[1].rate.value = 0.0
        ctl.route(0, 1.0)
        assert ctl.stats.shifts == 1 and ctl.stats.refused == 0
        assert gpu0(client)["online"]["mps_shares"] == {"a": 75, "b": 25}
        busy.queued = 0
        ctl.slots[0].rate.value = 0.0
        ctl.tick(0, 1.0 + ctl.cfg.hold_s + 0.1)
        assert ctl.stats.restores == 1
        assert "mps_shares" not in gpu0(client)["online"]


def test_shift_mps_stays_within_the_plans_placements(
    run_agent: Callable[..., Running],  # noqa: F811
) -> None:
    _, client = start(run_agent, shared=True)
    with client:
        out = client.shift_shares("n0/0", {"a": 75, "b": 25})
        assert out["shares"] == {"a": 75, "b": 25} and out["previous"] == {"a": 50, "b": 50}
        env = out["client_env"]["a"]
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "75"
        for shares, code, words in (
            ({"a": 100}, "outside_envelope", "125 %"),
            ({"c": 25}, "outside_envelope", "not an MPS client"),
            ({"a": 0}, "bad_request", "1-100"),
            ({}, "bad_request", "no client"),
        ):
            with pytest.raises(Refused) as info:
                client.shift_shares("n0/0", shares)
            assert info.value.code == code and words in info.value.reason
        with pytest.raises(Refused) as info:
            client.shift_shares("n0/1", {"a": 50})
        assert info.value.code == "outside_envelope"
        assert gpu0(client)["online"]["mps_shares"] == {"a": 75, "b": 25}
        client.shift_shares("n0/0", {"a": 50, "b": 50})  # the plan's: no online change left
        assert "mps_shares" not in gpu0(client)["online"]


def test_the_watchdog_and_a_new_apply_return_a_shift_to_the_plans_shares(
    run_agent: Callable[..., Running],  # noqa: F811
) -> None:
    running = run_agent(online_policy(), heartbeat_timeout_s=0.3)
    with running.client() as client:
        client.apply(online_plan(True))
        client.shift_shares("n0/0", {"a": 75, "b": 25})
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and not client.status()["watchdog_fired"]:
            time.sleep(0.05)
        assert client.status()["watchdog_fired"]
        assert "mps_shares" not in gpu0(client)["online"]
        assert client.shift_shares("n0/0", {"a": 75, "b": 25})["previous"] == {"a": 50, "b": 50}
        client.apply(online_plan(True))
        assert "mps_shares" not in gpu0(client)["online"]


def test_shift_mps_needs_an_mps_layout_and_the_policy(
    run_agent: Callable[..., Running],  # noqa: F811
) -> None:
    _, client = start(run_agent, shared=False)
    with client:
        with pytest.raises(Refused) as info:
            client.shift_shares("n0/0", {"a": 50})
        assert info.value.code == "outside_envelope" and "no MPS" in info.value.reason
    running = run_agent(policy_data())  # shift_mps and measure not allowed
    with running.client() as other:
        for call in (lambda: other.shift_shares("n/0", {"a": 50}), lambda: other.measure(1.0)):
            with pytest.raises(Refused) as info:
                call()
            assert info.value.code == "unauthorized"


def test_measure_reports_energy_over_the_window(
    run_agent: Callable[..., Running],  # noqa: F811
) -> None:
    running, client = start(run_agent, shared=False)
    with client:
        before = running.sim.get_total_energy(0)
        out = client.measure(2.0)
        assert out["window_s"] == 2.0 and out["plan_id"]
        rows = {g["index"]: g for g in out["gpus"]}
        assert sorted(rows) == [0, 1, 2]  # the policy's GPUs only (the host has 4)
        row = rows[0]
        assert row["plan_gpu"] == "n0/0" and row["seconds"] >= 2.0
        assert row["energy_j"] > 0
        assert row["avg_power_w"] == pytest.approx(row["energy_j"] / row["seconds"])
        assert running.sim.get_total_energy(0) - before >= row["energy_j"] * 1000 - 1
        for window in (0, -1, 61, "2"):
            with pytest.raises(Refused) as info:
                client.call("measure", window_s=window)
            assert info.value.code == "bad_request"
        with pytest.raises(ValueError, match="timeout_s"):
            client.measure(client.timeout_s)


class _NoActuator:
    """The scheduler's actuator: only a wake, which these tests never reach."""

    def set_clock(self, gpu: str, clock_mhz: int, power_limit_w: float, now_s: float) -> None:
        raise AssertionError("GPU settings must go through the agent")

    def set_share(self, instance: int, share: int, now_s: float) -> None:
        raise AssertionError("GPU settings must go through the agent")

    def wake(self, gpu: str, workload: int, clock_mhz: int, now_s: float) -> None:
        raise AssertionError("no wake expected")
