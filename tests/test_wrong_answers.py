"""Regressions for wrong answers: mixed-cap tensor-parallel groups, stated objectives
that are not the plan's cost, and instances the solvers cannot use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.catalog import resolve
from energyopt.cli import main
from energyopt.families import Stated, check_stated, family
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from energyopt.spec import Instance
from energyopt.spec.errors import SpecError
from tests.serving_exhaustive import exhaustive_optimum

H100 = "H100-SXM5-80GB"
ROOT = Path(__file__).resolve().parents[1]


def tp_pair(caps: tuple[float | None, float | None]) -> dict[str, Any]:
    """A 70B model that needs a TP group of 2 on a node of two H100s with these caps."""
    gpus = []
    for i, cap in enumerate(caps):
        entry: dict[str, Any] = {"type": H100, "ids": [f"g{i}"]}
        if cap is not None:
            entry["power_cap_w"] = cap
        gpus.append(entry)
    return {
        "name": "tp-mixed-caps",
        "cluster": {"nodes": [{"name": "n0", "gpus": gpus}]},
        "workloads": [
            {
                "name": "big",
                "model": "Llama-3.1-70B",
                "rate_rps": 0.8,
                "prompt_tokens": {"mean": 512},
                "output_tokens": {"mean": 128},
                "slo": {"ttft_ms": 3000, "tbt_ms": 150},
                "tensor_parallel": [2],
            }
        ],
        "options": {"clocks_mhz": {H100: [1200, 1980]}},
    }


@pytest.mark.parametrize("name", ["highs-exact", "highs-per-gpu", "cpsat", "shadow-price", "pop"])
def test_gpus_with_different_caps_form_one_tp_group(name: str) -> None:
    problem = resolve(Instance.model_validate(tp_pair((500.0, None))), "tp-mixed-caps")
    optimum = exhaustive_optimum(problem).value
    assert optimum is not None
    res = solve(problem, load_preset(name), time_limit_s=30)
    assert res.plan is not None, res.log
    groups = {p.tp_group for g in res.plan.gpus for p in g.placements}
    assert len(groups) == 1 and None not in groups
    assert res.objective == pytest.approx(optimum, rel=1e-3)
    assert res.bound is not None and res.bound <= optimum * (1 + 1e-6)
    # The group is limited by its tightest member: no member over its own cap.
    ev = evaluate_plan(problem, res.plan)
    assert ev.violations == []
    assert ev.gpu_power_w["g0"] <= 500.0 * (1 + 1e-6)


def test_a_cap_that_leaves_no_room_makes_the_tp_group_infeasible() -> None:
    """The tighter member's cap binds: a cap just above the GPU's on-power at the lowest
    candidate clock leaves no rate for the group, so the only unit has nowhere to run."""
    data = tp_pair((201.0, None))
    data["options"]["clocks_mhz"] = {H100: [1980]}
    problem = resolve(Instance.model_validate(data), "tight")
    assert exhaustive_optimum(problem).value is None
    res = solve(problem, load_preset("highs-exact"), time_limit_s=30)
    assert res.status == INFEASIBLE and res.plan is None
    assert res.diagnosis


def test_an_infeasible_instance_is_proven_infeasible_by_bnp_and_highs_exact() -> None:
    """MIG A100s with three times the bundled token counts: no combination of MIG
    instances hosts all three workloads (an exhaustive enumeration finds none, in about
    15 s). Every node LP of the tree still leaned on artificial demand, so the tree
    alone ended on its node limit with no plan; branch-and-price must say infeasible,
    as highs-exact does, not "no solution"."""
    data = yaml.safe_load((ROOT / "instances" / "mig-a100.yaml").read_text())
    for wl in data["workloads"]:
        for key in ("prompt_tokens", "output_tokens"):
            wl[key]["mean"] *= 3
    problem = resolve(Instance.model_validate(data), "mig-a100-x3-tokens")
    for name in ("highs-exact", "bnp"):
        res = solve(problem, load_preset(name), time_limit_s=30)
        assert res.status == INFEASIBLE and res.plan is None, (name, res.status)
        if name == "highs-exact":
            # With no plan the filter's slack is unbounded: its first step takes every
            # configuration and is the only one (a second solve from scratch left
            # feasible instances with no plan in a user's time limit).
            filters = [line for line in res.log if "reduced-cost filter" in line]
            assert len(filters) == 1 and filters[0].endswith("within inf"), filters


def test_a_stated_objective_that_is_not_the_plans_cost_fails_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inst = tmp_path / "tp.yaml"
    inst.write_text(yaml.safe_dump(tp_pair((500.0, None))))
    plan_file = tmp_path / "plan.json"
    assert main(["solve", str(inst), "-q", "-o", str(plan_file)]) == 0
    assert main(["verify", str(inst), str(plan_file)]) == 0
    plan = json.loads(plan_file.read_text())
    assert plan["status"] == OPTIMAL
    for field, value in (("objective", plan["objective"] * 0.7), ("bound", plan["objective"] * 2)):
        bad = dict(plan, **{field: value})
        bad_file = tmp_path / f"bad-{field}.json"
        bad_file.write_text(json.dumps(bad))
        capsys.readouterr()
        assert main(["verify", str(inst), str(bad_file)]) == 1
        assert f"[{field}]" in capsys.readouterr().err


def test_check_reported_accepts_the_solvers_own_figures() -> None:
    problem = resolve(Instance.model_validate(tp_pair((None, None))), "tp")
    res = solve(problem, load_preset("highs-exact"))
    assert res.plan is not None
    assert reported(problem, res.plan) == []
    assert res.plan.objective == res.objective == evaluate_plan(problem, res.plan).objective
    wrong = res.plan.model_copy(update={"gap": 0.5})
    assert [v.kind for v in reported(problem, wrong)] == ["gap"]


def test_unsupported_candidate_clock_is_refused_with_the_nearest_ones() -> None:
    data = tp_pair((None, None))
    data["options"]["clocks_mhz"] = {H100: [892, 1980]}
    with pytest.raises(SpecError) as err:
        resolve(Instance.model_validate(data), "clocks.yaml")
    text = "\n".join(err.value.problems)
    assert "clocks.yaml: options.clocks_mhz.H100-SXM5-80GB: 892 MHz" in text
    assert "885, 900 MHz" in text


def test_cap_below_the_lowest_power_limit_is_refused() -> None:
    data = tp_pair((150.0, None))
    with pytest.raises(SpecError) as err:
        resolve(Instance.model_validate(data), "caps.yaml")
    text = "\n".join(err.value.problems)
    assert "caps.yaml: cluster.nodes[0](n0).gpus[0].power_cap_w: 150 W" in text
    assert "lowest power limit" in text


def reported(problem: Any, plan: Any) -> list[Any]:
    """What ``energyopt verify`` finds wrong with the figures a serving plan states."""
    stated = Stated(plan.objective, plan.bound, plan.gap)
    return check_stated(family("serving"), problem, plan, stated, "min")
