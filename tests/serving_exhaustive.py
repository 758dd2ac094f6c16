"""Random tiny serving instances and an exhaustive optimiser written apart from the
formulations, for the differential test of every serving preset.

The optimiser reads only the operating-point table (the performance model) and the
instance: it enumerates every per-GPU choice (off; a clock with a set of single-GPU
placements; membership of a tensor-parallel group), every way of forming TP groups
from the GPUs that chose them, and which placements of a unit now on its GPU stay idle
(rate 0); it drops the combinations whose worst-case draw (on-power + each
placement's steady power at its SLO capacity) breaks a cap or budget, and solves the
routed rates of the rest as an LP with scipy. A placement that carries rate costs its
power line's fixed part plus its part per request; an idle one costs nothing. It
knows each objective of ``options.objective`` from its definition in
docs/formulations/serving.md, not from ``families.serving.formulations.costs``.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from energyopt.catalog import Problem, builtin_catalog, resolve
from energyopt.perf.oppoints import OpTable, build_op_table
from energyopt.spec import Instance

from .lp_helpers import lp_minimum

MAX_COMBINATIONS = 4000
"""Instances whose enumeration is larger than this are redrawn."""

GpuChoice = tuple[str, int, tuple[int, ...]] | None
"""("shared", clock, ops) or ("tp", clock, (op,)) or None (off)."""


@dataclass(frozen=True)
class Optimum:
    """Exhaustive optimum: objective value, or None when no plan exists."""

    value: float | None
    combinations: int
    choice: tuple[GpuChoice, ...] | None = None
    """The best per-GPU choice (for failure messages)."""


def _cap_w(problem: Problem, i: int) -> float:
    gpu = problem.gpus[i]
    gtype = problem.gpu_type(gpu.type)
    if gpu.power_cap_w is None:
        return gtype.power_limit_max_w
    return min(gpu.power_cap_w, gtype.power_limit_max_w)


def _gpu_choices(problem: Problem, table: OpTable, i: int) -> list[GpuChoice]:
    gpu = problem.gpus[i]
    gtype = problem.gpu_type(gpu.type)
    opts = problem.instance.options
    usable = gtype.memory_gb * (1 - opts.memory_reserve_fraction)
    mig = opts.sharing.mode == "mig" and bool(gtype.mig_profiles)
    capacity = 100
    mine = [o for o in range(len(table)) if table.type_names[table.gpu_type[o]] == gpu.type]
    out: list[GpuChoice] = [None]
    for clock in table.clocks[gpu.type]:
        at = [o for o in mine if table.clock_mhz[o] == clock]
        single = [o for o in at if table.tp[o] == 1]
        for size in range(1, len(table.units) + 1):
            for combo in itertools.combinations(single, size):
                units = [int(table.unit[o]) for o in combo]
                if len(set(units)) != len(units):
                    continue
                if not mig and sum(int(table.share[o]) for o in combo) > capacity:
                    continue
                if mig:
                    if not _mig_layout_fits(gtype, [table.mig_profile[o] for o in combo]):
                        continue
                elif sum(float(table.memory_gb[o]) for o in combo) > usable:
                    continue
                out.append(("shared", clock, combo))
        out.extend(("tp", clock, (o,)) for o in at if table.tp[o] > 1)
    return out


def _mig_layout_fits(gtype: Any, names: list[str | None]) -> bool:
    """Whether the MIG instances ``names`` can be created together: instance counts
    within each profile's limit, compute slices within the GPU's, and a start for
    every instance among its profile's allowed placements with no two instances
    sharing a memory slice (tried exhaustively)."""
    profiles = [gtype.mig_profile(n) for n in names if n is not None]
    for p in profiles:
        if sum(1 for q in profiles if q.name == p.name) > p.max_instances:
            return False
    if sum(p.compute_slices for p in profiles) > gtype.mig_total_slices:
        return False
    if sum(1 for p in profiles if p.media_extensions) > 1:
        return False
    total = gtype.mig_memory_slices

    def size(p: Any) -> int:
        if p.memory_slices is not None:
            return int(p.memory_slices)
        return max(1, min(total, round(p.memory_gb / gtype.memory_gb * total)))

    def starts(p: Any) -> list[int]:
        k = size(p)
        given = p.placements or range(0, total - k + 1, k)
        return [s for s in given if s + k <= total]

    for chosen in itertools.product(*(starts(p) for p in profiles)):
        used: set[int] = set()
        ok = True
        for p, start in zip(profiles, chosen, strict=True):
            cells = set(range(start, start + size(p)))
            if cells & used:
                ok = False
                break
            used |= cells
        if ok:
            return True
    return False


def _groupings(members: list[int], k: int) -> Iterator[list[tuple[int, ...]]]:
    """Every partition of ``members`` into groups of ``k`` (none if not divisible)."""
    if not members:
        yield []
        return
    if len(members) % k:
        return
    first, rest = members[0], members[1:]
    for others in itertools.combinations(rest, k - 1):
        left = [m for m in rest if m not in others]
        for tail in _groupings(left, k):
            yield [(first, *others), *tail]


def _moved(problem: Problem, table: OpTable, choice: tuple[GpuChoice, ...]) -> int:
    """Current (GPU, unit) placements the choice does not keep as single placements."""
    moved = 0
    for i, gpu in enumerate(problem.gpus):
        if gpu.state is None:
            continue
        c = choice[i]
        kept = set()
        if c is not None and c[0] == "shared":
            kept = {
                (table.units[int(table.unit[o])].workload, table.units[int(table.unit[o])].phase)
                for o in c[2]
            }
        current = {(p.workload, p.phase) for p in gpu.state.placements}
        moved += len(current - kept)
    return moved


PRUNE_TOL = 1e-6
"""Relative margin by which a choice's lower bound must exceed the best value before
its LP is skipped (the LP's own value may sit ~1e-9 below the bound)."""


def _current_ops(problem: Problem, table: OpTable, choice: tuple[GpuChoice, ...]) -> list[int]:
    """Indices into the choice's single placements (in ``_singles`` order) of those
    whose unit is placed on that GPU now: such a placement may stay at rate 0,
    where it costs nothing and avoids a migration."""
    out = []
    for j, (i, o) in enumerate(_singles(choice)):
        state = problem.gpus[i].state
        unit = table.units[int(table.unit[o])]
        if state is not None and any(
            (p.workload, p.phase) == (unit.workload, unit.phase) for p in state.placements
        ):
            out.append(j)
    return out


def _singles(choice: tuple[GpuChoice, ...]) -> list[tuple[int, int]]:
    """(GPU index, op) of every single-GPU placement of the choice."""
    return [
        (i, o) for i, c in enumerate(choice) if c is not None and c[0] == "shared" for o in c[2]
    ]


def _worst_case_fits(
    problem: Problem, table: OpTable, choice: tuple[GpuChoice, ...], caps: list[float]
) -> bool:
    """Whether every GPU's worst-case draw (on-power at its clock + the steady power
    at SLO capacity of each placement on it, 1/k of a TP group's) is within its cap,
    and the node and cluster sums within their budgets, whatever the rates."""
    gpus = problem.gpus
    draw = [0.0] * len(gpus)
    for i, c in enumerate(choice):
        if c is None:
            continue
        draw[i] = table.on_power[(gpus[i].type, c[1])] + sum(
            float(table.peak_power_w[o]) / int(table.tp[o]) for o in c[2]
        )
        if draw[i] > caps[i]:
            return False
    for node in problem.instance.cluster.nodes:
        if node.power_budget_w is not None:
            used = sum(d for d, g in zip(draw, gpus, strict=True) if g.node == node.name)
            if used > node.power_budget_w:
                return False
    budget = problem.instance.cluster.power_budget_w
    return budget is None or sum(draw) <= budget


def exhaustive_optimum(problem: Problem, table: OpTable | None = None) -> Optimum:
    """Least objective over every plan the instance allows (see module docstring);
    ``table``: the problem's operating-point table, if the caller has built it."""
    if table is None:
        table = build_op_table(problem)
    gpus = problem.gpus
    n_units = len(table.units)
    choices = [_gpu_choices(problem, table, i) for i in range(len(gpus))]
    opts = problem.instance.options
    objective = opts.objective
    scale = sum(problem.gpu_type(g.type).tdp_w for g in gpus)
    # Delay weight of each op for the edp objective: its unloaded latency over the
    # same unit's at the type's max clock on a full GPU (it weights the placement's
    # whole dynamic power, fixed part and part per request).
    weight = np.where(table.ref_latency_ms > 0, table.latency_ms / table.ref_latency_ms, 1.0)
    if objective != "edp":
        weight = np.ones(len(table))
    caps = [_cap_w(problem, i) for i in range(len(gpus))]
    node_of = [g.node for g in gpus]
    best: float | None = None
    arg: tuple[GpuChoice, ...] | None = None
    count = 0
    # A choice's value is at least its static power, plus the fixed part of each
    # placement that must carry rate (every TP group; every single placement but
    # those of a current unit, which may stay idle), plus each unit's rate at the
    # cheapest part per request of its ops the choice offers (the LP without
    # capacities), plus its GPU count or migration penalty. Choices are tried in
    # order of that floor; once the floor is above the best value found, no later
    # choice can beat it and their LPs are skipped (they are still counted).
    marginal = table.marginal_j * weight
    fixed = table.fixed_w * weight
    rates = [u.rate_rps for u in table.units]
    candidates: list[tuple[float, int, tuple[GpuChoice, ...], list[tuple[str, int]], Any]] = []
    for choice in itertools.product(*choices):
        covered = {int(table.unit[o]) for c in choice if c is not None for o in c[2]}
        if len(covered) != n_units:
            continue
        tp_members: dict[tuple[str, int], list[int]] = defaultdict(list)
        for i, c in enumerate(choice):
            if c is not None and c[0] == "tp":
                tp_members[(node_of[i], c[2][0])].append(i)
        pools = [
            list(_groupings(members, int(table.tp[o]))) for (_, o), members in tp_members.items()
        ]
        if any(not p for p in pools):
            continue
        count += math.prod(len(p) for p in pools)
        if not _worst_case_fits(problem, table, choice, caps):
            continue
        static_w = sum(
            table.on_power[(gpus[i].type, c[1])] for i, c in enumerate(choice) if c is not None
        )
        cheapest = [np.inf] * n_units
        for c in choice:
            for o in c[2] if c is not None else ():
                u = int(table.unit[o])
                cheapest[u] = min(cheapest[u], float(marginal[o]))
        singles = _singles(choice)
        may_idle = set(_current_ops(problem, table, choice))
        floor = static_w + sum(r * k for r, k in zip(rates, cheapest, strict=True) if r > 0)
        floor += sum(float(fixed[o]) for j, (_, o) in enumerate(singles) if j not in may_idle)
        floor += sum(
            float(fixed[o]) * len(members) / int(table.tp[o])
            for (_, o), members in tp_members.items()
        )
        if objective == "gpus_on":
            floor = sum(1 for c in choice if c is not None) + floor / scale
        elif objective == "power_migration":
            floor += opts.migration_penalty_w * _moved(problem, table, choice)
        candidates.append((floor, len(candidates), choice, list(tp_members), pools))
    candidates.sort(key=lambda c: (c[0], c[1]))
    for floor, _, choice, pool_keys, pools in candidates:
        if best is not None and floor - PRUNE_TOL * max(1.0, abs(best)) > best:
            break
        current = _current_ops(problem, table, choice)
        # Each current placement either carries rate or stays idle (rate 0, no cost).
        idle_sets = [
            set(s) for n in range(len(current) + 1) for s in itertools.combinations(current, n)
        ]
        for grouping in itertools.product(*pools):
            for idle in idle_sets:
                value = _solve_rates(
                    problem, table, choice, pool_keys, grouping, idle, marginal, fixed
                )
                if value is None:
                    continue
                if objective == "gpus_on":
                    value = sum(1 for c in choice if c is not None) + value / scale
                elif objective == "power_migration":
                    value += opts.migration_penalty_w * _moved(problem, table, choice)
                if best is None or value < best:
                    best, arg = value, choice
    return Optimum(best, count, arg)


def _solve_rates(
    problem: Problem,
    table: OpTable,
    choice: tuple[GpuChoice, ...],
    pool_keys: list[tuple[str, int]],
    grouping: tuple[list[tuple[int, ...]], ...],
    idle: set[int],
    marginal: np.ndarray,
    fixed: np.ndarray,
) -> float | None:
    """Least (delay-weighted, for edp) power of the choice: static power, the fixed
    part of every placement but the ``idle`` ones (indices into its single
    placements, held at rate 0), and the rates' part by LP; None if no rates
    serve the demand within the capacities."""
    gpus = problem.gpus
    static = sum(
        table.on_power[(gpus[i].type, c[1])] for i, c in enumerate(choice) if c is not None
    )
    # Variables: one rate per single placement, one per TP group.
    ops = [o for _, o in _singles(choice)]
    for (_, o), groups in zip(pool_keys, grouping, strict=True):
        ops.extend(o for _ in groups)
    cost = np.asarray([float(marginal[o]) for o in ops])
    constant = sum(float(fixed[o]) for j, o in enumerate(ops) if j not in idle)
    a_eq = np.zeros((len(table.units), len(ops)))
    for j, o in enumerate(ops):
        a_eq[int(table.unit[o]), j] = 1.0
    b_eq = np.asarray([u.rate_rps for u in table.units])
    bounds = [(0.0, 0.0 if j in idle else float(table.capacity_rps[o])) for j, o in enumerate(ops)]
    least = lp_minimum(cost, [], [], a_eq, b_eq, bounds)
    if least is None:
        return None
    return float(static) + constant + least


SMALL_MODELS = ("Llama-3.1-8B", "Mistral-7B", "Qwen2.5-14B")
MIG_TYPES = ("A100-SXM4-80GB", "H100-SXM5-80GB")
TYPES = ("H100-SXM5-80GB", "A100-SXM4-80GB", "L40S", "H200-SXM-141GB")


def random_instance(rng: random.Random) -> dict[str, Any]:
    """One random tiny instance (as file data): types, caps, budgets, TP, MIG, state."""
    cat = builtin_catalog()
    mig = rng.random() < 0.2
    big = not mig and rng.random() < 0.25
    pool = MIG_TYPES if mig else TYPES
    if big:
        pool = ("H100-SXM5-80GB", "A100-SXM4-80GB")
    types = rng.sample(pool, rng.choice([1, 1, 2]))
    n_gpus = rng.randint(2, 3) if big else rng.randint(1, 3)
    gpus: list[dict[str, Any]] = []
    for g in range(n_gpus):
        t = types[0] if big else rng.choice(types)
        gtype = cat.gpu(t)
        entry: dict[str, Any] = {"type": t, "ids": [f"g{g}"]}
        if rng.random() < 0.4:
            lo, hi = gtype.power_limit_min_w, gtype.power_limit_max_w
            entry["power_cap_w"] = float(round(rng.uniform(lo + 0.1 * (hi - lo), hi)))
        gpus.append(entry)
    clocks = {}
    for t in sorted({g["type"] for g in gpus}):
        supported = cat.gpu(t).sm_clocks_mhz()
        high = [c for c in supported if c >= 0.5 * max(supported)]
        clocks[t] = sorted(rng.sample(high, rng.randint(2, 3)))
    workloads: list[dict[str, Any]] = []
    n_work = 1 if big else rng.randint(1, 2 if n_gpus == 3 else 3)
    for w in range(n_work):
        model = "Llama-3.1-70B" if big and w == 0 else rng.choice(SMALL_MODELS)
        wl: dict[str, Any] = {
            "name": f"w{w}",
            "model": model,
            "rate_rps": round(rng.uniform(0.3, 1.5 if big else 6.0), 2),
            "prompt_tokens": {"mean": rng.choice([256, 512, 1024])},
            "output_tokens": {"mean": rng.choice([64, 128, 256])},
            "slo": {
                "ttft_ms": rng.choice([600.0, 1200.0, 3000.0]),
                "tbt_ms": rng.choice([60.0, 100.0, 150.0]),
            },
        }
        if big:
            wl["tensor_parallel"] = [2]
        workloads.append(wl)
    objective = rng.choice(["power", "power", "gpus_on", "edp", "power_migration"])
    options: dict[str, Any] = {"clocks_mhz": clocks, "objective": objective}
    if mig:
        options["sharing"] = {"mode": "mig"}
    else:
        levels = sorted(rng.sample([25, 50, 75, 100], rng.randint(1, 2)))
        options["sharing"] = {"mode": "mps", "levels_pct": levels}
    if objective == "power_migration":
        options["migration_penalty_w"] = float(rng.choice([20, 80]))
        holder = gpus[0]
        holder["state"] = {
            "clock_mhz": clocks[holder["type"]][-1],
            "placements": [{"workload": workloads[-1]["name"], "share_pct": 100}],
        }
    node: dict[str, Any] = {"name": "n0", "gpus": gpus}
    cluster: dict[str, Any] = {"nodes": [node]}
    if rng.random() < 0.25:
        node["power_budget_w"] = float(rng.choice([300, 450, 700, 1000]))
    if rng.random() < 0.15:
        cluster["power_budget_w"] = float(rng.choice([350, 600, 900]))
    return {
        "name": "random-tiny",
        "cluster": cluster,
        "workloads": workloads,
        "options": options,
    }


def random_problems(seed: int, count: int) -> Iterator[tuple[dict[str, Any], Problem, Optimum]]:
    """``count`` random tiny problems small enough to enumerate, with their optimum."""
    rng = random.Random(seed)
    made = 0
    while made < count:
        data = random_instance(rng)
        problem = resolve(Instance.model_validate(data), "random-tiny")
        table = build_op_table(problem)
        sizes = [len(_gpu_choices(problem, table, i)) for i in range(len(problem.gpus))]
        if float(np.prod(sizes)) > MAX_COMBINATIONS:
            continue
        made += 1
        yield data, problem, exhaustive_optimum(problem, table)


_MADE: dict[int, list[tuple[dict[str, Any], Problem, Optimum]]] = {}


def shared_random_problems(seed: int, count: int) -> list[tuple[dict[str, Any], Problem, Optimum]]:
    """The first ``count`` of ``random_problems(seed, ...)``, enumerated once per test
    process for every module that asks for them (40 take about 30 s). The same
    objects are handed to every caller: tests must not change them."""
    made = _MADE.get(seed, [])
    if len(made) < count:
        made = list(random_problems(seed, count))
        _MADE[seed] = made
    return made[:count]
