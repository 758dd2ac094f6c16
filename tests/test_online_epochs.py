"""Epoch plans (families/serving/loop.py, planners.py, sim/engine.py): the bundled
specs' epoch planner returns the same plan on repeated solves (its solves stop on
counted work, not on the clock), also when it must back off an overloaded
forecast; with ``plan_ahead`` each epoch's plan is made its plan lead before the
boundary, so its new instances serve from the boundary on."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from energyopt.families.serving.loop import (
    EvaluationResult,
    epoch_lead_s,
    next_epoch_s,
    plan_lead_s,
    run_planner,
)
from energyopt.families.serving.planners import (
    BACKOFF,
    BACKOFF_STEPS,
    DEEP_BACKOFF,
    DEEP_STEPS,
    RAISE_STEP,
    REFINE_STEPS,
    SolverPlanner,
    make_planner,
    raise_fractions,
    settle_fraction,
)
from energyopt.families.serving.remap import plan_rates_rps, problem_at_plan_rates
from energyopt.families.serving.solvers.capacity import Capacity, filled_plan, packed_plan
from energyopt.families.serving.tables import scaled_problem
from energyopt.families.serving.verify import evaluate_plan
from energyopt.sim.engine import Simulator
from energyopt.sim.forecast import planned_rates_rps, raw_rates_rps
from energyopt.sim.passes import PassTables
from energyopt.sim.synthetic import synthetic_arrivals
from energyopt.spec.errors import SpecError
from energyopt.spec.evaluation import (
    DiurnalLoad,
    Evaluation,
    Forecast,
    OnlineOptions,
    PlannerSpec,
    Transitions,
    load_evaluation,
)
from energyopt.spec.plan import Plan
from tests.test_sim_engine import shared_plan, split_plan, two_workloads

SPECS = Path(__file__).resolve().parents[1] / "instances" / "evaluate"


def _online_spec(name: str) -> PlannerSpec:
    ev = load_evaluation(SPECS / name)
    return next(p for p in ev.planners if p.online)


def _plan_json(plan: Plan | None) -> str | None:
    return None if plan is None else plan.model_dump_json(exclude={"solver"})


@pytest.mark.parametrize("factor", [1.0, 4.0])
def test_the_bundled_epoch_planner_returns_the_same_plan_on_repeated_solves(
    factor: float,
) -> None:
    spec = _online_spec("fleet16-ramp-flash.yaml")
    problem = two_workloads(rate_a=36.0, rate_b=20.0, gpus=6)
    rates = {w.name: factor * w.rate_rps for w in problem.instance.workloads}
    answers = []
    for _ in range(2):
        planner = make_planner(spec, problem, SPECS / "fleet16-ramp-flash.yaml")
        assert planner is not None
        answers.append(planner.plan(rates))  # a fresh planner: no cache
    first, second = answers
    assert first.plan is not None
    assert _plan_json(first.plan) == _plan_json(second.plan)
    assert first.served_fraction == second.served_fraction
    assert first.objective == second.objective and first.bound == second.bound
    # every solve ended on its gap, its node limit or a proof, not on the time limit
    assert not first.unproven and not second.unproven
    assert not first.time_limited and not second.time_limited
    if factor > 1.0:  # 4x what the six GPUs serve: backed off
        assert first.served_fraction < 1.0


@pytest.mark.parametrize("fill", [False, True])
def test_an_overloaded_forecast_backs_off_to_the_same_fraction_and_plan_on_any_time_limit(
    fill: bool,
) -> None:
    """Two fresh planners, one with a minute per solve and one whose solves end at
    once, settle on the same fraction and plan of a forecast 4 x what six GPUs
    serve (with ``fill_overload`` too, the same per-workload fractions); the plan
    passes the verifier at the rates it routes, and the ladder fraction above the
    least served one does not pack."""
    spec = _online_spec("fleet16-ramp-flash.yaml").model_copy(update={"fill_overload": fill})
    problem = two_workloads(rate_a=36.0, rate_b=20.0, gpus=6)
    rates = {w.name: 4.0 * w.rate_rps for w in problem.instance.workloads}
    answers = []
    for limit in (60.0, 1e-6):
        planner = make_planner(
            spec.model_copy(update={"time_limit_s": limit}),
            problem,
            SPECS / "fleet16-ramp-flash.yaml",
        )
        assert isinstance(planner, SolverPlanner)
        answers.append(planner.plan(rates))
    patient, hurried = answers
    assert patient.plan is not None and 0.0 < patient.served_fraction < 1.0
    assert hurried.served_fraction == patient.served_fraction
    assert hurried.served == patient.served
    assert _plan_json(hurried.plan) == _plan_json(patient.plan)
    # verified at what it routes; served_fraction is the least workload's share
    routed = plan_rates_rps(patient.plan)
    if fill:
        assert patient.served is not None
        for n, r in rates.items():
            assert patient.served[n] == pytest.approx(min(routed[n] / r, 1.0))
        assert patient.served_fraction == pytest.approx(min(patient.served.values()))
    else:
        assert patient.served is None
        for n, r in rates.items():
            assert routed[n] == pytest.approx(patient.served_fraction * r, rel=1e-6)
    at = problem_at_plan_rates(problem, patient.plan)
    assert not evaluate_plan(at, patient.plan).violations
    above = [f for f in (1.0, 0.9, 0.81, 0.729) if f > patient.served_fraction + 1e-9]
    assert above
    assert packed_plan(scaled_problem(problem, {n: above[-1] * 4.0 for n in rates})).plan is None


def test_the_capacity_test_reads_no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Column generation and residual packing stop on counted work only: with every
    clock read failing, the test still packs a verified plan at 65.6 % of 4 x six
    GPUs' load and proves 4 x unservable (its LP relaxation leaves demand over)."""
    problem = two_workloads(rate_a=36.0, rate_b=20.0, gpus=6)
    below = scaled_problem(problem, {"a": 4.0 * 0.9**4, "b": 4.0 * 0.9**4})
    over = scaled_problem(problem, {"a": 4.0, "b": 4.0})

    def no_clock() -> float:
        raise AssertionError("the capacity test read the clock")

    monkeypatch.setattr(time, "perf_counter", no_clock)
    monkeypatch.setattr(time, "monotonic", no_clock)
    monkeypatch.setattr(time, "time", no_clock)
    fits = packed_plan(below)
    unservable = packed_plan(over)
    monkeypatch.undo()
    assert fits.applies and fits.plan is not None and fits.objective is not None
    ev = evaluate_plan(below, fits.plan)
    assert not ev.violations and ev.objective == pytest.approx(fits.objective)
    assert unservable.applies and not unservable.lp_serves and unservable.plan is None


