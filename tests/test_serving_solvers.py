"""Every backend finds the brute-force optimum on tiny instances; plans verify."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.catalog import Problem, load_problem
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import INFEASIBLE, OPTIMAL
from energyopt.solvers.serving import solve
from energyopt.verify import evaluate_plan, verify_plan

from .conftest import INSTANCES
from .serving_helpers import (
    A100,
    CANONICAL,
    CLOCKS,
    H100,
    TINY_WORKLOAD,
    brute_force_power,
    canonical_problems,
    tiny_instance,
)

SOLVERS = ["highs-exact", "highs-pattern", "highs-per-gpu", "highs-plain", "cpsat"]


def check(problem, name: str, expected: float | None) -> None:
    result = solve(problem, load_preset(name), time_limit_s=60)
    if expected is None:
        assert result.status == INFEASIBLE
        assert result.plan is None
        return
    assert result.plan is not None, result.log
    ev = evaluate_plan(problem, result.plan)
    assert ev.violations == []  # verify_plan's list
    assert ev.total_power_w == pytest.approx(result.objective, rel=1e-6)
    assert result.objective == pytest.approx(expected, rel=2e-4), name
    assert result.bound is not None and result.bound <= expected * (1 + 1e-6)
    # CP-SAT's bound is its relaxed discretization's: within the preset's gap here.
    assert result.status == OPTIMAL


@pytest.fixture(scope="module")
def canonical() -> dict[str, tuple[Problem, float | None]]:
    return canonical_problems()


@pytest.mark.parametrize("name", SOLVERS)
@pytest.mark.parametrize("case", list(CANONICAL))
def test_canonical_instances_match_brute_force(canonical, case: str, name: str) -> None:
    problem, expected = canonical[case]
    if case != "too-much-load":
        assert expected is not None
    check(problem, name, expected)


def test_brute_force_sees_the_budget(canonical) -> None:
    """The node budget case must be constrained by its budget, or it tests nothing."""
    _, with_budget = canonical["node-budget"]
    kw = CANONICAL["node-budget"]
    free = tiny_instance(kw["gpus"], kw["workloads"], clocks=CLOCKS)
    assert with_budget is not None
    unconstrained = brute_force_power(free)
    assert unconstrained is not None and unconstrained <= with_budget


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.sampled_from([H100, A100]), min_size=1, max_size=3),
    workloads=st.lists(TINY_WORKLOAD, min_size=1, max_size=2),
)
def test_random_tiny_instances_agree_with_brute_force(gpus, workloads) -> None:
    problem = tiny_instance(gpus, workloads, clocks=CLOCKS)
    expected = brute_force_power(problem)
    for name in ("highs-exact", "highs-per-gpu", "cpsat"):
        check(problem, name, expected)


def test_infeasible_instance_gets_an_actionable_diagnosis() -> None:
    problem = load_problem(INSTANCES / "infeasible.yaml")
    result = solve(problem, load_preset("highs-exact"))
    assert result.status == INFEASIBLE
    assert any("'chat'" in line and "req/s" in line for line in result.diagnosis)


def test_budget_bound_infeasibility_names_the_budget() -> None:
    problem = tiny_instance(
        [H100, H100], [("Llama-3.1-8B", 10.0, 800.0, 80.0)], clocks=CLOCKS, node_budget_w=120.0
    )
    result = solve(problem, load_preset("highs-exact"))
    assert result.status == INFEASIBLE
    assert any("budget" in line for line in result.diagnosis)


def test_per_gpu_and_pattern_agree_with_migration_costs() -> None:
    problem = load_problem(INSTANCES / "hetero-migration.yaml")
    a = solve(problem, load_preset("highs-per-gpu"), time_limit_s=60)
    b = solve(problem, load_preset("highs-exact"), time_limit_s=60)
    assert a.status == OPTIMAL and b.status == OPTIMAL
    assert a.objective == pytest.approx(b.objective, rel=1e-4)
    # the objective counts moved placements: it exceeds the power by penalty multiples
    ev = evaluate_plan(problem, b.plan)
    moved = (b.objective - ev.total_power_w) / problem.instance.options.migration_penalty_w
    assert moved == pytest.approx(round(moved), abs=1e-6) and moved >= 0


@pytest.mark.parametrize("instance", ["quickstart", "tensor-parallel", "mig-a100", "disaggregated"])
def test_bundled_instances_solve_to_verified_optimal_plans(instance: str) -> None:
    problem = load_problem(INSTANCES / f"{instance}.yaml")
    result = solve(problem, load_preset("highs-exact"), time_limit_s=60)
    assert result.status == OPTIMAL
    assert result.plan is not None and verify_plan(problem, result.plan) == []
    if instance == "tensor-parallel":
        groups = {p.tp_group for g in result.plan.gpus for p in g.placements if p.tp_group}
        assert groups, "the 70B model must run as a TP group"
    if instance == "mig-a100":
        assert all(p.mig_profile for g in result.plan.gpus for p in g.placements)


def test_model_that_fits_no_gpu_gets_a_memory_diagnosis(tmp_path) -> None:
    from energyopt.catalog import resolve
    from energyopt.spec import Instance

    data = {
        "name": "nofit",
        "cluster": {"nodes": [{"name": "edge", "gpus": [{"type": "L4", "count": 2}]}]},
        "workloads": [
            {
                "name": "big",
                "model": "Llama-3.1-70B",
                "rate_rps": 0.5,
                "prompt_tokens": {"mean": 512},
                "output_tokens": {"mean": 128},
                "slo": {"ttft_ms": 5000, "tbt_ms": 200},
            }
        ],
    }
    problem = resolve(Instance.model_validate(data), "nofit")
    result = solve(problem, load_preset("highs-exact"))
    assert result.status == INFEASIBLE
    text = " ".join(result.diagnosis)
    assert "'big'" in text and "do not fit" in text and "more memory" in text


def test_a_thread_count_in_the_preset_never_breaks_highs() -> None:
    problem = load_problem(INSTANCES / "quickstart.yaml")
    preset = load_preset("highs-exact").model_copy(update={"threads": 1})
    assert solve(problem, preset).status == OPTIMAL
