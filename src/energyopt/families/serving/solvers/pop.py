"""POP-style partitioned solve: split the fleet and the workloads into k random parts,
solve each part alone, merge the plans.

Workloads are dealt to parts at random (seeded); nodes are dealt per GPU type so
that every part gets about 1/k of each type; a cluster power budget is split in
proportion to the GPUs of each part. Every part's plan is feasible for its own
GPUs and workloads, so the merged plan is feasible for the whole fleet (the
verifier checks it). A part that cannot serve its workloads makes the solver try
again with half as many parts. POP itself proves nothing about optimality; the
bound it reports is the per-unit cover bound of the whole problem at zero prices
(every unit served as cheaply as it could be alone), which is valid but weak.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import defaultdict
from typing import Protocol

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.classes import gpu_classes
from energyopt.families.serving.formulations.columns import Duals
from energyopt.families.serving.formulations.costs import objective_costs
from energyopt.families.serving.solvers.unit_bound import best_unit_bound
from energyopt.families.serving.verify import evaluate_plan
from energyopt.perf.oppoints import OpTable
from energyopt.progress import Progress
from energyopt.solvers.presets import SolverPreset, load_preset
from energyopt.solvers.result import (
    INFEASIBLE,
    NO_SOLUTION,
    Result,
    Termination,
    status_at,
    stop_reason,
)
from energyopt.solvers.result import relative_gap as rel_gap_of
from energyopt.spec.cluster import Node
from energyopt.spec.plan import Plan
from energyopt.spec.workload import Workload


def split_problem(problem: Problem, parts: int, seed: int) -> list[Problem]:
    """``parts`` sub-problems over disjoint nodes and workloads (fewer if the fleet
    has fewer nodes or workloads than ``parts``)."""
    inst = problem.instance
    nodes = list(inst.cluster.nodes)
    k = max(1, min(parts, len(nodes), len(inst.workloads)))
    rng = random.Random(seed)
    by_type: dict[str, list[Node]] = defaultdict(list)
    for node in nodes:
        by_type[node.gpus[0].type if node.gpus else ""].append(node)
    node_parts: list[list[Node]] = [[] for _ in range(k)]
    offset = 0
    for members in by_type.values():
        rng.shuffle(members)
        for i, node in enumerate(members):
            node_parts[(i + offset) % k].append(node)
        offset += len(members)
    workloads = list(inst.workloads)
    rng.shuffle(workloads)
    wl_parts: list[list[Workload]] = [[] for _ in range(k)]
    for i, wl in enumerate(workloads):
        wl_parts[i % k].append(wl)
    total = sum(_node_gpus(n) for n in nodes)
    out = []
    for i in range(k):
        if not node_parts[i] or not wl_parts[i]:
            continue
        share = sum(_node_gpus(n) for n in node_parts[i]) / total
        budget = inst.cluster.power_budget_w
        cluster = inst.cluster.model_copy(
            update={
                "nodes": tuple(node_parts[i]),
                "links": (),
                "power_budget_w": None if budget is None else budget * share,
            }
        )
        sub = inst.model_copy(
            update={
                "name": f"{inst.name}-part{i}",
                "cluster": cluster,
                "workloads": tuple(sorted(wl_parts[i], key=lambda w: w.name)),
            }
        )
        out.append(dataclasses.replace(problem, instance=sub))
    return out


def _node_gpus(node: Node) -> int:
    return sum(e.count for e in node.gpus)


def zero_price_bound(problem: Problem, table: OpTable, deadline: float | None = None) -> float:
    """Per-unit cover bound with no prices on GPUs or budgets (valid, weak); its
    share-charge search stops at ``deadline`` (``time.perf_counter`` seconds) with
    the best charge evaluated so far."""
    classes = gpu_classes(problem, table)
    costs = objective_costs(problem, table)
    zero = np.zeros(len(classes))
    duals = Duals(np.zeros(len(table.units)), zero, zero)
    bound, _ = best_unit_bound(table, costs, classes, duals, [], [], exact=False, deadline=deadline)
    return bound


class SolvePart(Protocol):
    """Solves one part with a preset: ``solvers.serving.solve``'s signature."""

    def __call__(
        self,
        problem: Problem,
        preset: SolverPreset,
        *,
        time_limit_s: float | None = ...,
        rel_gap: float | None = ...,
    ) -> Result[Plan]: ...