@pytest.mark.parametrize("capacity", [0.95, 0.7, 0.3, 0.004])
def test_the_back_off_settles_on_the_largest_ladder_fraction_that_packs(capacity: float) -> None:
    """The rule on a capacity known exactly: the first BACKOFF_STEPS fractions are
    taken as they are; below them the fraction is bisected to within
    2^(1/2^(REFINE_STEPS+1)) of the capacity; nothing packs below the ladder."""
    plan = shared_plan(two_workloads())
    tried: list[float] = []

    def test(at: float) -> Capacity:
        tried.append(at)
        return Capacity(True, True, plan if at <= capacity else None, 1.0)

    settled = settle_fraction(test)
    assert settled is not None and settled.fraction <= capacity
    assert tried[0] == pytest.approx(BACKOFF)  # 1 x was solved, not tested
    ladder = [BACKOFF**k for k in range(1, BACKOFF_STEPS)]
    if capacity >= ladder[-1]:
        assert settled.fraction == max(f for f in ladder if f <= capacity)
        assert settled.plan is plan
    elif capacity >= BACKOFF ** (BACKOFF_STEPS - 1) * DEEP_BACKOFF**DEEP_STEPS:
        assert settled.fraction > capacity * (1 / DEEP_BACKOFF) ** (-(0.5**REFINE_STEPS))
        assert settled.plan is plan
    else:
        assert settled.fraction == 0.0 and settled.plan is None
    assert settle_fraction(lambda _: Capacity(False, False, None)) is None


