"""The verifier catches every kind of broken plan, and the CLI reports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from energyopt.catalog import load_problem
from energyopt.cli import main
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import verify_plan
from energyopt.solvers.presets import load_preset
from energyopt.spec import GpuPlan, Placement, Plan

from .conftest import INSTANCES

QUICKSTART = INSTANCES / "quickstart.yaml"


@pytest.fixture(scope="module")
def solved() -> tuple:
    problem = load_problem(QUICKSTART)
    result = solve(problem, load_preset("highs-exact"))
    assert result.plan is not None
    return problem, result.plan


def replace_gpu(plan: Plan, gpu_id: str, **changes) -> Plan:
    gpus = tuple(g.model_copy(update=changes) if g.gpu == gpu_id else g for g in plan.gpus)
    return plan.model_copy(update={"gpus": gpus})


def scale_first_rate(plan: Plan, factor: float) -> Plan:
    """The plan with the first placement of the first busy GPU at ``factor`` x its rate."""
    g = first_busy(plan)
    pl = g.placements[0]
    scaled = pl.model_copy(update={"rate_rps": pl.rate_rps * factor})
    return replace_gpu(plan, g.gpu, placements=(scaled, *g.placements[1:]))


def first_busy(plan: Plan) -> GpuPlan:
    return next(g for g in plan.gpus if g.on and g.placements)


def kinds(problem, plan) -> set[str]:
    return {v.kind for v in verify_plan(problem, plan)}


def test_solver_plan_is_clean(solved) -> None:
    problem, plan = solved
    assert verify_plan(problem, plan) == []


def test_over_subscribed_share_fails(solved) -> None:
    problem, plan = solved
    g = first_busy(plan)
    extra = Placement(workload=g.placements[0].workload, phase="both", share_pct=100, rate_rps=0.0)
    other = next(p for p in plan.gpus if p.gpu != g.gpu and p.on and p.placements)
    moved = other.placements[0].model_copy(update={"share_pct": 75})
    bad = replace_gpu(plan, g.gpu, placements=(*g.placements, moved))
    assert "share" in kinds(problem, bad) or "demand" in kinds(problem, bad)
    bad2 = replace_gpu(
        plan,
        g.gpu,
        placements=(
            g.placements[0].model_copy(update={"share_pct": 100}),
            extra.model_copy(update={"workload": "summarize-qwen", "share_pct": 50}),
        ),
    )
    assert "share" in kinds(problem, bad2)


def test_exceeded_power_limit_fails(solved) -> None:
    problem, plan = solved
    g = first_busy(plan)
    low = problem.gpu_type(g.type).power_limit_min_w
    bad = replace_gpu(plan, g.gpu, power_limit_w=low)
    if g.predicted_power_w > low:
        assert "power-limit" in kinds(problem, bad)
    too_high = replace_gpu(plan, g.gpu, power_limit_w=10_000.0)
    assert "power-limit" in kinds(problem, too_high)


def test_unserved_rate_fails(solved) -> None:
    problem, plan = solved
    assert "demand" in kinds(problem, scale_first_rate(plan, 0.5))


def test_rate_beyond_slo_capacity_fails(solved) -> None:
    problem, plan = solved
    bad = scale_first_rate(plan, 5.0)
    assert kinds(problem, bad) & {"ttft", "tbt", "capacity", "batch"}


def test_unsupported_clock_and_off_gpu_with_work_fail(solved) -> None:
    problem, plan = solved
    g = first_busy(plan)
    assert "clock" in kinds(problem, replace_gpu(plan, g.gpu, clock_mhz=1234))
    assert "off-gpu-work" in kinds(problem, replace_gpu(plan, g.gpu, on=False))


def test_budget_violation_fails(solved) -> None:
    problem, plan = solved
    node = problem.instance.cluster.nodes[0]
    tight = problem.instance.model_copy(
        update={
            "cluster": problem.instance.cluster.model_copy(
                update={"nodes": (node.model_copy(update={"power_budget_w": 100.0}),)}
            )
        }
    )
    from energyopt.catalog import resolve

    assert "node-budget" in kinds(resolve(tight), plan)


def test_a_cap_below_the_worst_case_draw_fails(solved) -> None:
    """Caps hold the worst-case draw (every placement at its SLO capacity), not the
    predicted power at the planned rates: a cap between the two is broken."""
    from energyopt.catalog import resolve
    from energyopt.families.serving.verify import evaluate_plan

    problem, plan = solved
    ev = evaluate_plan(problem, plan)
    gid = max(ev.gpu_worst_w, key=lambda g: ev.gpu_worst_w[g] - ev.gpu_power_w[g])
    predicted, worst = ev.gpu_power_w[gid], ev.gpu_worst_w[gid]
    assert worst > predicted + 1.0
    cap = (predicted + worst) / 2
    node = problem.instance.cluster.nodes[0]
    (entry,) = node.gpus
    entries = tuple(
        entry.model_copy(
            update={"count": 1, "ids": [g.id], "power_cap_w": cap if g.id == gid else None}
        )
        for g in problem.gpus
    )
    capped = problem.instance.model_copy(
        update={
            "cluster": problem.instance.cluster.model_copy(
                update={"nodes": (node.model_copy(update={"gpus": entries}),)}
            )
        }
    )
    violations = verify_plan(resolve(capped), plan)
    assert [v.where for v in violations if v.kind == "power-cap"] == [gid]
    assert "worst-case" in next(v.message for v in violations if v.kind == "power-cap")


def test_cli_solve_then_verify_round_trip(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert main(["solve", str(QUICKSTART), "-q", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GPUs on:" in text and "gap" in text and "MHz" in text
    assert main(["verify", str(QUICKSTART), str(out)]) == 0
    data = json.loads(out.read_text())
    data["gpus"][0]["clock_mhz"] = 1234
    data["gpus"][0]["on"] = True
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    assert main(["verify", str(QUICKSTART), str(broken)]) == 1
    err = capsys.readouterr().err
    assert "violation" in err and "Traceback" not in err


def test_cli_infeasible_exit_code_and_diagnosis(capsys) -> None:
    assert main(["solve", str(INSTANCES / "infeasible.yaml"), "-q"]) == 3
    err = capsys.readouterr().err
    assert "chat" in err and "req/s" in err
