"""The configuration formulation's pieces against definitions written apart: every
configuration that fits is listed (not only the maximal ones), a column pays each
placement's fixed part and puts its worst-case draw in the budget rows, a
configuration over its class's cap is no column, the knapsack pricing's bound is
never above the least enumerated reduced cost, its repair keeps the worst case
within the cap, the plan a solve returns costs what the solver says, and a current
placement is kept without a rate where that is cheapest."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.catalog import Problem, resolve
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.formulations.columns import Duals, price_configs, shared_column
from energyopt.families.serving.formulations.configs import ConfigSet, enumerate_configs
from energyopt.families.serving.formulations.knapsack import (
    KnapsackItems,
    best_configuration,
    knapsack_items,
    repair_and_fill,
)
from energyopt.families.serving.formulations.master import build_master
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import evaluate_plan
from energyopt.perf.oppoints import build_op_table
from energyopt.solvers.presets import load_preset
from energyopt.spec import Instance

from .serving_exhaustive import exhaustive_optimum
from .serving_helpers import CLOCKS, H100, tiny_instance

WORKLOADS = [
    ("Llama-3.1-8B", 6.0, 800.0, 80.0),
    ("Mistral-7B", 2.0, 800.0, 80.0),
    ("Llama-3.1-8B", 1.0, 1200.0, 100.0),
]


def three_workloads(cap_w: float | None = None, budget_w: float | None = None) -> Problem:
    return tiny_instance(
        [H100, H100],
        WORKLOADS,
        clocks=CLOCKS,
        shares=[25, 50, 100],
        cap_w=cap_w,
        node_budget_w=budget_w,
    )


def fitting_sets(problem: Problem, type_name: str, clock: int) -> set[frozenset[int]]:
    """Every non-empty set of single-GPU ops of one type and clock, one per unit,
    within share, memory and the type's highest power limit in the worst case."""
    table = build_op_table(problem)
    gtype = problem.gpu_type(type_name)
    usable = gtype.memory_gb * (1 - problem.instance.options.memory_reserve_fraction)
    room = gtype.power_limit_max_w - table.on_power[(type_name, clock)]
    items = [
        o
        for o in range(len(table))
        if table.type_names[table.gpu_type[o]] == type_name
        and table.clock_mhz[o] == clock
        and table.tp[o] == 1
    ]
    out = set()
    for size in range(1, len(table.units) + 1):
        for combo in itertools.combinations(items, size):
            if len({int(table.unit[o]) for o in combo}) != size:
                continue
            if sum(int(table.share[o]) for o in combo) > table.share_capacity[type_name]:
                continue
            if sum(float(table.memory_gb[o]) for o in combo) > usable + 1e-9:
                continue
            if sum(float(table.peak_power_w[o]) for o in combo) > room * (1 + 1e-9):
                continue
            out.add(frozenset(combo))
    return out


def test_every_fitting_configuration_is_listed() -> None:
    """A placement costs its fixed part, so a configuration that could take one more
    is not dominated: the listing is every fitting set, the smaller ones too."""
    problem = three_workloads()
    table = build_op_table(problem)
    smaller = 0
    for clock in table.clocks[H100]:
        cs = enumerate_configs(problem, table, H100, clock)
        assert cs.complete
        listed = [frozenset(int(o) for o in cs.ops(j)) for j in range(len(cs))]
        assert len(listed) == len(set(listed))
        expected = fitting_sets(problem, H100, clock)
        assert set(listed) == expected
        smaller += sum(1 for s in expected if any(s < t for t in expected))
    assert smaller > 0  # non-maximal sets exist here, so the test can tell


def test_a_column_pays_fixed_parts_and_budgets_its_worst_case() -> None:
    problem = three_workloads(budget_w=5000.0)
    table = build_op_table(problem)
    prog = pat.prepare(problem, table)
    cls = prog.classes[0]
    clock = max(table.clocks[H100])
    cs = enumerate_configs(problem, table, H100, clock)
    ops = max((tuple(int(o) for o in cs.ops(j)) for j in range(len(cs))), key=len)
    assert len(ops) >= 2
    col = shared_column(cls, table, prog.costs, clock, ops)
    on = table.on_power[(H100, clock)]
    assert col.on_cost == pytest.approx(on + sum(float(table.fixed_w[o]) for o in ops))
    assert col.worst_w == pytest.approx(on + sum(float(table.peak_power_w[o]) for o in ops))
    mp = build_master(problem, table, prog.costs, prog.classes, [col], artificials=False)
    (budget_row, _), *_ = mp.budget_rows
    in_budget = [(v, coef) for r, v, coef in mp.entries if r == budget_row]
    # one entry, on the count: the worst case is a constant per use, the rates add none
    assert len(in_budget) == 1 and in_budget[0][0] == mp.z_var[0]
    assert in_budget[0][1] == pytest.approx(col.worst_w)
    rate_costs = [mp.cost[r] for r in mp.r_vars[0]]
    assert rate_costs == pytest.approx([float(table.marginal_j[o]) for o in ops])


