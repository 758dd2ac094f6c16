"""Plan and instance reports: the figures ``energyopt show`` prints are the model's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from energyopt.catalog.problem import load_problem
from energyopt.families.serving.report import format_plan, format_problem
from energyopt.families.serving.verify import evaluate_plan
from energyopt.perf.oppoints import build_op_table
from energyopt.spec.plan import GpuPlan, Placement, Plan

QUICKSTART = Path(__file__).resolve().parents[1] / "instances" / "quickstart.yaml"


def test_show_gives_energy_per_request_at_the_top_rate_with_the_decode_loop() -> None:
    """Each unit's line shows its best op's power line at its top rate over that rate
    (J per request, the decode loop's fixed part shared by the requests it carries)
    and the same per output token; a unit far below the op's capacity pays more per
    request than the op's marginal energy."""
    problem = load_problem(QUICKSTART)
    table = build_op_table(problem)
    lines = format_problem(problem, table)
    below_capacity = 0
    for unit in table.units:
        ops = table.ops_of(unit.index)
        best = max(ops, key=lambda o: table.capacity_rps[o] / table.tp[o])
        top = table.top_rps(int(best))
        per_request = (float(table.fixed_w[best]) + float(table.marginal_j[best]) * top) / top
        tokens = problem.instance.workload(unit.workload).output_tokens.mean
        row = next(line for line in lines if line.strip().startswith(unit.label))
        assert f"{per_request:.1f} J/req" in row
        assert f"{per_request / tokens:.3f} J/token" in row
        if top < float(table.capacity_rps[best]):
            below_capacity += 1
            assert per_request > float(table.marginal_j[best]) * 1.05
    assert below_capacity > 0
    assert per_request == pytest.approx(table.power_w(int(best), top) / top)


def test_plan_report_shows_the_worst_case_draw_caps_are_checked_on() -> None:
    """Next to the predicted power at the planned rates, each GPU's line shows its
    worst-case draw (every placement at its SLO capacity), the figure the
    verifier holds against caps, limits and budgets; a lightly loaded GPU may draw
    far more than predicted."""
    problem = load_problem(QUICKSTART)
    gpu = problem.gpus[0]
    clock = problem.gpu_type(gpu.type).max_sm_clock_mhz
    plan = Plan(
        instance=problem.instance.name,
        gpus=(
            GpuPlan(
                gpu=gpu.id,
                type=gpu.type,
                on=True,
                clock_mhz=clock,
                placements=(Placement(workload="chat-llama", share_pct=100, rate_rps=1.0),),
            ),
        ),
    )
    ev = evaluate_plan(problem, plan)
    power, worst = ev.gpu_power_w[gpu.id], ev.gpu_worst_w[gpu.id]
    assert worst > power * 1.1
    lines = format_plan(problem, plan, ev)
    assert "worst case" in lines[0]
    row = next(line for line in lines if line.startswith(gpu.id))
    cells = re.split(r"\s{2,}", row)
    assert cells[3:5] == [f"{power:.0f} W", f"{worst:.0f} W"]
