"""The plan's power is the power the simulator draws (docs/performance-model.md §5).

A placement's power in a plan is its op's power line (fixed part while placed plus
a part per req/s, ``perf.energy.power_line``); the simulator charges every decode
step and prefill chunk it runs. On a grid of (model, GPU type, clock, share, TP,
rate) points the two agree within 3 % of the GPU's board power, from half the
placement's top rate up to its capacity, and the steady-state curve the line is
drawn through agrees at every rate. Caps are held on the worst-case draw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from energyopt.catalog.problem import Problem, resolve
from energyopt.perf.energy import LINE_LOW_ANCHOR, power_line, steady_power_w
from energyopt.perf.oppoints import OpTable, build_op_table, op_spec, share_options
from energyopt.perf.params import OpParams, build_params
from energyopt.sim.engine import Simulator
from energyopt.sim.synthetic import poisson_arrivals
from energyopt.spec.instance import Instance
from energyopt.spec.plan import GpuPlan, Placement, Plan

TOLERANCE = 0.03
"""Plan against simulator, as a fraction of the GPUs' mean board power."""


@dataclass(frozen=True)
class Case:
    model: str
    prompt: int
    output: int
    gpu: str
    gpus: int
    tp: int | None
    levels: tuple[int, ...]


CASES = {
    "8B-H100": Case("Llama-3.1-8B", 1024, 256, "H100-SXM5-80GB", 1, None, (50, 100)),
    "7B-A100": Case("Mistral-7B", 512, 128, "A100-SXM4-80GB", 1, None, (100,)),
    "70B-H100-TP4": Case("Llama-2-70B", 1024, 256, "H100-SXM5-80GB", 4, 4, (100,)),
}


def problem_of(case: Case, rate_rps: float = 1.0) -> Problem:
    workload: dict[str, object] = {
        "name": "w",
        "model": case.model,
        "rate_rps": rate_rps,
        "prompt_tokens": {"mean": case.prompt},
        "output_tokens": {"mean": case.output},
        "slo": {"ttft_ms": 1500, "tbt_ms": 100, "percentile": 90},
    }
    if case.tp is not None:
        workload["tensor_parallel"] = [case.tp]
    inst = Instance.model_validate(
        {
            "name": "power-grid",
            "cluster": {
                "nodes": [{"name": "n0", "gpus": [{"type": case.gpu, "count": case.gpus}]}]
            },
            "workloads": [workload],
            "options": {
                "clock_count": 3,
                "sharing": {"mode": "mps", "levels_pct": list(case.levels)},
            },
        }
    )
    return resolve(inst)


def op_params(problem: Problem, table: OpTable, op: int) -> OpParams:
    gtype = problem.gpu_type(table.type_names[int(table.gpu_type[op])])
    k = int(table.tp[op])
    if k == 1:
        share = next(s for s in share_options(problem, gtype) if s[0] == int(table.share[op]))
    else:
        usable = gtype.memory_gb * (1 - problem.instance.options.memory_reserve_fraction)
        share = (100, None, 1.0, 1.0, usable)
    wl = problem.instance.workloads[0]
    return build_params([op_spec(problem, wl, "both", gtype, int(table.clock_mhz[op]), share, k)])


def simulated_draw_w(
    problem: Problem, table: OpTable, op: int, rate_rps: float, seconds: float, seed: int = 1
) -> tuple[float, float]:
    """(mean board power of the op's GPUs, their on-power) in a run of one
    placement at ``rate_rps`` with Poisson arrivals of mean-sized requests (W)."""
    k = int(table.tp[op])
    clock = int(table.clock_mhz[op])
    gtype = table.type_names[int(table.gpu_type[op])]
    used = [g.id for g in problem.gpus][:k]
    placement = Placement(
        workload="w",
        share_pct=int(table.share[op]) if k == 1 else 100,
        rate_rps=rate_rps,
        tp_group="g0" if k > 1 else None,
        tp_size=k,
    )
    gpus = tuple(
        GpuPlan(gpu=g.id, type=g.type, on=True, clock_mhz=clock, placements=(placement,))
        if g.id in used
        else GpuPlan(gpu=g.id, type=g.type, on=False)
        for g in problem.gpus
    )
    plan = Plan(instance=problem.instance.name, gpus=gpus)
    wl = problem.instance.workloads[0].model_copy(update={"rate_rps": rate_rps})
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals([wl], lambda t: np.ones_like(t), 1.0, seconds, 0.0, rng)
    res = Simulator(problem, arrivals, window_s=seconds).run(plan)
    drawn = sum(res.meter.gpus[g].window_j for g in used) / seconds
    return drawn, k * table.on_power[(gtype, clock)]


