"""Tiny serving instances and an independent brute-force optimum for them."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
from hypothesis import strategies as st

from energyopt.catalog import Problem, resolve
from energyopt.perf.oppoints import OpTable, build_op_table
from energyopt.spec import Instance

from .lp_helpers import lp_minimum


def tiny_instance(
    gpus: list[str],
    workloads: list[tuple[str, float, float, float]],
    *,
    clocks: dict[str, list[int]],
    shares: list[int] = [50, 100],  # noqa: B006 - read only
    cap_w: float | None = None,
    node_budget_w: float | None = None,
    cluster_budget_w: float | None = None,
) -> Problem:
    """GPUs of the given types in one node; workloads (model, rate, ttft, tbt)."""
    data: dict[str, Any] = {
        "name": "tiny",
        "cluster": {
            **({"power_budget_w": cluster_budget_w} if cluster_budget_w else {}),
            "nodes": [
                {
                    "name": "n0",
                    "gpus": [
                        {"type": t, "power_cap_w": cap_w} if cap_w else {"type": t} for t in gpus
                    ],
                    **({"power_budget_w": node_budget_w} if node_budget_w else {}),
                }
            ]
        },
        "workloads": [
            {
                "name": f"w{i}",
                "model": model,
                "rate_rps": rate,
                "prompt_tokens": {"mean": 512},
                "output_tokens": {"mean": 128},
                "slo": {"ttft_ms": ttft, "tbt_ms": tbt},
            }
            for i, (model, rate, ttft, tbt) in enumerate(workloads)
        ],
        "options": {"clocks_mhz": clocks, "sharing": {"mode": "mps", "levels_pct": shares}},
    }
    return resolve(Instance.model_validate(data), "tiny")


def brute_force_power(problem: Problem) -> float | None:
    """Least total power over every per-GPU choice (off, a clock and a set of
    single-GPU placements, or membership of a tensor-parallel group of one TP
    operating point), with rates by LP. None if nothing is feasible.

    The GPUs that choose the same TP operating point form groups of its TP size
    (identical groups, so which GPUs pair up does not matter); a group takes its
    GPUs whole and carries one rate.

    A placement costs its power line, fixed_w + marginal_j * rate; the caps and the
    node budget hold the worst-case draw, on-power + the peak power of each
    placement (its steady power at SLO capacity), whatever the rates. Every
    placement of a choice is charged its fixed part: one that would carry no rate
    is the same choice without it, also enumerated.

    Independent of the formulations: it reads only the operating-point table.
    """
    table: OpTable = build_op_table(problem)
    single = [o for o in range(len(table)) if table.tp[o] == 1]
    grouped = [o for o in range(len(table)) if table.tp[o] > 1]
    gpus = problem.gpus
    # A choice is None (off), (clock, single-GPU ops) or (clock, (), TP op).
    Choice = tuple[int, tuple[int, ...]] | tuple[int, tuple[int, ...], int] | None
    options: list[list[Choice]] = []
    for gpu in gpus:
        gtype = problem.gpu_type(gpu.type)
        usable = gtype.memory_gb * (1 - problem.instance.options.memory_reserve_fraction)
        mine = [o for o in single if table.type_names[table.gpu_type[o]] == gpu.type]
        opts: list[Choice] = [None]
        opts += [
            (int(table.clock_mhz[o]), (), o)
            for o in grouped
            if table.type_names[table.gpu_type[o]] == gpu.type
            and float(table.memory_gb[o]) <= usable
        ]
        for clock in table.clocks[gpu.type]:
            at = [o for o in mine if table.clock_mhz[o] == clock]
            for size in range(1, len(table.units) + 1):
                for combo in itertools.combinations(at, size):
                    units = [int(table.unit[o]) for o in combo]
                    if len(set(units)) != len(units):
                        continue
                    if sum(int(table.share[o]) for o in combo) > 100:
                        continue
                    if sum(float(table.memory_gb[o]) for o in combo) > usable:
                        continue
                    opts.append((clock, combo))
        options.append(opts)
    caps = [
        min(
            g.power_cap_w or problem.gpu_type(g.type).power_limit_max_w,
            problem.gpu_type(g.type).power_limit_max_w,
        )
        for g in gpus
    ]
    budget = problem.instance.cluster.nodes[0].power_budget_w
    best: float | None = None
    for choice in itertools.product(*options):
        var: list[int] = [o for c in choice if c for o in c[1]]
        members: dict[int, int] = {}
        for c in choice:
            if c and len(c) == 3:
                members[c[2]] = members.get(c[2], 0) + 1
        if any(n % int(table.tp[o]) for o, n in members.items()):
            continue  # a TP group needs exactly its TP size of GPUs
        var += [o for o, n in members.items() for _ in range(n // int(table.tp[o]))]
        served = {int(table.unit[o]) for o in var}
        if served != set(range(len(table.units))):
            continue
        worst = {
            i: table.on_power[(gpus[i].type, c[0])]
            + sum(float(table.peak_power_w[o]) for o in c[1])
            + (float(table.peak_power_w[c[2]]) / int(table.tp[c[2]]) if len(c) == 3 else 0.0)
            for i, c in enumerate(choice)
            if c
        }
        if any(w > caps[i] for i, w in worst.items()):
            continue
        if budget is not None and sum(worst.values()) > budget:
            continue
        static = sum(table.on_power[(gpus[i].type, c[0])] for i, c in enumerate(choice) if c)
        fixed = sum(float(table.fixed_w[o]) for o in var)
        cost = np.asarray([table.marginal_j[o] for o in var])
        a_eq = np.asarray(
            [[1.0 if table.unit[o] == u else 0.0 for o in var] for u in range(len(table.units))]
        )
        b_eq = np.asarray([u.rate_rps for u in table.units])
        bounds = [(0.0, float(table.capacity_rps[o])) for o in var]
        least = lp_minimum(cost, [], [], a_eq, b_eq, bounds)
        if least is None:
            continue
        total = static + fixed + least
        if best is None or total < best:
            best = total
    return best


H100 = "H100-SXM5-80GB"
A100 = "A100-SXM4-80GB"
CLOCKS = {H100: [1200, 1980], A100: [900, 1410]}


CANONICAL = {
    "one-gpu-one-workload": dict(gpus=[H100], workloads=[("Llama-3.1-8B", 3.0, 800.0, 80.0)]),
    "two-workloads-share-or-split": dict(
        gpus=[H100, H100],
        workloads=[("Llama-3.1-8B", 2.0, 800.0, 80.0), ("Mistral-7B", 2.0, 800.0, 80.0)],
    ),
    "heterogeneous-pair": dict(
        gpus=[H100, A100, A100], workloads=[("Llama-3.1-8B", 6.0, 800.0, 80.0)]
    ),
    # The cap and the budget bind: without them the optimum is another plan
    # (test_brute_force_sees_the_cap_and_the_budget). Caps and budgets hold the
    # worst-case draw, so the load is high enough that the cheapest plan's draw at
    # capacity is above them while another plan's is not.
    "power-capped": dict(
        gpus=[H100, H100], workloads=[("Llama-3.1-8B", 16.0, 800.0, 80.0)], cap_w=260.0
    ),
    "node-budget": dict(
        gpus=[H100, H100, H100],
        workloads=[("Llama-3.1-8B", 16.0, 800.0, 80.0), ("Mistral-7B", 3.0, 600.0, 60.0)],
        node_budget_w=610.0,
    ),
    "too-much-load": dict(gpus=[A100], workloads=[("Qwen2.5-14B", 40.0, 800.0, 80.0)]),
}


def canonical_problems() -> dict[str, tuple[Problem, float | None]]:
    """Every canonical case with its brute-force optimum (None when infeasible)."""
    out = {}
    for key, kw in CANONICAL.items():
        problem = tiny_instance(
            kw["gpus"],
            kw["workloads"],
            clocks=CLOCKS,
            cap_w=kw.get("cap_w"),
            node_budget_w=kw.get("node_budget_w"),
        )
        out[key] = (problem, brute_force_power(problem))
    return out


TINY_WORKLOAD = st.tuples(
    st.sampled_from(["Llama-3.1-8B", "Mistral-7B"]),
    st.floats(0.2, 8.0),
    st.sampled_from([600.0, 1200.0]),
    st.sampled_from([50.0, 100.0]),
)
"""Hypothesis strategy of one tiny-instance workload: (model, rate, TTFT ms, TBT ms)."""
