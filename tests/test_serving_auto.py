"""The serving ``auto`` preset: which method it runs on which instance shape, and
that what it returns is the chosen method's certified result, never worse than the
exact preset on the bundled small instances."""

from __future__ import annotations

from pathlib import Path

import pytest

from energyopt.catalog import load_problem
from energyopt.families.serving.solvers import solve as serving
from energyopt.perf.oppoints import build_op_table
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import INFEASIBLE, OPTIMAL

INSTANCES = Path(__file__).resolve().parents[1] / "instances"


def test_auto_runs_branch_and_price_where_the_configuration_formulation_applies() -> None:
    problem = load_problem(INSTANCES / "quickstart.yaml")
    choice, why = serving.auto_choice(problem, build_op_table(problem))
    assert choice == "bnp" and "4 GPUs" in why


def test_auto_runs_the_exact_per_gpu_milp_where_gpus_have_a_current_state() -> None:
    problem = load_problem(INSTANCES / "hetero-migration.yaml")
    choice, why = serving.auto_choice(problem, build_op_table(problem))
    assert choice == "highs-exact" and "does not apply" in why
    result = serving.solve(problem, load_preset("auto"))
    exact = serving.solve(problem, load_preset("highs-exact"))
    assert result.formulation == "per_gpu" and result.solver == "auto (highs-exact)"
    assert result.objective == pytest.approx(exact.objective, rel=1e-6)


def test_auto_runs_the_configuration_milp_then_column_generation_as_fleets_grow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = load_problem(INSTANCES / "tensor-parallel.yaml")
    table = build_op_table(problem)
    monkeypatch.setattr(serving, "AUTO_BNP_GPUS", len(problem.gpus) - 1)
    assert serving.auto_choice(problem, table)[0] == "highs-exact"
    monkeypatch.setattr(serving, "AUTO_COLGEN_GPUS", len(problem.gpus) - 1)
    choice, _ = serving.auto_choice(problem, build_op_table(problem))
    assert choice == "colgen"
    result = serving.solve(problem, load_preset("auto"))
    assert result.solver == "auto (colgen)" and result.formulation == "colgen"
    assert result.plan is not None and result.plan.solver == "auto (colgen)"


@pytest.mark.parametrize("instance", ["quickstart", "tensor-parallel", "mig-a100"])
def test_auto_is_certified_and_as_good_as_the_exact_preset(instance: str) -> None:
    problem = load_problem(INSTANCES / f"{instance}.yaml")
    auto = serving.solve(problem, load_preset("auto"))
    exact = serving.solve(problem, load_preset("highs-exact"))
    assert auto.solver == "auto (bnp)" and auto.formulation == "branch_price"
    assert auto.status == OPTIMAL and auto.objective is not None and auto.bound is not None
    assert exact.objective is not None
    assert auto.objective <= exact.objective * (1 + 1e-6)
    # on these small fleets the auto preset's own gap (1e-4), not branch-and-price's 1e-3
    assert len(problem.gpus) <= serving.AUTO_EXACT_GAP_GPUS
    assert auto.gap is not None and auto.gap <= 1e-4 + 1e-12


def test_auto_proves_infeasibility() -> None:
    problem = load_problem(INSTANCES / "infeasible.yaml")
    assert serving.solve(problem, load_preset("auto")).status == INFEASIBLE
