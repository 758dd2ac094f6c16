"""Consolidation on a drop (families/serving/loop.py, online/surprise.py,
online/headroom.py): the lower band fires on a drop and stays quiet within the
planned rate's noise; a consolidation re-plan for half the load turns GPUs off and
keeps the SLO capacity for the observed rate; a re-plan whose saving until the next
epoch does not pay its transitions is not applied."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from energyopt.catalog.problem import Problem
from energyopt.families.serving import loop
from energyopt.families.serving.loop import (
    CONSOLIDATION_PENALTY_W,
    PlannerRun,
    burst_ratio,
    consolidation_rates_rps,
    consolidation_saving_j,
    consolidation_transition_j,
    drop_band,
    run_planner,
    top_capacity_rps,
)
from energyopt.families.serving.planners import make_planner
from energyopt.families.serving.remap import plan_rates_rps
from energyopt.families.serving.solvers.replan import replan, target_problem
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import verify_plan
from energyopt.online import OpLookups
from energyopt.online.headroom import ErrorHeadroom
from energyopt.online.surprise import SurpriseConfig, SurpriseDetector
from energyopt.perf.power import gpu_on_power_w
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.passes import PassTables
from energyopt.sim.synthetic import synthetic_arrivals
from energyopt.solvers.presets import load_preset
from energyopt.spec.evaluation import (
    DiurnalLoad,
    Evaluation,
    Forecast,
    OnlineOptions,
    PlannerSpec,
    Spike,
    Transitions,
)
from energyopt.spec.plan import Plan
from tests.test_sim_engine import two_workloads


def test_drop_band_fires_where_a_plan_made_now_would_route_less() -> None:
    spread = np.asarray([0.0, 0.25, 1.0])
    band = drop_band(spread, 0.25)
    assert band == pytest.approx(1.0 - 0.75 / (1.0 + spread))
    planned = 20.0
    # at the band's limit, observed x (1 + spread) is 0.75 x the planned rate
    assert planned * (1.0 - band) * (1.0 + spread) == pytest.approx([15.0, 15.0, 15.0])
    with pytest.raises(ValueError, match="below"):
        drop_band(spread, 1.0)


def test_error_headroom_knows_a_workload_once_it_has_its_samples() -> None:
    errors = ErrorHeadroom(2, min_samples=5)
    assert not errors.known().any()
    errors.record(np.asarray([10.0, 0.0]), np.full((6, 2), 9.0))  # b forecast at 0: no samples
    assert errors.known().tolist() == [True, False]


def test_burst_ratio_is_the_highest_short_window_over_the_median_level() -> None:
    # workload 0: 2 req/s for 30 s, then a 5-s burst at 10 req/s inside a 30-s window
    # of 2 req/s otherwise; workload 1: nothing
    times = np.concatenate([np.arange(0.0, 30.0, 0.5), np.arange(30.0, 50.0, 0.5)])
    times = np.sort(np.concatenate([times, np.arange(50.0, 55.0, 0.1), np.arange(55.0, 60.0, 0.5)]))
    arrivals = Arrivals(
        times,
        np.zeros(len(times), dtype=np.int64),
        np.full(len(times), 100, dtype=np.int64),
        np.full(len(times), 10, dtype=np.int64),
        ("a", "b"),
    )
    ratio = burst_ratio(arrivals, 0.0, 60.0, 5.0, 30.0)
    level = float(np.median([2.0, 100 / 30.0]))  # the 30-s windows: 60, then 40 + 50 + 10
    assert ratio[0] == pytest.approx(10.0 / level)
    assert ratio[1] == 1.0
    assert burst_ratio(arrivals, 0.0, 20.0, 5.0, 30.0).tolist() == [1.0, 1.0]  # no whole window


def _poisson_rates(rng: np.random.Generator, rate: float, window_s: float, n: int) -> list[float]:
    """``n`` rates (req/s) counted over ``window_s`` at a true ``rate`` (independent
    windows: each check sees a fresh count)."""
    return (rng.poisson(rate * window_s, size=n) / window_s).tolist()


def test_lower_band_fires_on_a_drop_and_not_within_noise() -> None:
    config = SurpriseConfig(surprise_s=10.0, cooldown_s=60.0, window_s=5.0)
    det = SurpriseDetector(1, config)
    det.set_plan([20.0], None, [0.2])  # no upper band: only drops fire
    low, high = det.band()
    assert high[0] == np.inf
    assert low[0] == pytest.approx(20.0 * 0.8 - 1.28 * np.sqrt(20.0 / 5.0))
    rng = np.random.default_rng(7)
    # 30 minutes at the planned rate, a check per second: the noise stays in band
    for t, rate in enumerate(_poisson_rates(rng, 20.0, 5.0, 1800)):
        assert det.update(float(t), [rate]) == []
    # far above the plan is no drop either
    assert all(det.update(1800.0 + t, [60.0]) == [] for t in range(30))
    # the load halves: it fires once out of band for 10 s, then not within the cooldown
    fired = [
        t
        for t, rate in enumerate(_poisson_rates(rng, 10.0, 5.0, 70), start=1900)
        if det.update(float(t), [rate])
    ]
    assert fired == [1910]


@cache
def fleet() -> tuple[Problem, Plan]:
    """Six H100s, workloads a (36 req/s) and b (20 req/s), and their exact plan."""
    problem = two_workloads(rate_a=36.0, rate_b=20.0, gpus=6)
    result = solve(problem, load_preset("highs-exact"))
    assert result.plan is not None
    return problem, result.plan


def test_a_consolidation_for_half_the_load_turns_gpus_off_and_keeps_slo_capacity() -> None:
    problem, plan = fleet()
    routed = plan_rates_rps(plan)
    names = ["a", "b"]
    observed = np.asarray([routed[n] / 2.0 for n in names])  # req/s over the last 15 s
    want = consolidation_rates_rps(
        observed, 15.0, np.asarray([0.1, 0.1]), np.zeros(2), np.asarray([0.01, 0.01]), 1.28
    )
    noisy = observed + 1.28 * np.sqrt(observed / 15.0)
    assert want == pytest.approx(noisy * 1.1)
    assert (want < np.asarray([routed[n] for n in names])).all()
    rates = {n: float(want[k]) for k, n in enumerate(names)}
    out = replan(problem, plan, rates, migration_penalty_w=CONSOLIDATION_PENALTY_W)
    assert out.plan is not None and out.power_w is not None
    # fewer GPUs on, and every workload's SLO holds at the consolidation rate
    assert sum(gp.on for gp in out.plan.gpus) < sum(gp.on for gp in plan.gpus)
    assert verify_plan(target_problem(problem, plan, rates), out.plan) == []
    after = plan_rates_rps(out.plan)
    assert after["a"] == pytest.approx(rates["a"]) and after["b"] == pytest.approx(rates["b"])
    # the saving over a long rest of the epoch pays the transitions, a short one does not
    ev = Evaluation(
        kind="evaluate", name="c", base="b.yaml", load=DiurnalLoad(kind="diurnal"), duration_s=60
    )
    per_s = consolidation_saving_j(problem, plan, out.plan, out.power_w, 1.0)
    assert per_s > 0
    cost = consolidation_transition_j(problem, ev, plan, out.plan)
    assert cost > 0  # the GPUs switched off draw until their admitted requests finish
    assert per_s * 300.0 > cost > per_s * 1.0


def test_top_capacity_is_each_placements_slo_capacity_at_the_highest_clock() -> None:
    problem, plan = fleet()
    lookups = OpLookups.build(problem)
    top = top_capacity_rps(lookups, plan)
    routed = plan_rates_rps(plan)
    for name, rate in routed.items():
        expected = sum(
            max(
                lookups.capacity_rps(
                    p.workload, gp.type, max(lookups.clocks[gp.type]), p.share_pct
                ),
                p.rate_rps,
            )
            for gp in plan.gpus
            if gp.on
            for p in gp.placements
            if p.workload == name
        )
        assert top[name] == pytest.approx(expected)
        assert top[name] >= rate
    # the plan runs below the top clock, so the boosts reach beyond the planned rates
    assert sum(top.values()) > sum(routed.values())


def test_transition_energy_is_power_on_load_and_drain() -> None:
    problem, plan = fleet()
    on = [gp for gp in plan.gpus if gp.on]
    off = [gp for gp in plan.gpus if not gp.on]
    assert on and off
    gtype = problem.gpu_type(on[0].type)
    tr = Transitions(power_on_s=10.0, startup_s=2.0, load_gbps=20.0)
    ev = Evaluation(
        kind="evaluate",
        name="c",
        base="b.yaml",
        load=DiurnalLoad(kind="diurnal"),
        duration_s=60,
        transitions=tr,
    )
    # one GPU switched off: its on-power until its slowest workload's request finishes
    first = on[0]
    switched_off = plan.model_copy(
        update={
            "gpus": tuple(
                gp.model_copy(update={"on": False, "placements": ()}) if gp is first else gp
                for gp in plan.gpus
            )
        }
    )
    wl = {w.name: w for w in problem.instance.workloads}
    drain = max(
        (wl[p.workload].slo.ttft_ms + wl[p.workload].output_tokens.mean * wl[p.workload].slo.tbt_ms)
        / 1e3
        for p in first.placements
    )
    assert first.clock_mhz is not None
    expected = gpu_on_power_w(gtype, first.clock_mhz) * drain
    assert consolidation_transition_j(problem, ev, plan, switched_off) == pytest.approx(expected)
    # the reverse: a GPU switched on idles for power_on_s, then loads its weights
    weights = max(problem.model_of(wl[p.workload]).weight_bytes for p in first.placements)
    load_s = 2.0 + weights / 20e9
    back = gtype.idle_w * 10.0 + gpu_on_power_w(gtype, first.clock_mhz) * load_s
    assert consolidation_transition_j(problem, ev, switched_off, plan) == pytest.approx(back)
    assert consolidation_transition_j(problem, ev, plan, plan) == 0.0


def _drop_run(consolidate: bool) -> PlannerRun:
    """The loop on six H100s whose load falls to 0.3x 10 s into its second epoch."""
    problem = two_workloads(rate_a=36.0, rate_b=20.0, gpus=6)
    load = DiurnalLoad(
        kind="diurnal", amplitude=0.0, spikes=(Spike(at_s=110.0, duration_s=90.0, factor=0.3),)
    )
    ev = Evaluation(
        kind="evaluate",
        name="drop",
        base="base.yaml",
        load=load,
        duration_s=200.0,
        epoch_s=100.0,
        forecast=Forecast(method="trend", window_s=10.0, headroom=1.1, quantum=0.05),
        online=OnlineOptions(consolidate_on_drop=consolidate, max_headroom=1.5),
    )
    arrivals = synthetic_arrivals(load, problem.instance.workloads, ev.duration_s, 3)
    spec = PlannerSpec(name="online", kind="energyopt", online=True)
    planner = make_planner(spec, problem, "eval.yaml")
    assert planner is not None
    return run_planner(
        ev, problem, arrivals, planner, PassTables(problem, 4096), lookups=OpLookups.build(problem)
    )


def _on_at(run: PlannerRun, t: float) -> int:
    """GPUs on at ``t`` (s) in ``run``'s simulation."""
    return [n for start, n in run.result.gpus_on if start <= t][-1]


