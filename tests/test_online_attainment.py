"""The attainment guard (energyopt/online/attainment.py, docs/online.md): a workload
whose first tokens come late more often than its target tightens the online
control's rules for that workload only (its risk limit falls, a harvest keeps more
capacity), as far as its misses say, and relaxes when they stop; shed requests count
as late; the guard off changes nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from energyopt.families.serving import loop
from energyopt.families.serving.loop import evaluate, online_policy
from energyopt.online import GlobalScheduler, OnlineConfig, OnlinePolicy
from energyopt.online.attainment import AttainmentGuard, plan_reserves
from energyopt.sim.engine import Simulator
from energyopt.sim.synthetic import poisson_arrivals
from energyopt.spec.evaluation import OnlineOptions, PlannerSpec, load_evaluation
from tests.test_online import LOOKUPS, View, scheduler
from tests.test_online_bursts import at_top_clock
from tests.test_online_harvest import DURATION_S, setting
from tests.test_online_tail import EVALUATE


def feed(
    guard: AttainmentGuard, late_fraction: float, start_s: float, end_s: float
) -> tuple[int, int]:
    """Reports of 10 first tokens per second, ``late_fraction`` of them late: the
    (raises, lowers) of the factor they caused."""
    t = start_s
    raises = lowers = 0
    while t < end_s:
        late = round(10 * late_fraction)
        change = guard.observe(10 - late, late, t)
        raises += change > 0
        lowers += change < 0
        t += 1.0
    return raises, lowers


def test_misses_above_the_target_raise_the_factor_once_per_hold_up_to_its_largest() -> None:
    guard = AttainmentGuard(target=0.97, hold_s=10.0, step=0.1, max_factor=2.0)
    # reports at 0..34 s; the first change once min_samples are counted (t = 1 s), then
    # every 10 s: 1, 11, 21, 31
    assert feed(guard, 0.1, 0.0, 35.0) == (4, 0)
    assert guard.factor == pytest.approx(1.1**4)
    raises, lowers = feed(guard, 0.1, 35.0, 400.0)
    assert guard.factor == 2.0
    assert raises > 0 and lowers == 0


def test_the_factor_relaxes_to_one_once_the_misses_stop() -> None:
    guard = AttainmentGuard(target=0.97, tau_s=30.0)
    feed(guard, 0.2, 0.0, 120.0)
    assert guard.factor > 1.5
    raises, lowers = feed(guard, 0.0, 120.0, 600.0)
    assert guard.factor == 1.0
    assert lowers > 0 and raises == 0


def test_misses_within_the_target_leave_the_factor_alone() -> None:
    guard = AttainmentGuard(target=0.9)
    assert feed(guard, 0.05, 0.0, 600.0) == (0, 0)  # 95 % on time against a 90 % target
    assert guard.factor == 1.0


def test_a_guard_without_a_target_never_changes() -> None:
    guard = AttainmentGuard()
    feed(guard, 1.0, 0.0, 100.0)
    assert guard.factor == 1.0


@pytest.mark.parametrize(
    "kwargs", [{"target": 1.0}, {"target": -0.1}, {"tau_s": 0.0}, {"max_factor": 0.5}]
)
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AttainmentGuard(**kwargs)


def late_reports(ctl: GlobalScheduler, end_s: float) -> None:
    """Workload 0 reports a tenth of its first tokens late, every second to ``end_s``."""
    t = 0.0
    while t < end_s:
        ctl.first_tokens(0, 9, 1, t)
        t += 1.0


def test_a_late_workload_is_at_risk_at_a_rate_it_held_before() -> None:
    """At the plan's clock a slice is at risk once its rate passes its planned rate
    (plus noise); with the guard raised, at the planned rate over the factor."""
    ctl, _ = scheduler(700.0, [View()], OnlineConfig(trim=False, attainment_target=0.97))
    s = ctl.slots[0]
    rate = 0.8 * s.info.planned_rps
    s.rate.value = s.fast.value = rate
    s.rate.at_s = s.fast.at_s = 0.0
    assert ctl._risk(s, 0.0) == 0
    late_reports(ctl, 60.0)
    k = ctl.workloads[0].guard.factor
    assert k >= 1.5
    assert ctl.stats.guard_raises > 0
    s.rate.at_s = s.fast.at_s = 60.0
    assert ctl._risk(s, 60.0) == 1
    # the boost then covers the load over the guard's utilisation
    assert ctl._need_rps(s, 60.0) == pytest.approx(rate * k, rel=1e-9)


def test_a_late_workload_keeps_more_capacity_when_harvested() -> None:
    clocks = {}
    for target in (0.0, 0.97):
        ctl = at_top_clock(OnlineConfig(harvest_margin=0.1, attainment_target=target))
        late_reports(ctl, 40.0)
        assert ctl.workloads[0].guard.factor == pytest.approx(1.1**4 if target else 1.0)
        s = ctl.slots[0]
        t = ctl.gpus["n0/0"].info.gpu_type
        second = ctl.lk.capacity_rps(s.info.label, t, ctl.lk.clocks[t][1], s.share)
        k = 1.1**4  # the guard's factor after a tenth late for 40 s (asserted below)
        # the second clock covers this rate with the margin times k; the lowest clock
        # covers it with the margin alone
        s.rate.value = s.fast.value = 0.95 * second / (1.1 * k)
        s.rate.at_s = s.fast.at_s = 40.0
        ctl.tick(0, 40.0)
        g = ctl.gpus["n0/0"]
        assert g.clock < g.plan_clock
        assert s.capacity_rps >= ctl._need(s, 40.0)
        clocks[target] = g.clock
    assert clocks[0.97] > clocks[0.0]


def test_a_shed_request_counts_as_late() -> None:
    view = View()
    ctl, _ = scheduler(700.0, [view], OnlineConfig(attainment_target=0.97))
    view.queued = ctl.slots[0].queue_limit
    for i in range(30):
        assert ctl.route(0, 0.01 * i) is None
    guard = ctl.workloads[0].guard
    assert guard.late_fraction(0.3) == 1.0
    assert guard.factor > 1.0


def test_the_simulator_reports_every_first_token_and_shed_request_to_the_guard() -> None:
    """With counts that do not decay, each workload's guard has counted every first
    token (late: after its TTFT SLO) and every shed request (late)."""

    problem, plan, lookups, tables = setting()
    rng = np.random.default_rng(5)
    arrivals = poisson_arrivals(
        problem.instance.workloads, lambda t: np.full_like(t, 1.5), 1.5, DURATION_S, 0.8, rng
    )
    config = OnlineConfig(attainment_target=0.98, guard_tau_s=1e12)
    sim = Simulator(
        problem, arrivals, window_s=DURATION_S, tables=tables, online=OnlinePolicy(lookups, config)
    )
    result = sim.run(plan)
    assert sim.ctl is not None
    for w, stats in enumerate(result.stats):
        guard = sim.ctl.workloads[w].guard
        firsts = len(stats.ttft_ms)
        assert guard.ok + guard.late == pytest.approx(firsts + stats.shed, rel=1e-9)
        assert guard.late == pytest.approx(firsts - stats.ttft_ok + stats.shed, rel=1e-9)
    assert sum(s.ttft_ok for s in result.stats) < sum(len(s.ttft_ms) for s in result.stats)


def test_the_spec_online_block_reaches_the_scheduler() -> None:
    """Every threshold the evaluation spec's ``online:`` block shares with the
    scheduler's config arrives with the spec's value (the bundled code-bursty spec
    sets the guard's target, the burst memory and TBT protection)."""
    spec = Path(__file__).resolve().parents[1] / "instances" / "evaluate"
    ev = load_evaluation(spec / "fleet16-code-bursty.yaml")
    config = online_policy(ev, LOOKUPS).config
    assert config.attainment_target == 0.98 and config.burst_memory_s == 300
    shared = {f.name for f in dataclasses.fields(OnlineConfig)} & set(type(ev.online).model_fields)
    assert {"attainment_target", "guard_tau_s", "risk_utilization", "hold_s"} <= shared
    for name in shared:
        assert getattr(config, name) == getattr(ev.online, name), name
    changed = ev.model_copy(
        update={"online": ev.online.model_copy(update={"guard_tau_s": 7.0, "hold_s": 3.0})}
    )
    moved = online_policy(changed, LOOKUPS).config
    assert moved.guard_tau_s == 7.0 and moved.hold_s == 3.0


def test_plan_reserves_cover_every_workload_first_then_only_the_raised_ones() -> None:
    """Before any outcome every workload gets the guard's reserve; later only those
    whose factor is above 1; the tail reserve is a floor for all; bad input refused."""
    assert plan_reserves(3, 0.0, 1.0, None).tolist() == [1.0, 1.0, 1.0]
    assert plan_reserves(3, 0.0, 1.0, [1.0, 1.21, 1.0]).tolist() == [0.0, 1.0, 0.0]
    assert plan_reserves(3, 0.5, 1.0, [2.0, 1.0, 1.0]).tolist() == [1.0, 0.5, 0.5]
    assert plan_reserves(2, 0.5, 0.0, None).tolist() == [0.5, 0.5]
    assert plan_reserves(2, 1.2, 1.0, [2.0, 1.0]).tolist() == [1.2, 1.2]
    with pytest.raises(ValueError, match="factors"):
        plan_reserves(3, 0.0, 1.0, [1.0, 2.0])
    with pytest.raises(ValueError, match="negative"):
        plan_reserves(2, -0.1, 1.0, None)


def test_guard_reserve_needs_the_guard() -> None:
    """A reserve that follows the guard's factors is refused without a target."""
    with pytest.raises(ValidationError, match="guard_reserve"):
        OnlineOptions(guard_reserve=1.0)
    assert OnlineOptions(guard_reserve=1.0, attainment_target=0.98).guard_reserve == 1.0


def test_a_raised_workload_is_planned_for_its_burst_peak_at_the_next_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``guard_reserve`` the first plan reaches every workload's burst peak; at
    the next epoch only the workload whose guard factor is above 1 does, and the
    others are planned as without the reserve."""
    spec = EVALUATE / "quickstart-bursty.yaml"
    online = PlannerSpec(name="online", kind="energyopt", solver="highs-exact", online=True)
    base = load_evaluation(spec).model_copy(update={"planners": (online,), "duration_s": 240.0})
    peaks: list[np.ndarray] = []
    real_peak = loop.burst_peak_rps

    def peak(*args: object) -> np.ndarray:
        out = real_peak(*args)  # type: ignore[arg-type]
        peaks.append(out)
        return out

    monkeypatch.setattr(loop, "burst_peak_rps", peak)
    monkeypatch.setattr(
        GlobalScheduler, "guard_factors", lambda self: [2.0] + [1.0] * (len(self.workloads) - 1)
    )
    planned = {}
    for reserve in (0.0, 1.0):
        peaks.clear()
        settings = {"attainment_target": 0.98, "guard_reserve": reserve}
        ev = base.model_copy(update={"online": base.online.model_copy(update=settings)})
        res = evaluate(ev, spec)
        planned[reserve] = np.asarray(res.runs[0].tally.planned_rps)
        if reserve:
            first, second = peaks
    with_, without = planned[1.0], planned[0.0]
    assert with_.shape[0] == without.shape[0] == 2 and with_.shape[1] >= 2
    assert np.all(with_[0] >= first - 1e-9)
    assert np.any(without[0] < first)  # the first plan would not reach it otherwise
    assert with_[1][0] >= second[0] - 1e-9
    np.testing.assert_allclose(with_[1][1:], without[1][1:])
