"""The pricing knapsack DP behind the fleet-scale column-generation bound, against
enumeration of every configuration."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from energyopt.families.serving.formulations.knapsack import (
    KnapsackItems,
    best_configuration,
    greedy_configuration,
    greedy_configurations,
    repair_and_fill,
)

STEP_GB = 1.0

item = st.tuples(
    st.integers(0, 3),  # unit
    st.integers(1, 4),  # share steps (of 25 %)
    st.floats(0.5, 40.0),  # memory GB
    st.floats(-5.0, 50.0),  # value
)


def knapsack(items: list[tuple[int, int, float, float]], memory_gb: float) -> KnapsackItems:
    return KnapsackItems(
        type_name="T",
        clock_mhz=1000,
        items=np.arange(len(items), dtype=np.int64),
        units=np.asarray([i[0] for i in items], dtype=np.int64),
        share_steps=np.asarray([i[1] for i in items], dtype=np.int64),
        mem_gb=np.asarray([i[2] for i in items], dtype=np.float64),
        capacity_steps=4,
        step=25,
        memory_gb=memory_gb,
        peak_w=np.full(len(items), 50.0),
        on_power_w=100.0,
        power_cap_w=700.0,
    )


def enumerate_best(
    ks: KnapsackItems, values: np.ndarray, weight: list[int], capacity: int
) -> float:
    """Best value over every item set with one item per unit, within share and the
    memory capacity in the given integer weights."""
    best = 0.0
    n = len(ks)
    for r in range(1, n + 1):
        for combo in itertools.combinations(range(n), r):
            units = [int(ks.units[i]) for i in combo]
            if len(set(units)) != len(units):
                continue
            if sum(int(ks.share_steps[i]) for i in combo) > ks.capacity_steps:
                continue
            if sum(weight[i] for i in combo) > capacity:
                continue
            best = max(best, float(sum(max(0.0, values[i]) for i in combo)))
    return best


@settings(max_examples=60, deadline=None)
@given(st.lists(item, min_size=1, max_size=8), st.floats(10.0, 80.0))
@example([(0, 1, 11.0, 1.0)], 10.999999999999993)  # over by 7e-15 GB: within tolerance
def test_dp_equals_enumeration_on_its_rounded_memory(
    items: list[tuple[int, int, float, float]], memory_gb: float
) -> None:
    ks = knapsack(items, memory_gb)
    values = np.asarray([i[3] for i in items])
    capacity = math.floor(memory_gb / STEP_GB + 1e-9)
    down = [math.floor(m / STEP_GB + 1e-9) for m in ks.mem_gb]
    up = [math.ceil(m / STEP_GB - 1e-9) for m in ks.mem_gb]
    # in MB, with the DP's own tolerance of 1e-9 GB on the capacity (the verifier
    # allows a relative 1e-6)
    exact_true = enumerate_best(
        ks, values, [round(m * 1000) for m in ks.mem_gb], math.floor(memory_gb * 1000 + 1e-6)
    )

    relaxed, _ = best_configuration(ks, values, step_gb=STEP_GB)
    assert math.isclose(relaxed, enumerate_best(ks, values, down, capacity), abs_tol=1e-9)
    assert relaxed >= exact_true - 1e-9  # a valid bound: never below the true best

    value, chosen = best_configuration(ks, values, step_gb=STEP_GB, feasible=True)
    assert math.isclose(value, enumerate_best(ks, values, up, capacity), abs_tol=1e-9)
    assert value <= exact_true + 1e-9
    assert sum(float(ks.mem_gb[i]) for i in chosen) <= memory_gb + 1e-9
    assert sum(int(ks.share_steps[i]) for i in chosen) <= ks.capacity_steps
    assert len({int(ks.units[i]) for i in chosen}) == len(chosen)
    assert math.isclose(value, sum(values[i] for i in chosen), abs_tol=1e-9)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(item, min_size=1, max_size=14),
    st.floats(-5.0, 60.0),
    st.integers(0, 6),
)
def test_greedy_configurations_are_the_repeated_greedy_on_disjoint_units(
    items: list[tuple[int, int, float, float]], base: float, limit: int
) -> None:
    """One sort and one pass give the configurations of ``greedy_configuration``
    called again and again with the taken units' values set to 0, stopping at the
    first empty or non-improving one (what column generation did before)."""
    ks = knapsack(items, 60.0)
    values = np.asarray([i[3] for i in items], dtype=np.float64)
    expect: list[list[int]] = []
    left = values.copy()
    for _ in range(limit):
        value, chosen = greedy_configuration(ks, left)
        if not chosen or base - value >= 0:
            break
        expect.append(chosen)
        left[np.isin(ks.units, ks.units[chosen])] = 0.0
    assert greedy_configurations(ks, values, base, limit) == expect


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    st.lists(item, min_size=1, max_size=14),
    st.lists(st.integers(0, 13), max_size=4, unique=True),
    st.floats(100.0, 700.0),
)
def test_the_fill_over_an_array_takes_the_items_of_the_loop_over_a_list(
    items: list[tuple[int, int, float, float]], chosen: list[int], cap_w: float
) -> None:
    """``repair_and_fill`` given its order as an array (numpy, one pass per item
    taken) and as a list (a Python step per item) makes the same configuration."""
    ks = knapsack(items, 60.0)
    ks = KnapsackItems(**{**ks.__dict__, "peak_w": np.linspace(20.0, 160.0, len(items))})
    values = np.asarray([i[3] for i in items], dtype=np.float64)
    chosen = [i for i in chosen if i < len(items)]
    order = np.argsort(-values, kind="stable")
    as_array = repair_and_fill(ks, values, chosen, order, cap_w)
    as_list = repair_and_fill(ks, values, chosen, order.tolist(), cap_w)
    assert as_array == as_list
