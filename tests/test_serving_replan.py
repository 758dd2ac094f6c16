"""Re-plan on surprise (families/serving/solvers/replan.py): the plan it returns is
verified on the full problem at the new rates, keeps every GPU that holds no
surprised workload as it was, reports the verifier's objective, and falls back to
the general restricted solve and then to the full warm-started solve; the
simulator's watch callback and the evaluation loop use it between epochs."""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.catalog.problem import Problem
from energyopt.families.serving.loop import run_planner
from energyopt.families.serving.planners import make_planner
from energyopt.families.serving.remap import plan_rates_rps
from energyopt.families.serving.solvers import replan as rp
from energyopt.families.serving.solvers.replan import (
    changed_gpus,
    moved_placements,
    replan,
    surprise_groups,
    target_problem,
)
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan, verify_plan
from energyopt.online import OpLookups
from energyopt.sim.engine import Simulator
from energyopt.sim.passes import PassTables
from energyopt.sim.synthetic import synthetic_arrivals
from energyopt.solvers.presets import load_preset
from energyopt.spec.evaluation import DiurnalLoad, Evaluation, OnlineOptions, PlannerSpec, Spike
from energyopt.spec.plan import Plan
from tests.test_sim_engine import random_arrivals, shared_plan, split_plan, two_workloads


@cache
def fleet() -> tuple[Problem, Plan]:
    """Four H100s, workloads a (18 req/s) and b (10 req/s), and their exact plan."""
    problem = two_workloads(rate_a=18.0, rate_b=10.0, gpus=4)
    result = solve(problem, load_preset("highs-exact"))
    assert result.plan is not None
    return problem, result.plan


def _untouched(old: Plan, new: Plan, surprised: set[str]) -> list[str]:
    """GPUs of ``old`` that hold no surprised workload but differ in ``new``."""
    after = {gp.gpu: gp for gp in new.gpus}
    return [
        gp.gpu
        for gp in old.gpus
        if gp.on and not any(p.workload in surprised for p in gp.placements) and after[gp.gpu] != gp
    ]


def test_a_surprise_is_replanned_verified_and_leaves_other_gpus_alone() -> None:
    problem, plan = fleet()
    rates = plan_rates_rps(plan)
    out = replan(problem, plan, {"a": 1.5 * rates["a"]})
    assert out.plan is not None and out.method == "restricted"
    target = target_problem(problem, plan, {"a": 1.5 * rates["a"]})
    ev = evaluate_plan(target, out.plan)
    assert ev.violations == []
    assert out.objective == pytest.approx(ev.objective)
    assert out.power_w == pytest.approx(ev.total_power_w)
    assert plan_rates_rps(out.plan)["a"] == pytest.approx(1.5 * rates["a"])
    assert plan_rates_rps(out.plan)["b"] == pytest.approx(rates["b"])
    assert _untouched(plan, out.plan, {"a"}) == []
    assert set(out.changed_gpus) == set(changed_gpus(plan, out.plan))
    assert out.changed_gpus  # 1.5x the rate needs more than the settings of the plan
    assert out.moved == moved_placements(plan, out.plan)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(factor=st.floats(0.3, 2.5), which=st.sampled_from(["a", "b"]))
def test_replanned_plans_verify_and_keep_the_rest(factor: float, which: str) -> None:
    problem, plan = fleet()
    new = {which: factor * plan_rates_rps(plan)[which]}
    out = replan(problem, plan, new, full_time_limit_s=10.0)
    if out.plan is None:  # only when even the full solve finds none
        assert out.method == "none"
        return
    assert verify_plan(target_problem(problem, plan, new), out.plan) == []
    if out.method == "restricted":
        assert _untouched(plan, out.plan, {which}) == []


def test_nothing_surprised_keeps_the_plan() -> None:
    problem, plan = fleet()
    out = replan(problem, plan, dict(plan_rates_rps(plan)))
    assert out.method == "none" and out.changed_gpus == () and out.moved == 0
    assert out.plan is not None
    assert [gp.placements for gp in out.plan.gpus] == [gp.placements for gp in plan.gpus]


