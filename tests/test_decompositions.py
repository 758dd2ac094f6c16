"""Decompositions (colgen, shadow-price, pop): bounds never exceed the optimum, no
plan beats it, every plan verifies, and shadow prices reach the dual optimum."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from energyopt.catalog import Problem, resolve
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers.pop import split_problem
from energyopt.families.serving.solvers.shadow_price import find_prices
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan, verify_plan
from energyopt.perf.oppoints import build_op_table
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import INFEASIBLE, NO_SOLUTION
from energyopt.spec import Instance

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

DECOMPOSITIONS = ["colgen", "shadow-price", "pop"]


def check_sandwich(problem: Problem, name: str, expected: float | None) -> None:
    """bound <= optimum <= objective, and the plan verifies."""
    result = solve(problem, load_preset(name), time_limit_s=30)
    if expected is None:
        assert result.status in (INFEASIBLE, NO_SOLUTION)
        assert result.plan is None
        return
    assert result.plan is not None, result.log
    assert verify_plan(problem, result.plan) == []
    assert evaluate_plan(problem, result.plan).total_power_w == pytest.approx(
        result.objective, rel=1e-6
    )
    assert result.objective is not None and result.bound is not None
    assert result.bound <= expected * (1 + 1e-6), name
    assert result.objective >= expected * (1 - 1e-6), name
    assert result.gap is not None and result.gap >= 0


@pytest.fixture(scope="module")
def canonical() -> dict[str, tuple[Problem, float | None]]:
    return canonical_problems()


@pytest.mark.parametrize("name", DECOMPOSITIONS)
@pytest.mark.parametrize("case", list(CANONICAL))
def test_bound_and_plan_sandwich_the_optimum(canonical: Any, case: str, name: str) -> None:
    problem, expected = canonical[case]
    check_sandwich(problem, name, expected)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.lists(st.sampled_from([H100, A100]), min_size=1, max_size=3),
    workloads=st.lists(TINY_WORKLOAD, min_size=1, max_size=2),
)
def test_random_tiny_instances_sandwich_the_optimum(
    gpus: list[str], workloads: list[tuple[str, float, float, float]]
) -> None:
    problem = tiny_instance(gpus, workloads, clocks=CLOCKS)
    expected = brute_force_power(problem)
    for name in ("colgen", "shadow-price"):
        check_sandwich(problem, name, expected)


def two_node_problem() -> Problem:
    """Two nodes of one H100 each, four workloads: POP splits it into two real parts."""
    data: dict[str, Any] = {
        "name": "two-nodes",
        "cluster": {
            "nodes": [{"name": f"n{i}", "gpus": [{"type": H100, "count": 1}]} for i in range(2)],
            "power_budget_w": 1200.0,
        },
        "workloads": [
            {
                "name": f"w{i}",
                "model": "Llama-3.1-8B" if i % 2 else "Mistral-7B",
                "rate_rps": 1.0 + 0.3 * i,
                "prompt_tokens": {"mean": 512},
                "output_tokens": {"mean": 128},
                "slo": {"ttft_ms": 800.0, "tbt_ms": 80.0},
            }
            for i in range(4)
        ],
        "options": {"clocks_mhz": {H100: [1200, 1980]}, "sharing": {"levels_pct": [50, 100]}},
    }
    return resolve(Instance.model_validate(data), "two-nodes")


def test_pop_splits_nodes_workloads_and_budget() -> None:
    problem = two_node_problem()
    parts = split_problem(problem, 2, seed=3)
    assert len(parts) == 2
    nodes = [n.name for p in parts for n in p.instance.cluster.nodes]
    assert sorted(nodes) == ["n0", "n1"]
    names = [w.name for p in parts for w in p.instance.workloads]
    assert sorted(names) == ["w0", "w1", "w2", "w3"]
    budgets = [p.instance.cluster.power_budget_w for p in parts]
    assert sum(b for b in budgets if b is not None) == pytest.approx(1200.0)


def test_pop_merged_plan_verifies_and_never_beats_the_optimum() -> None:
    problem = two_node_problem()
    expected = brute_force_power(problem)
    assert expected is not None
    check_sandwich(problem, "pop", expected)
    exact = solve(problem, load_preset("highs-exact"), time_limit_s=30)
    pop = solve(problem, load_preset("pop"), time_limit_s=30)
    assert exact.objective is not None and pop.objective is not None
    assert pop.objective >= exact.objective * (1 - 1e-6)


def pooled_lp_optimum(problem: Problem, count_limit: bool = True) -> float:
    """Optimum of the pooled relaxation, written out directly for scipy's LP: each
    req/s routed to op o is 1 / top_o of a placement (top_o = min(capacity, unit
    rate), the most one placement carries), charged that part of its GPU share's
    on-cost, GPU count and memory and of the placement's fixed cost."""
    table = build_op_table(problem)
    prog = pat.prepare(problem, table)
    (cls,) = prog.classes
    phi = np.where(table.tp > 1, table.tp, table.share / table.share_capacity[cls.type_name])
    top = np.asarray([table.top_rps(o) for o in range(len(table))])
    on_cost = np.asarray(
        [prog.costs.on_cost[(cls.type_name, int(f))] for f in table.clock_mhz], dtype=float
    )
    cost = (phi * on_cost + prog.costs.op_fixed) / top + prog.costs.op_cost
    usable = problem.gpu_type(cls.type_name).memory_gb * 0.9
    a_ub = [phi / top, table.memory_gb * table.tp / top]
    b_ub = [cls.size, cls.size * usable]
    a_eq = [(table.unit == u).astype(float) for u in range(len(table.units))]
    b_eq = [u.rate_rps for u in table.units]
    res = linprog(
        cost,
        A_ub=np.asarray(a_ub) if count_limit else None,
        b_ub=np.asarray(b_ub) if count_limit else None,
        A_eq=np.asarray(a_eq),
        b_eq=np.asarray(b_eq),
        bounds=(0, None),
        method="highs",
    )
    assert res.status == 0
    return float(res.fun)


