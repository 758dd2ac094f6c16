"""Every backend finds the brute-force optimum on tiny instances; plans verify."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.catalog import Problem, load_problem
from energyopt.families.serving.solvers.diagnose import _minimum_power_w
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan, verify_plan
from energyopt.perf.oppoints import build_op_table
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import INFEASIBLE, OPTIMAL

from .conftest import INSTANCES
from .serving_exhaustive import exhaustive_optimum, shared_random_problems
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


@pytest.mark.parametrize("case", ["power-capped", "node-budget"])
def test_brute_force_sees_the_cap_and_the_budget(canonical, case: str) -> None:
    """The capped and the budget cases must be constrained by their cap or budget
    (on the worst-case draw), or they test nothing."""
    _, limited = canonical[case]
    kw = CANONICAL[case]
    free = tiny_instance(kw["gpus"], kw["workloads"], clocks=CLOCKS)
    assert limited is not None
    unconstrained = brute_force_power(free)
    assert unconstrained is not None and unconstrained < limited * (1 - 1e-3)


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


def test_the_diagnosis_power_floor_is_below_every_optimum(canonical) -> None:
    """The power floor the diagnosis holds a cluster budget against (on-power share,
    fixed part and part per request of each unit's cheapest op) never exceeds the
    optimum, so a budget it names as too low is too low."""
    for case, (problem, expected) in canonical.items():
        if expected is not None:
            floor = _minimum_power_w(problem, build_op_table(problem))
            assert 0 < floor <= expected * (1 + 1e-9), case


def test_a_cluster_budget_below_the_power_floor_is_named() -> None:
    kw = CANONICAL["two-workloads-share-or-split"]
    free = tiny_instance(kw["gpus"], kw["workloads"], clocks=CLOCKS)
    floor = _minimum_power_w(free, build_op_table(free))
    problem = tiny_instance(
        kw["gpus"], kw["workloads"], clocks=CLOCKS, cluster_budget_w=round(0.9 * floor)
    )
    result = solve(problem, load_preset("highs-per-gpu"))
    assert result.status == INFEASIBLE
    assert any("cluster power budget" in line for line in result.diagnosis), result.diagnosis


IDLE_KEPT = {
    "name": "idle-kept",
    "cluster": {
        "nodes": [
            {
                "name": "n0",
                "gpus": [
                    {
                        "type": "L40S",
                        "ids": ["g0"],
                        "state": {"clock_mhz": 1995, "placements": [{"workload": "w0"}]},
                    },
                    {"type": "H200-SXM-141GB", "ids": ["g1"]},
                ],
            }
        ]
    },
    "workloads": [
        {
            "name": "w0",
            "model": "Qwen2.5-14B",
            "rate_rps": 5.32,
            "prompt_tokens": {"mean": 256},
            "output_tokens": {"mean": 128},
            "slo": {"ttft_ms": 600.0, "tbt_ms": 150.0},
        }
    ],
    "options": {
        "clocks_mhz": {"H200-SXM-141GB": [1365, 1740], "L40S": [1950, 1995]},
        "objective": "power_migration",
        "sharing": {"mode": "mps", "levels_pct": [25, 50]},
        "migration_penalty_w": 80.0,
    },
}
"""w0 runs on g0 now; serving it on g1 is cheaper, and keeping an idle w0 slot on g0
(its on-power, no placement power at rate 0) costs less than the penalty."""


@pytest.mark.parametrize(
    ("name", "formulation"),
    [("highs-per-gpu", None), ("highs-plain", None), ("cpsat", None), ("cpsat", "per_gpu")],
)
def test_an_idle_current_placement_avoids_the_migration_penalty(
    name: str, formulation: str | None
) -> None:
    """A placement at rate 0 costs no fixed part (the verifier prices its power line,
    0 at rate 0) yet keeps the unit on its GPU: the exact presets reach the
    exhaustive optimum, which keeps it."""
    from energyopt.catalog import resolve
    from energyopt.spec import Instance

    problem = resolve(Instance.model_validate(IDLE_KEPT), "idle-kept")
    best = exhaustive_optimum(problem).value
    assert best is not None
    preset = load_preset(name)
    if formulation is not None:
        preset = preset.model_copy(update={"formulation": formulation})
    result = solve(problem, preset, time_limit_s=60)
    assert result.status == OPTIMAL and result.plan is not None
    assert result.objective == pytest.approx(best, rel=preset.rel_gap)
    assert result.bound is not None and result.bound <= best * (1 + 1e-6)
    g0 = next(g for g in result.plan.gpus if g.gpu == "g0")
    assert [(p.workload, p.rate_rps) for p in g0.placements] == [("w0", 0.0)]
    assert evaluate_plan(problem, result.plan).moved == 0


def test_cpsat_on_the_per_gpu_model_agrees_with_the_exhaustive_optimum() -> None:
    """The cpsat preset takes the pattern formulation where it applies; here CP-SAT
    solves the per-GPU model (fixed parts, worst-case caps, TP groups, MIG, state)
    of random tiny instances: the plan's cost within the gap of the optimum, the
    bound below it, infeasibility proven."""
    preset = load_preset("cpsat").model_copy(update={"formulation": "per_gpu"})
    for k, (_, problem, opt) in enumerate(shared_random_problems(20, 12)):
        result = solve(problem, preset, time_limit_s=60)
        if opt.value is None:
            assert result.status == INFEASIBLE, k
            continue
        assert result.status == OPTIMAL, (k, result.status)
        assert result.objective == pytest.approx(opt.value, rel=preset.rel_gap), k
        assert result.bound is not None and result.bound <= opt.value * (1 + 1e-9), k


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
