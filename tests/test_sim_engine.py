"""The simulator: request conservation, energy accounting, and SLOs of verified
versus over-subscribed plans at their planned load."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.catalog import Problem, resolve
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.tables import scaled_problem
from energyopt.families.serving.verify import verify_plan
from energyopt.perf.power import gpu_on_power_w
from energyopt.sim.arrivals import Arrivals
from energyopt.sim.engine import Simulator
from energyopt.sim.passes import PassTables
from energyopt.sim.synthetic import poisson_arrivals
from energyopt.solvers.presets import load_preset
from energyopt.spec import Instance
from energyopt.spec.evaluation import Transitions
from energyopt.spec.plan import GpuPlan, Placement, Plan

H100 = "H100-SXM5-80GB"


def two_workloads(rate_a: float = 4.0, rate_b: float = 2.0, gpus: int = 2) -> Problem:
    data = {
        "name": "sim-tiny",
        "cluster": {"nodes": [{"name": "n0", "gpus": [{"type": H100, "count": gpus}]}]},
        "workloads": [
            {
                "name": "a",
                "model": "Llama-3.1-8B",
                "rate_rps": rate_a,
                "prompt_tokens": {"mean": 512},
                "output_tokens": {"mean": 128},
                "slo": {"ttft_ms": 400, "tbt_ms": 50},
            },
            {
                "name": "b",
                "model": "Mistral-7B",
                "rate_rps": rate_b,
                "prompt_tokens": {"mean": 1024},
                "output_tokens": {"mean": 64},
                "slo": {"ttft_ms": 600, "tbt_ms": 60},
            },
        ],
        "options": {
            "clocks_mhz": {H100: [990, 1410, 1980]},
            "sharing": {"mode": "mps", "levels_pct": [50, 100]},
        },
    }
    return resolve(Instance.model_validate(data), "sim-tiny")


def shared_plan(problem: Problem, clock: int = 1980) -> Plan:
    """Both workloads on GPU 0 at 50 % each; GPU 1 off."""
    a, b = (w.rate_rps for w in problem.instance.workloads)
    return Plan(
        instance="sim-tiny",
        gpus=(
            GpuPlan(
                gpu="n0/0",
                type=H100,
                on=True,
                clock_mhz=clock,
                power_limit_w=700,
                placements=(
                    Placement(workload="a", share_pct=50, rate_rps=a),
                    Placement(workload="b", share_pct=50, rate_rps=b),
                ),
            ),
            GpuPlan(gpu="n0/1", type=H100, on=False),
        ),
    )


def split_plan(problem: Problem) -> Plan:
    """One workload per GPU, lower clock."""
    a, b = (w.rate_rps for w in problem.instance.workloads)
    return Plan(
        instance="sim-tiny",
        gpus=(
            GpuPlan(
                gpu="n0/0",
                type=H100,
                on=True,
                clock_mhz=1410,
                power_limit_w=700,
                placements=(Placement(workload="b", rate_rps=b),),
            ),
            GpuPlan(
                gpu="n0/1",
                type=H100,
                on=True,
                clock_mhz=1410,
                power_limit_w=700,
                placements=(Placement(workload="a", rate_rps=a),),
            ),
        ),
    )


def random_arrivals(seed: int, n: int, window_s: float) -> Arrivals:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.random(n) * window_s)
    return Arrivals(
        t,
        rng.integers(0, 2, n).astype(np.int64),
        rng.integers(1, 3000, n).astype(np.int64),
        rng.integers(1, 300, n).astype(np.int64),
        ("a", "b"),
    )


PROBLEM = two_workloads()
TABLES = PassTables(PROBLEM)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(0, 120), replan_at=st.floats(1.0, 29.0))
def test_every_request_completes_exactly_once_across_replans(
    seed: int, n: int, replan_at: float
) -> None:
    arrivals = random_arrivals(seed, n, 30.0)
    sim = Simulator(
        PROBLEM,
        arrivals,
        window_s=30.0,
        drain_s=600.0,
        tables=TABLES,
        transitions=Transitions(power_on_s=2.0, startup_s=0.5),
    )
    plans = iter([split_plan(PROBLEM), shared_plan(PROBLEM, 990)])

    def replan(now: float) -> Plan | None:
        return next(plans, None)

    res = sim.run(shared_plan(PROBLEM), epoch_s=replan_at / 2, replan=replan)
    assert res.arrived == n
    assert res.completed == n
    assert res.unfinished == 0
    assert all(sim.req.done)
    assert sum(s.completed for s in res.stats) == n
    assert sum(len(s.ttft_ms) for s in res.stats) == n
    # every output token after the first is one recorded gap
    assert sum(s.tbt_gaps for s in res.stats) == int((arrivals.output_tokens - 1).sum())


def test_energy_is_the_integral_of_power() -> None:
    arrivals = random_arrivals(3, 200, 40.0)
    sim = Simulator(
        PROBLEM,
        arrivals,
        window_s=40.0,
        drain_s=600.0,
        tables=TABLES,
        bin_s=1.0,
        record=True,
        transitions=Transitions(power_on_s=2.0, clock_change_ms=30.0),
    )
    plans = iter([split_plan(PROBLEM)])
    res = sim.run(shared_plan(PROBLEM), epoch_s=15.0, replan=lambda now: next(plans, None))
    segments = res.meter.segments
    integral = sum((t1 - t0) * w for _, t0, t1, w in segments)
    assert integral == pytest.approx(res.energy_total_j, rel=1e-9)
    assert sum(res.power_w) * res.bin_s == pytest.approx(res.energy_total_j, rel=1e-9)
    inside = sum(
        w * (min(t1, 40.0) - t0) if t1 > t0 else 0.0 for _, t0, t1, w in segments if t0 < 40.0
    )
    assert inside == pytest.approx(res.energy_j, rel=1e-9)
    # the static part: GPU 0 on for the whole run, GPU 1 off until 15 s, then
    # idle while powering on (2 s), then on at 1410 MHz
    gpu = PROBLEM.gpu_type(H100)
    end = res.end_s
    static = (
        gpu_on_power_w(gpu, 1980) * 15.0
        + gpu_on_power_w(gpu, 1410) * (end - 15.0)
        + gpu.idle_w * 2.0
        + gpu_on_power_w(gpu, 1410) * (end - 17.0)
    )
    got = sum(e.static_j for e in res.meter.gpus.values())
    assert got == pytest.approx(static, rel=1e-9)
    assert res.meter.gpus["n0/1"].dynamic_j > 0  # it served after the re-plan


def solved(problem: Problem) -> Plan:
    result = solve(problem, load_preset("highs-exact"), time_limit_s=30)
    assert result.plan is not None
    return result.plan


def steady_arrivals(problem: Problem, duration_s: float, seed: int) -> Arrivals:
    """Poisson arrivals at the workloads' rates, every request of the mean size."""
    rng = np.random.default_rng(seed)
    return poisson_arrivals(
        problem.instance.workloads, lambda t: np.ones_like(t), 1.0, duration_s, 0.0, rng
    )