def test_fallbacks_run_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    problem, plan = fleet()
    new = {"a": 1.4 * plan_rates_rps(plan)["a"]}
    monkeypatch.setattr(rp, "surprise_milp", lambda *a, **k: (None, set(), "forced"))
    out = replan(problem, plan, new)
    assert out.method == "restricted-exact" and out.notes[0] == "forced"
    assert out.plan is not None and verify_plan(target_problem(problem, plan, new), out.plan) == []
    monkeypatch.setattr(rp, "restricted_instance", lambda *a, **k: None)
    out = replan(problem, plan, new)
    assert out.method == "full" and out.plan is not None
    assert verify_plan(target_problem(problem, plan, new), out.plan) == []
    assert replan(problem, plan, new, full_time_limit_s=None).plan is None


def test_a_load_no_fleet_serves_has_no_plan() -> None:
    problem, plan = fleet()
    out = replan(problem, plan, {"a": 1e4}, full_time_limit_s=10.0)
    assert out.plan is None and out.method == "none" and out.notes


def test_bad_rates_name_the_field() -> None:
    problem, plan = fleet()
    with pytest.raises(ValueError, match="rates_rps"):
        replan(problem, plan, {"nope": 1.0})
    with pytest.raises(ValueError, match="rates_rps"):
        replan(problem, plan, {"a": 0.0})


def test_groups_join_workloads_that_share_a_gpu() -> None:
    problem = two_workloads()
    assert surprise_groups(shared_plan(problem), ["a", "b"]) == [["a", "b"]]
    assert surprise_groups(split_plan(problem), ["a", "b"]) == [["a"], ["b"]]


def test_the_simulator_asks_the_watch_and_applies_its_plan() -> None:
    problem = two_workloads()
    arrivals = random_arrivals(3, 60, 20.0)
    sim = Simulator(problem, arrivals, window_s=20.0, tables=PassTables(problem))
    asked: list[float] = []

    def watch(now: float) -> Plan | None:
        asked.append(now)
        return split_plan(problem) if len(asked) == 3 else None

    res = sim.run(shared_plan(problem), watch=(4.0, watch))
    assert asked == pytest.approx([4.0, 8.0, 12.0, 16.0])
    assert res.instances_started >= 1  # the split plan's new instance
    assert res.completed + res.unfinished + res.shed == res.arrived


@pytest.mark.parametrize("on", [True, False])
def test_the_loop_replans_on_a_spike_only_when_asked(on: bool) -> None:
    problem = two_workloads(rate_a=12.0, rate_b=6.0, gpus=4)
    load = DiurnalLoad(
        kind="diurnal",
        amplitude=0.0,
        spikes=(Spike(at_s=130.0, duration_s=70.0, factor=2.5),),
    )
    ev = Evaluation(
        kind="evaluate",
        name="spike",
        base="base.yaml",
        load=load,
        duration_s=200.0,
        epoch_s=100.0,
        online=OnlineOptions(replan_on_surprise=on, surprise_s=5.0, max_headroom=1.5),
    )
    arrivals = synthetic_arrivals(load, problem.instance.workloads, ev.duration_s, 1)
    spec = PlannerSpec(name="online", kind="energyopt", online=True)
    planner = make_planner(spec, problem, "eval.yaml")
    assert planner is not None
    out = run_planner(
        ev, problem, arrivals, planner, PassTables(problem, 4096), lookups=OpLookups.build(problem)
    )
    tally = out.tally
    if on:
        assert tally.surprise_replans >= 1
        assert len(tally.surprise_s) == tally.surprise_replans + tally.surprise_failed
    else:
        assert tally.surprise_replans == 0 and tally.surprise_s == []
    res = out.result
    assert res.completed + res.unfinished + res.shed == res.arrived