@cache
def drop_run(consolidate: bool) -> PlannerRun:
    return _drop_run(consolidate)


def test_the_loop_consolidates_after_a_drop_only_when_asked() -> None:
    on, off = drop_run(True), drop_run(False)
    assert off.tally.consolidations == 0 and off.tally.consolidation_s == []
    assert on.tally.consolidations >= 1
    assert on.tally.consolidation_saved_j > on.tally.consolidation_cost_j > 0
    # after the drop the consolidated run has fewer GPUs on than the epoch plan kept
    assert _on_at(on, 190.0) < _on_at(off, 190.0)
    assert on.result.energy_j < off.result.energy_j
    for run in (on, off):
        res = run.result
        assert res.completed + res.unfinished + res.shed == res.arrived


def test_no_consolidation_when_the_saving_does_not_pay(monkeypatch: pytest.MonkeyPatch) -> None:
    # transitions dearer than any saving the rest of the epoch can hold
    monkeypatch.setattr(loop, "consolidation_transition_j", lambda *a, **k: 1e12)
    run = _drop_run(True)
    assert run.tally.consolidations == 0
    assert run.tally.consolidations_declined >= 1
    assert len(run.tally.consolidation_s) == (
        run.tally.consolidations_declined + run.tally.consolidations_failed
    )