def test_a_configuration_over_the_cap_is_no_column() -> None:
    """With a cap between the smallest and the largest worst-case draw, the
    configurations above it price at +inf and their counts are held at 0."""
    loose = three_workloads()
    table = build_op_table(loose)
    clock = max(table.clocks[H100])
    cs = enumerate_configs(loose, table, H100, clock)
    worst = [
        table.on_power[(H100, clock)] + float(table.peak_power_w[cs.ops(j)].sum())
        for j in range(len(cs))
    ]
    cap = float(np.median(worst))
    problem = three_workloads(cap_w=cap)
    prog = pat.prepare(problem, build_op_table(problem))
    cls = prog.classes[0]
    duals = Duals(np.zeros(len(table.units)), np.zeros(1), np.zeros(1))
    rc = price_configs(cls, cs, prog.table, prog.costs, duals)
    over = np.asarray(worst) > cap * (1 + 1e-9)
    assert over.any() and (~over).any()
    assert np.all(np.isinf(rc[over])) and np.all(np.isfinite(rc[~over]))
    cols = [
        shared_column(cls, prog.table, prog.costs, clock, tuple(int(o) for o in cs.ops(j)))
        for j in range(len(cs))
    ]
    mp = build_master(problem, prog.table, prog.costs, prog.classes, cols, artificials=False)
    assert [mp.hi[z] == 0 for z in mp.z_var] == over.tolist()


@functools.cache
def budgeted_program() -> pat.PatternProgram:
    """The three-workload instance under a node budget, every configuration listed
    (read only)."""
    problem = three_workloads(budget_w=5000.0)
    return pat.prepare(problem, build_op_table(problem), pricing="enumerate")


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    prices=st.lists(st.floats(0.0, 400.0), min_size=3, max_size=3),
    power_price=st.floats(-0.5, 0.0),
    count_price=st.floats(-300.0, 0.0),
)
def test_the_knapsack_bound_is_never_above_the_least_listed_reduced_cost(
    prices: list[float], power_price: float, count_price: float
) -> None:
    """At any prices, base - (the exact DP's value) is at most the least reduced cost
    of every listed configuration, and the configuration it picks, made feasible,
    prices at no less than that bound."""
    prog = budgeted_program()
    problem, table = prog.problem, prog.table
    cls = prog.classes[0]
    duals = Duals(np.asarray(prices), np.asarray([count_price]), np.asarray([power_price]))
    for clock in table.clocks[H100]:
        cs = prog.configs[(H100, clock)]
        least = min(0.0, float(price_configs(cls, cs, table, prog.costs, duals).min()))
        ks = knapsack_items(problem, table, H100, clock)
        pricing = pat.knapsack_pricing(prog, cls, ks, duals)
        value, chosen = best_configuration(ks, pricing.values)
        low = min(0.0, pricing.base - value)
        assert low <= least + 1e-6 * max(1.0, abs(least))
        if chosen:
            ops = np.asarray(
                repair_and_fill(ks, pricing.values, chosen, pricing.order, cls.power_cap_w)
            )
            one = ConfigSet(H100, clock, ops, np.asarray([0, len(ops)]), ops, True)
            assert float(price_configs(cls, one, table, prog.costs, duals)[0]) >= low - 1e-6