def test_verified_plan_meets_its_slos_and_oversubscribed_plan_does_not() -> None:
    problem = two_workloads(rate_a=6.0, rate_b=2.5, gpus=2)
    plan = solved(problem)
    assert verify_plan(problem, plan) == []
    res = Simulator(problem, steady_arrivals(problem, 400.0, 5), window_s=400.0).run(plan)
    for stats in res.stats:
        assert stats.meets_percentiles(), (stats.name, stats.ttft_percentile_ms(0.9))
    # the same plan with more load on every placement than its GPU can serve
    for factor in (1.5, 2.0, 3.0, 4.0, 6.0):
        heavy = scaled_problem(problem, {"a": factor, "b": factor})
        over = scaled_plan(plan, factor)
        if {v.kind for v in verify_plan(heavy, over)} & {"capacity", "ttft", "tbt"}:
            break
    else:
        pytest.fail("no load factor over-subscribes the plan")
    res = Simulator(heavy, steady_arrivals(heavy, 400.0, 5), window_s=400.0).run(over)
    assert not all(s.meets_percentiles() for s in res.stats)


@pytest.mark.parametrize(("rate_a", "rate_b"), [(6.0, 2.5), (1.0, 0.5)])
def test_power_limits_sit_above_the_simulated_draw_at_the_planned_load(
    rate_a: float, rate_b: float
) -> None:
    # The executor sets each GPU's power limit from the plan; one below what the GPU
    # draws would throttle its locked clock. The limit comes from the worst-case draw
    # (every placement at capacity), and the predicted power at the planned load is
    # the draw (each slice's decode loop charged whatever its rate; the former
    # per-request form put the draw 60-80 % above the prediction here).
    problem = two_workloads(rate_a=rate_a, rate_b=rate_b, gpus=2)
    plan = solved(problem)
    duration = 300.0
    res = Simulator(problem, steady_arrivals(problem, duration, 5), window_s=duration).run(plan)
    on = [g for g in plan.gpus if g.on]
    assert on
    for g in on:
        draw_w = res.meter.gpus[g.gpu].window_j / duration
        assert g.power_limit_w is not None and draw_w <= g.power_limit_w, (g.gpu, draw_w)
        assert abs(draw_w - g.predicted_power_w) <= 0.03 * draw_w, (g.gpu, draw_w)


def scaled_plan(plan: Plan, factor: float) -> Plan:
    """``plan`` with every placement's rate multiplied by ``factor``."""
    gpus = tuple(
        gp.model_copy(
            update={
                "placements": tuple(
                    p.model_copy(update={"rate_rps": factor * p.rate_rps}) for p in gp.placements
                )
            }
        )
        for gp in plan.gpus
    )
    return plan.model_copy(update={"gpus": gpus})


def test_disaggregated_requests_pass_from_prefill_to_decode_instances() -> None:
    data = {
        "name": "disagg",
        "cluster": {"nodes": [{"name": "n0", "gpus": [{"type": H100, "count": 2}]}]},
        "workloads": [
            {
                "name": "a",
                "model": "Llama-3.1-8B",
                "rate_rps": 3.0,
                "prompt_tokens": {"mean": 512},
                "output_tokens": {"mean": 128},
                "slo": {"ttft_ms": 400, "tbt_ms": 50},
                "disaggregated": True,
            }
        ],
        "options": {"clocks_mhz": {H100: [1410, 1980]}},
    }
    problem = resolve(Instance.model_validate(data), "disagg")
    plan = solved(problem)
    assert {p.phase for gp in plan.gpus for p in gp.placements} == {"prefill", "decode"}
    rng = np.random.default_rng(2)
    arrivals = Arrivals(
        np.sort(rng.random(90) * 30.0),
        np.zeros(90, dtype=np.int64),
        rng.integers(1, 2000, 90).astype(np.int64),
        rng.integers(1, 200, 90).astype(np.int64),
        ("a",),
    )
    res = Simulator(problem, arrivals, window_s=30.0, drain_s=300.0).run(plan)
    assert res.completed == res.arrived == 90
    assert res.stats[0].tbt_gaps == int((arrivals.output_tokens - 1).sum())
    assert res.stats[0].tbt_attainment > 0.9
