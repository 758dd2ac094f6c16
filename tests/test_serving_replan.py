"""Re-plan on surprise (families/serving/solvers/replan.py): the plan it returns is
verified on the full problem at the new rates, keeps every GPU that holds no
surprised workload as it was, reports the verifier's objective, and falls back to
the general restricted solve and then to the full warm-started solve; the
simulator's watch callback and the evaluation loop use it between epochs."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.catalog.problem import Problem, load_problem
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
from energyopt.families.serving.verify import (
    PlacementFigures,
    PlanEvaluation,
    evaluate_plan,
    evaluate_plan_incremental,
    learn_capacities,
    verify_plan,
)
from energyopt.online import OpLookups
from energyopt.sim.engine import Simulator
from energyopt.sim.passes import PassTables
from energyopt.sim.synthetic import synthetic_arrivals
from energyopt.solvers.presets import load_preset
from energyopt.spec.evaluation import DiurnalLoad, Evaluation, OnlineOptions, PlannerSpec, Spike
from energyopt.spec.plan import GpuPlan, Plan
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
    out = replan(problem, plan, {"a": 1.5 * rates["a"]}, full_verify=True)
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
    out = replan(problem, plan, new, full_time_limit_s=10.0, full_verify=True)
    if out.plan is None:  # only when even the full solve finds none
        assert out.method == "none"
        return
    assert verify_plan(target_problem(problem, plan, new), out.plan) == []
    if out.method == "restricted":
        assert _untouched(plan, out.plan, {which}) == []


def test_nothing_surprised_keeps_the_plan() -> None:
    problem, plan = fleet()
    out = replan(problem, plan, dict(plan_rates_rps(plan)), full_verify=True)
    assert out.method == "none" and out.changed_gpus == () and out.moved == 0
    assert out.plan is not None
    assert [gp.placements for gp in out.plan.gpus] == [gp.placements for gp in plan.gpus]


def test_fallbacks_run_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    problem, plan = fleet()
    new = {"a": 1.4 * plan_rates_rps(plan)["a"]}
    monkeypatch.setattr(rp, "surprise_milp", lambda *a, **k: (None, set(), "forced"))
    out = replan(problem, plan, new, full_verify=True)
    assert out.method == "restricted-exact" and out.notes[0] == "forced"
    assert out.plan is not None and verify_plan(target_problem(problem, plan, new), out.plan) == []
    monkeypatch.setattr(rp, "restricted_instance", lambda *a, **k: None)
    out = replan(problem, plan, new, full_verify=True)
    assert out.method == "full" and out.plan is not None
    assert verify_plan(target_problem(problem, plan, new), out.plan) == []
    assert replan(problem, plan, new, full_time_limit_s=None, full_verify=True).plan is None


def test_a_load_no_fleet_serves_has_no_plan() -> None:
    problem, plan = fleet()
    out = replan(problem, plan, {"a": 1e4}, full_time_limit_s=10.0, full_verify=True)
    assert out.plan is None and out.method == "none" and out.notes


def test_bad_rates_name_the_field() -> None:
    problem, plan = fleet()
    with pytest.raises(ValueError, match="rates_rps"):
        replan(problem, plan, {"nope": 1.0}, full_verify=True)
    with pytest.raises(ValueError, match="rates_rps"):
        replan(problem, plan, {"a": 0.0}, full_verify=True)


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


ROOT = Path(__file__).resolve().parents[1]


@cache
def instance_plan(name: str) -> tuple[Problem, Plan]:
    """An instance of instances/ and a plan of it (quickstart: exact; fleet-16: the
    pattern preset's first plan within 3 s, any feasible plan serves here)."""
    problem = load_problem(ROOT / "instances" / f"{name}.yaml")
    preset = "highs-exact" if name == "quickstart" else "highs-pattern"
    result = solve(problem, load_preset(preset), time_limit_s=3.0, rel_gap=0.05)
    assert result.plan is not None
    return problem, result.plan


def _perturbed(problem: Problem, plan: Plan, rng: random.Random) -> tuple[Problem, Plan]:
    """``plan`` with one to three random GPUs changed (clock, a share, a rate, power
    limit, off, off with its work left on, or a placement moved to another GPU), and
    sometimes a workload's rate changed in the problem."""
    gpus = list(plan.gpus)
    types = {g.id: problem.gpu_type(g.type) for g in problem.gpus}
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(len(gpus))
        gp = gpus[k]
        kind = rng.choice(["clock", "share", "rate", "limit", "off", "off-busy", "move"])
        if not gp.on or not gp.placements:
            kind = "clock" if gp.on else "move"
        if kind == "clock":
            clocks = types[gp.gpu].sm_clocks_mhz()
            gp = gp.model_copy(
                update={"on": True, "clock_mhz": rng.choice(clocks), "power_limit_w": 700.0}
            )
        elif kind == "share":
            i = rng.randrange(len(gp.placements))
            pls = list(gp.placements)
            pls[i] = pls[i].model_copy(update={"share_pct": rng.choice([25, 50, 75, 100])})
            gp = gp.model_copy(update={"placements": tuple(pls)})
        elif kind == "rate":
            i = rng.randrange(len(gp.placements))
            pls = list(gp.placements)
            pls[i] = pls[i].model_copy(update={"rate_rps": pls[i].rate_rps * rng.uniform(0.5, 2)})
            gp = gp.model_copy(update={"placements": tuple(pls)})
        elif kind == "limit":
            gp = gp.model_copy(update={"power_limit_w": rng.uniform(150.0, 750.0)})
        elif kind == "off":
            gp = GpuPlan(gpu=gp.gpu, type=gp.type, on=False)
        elif kind == "off-busy":
            gp = gp.model_copy(update={"on": False})
        else:  # a placement of a random busy GPU also runs here
            busy = [g for g in gpus if g.on and g.placements]
            pl = rng.choice(rng.choice(busy).placements)
            clock = gp.clock_mhz if gp.on else types[gp.gpu].max_sm_clock_mhz
            gp = gp.model_copy(
                update={
                    "on": True,
                    "clock_mhz": clock,
                    "power_limit_w": gp.power_limit_w or 700.0,
                    "placements": (*gp.placements, pl.model_copy(update={"share_pct": 50})),
                }
            )
        gpus[k] = gp
    if rng.random() < 0.3:
        w = rng.choice(problem.instance.workloads)
        problem = target_problem(problem, plan, {w.name: w.rate_rps * rng.uniform(0.7, 1.5)})
    return problem, plan.model_copy(update={"gpus": tuple(gpus)})


def _same(full: PlanEvaluation, incremental: PlanEvaluation) -> None:
    """The two evaluations agree on every verdict and figure, exactly."""
    assert [str(v) for v in incremental.violations] == [str(v) for v in full.violations]
    assert incremental.total_power_w == full.total_power_w
    assert incremental.objective == full.objective
    assert incremental.gpu_power_w == full.gpu_power_w
    assert incremental.gpu_worst_w == full.gpu_worst_w
    assert incremental.headroom == full.headroom
    assert incremental.served_rps == full.served_rps
    assert (incremental.gpus_on, incremental.moved) == (full.gpus_on, full.moved)
    assert incremental.static_power_w == full.static_power_w


@pytest.mark.parametrize("name", ["quickstart", "fleet-16"])
def test_incremental_verification_equals_the_full_one(name: str) -> None:
    """Plans of the instance perturbed on random GPUs: the incremental verifier, with
    the unperturbed plan's figures (and, every other time, the SLO capacities of
    every single-GPU point of the instance) in hand, gives the full verifier's
    verdict, problems and figures, and runs the model only for placements it has not
    verified before."""
    problem, plan = instance_plan(name)
    learned = PlacementFigures()
    learn_capacities(problem, rp.single_gpu_points(problem), learned)
    flagged = 0
    seeds = 6
    for seed in range(seeds):
        rng = random.Random(seed)
        verified = PlacementFigures()
        _same(evaluate_plan(problem, plan), evaluate_plan_incremental(problem, plan, verified))
        if seed % 2:
            verified.capacity.update(learned.capacity)
        known = len(verified.placements)
        assert 0 < known <= sum(len(gp.placements) for gp in plan.gpus if gp.on)
        changed_problem, changed = _perturbed(problem, plan, rng)
        full = evaluate_plan(changed_problem, changed)
        _same(full, evaluate_plan_incremental(changed_problem, changed, verified))
        if changed_problem is problem:  # only the perturbed GPUs' placements are new
            touched = {gp.gpu for gp in changed.gpus} - {
                a.gpu for a, b in zip(changed.gpus, plan.gpus, strict=True) if a == b
            }
            fresh = sum(len(gp.placements) for gp in changed.gpus if gp.gpu in touched)
            assert len(verified.placements) - known <= fresh
        flagged += bool(full.violations)
    assert 0 < flagged < seeds  # both verdicts were compared


def test_incremental_replan_returns_what_the_full_one_does() -> None:
    problem, plan = fleet()
    new = {"a": 1.5 * plan_rates_rps(plan)["a"]}
    rp.remember_plan_in_force(problem, plan)
    fast = replan(problem, plan, new)
    full = replan(problem, plan, new, full_verify=True)
    assert fast.plan is not None and full.plan is not None
    assert (fast.method, fast.objective, fast.power_w) == (
        full.method,
        full.objective,
        full.power_w,
    )
    assert fast.plan.gpus == full.plan.gpus