item = st.tuples(
    st.integers(0, 3),  # unit
    st.integers(1, 4),  # share steps (of 25 %)
    st.floats(0.5, 40.0),  # memory GB
    st.floats(10.0, 300.0),  # peak W
    st.floats(-5.0, 50.0),  # value
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(item, min_size=1, max_size=8), st.floats(150.0, 700.0))
def test_the_repair_keeps_the_worst_case_within_the_cap(
    items: list[tuple[int, int, float, float, float]], cap_w: float
) -> None:
    ks = KnapsackItems(
        type_name="T",
        clock_mhz=1000,
        items=np.arange(len(items), dtype=np.int64),
        units=np.asarray([i[0] for i in items], dtype=np.int64),
        share_steps=np.asarray([i[1] for i in items], dtype=np.int64),
        mem_gb=np.asarray([i[2] for i in items], dtype=np.float64),
        capacity_steps=4,
        step=25,
        memory_gb=60.0,
        peak_w=np.asarray([i[3] for i in items], dtype=np.float64),
        on_power_w=100.0,
        power_cap_w=700.0,
    )
    values = np.asarray([i[4] for i in items])
    _, chosen = best_configuration(ks, values, step_gb=1.0)
    ops = list(repair_and_fill(ks, values, chosen, np.argsort(-values), cap_w))
    assert ks.on_power_w + float(ks.peak_w[ops].sum()) <= cap_w * (1 + 1e-9) or not ops
    assert float(ks.mem_gb[ops].sum()) <= ks.memory_gb + 1e-9
    assert int(ks.share_steps[ops].sum()) <= ks.capacity_steps
    assert len({int(ks.units[i]) for i in ops}) == len(ops)
    assert all(values[i] > 0 for i in ops)  # an item of no value would only add its cost


@pytest.mark.parametrize("solver", ["colgen", "bnp"])
def test_the_solver_reports_what_its_plan_costs(solver: str) -> None:
    """The objective a configuration solver states for its plan (before the
    verifier settles it) is the verifier's: a placement is charged its fixed part
    only where the plan makes it."""
    problem = three_workloads(budget_w=1400.0)
    result = solve(problem, load_preset(solver), time_limit_s=60)
    assert result.plan is not None, result.log[-3:]
    assert not any("solver failure" in line for line in result.log), result.log[-3:]
    ev = evaluate_plan(problem, result.plan)
    assert ev.violations == []
    assert result.objective == pytest.approx(ev.objective, rel=1e-9)
    assert result.bound is not None and math.isfinite(result.bound)
    assert result.bound <= ev.objective * (1 + 1e-9)


def kept_idle_problem() -> Problem:
    """Two H100s; the first holds a and b at 50 % each now, migration costs 80 W.
    a needs a whole GPU: the cheapest plan keeps it on the first GPU without a rate
    (no decode loop, no penalty) and serves it on the second."""
    load = {"prompt_tokens": {"mean": 512}, "output_tokens": {"mean": 128}}
    slo = {"ttft_ms": 800.0, "tbt_ms": 80.0}
    state = {
        "clock_mhz": 1980,
        "placements": [{"workload": w, "phase": "both", "share_pct": 50} for w in ("a", "b")],
    }
    data = {
        "name": "kept-idle",
        "cluster": {
            "nodes": [{"name": "n0", "gpus": [{"type": H100, "state": state}, {"type": H100}]}]
        },
        "workloads": [
            {
                "name": w,
                "model": "Llama-3.1-8B",
                "rate_rps": r,
                **load,
                "slo": slo,
                "tensor_parallel": [1],
            }
            for w, r in (("a", 20.0), ("b", 2.0))
        ],
        "options": {
            "clocks_mhz": {H100: [1200, 1980]},
            "sharing": {"mode": "mps", "levels_pct": [50, 100]},
            "objective": "power_migration",
            "migration_penalty_w": 80.0,
        },
    }
    return resolve(Instance.model_validate(data), "kept-idle")


@pytest.mark.parametrize("solver", ["highs-pattern", "bnp"])
def test_a_current_placement_is_kept_without_a_rate_where_that_is_cheapest(solver: str) -> None:
    problem = kept_idle_problem()
    optimum = exhaustive_optimum(problem, build_op_table(problem)).value
    assert optimum is not None
    result = solve(problem, load_preset(solver), time_limit_s=60)
    assert result.formulation in ("pattern", "branch_price") and result.plan is not None
    assert not any("solver failure" in line for line in result.log), result.log[-3:]
    assert result.objective == pytest.approx(optimum, rel=1e-6)
    assert result.bound is not None and result.bound <= optimum * (1 + 1e-9)
    idle = [(g.gpu, p.workload) for g in result.plan.gpus for p in g.placements if p.rate_rps == 0]
    assert idle == [("n0/0", "a")]