def test_shadow_price_bound_charges_the_decode_loop_once_per_placement() -> None:
    """One unit on one exclusive GPU, its rate below every op's capacity: a placement
    carries at most the unit's rate, so the pooled relaxation charges each op's
    on-power and its decode loop's fixed part once, and the Lagrangian bound at
    zero prices is the optimum itself (charged per req/s of capacity and without
    the fixed part, it is 25 % of it)."""
    problem = tiny_instance(
        [H100], [("Llama-3.1-8B", 3.0, 800.0, 80.0)], clocks=CLOCKS, shares=[100]
    )
    table = build_op_table(problem)
    assert len(table) > 0 and bool(np.all(table.capacity_rps > 3.0))
    plans = [
        table.on_power[(H100, int(table.clock_mhz[o]))] + table.power_w(o, 3.0)
        for o in range(len(table))
    ]
    optimum = brute_force_power(problem)
    assert optimum == pytest.approx(min(plans), rel=1e-9)
    run = find_prices(
        problem, table, pat.prepare(problem, table), iterations=20, step=1.0, time_limit_s=60
    )
    assert run.bound == pytest.approx(optimum, rel=1e-9)


def test_shadow_prices_converge_to_the_dual_optimum() -> None:
    """One class of two H100s whose GPU count binds in the pooled relaxation: the
    subgradient's best Lagrangian value reaches the LP optimum (strong duality)
    and never passes it (weak duality); the GPU price is positive."""
    problem = tiny_instance(
        [H100, H100], [("Llama-3.1-8B", 60.0, 800.0, 80.0)], clocks={H100: [900, 1200, 1980]}
    )
    optimum = pooled_lp_optimum(problem)
    assert pooled_lp_optimum(problem, count_limit=False) < optimum * (1 - 1e-3)
    table = build_op_table(problem)
    run = find_prices(
        problem, table, pat.prepare(problem, table), iterations=300, step=1.0, time_limit_s=60
    )
    assert run.bound <= optimum * (1 + 1e-9)
    assert run.bound >= optimum * (1 - 2e-3)
    assert run.prices.gpu[0] > 0