def grid_points() -> list[tuple[str, int]]:
    """(case, op) pairs: each case's lowest and highest clock at each share."""
    points = []
    for name, case in CASES.items():
        table = build_op_table(problem_of(case))
        for share in sorted(set(int(s) for s in table.share)):
            ops = [o for o in range(len(table)) if int(table.share[o]) == share]
            clocks = sorted(ops, key=lambda o: int(table.clock_mhz[o]))
            points += [(name, clocks[0]), (name, clocks[-1])]
    return points


@pytest.mark.parametrize(("name", "op"), grid_points())
def test_plan_power_is_the_simulated_draw(name: str, op: int) -> None:
    """At 50-95 % of capacity the op's power line (what the plan predicts and the
    solver pays) is the simulator's mean draw within 3 % of board power."""
    case = CASES[name]
    table = build_op_table(problem_of(case))
    cap = float(table.capacity_rps[op])
    # a workload arriving at the op's capacity: the line's top rate is its capacity
    problem = problem_of(case, rate_rps=cap)
    table = build_op_table(problem)
    assert table.top_rps(op) == pytest.approx(cap)
    for load in (LINE_LOW_ANCHOR, 0.7, 0.95):
        rate = load * cap
        drawn, on = simulated_draw_w(problem, table, op, rate, seconds=max(320.0, 400 / rate))
        predicted = on + table.power_w(op, rate)
        assert abs(predicted - drawn) <= TOLERANCE * drawn, (name, op, load, predicted, drawn)


@pytest.mark.parametrize("load", [0.05, 0.2])
def test_steady_power_holds_at_light_load(load: float) -> None:
    """Below the line's low anchor the plan over-charges (the line lies above the
    curve), and the steady-state curve itself still matches the simulator."""
    case = CASES["8B-H100"]
    problem = problem_of(case)
    table = build_op_table(problem)
    op = int(np.argmax(table.clock_mhz))
    cap = float(table.capacity_rps[op])
    rate = load * cap
    drawn, on = simulated_draw_w(problem, table, op, rate, seconds=1200.0)
    p = op_params(problem, table, op)
    model = on + float(steady_power_w(p, np.asarray([rate]))[0])
    assert abs(model - drawn) <= TOLERANCE * drawn
    line = power_line(p, np.asarray([cap]))
    assert on + float(line.at(np.asarray([rate]))[0]) >= drawn * (1 - TOLERANCE)


def test_power_line_passes_through_the_curve_and_lies_above_it_below() -> None:
    """Exact at its top rate and its low anchor, a fixed part that is never
    negative, and never below the steady-state curve under the low anchor."""
    problem = problem_of(CASES["8B-H100"])
    table = build_op_table(problem)
    params = OpParams.concat([op_params(problem, table, o) for o in range(len(table))])
    top = np.asarray(table.capacity_rps, dtype=np.float64)
    line = power_line(params, top)
    assert np.all(line.fixed_w >= 0) and np.all(line.marginal_j >= 0)
    for frac in (1.0, LINE_LOW_ANCHOR):
        curve = steady_power_w(params, frac * top)
        np.testing.assert_allclose(line.at(frac * top), curve, rtol=1e-9)
    for frac in (0.01, 0.1, 0.3):
        assert np.all(line.at(frac * top) >= steady_power_w(params, frac * top) * (1 - 1e-9))
    assert np.all(line.at(np.zeros_like(top)) == 0)


def test_line_is_drawn_at_the_workloads_rate_when_below_capacity() -> None:
    """A workload smaller than an op's capacity is priced where it will run: the
    line passes through the steady draw at the workload's rate."""
    case = CASES["8B-H100"]
    problem = problem_of(case, rate_rps=0.5)
    table = build_op_table(problem)
    op = int(np.argmax(table.clock_mhz))
    assert table.top_rps(op) == pytest.approx(0.5)
    p = op_params(problem, table, op)
    curve = float(steady_power_w(p, np.asarray([0.5]))[0])
    assert table.power_w(op, 0.5) == pytest.approx(curve, rel=1e-9)
    assert table.peak_power_w[op] > table.power_w(op, 0.5)


