"""The two loads benchmarks/online.py adds to the bundled three (code-bursty on the
long-prompt code fleet, ramp+flash on fleet-16): their spec files load, a short
evaluation gives every workload an SLO attainment, and requests the online
control sheds count as misses in that attainment (sim/metrics.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from energyopt.catalog.problem import load_problem
from energyopt.families.serving.loop import evaluate
from energyopt.families.serving.loop_report import workload_attainment, workload_points
from energyopt.online import OnlineConfig, OnlinePolicy
from energyopt.sim.engine import Simulator
from energyopt.spec.evaluation import BurstyLoad, DiurnalLoad, PlannerSpec, load_evaluation
from tests.test_online import LOOKUPS, PROBLEM, TABLES, WINDOW_S, low_clock_plan, step_arrivals

ROOT = Path(__file__).resolve().parents[1]
EVALUATE = ROOT / "instances" / "evaluate"
CODE = EVALUATE / "fleet16-code-bursty.yaml"
RAMP = EVALUATE / "fleet16-ramp-flash.yaml"


def test_the_code_load_has_long_prompts_and_short_outputs() -> None:
    ev = load_evaluation(CODE)
    assert isinstance(ev.load, BurstyLoad)
    problem = load_problem(EVALUATE / ev.base)
    assert len(problem.gpus) == 16
    assert {problem.gpu_type(g.type).name for g in problem.gpus} == {
        "H100-SXM5-80GB",
        "A100-SXM4-80GB",
    }
    for w in problem.instance.workloads:
        assert w.prompt_tokens.mean >= 10 * w.output_tokens.mean, w.name


def test_the_ramp_load_climbs_across_the_window_with_one_flash_crowd() -> None:
    ev = load_evaluation(RAMP)
    load = ev.load
    assert isinstance(load, DiurnalLoad)
    # half a period in the window: from the trough to the peak
    assert load.period_s == pytest.approx(2 * ev.duration_s)
    (spike,) = load.spikes
    assert spike.factor >= 3.0
    assert spike.duration_s <= 120.0
    assert 0 < spike.at_s < ev.duration_s - spike.duration_s


def test_the_benchmark_rescales_the_ramp_to_its_duration() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from online import LOAD_NAMES, all_loads
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    loads = all_loads(300.0)
    assert [ld.name for ld in loads] == list(LOAD_NAMES)
    ramp = loads[-1].evaluation
    assert isinstance(ramp.load, DiurnalLoad)
    original = load_evaluation(RAMP)
    assert isinstance(original.load, DiurnalLoad)
    ratio = 300.0 / original.duration_s
    assert ramp.duration_s == 300.0
    assert ramp.load.period_s == pytest.approx((original.load.period_s or 0) * ratio)
    assert ramp.load.spikes[0].at_s == pytest.approx(original.load.spikes[0].at_s * ratio)
    assert ramp.load.spikes[0].duration_s == original.load.spikes[0].duration_s


@pytest.mark.parametrize("spec", [CODE, RAMP], ids=["code-bursty", "ramp+flash"])
def test_a_short_evaluation_gives_every_workload_its_attainment(spec: Path) -> None:
    planners = (
        PlannerSpec(name="performance-first", kind="performance-first"),
        PlannerSpec(name="frequency-only", kind="frequency-only"),
    )
    ev = load_evaluation(spec).model_copy(
        update={"duration_s": 90.0, "planners": planners, "drain_s": 60.0}
    )
    res = evaluate(ev, spec)
    names = [w.name for w in res.problem.instance.workloads]
    ref = next(r for r in res.runs if r.name == "performance-first")
    for run in res.runs:
        att = workload_attainment(run)
        assert list(att) == names
        for s in run.result.stats:
            assert s.arrived > 0, (run.name, s.name)
            assert 0.0 <= att[s.name] <= 1.0
            assert att[s.name] == s.met_slo / s.arrived
        points = workload_points(run, ref)
        assert set(points) == set(names)
    assert all(p == 0.0 for p in workload_points(ref, ref).values())


def test_shed_requests_count_as_misses() -> None:
    # a plan at the lowest clocks, 3x its load after STEP_S, no wake, no spill room
    # and a short queue bound: the online control sheds, and every shed request
    # lowers its workload's attainment as a miss would
    config = OnlineConfig(queue_factor=0.3, wake=False, shift=False)
    policy = OnlinePolicy(LOOKUPS, config)
    sim = Simulator(PROBLEM, step_arrivals(3.0), window_s=WINDOW_S, tables=TABLES, online=policy)
    res = sim.run(low_clock_plan(990))
    assert res.shed > 0
    for s in res.stats:
        assert s.met_slo <= s.arrived - s.shed
        assert s.slo_attainment == s.met_slo / s.arrived
        assert s.slo_attainment <= 1.0 - s.shed / s.arrived
    shed_workloads = [s for s in res.stats if s.shed]
    assert shed_workloads
    # the fleet-wide figure pools the same counts, shed requests included
    arrived = sum(s.arrived for s in res.stats)
    assert res.attainment[2] == sum(s.met_slo for s in res.stats) / arrived
    assert res.attainment[2] <= 1.0 - res.shed / arrived