def test_a_filled_plan_serves_more_on_the_gpus_the_back_off_left_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On 4 x what six GPUs serve, the capacity test's plan at 20 % leaves GPUs off;
    filled (with every clock read failing), it passes the verifier at the rates it
    routes, serves at least as much of every workload (more in all), turns those
    GPUs on, and is the same on two calls."""
    problem = two_workloads(rate_a=36.0, rate_b=20.0, gpus=6)
    over = scaled_problem(problem, {"a": 4.0, "b": 4.0})
    backed = packed_plan(scaled_problem(problem, {"a": 0.8, "b": 0.8})).plan
    assert backed is not None
    off = {g.gpu for g in backed.gpus if not g.on}
    assert off

    def no_clock() -> float:
        raise AssertionError("the fill read the clock")

    for name in ("perf_counter", "monotonic", "time"):
        monkeypatch.setattr(time, name, no_clock)
    first, second = filled_plan(over, backed), filled_plan(over, backed)
    monkeypatch.undo()
    assert first is not None and second is not None
    assert _plan_json(first.plan) == _plan_json(second.plan)
    assert first.served_rps == plan_rates_rps(first.plan)
    assert not evaluate_plan(problem_at_plan_rates(over, first.plan), first.plan).violations
    before = plan_rates_rps(backed)
    for w in over.instance.workloads:
        assert before[w.name] < first.served_rps[w.name] <= w.rate_rps + 1e-9
    now_on = {g.gpu for g in first.plan.gpus if g.on}
    assert first.gpus_filled == len(off & now_on) > 0
    for g in first.plan.gpus:  # the GPUs the back-off had on keep their settings
        if g.gpu not in off:
            assert g == backed.gpu(g.gpu)
    assert filled_plan(over, first.plan) is None or first.gpus_filled < len(off)


def test_raising_single_workloads_keeps_every_step_that_packs() -> None:
    """Against a capacity known exactly (a plan while the weighted fractions sum to
    at most 2.3, workload "b" counting double), each workload rises one step a
    round from the start while the test packs, a refused one stays, and the
    others go on; every step taken was a packing answer."""
    plan = shared_plan(two_workloads())
    names = ["a", "b", "c"]
    weight = {"a": 1.0, "b": 2.0, "c": 1.0}
    asked: list[dict[str, float]] = []

    def test(each: dict[str, float]) -> Capacity:
        asked.append(each)
        fits = sum(weight[n] * f for n, f in each.items()) <= 2.3 + 1e-9
        return Capacity(True, True, plan if fits else None, sum(each.values()))

    start = Capacity(True, True, plan, 0.0)
    raised = raise_fractions(test, names, 0.5, start)
    assert raised.tests == len(asked)
    assert all(f >= 0.5 for f in raised.fractions.values())
    assert sum(weight[n] * f for n, f in raised.fractions.items()) <= 2.3 + 1e-9
    # no single workload can rise one more step (nor past 1)
    for n in names:
        up = min(raised.fractions[n] + RAISE_STEP, 1.0)
        if up > raised.fractions[n]:
            assert test({**raised.fractions, n: up}).plan is None
    # round-robin from 0.5: a, b, c take 0.55; then a and c 0.6, b is refused 0.6
    assert asked[0] == {"a": 0.55, "b": 0.5, "c": 0.5}
    assert raised.fractions == pytest.approx({"a": 0.6, "b": 0.55, "c": 0.6})
    assert raised.found.objective == pytest.approx(sum(raised.fractions.values()))
    nothing = raise_fractions(lambda each: Capacity(True, True, None), names, 0.5, start)
    assert nothing.fractions == {} and nothing.found is start and nothing.tests == 3


def test_the_specs_with_online_control_plan_every_epoch_with_that_planner() -> None:
    reference = _online_spec("fleet16-ramp-flash.yaml")
    found = 0
    for path in sorted(SPECS.glob("*.yaml")):
        if "online: true" not in path.read_text():
            continue
        for p in load_evaluation(path).planners:
            if p.kind == "energyopt":
                found += 1
                assert (p.solver, p.time_limit_s) == (reference.solver, reference.time_limit_s)
    assert found >= 4


def _ahead(**fields: Any) -> Evaluation:
    """An evaluation of a diurnal load over 60 s with plans made ahead, ``fields``
    set on top."""
    base: dict[str, Any] = {
        "kind": "evaluate",
        "name": "ahead",
        "base": "b.yaml",
        "load": DiurnalLoad(kind="diurnal"),
        "duration_s": 60.0,
        "plan_ahead": True,
    }
    return Evaluation(**(base | fields))


def test_an_early_plan_brings_its_new_instances_up_by_the_epoch_boundary() -> None:
    problem = two_workloads()
    ev = _ahead(
        epoch_s=30.0, transitions=Transitions(power_on_s=3.0, startup_s=1.0, load_gbps=10.0)
    )
    lead = epoch_lead_s(ev, problem)
    assert lead == pytest.approx(plan_lead_s(ev, problem)) and 4.0 < lead < 30.0
    arrivals = synthetic_arrivals(ev.load, problem.instance.workloads, ev.duration_s, 1)
    assert len(arrivals) > 0
    ready: dict[float, list[float]] = {}
    for early in (0.0, lead):
        sim = Simulator(
            problem, arrivals, window_s=60.0, tables=PassTables(problem), transitions=ev.transitions
        )
        asked: list[float] = []

        def replan(now: float, asked: list[float] = asked) -> Plan | None:
            asked.append(now)
            return split_plan(problem) if len(asked) == 1 else None

        sim.run(shared_plan(problem), epoch_s=30.0, replan=replan, epoch_lead_s=early)
        assert asked == [pytest.approx(30.0 - early)]
        # the split plan switches GPU 1 on: its instance is new
        ready[early] = [s.ready_s for s in sim.by_sid.values() if s.gpus == ["n0/1"]]
    assert ready[0.0] and min(ready[0.0]) > 30.0  # made at the boundary: up a lead late
    assert ready[lead] and max(ready[lead]) <= 30.0 + 1e-9  # made a lead early: up by then


def test_next_epoch_is_the_next_early_plan() -> None:
    assert next_epoch_s(10.0, 300.0) == 300.0
    assert next_epoch_s(290.0, 300.0, 13.0) == 587.0
    assert next_epoch_s(280.0, 300.0, 13.0) == 287.0
    assert next_epoch_s(0.0, 60.0, 13.0) == 47.0


def test_the_loop_plans_each_epoch_a_lead_early_for_the_epoch_it_serves() -> None:
    problem = two_workloads(rate_a=12.0, rate_b=6.0, gpus=3)
    load = DiurnalLoad(kind="diurnal", amplitude=0.5, period_s=240.0)
    fc = Forecast(method="trend", window_s=10.0, headroom=1.1, quantum=0.05)
    ev = _ahead(
        load=load,
        duration_s=120.0,
        epoch_s=40.0,
        forecast=fc,
        online=OnlineOptions(replan_on_surprise=False),
    )
    lead = epoch_lead_s(ev, problem)
    arrivals = synthetic_arrivals(load, problem.instance.workloads, ev.duration_s, 4)
    planner = make_planner(PlannerSpec(name="e", kind="energyopt"), problem, "e.yaml")
    assert planner is not None
    said: list[str] = []
    run = run_planner(ev, problem, arrivals, planner, PassTables(problem), said.append)
    times = [float(s.split("t=")[1].split(" s")[0]) for s in said if "re-planning" in s]
    assert times == [pytest.approx(40.0 - lead, abs=0.5), pytest.approx(80.0 - lead, abs=0.5)]
    # each plan was sized for the trend at the end of the epoch it serves, a lead
    # further ahead than a plan made at that time for one epoch
    base = np.asarray([w.rate_rps for w in problem.instance.workloads])
    differs = 0
    for k, t in enumerate(40.0 * np.arange(1, 3) - lead, start=1):
        ahead = planned_rates_rps(
            raw_rates_rps(arrivals, float(t), 40.0, fc, 120.0, lead), base, fc
        )
        plain = planned_rates_rps(raw_rates_rps(arrivals, float(t), 40.0, fc, 120.0), base, fc)
        assert run.tally.planned_rps[k] == pytest.approx(ahead.tolist(), rel=1e-9)
        differs += int(not np.allclose(ahead, plain))
    assert differs >= 1
    assert run.result.completed + run.result.unfinished + run.result.shed == run.result.arrived


def test_a_lead_not_shorter_than_the_epoch_is_refused() -> None:
    problem = two_workloads()
    ev = _ahead(epoch_s=5.0)
    with pytest.raises(SpecError):
        epoch_lead_s(ev, problem)
    assert epoch_lead_s(ev.model_copy(update={"plan_ahead": False}), problem) == 0.0


def test_a_plan_from_a_solve_its_time_limit_cut_is_counted_and_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the time limit (not the gap, a node limit or a proof) ends an epoch's
    solve, its plan depends on the machine's load: the planner flags it, the loop
    counts and says it, and the report notes it next to the run."""
    from dataclasses import replace

    from energyopt.families.serving import loop_report
    from energyopt.families.serving.solvers import solve as solve_module
    from energyopt.solvers.result import Termination

    real = solve_module.solve

    def cut(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        return replace(out, termination=Termination.TIME_LIMIT) if out.plan else out

    monkeypatch.setattr(solve_module, "solve", cut)
    problem = two_workloads(rate_a=12.0, rate_b=6.0, gpus=3)
    planner = make_planner(PlannerSpec(name="e", kind="energyopt"), problem, "e.yaml")
    assert isinstance(planner, SolverPlanner)
    planned = planner.plan({w.name: w.rate_rps for w in problem.instance.workloads})
    assert planned.plan is not None and planned.time_limited
    ev = _ahead(
        load=DiurnalLoad(kind="diurnal", amplitude=0.5, period_s=240.0),
        duration_s=80.0,
        epoch_s=40.0,
        online=OnlineOptions(replan_on_surprise=False),
    )
    arrivals = synthetic_arrivals(ev.load, problem.instance.workloads, ev.duration_s, 4)
    fresh = make_planner(PlannerSpec(name="e", kind="energyopt"), problem, "e.yaml")
    assert fresh is not None
    said: list[str] = []
    run = run_planner(ev, problem, arrivals, fresh, PassTables(problem), said.append)
    assert run.tally.time_limited_plans >= 2  # the first plan and the re-plan at 40 s
    assert sum("stopped on its time limit" in line for line in said) == (
        run.tally.time_limited_plans
    )
    res = EvaluationResult(ev, problem, arrivals, [run], [], [])
    assert any(
        f"{run.tally.time_limited_plans} epoch plans from a solve its time limit cut" in line
        for line in loop_report.format_table(res)
    )