def test_simulated_draw_stays_under_the_caps_at_capacity() -> None:
    """Item 3 of the power model: a plan made under tight per-GPU caps, run with
    every placement at its SLO capacity (the most the router may send it), draws no
    more than each cap, in every 10-s bin of the simulated power meter."""
    from energyopt.catalog.problem import load_problem
    from energyopt.families.serving.solvers.solve import solve
    from energyopt.families.serving.verify import evaluate_plan
    from energyopt.solvers.presets import load_preset

    base = load_problem(_instance_path("quickstart.yaml"))
    data = base.instance.model_dump(mode="json", exclude_none=True)
    for node in data["cluster"]["nodes"]:
        node.pop("power_budget_w", None)
        for entry in node["gpus"]:
            entry["power_cap_w"] = 320.0
    problem = resolve(Instance.model_validate(data))
    plan = solve(problem, load_preset("highs-exact"), time_limit_s=60).plan
    assert plan is not None
    ev = evaluate_plan(problem, plan)
    assert not ev.violations
    assert max(ev.gpu_worst_w.values()) <= 320.0 * (1 + 1e-6)
    table = build_op_table(problem)
    at_capacity = []
    for gp in plan.gpus:
        placements = []
        for pl in gp.placements:
            ops = [
                o
                for o in range(len(table))
                if table.units[int(table.unit[o])].workload == pl.workload
                and table.type_names[int(table.gpu_type[o])] == gp.type
                and int(table.clock_mhz[o]) == gp.clock_mhz
                and int(table.share[o]) == pl.share_pct
                and int(table.tp[o]) == pl.tp_size
            ]
            assert len(ops) == 1
            placements.append(pl.model_copy(update={"rate_rps": float(table.capacity_rps[ops[0]])}))
        at_capacity.append(gp.model_copy(update={"placements": tuple(placements)}))
    full = plan.model_copy(update={"gpus": tuple(at_capacity)})
    rates: dict[str, float] = {}
    for gp in full.gpus:
        for pl in gp.placements:
            rates[pl.workload] = rates.get(pl.workload, 0.0) + pl.rate_rps
    workloads = [
        wl.model_copy(update={"rate_rps": rates[wl.name]}) for wl in problem.instance.workloads
    ]
    seconds = 320.0
    rng = np.random.default_rng(7)
    arrivals = poisson_arrivals(workloads, lambda t: np.ones_like(t), 1.0, seconds, 0.0, rng)
    sim = Simulator(problem, arrivals, window_s=seconds, record=True)
    res = sim.run(full)
    for gp in full.gpus:
        if not gp.on:
            continue
        bins = np.zeros(int(seconds // 10))
        for gpu, t0, t1, watts in res.meter.segments:
            if gpu != gp.gpu or t0 >= seconds:
                continue
            for b in range(int(t0 // 10), min(int(t1 // 10), len(bins) - 1) + 1):
                lo, hi = max(t0, 10.0 * b), min(t1, 10.0 * (b + 1), seconds)
                if hi > lo:
                    bins[b] += watts * (hi - lo) / 10.0
        # the first bin is the warm-up (an empty batch filling)
        assert bins[1:].max() <= ev.gpu_worst_w[gp.gpu] <= 320.0 * (1 + 1e-6), gp.gpu


def _instance_path(name: str) -> str:
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1] / "instances" / name)


def test_latency_margin_hedges_the_slos_not_the_power() -> None:
    """A latency margin plans as if passes were slower (lower capacities); the power
    at a rate is that of the modelled passes the GPU runs, with or without it."""
    problem = problem_of(CASES["8B-H100"])
    table = build_op_table(problem)
    op = int(np.argmax(table.clock_mhz))
    plain = op_params(problem, table, op)
    hedged = plain.replace(latency_margin=np.full_like(plain.latency_margin, 0.15))
    rates = np.asarray([0.5, 3.0, 8.0])
    both = OpParams.concat([plain, plain, plain])
    hedged3 = OpParams.concat([hedged, hedged, hedged])
    np.testing.assert_allclose(steady_power_w(hedged3, rates), steady_power_w(both, rates))