PARTS_SHARE = 0.8
"""Share of the time limit the parts are solved in; the bound takes the rest. With
the bound first, on fleet-4096 its search took 11 of the 24 s and each part was
left about 1 s (17.4 % above the best bound)."""


PART_SHARE_SLACK = 2.0
"""A part may take this many equal shares of the time left for the parts."""


def solve_pop(
    problem: Problem,
    table: OpTable,
    preset: SolverPreset,
    deadline: float,
    gap: float,
    note: Progress,
    solve_part: SolvePart,
) -> Result[Plan]:
    """Partitioned solve; see the module docstring. ``solve_part`` solves one part
    with the sub-solver's preset (``solvers.serving.solve``, which dispatches here)."""
    t0 = time.perf_counter()
    sub_preset = load_preset(preset.sub_solver)
    if sub_preset.formulation == "pop":
        raise ValueError(f"pop: sub_solver {preset.sub_solver!r} is itself a POP preset")
    parts_deadline = t0 + PARTS_SHARE * (deadline - t0)
    parts = preset.partitions
    cut_part = False
    while True:
        subs = split_problem(problem, parts, preset.seed)
        results = []
        for i, sub in enumerate(subs):
            # Each part stops on its own effort limits; its safety net is
            # PART_SHARE_SLACK times an equal share of the time to the parts'
            # deadline (an equal share binds first on a loaded machine and makes
            # the run unrepeatable; all of it leaves the last parts nothing when
            # the limit is too short for every part's effort).
            rest = parts_deadline - time.perf_counter()
            left = max(1.0, min(rest, PART_SHARE_SLACK * rest / (len(subs) - i)))
            res = solve_part(sub, sub_preset, time_limit_s=left, rel_gap=gap)
            if res.termination == Termination.TIME_LIMIT:
                cut_part = True
            note(
                f"pop: part {i + 1}/{len(subs)} ({len(sub.gpus)} GPUs, "
                f"{len(sub.instance.workloads)} workloads): {res.status}, "
                f"objective {res.objective if res.objective is not None else '-'}"
            )
            results.append(res)
            if res.plan is None:
                break
        if all(r.plan is not None for r in results) and len(results) == len(subs):
            break
        if len(subs) <= 1:
            wall = time.perf_counter() - t0
            status = INFEASIBLE if results and results[-1].status == INFEASIBLE else NO_SOLUTION
            return Result(status, None, None, wall, None, preset.name, [])
        parts = max(1, len(subs) // 2)
        note(f"pop: a part has no plan; trying {parts} parts")
    t_bound = time.perf_counter()
    bound = zero_price_bound(problem, table, deadline=deadline)
    cut_bound = time.perf_counter() >= deadline
    note(f"pop: bound at zero prices {bound:,.3f} ({time.perf_counter() - t_bound:.1f} s)")
    merged = {g.gpu: g for r in results if r.plan is not None for g in r.plan.gpus}
    plan = Plan(
        instance=problem.instance.name,
        gpus=tuple(merged[g.id] for g in problem.gpus if g.id in merged),
        solver=preset.name,
    )
    # The merged plan's cost, by the verifier's arithmetic (parts' objectives do not
    # add up for every objective: gpus_on scales power by the whole fleet's TDP).
    objective = evaluate_plan(problem, plan).objective
    bound = min(bound, objective)
    status = status_at(objective, bound, gap)
    plan = plan.model_copy(
        update={
            "objective": objective,
            "bound": bound,
            "gap": rel_gap_of(objective, bound),
            "status": status,
        }
    )
    termination = stop_reason(
        (["a part"] if cut_part else []) + (["the bound"] if cut_bound else []),
        False,
        note,
        otherwise=Termination.HEURISTIC,
    )
    return Result(
        status,
        objective,
        bound,
        time.perf_counter() - t0,
        plan,
        preset.name,
        [],
        termination=termination,
    )
