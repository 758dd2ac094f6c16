"""Elastic shadow pricing: per-unit configuration choices at resource prices.

Relaxation (see docs/formulations/serving.md, "Decompositions"): a placement of
op o (share fraction phi_o of a GPU, or k whole GPUs) carries a rate
r <= top_o = min(cap_o, rate of its unit) (req/s; a placement never carries more
than its unit's whole rate), so a unit routing x req/s to op o makes at least
x / top_o placements of it. Charge each req/s 1 / top_o of a placement: that
part of the slice's GPU on-cost, GPU count and memory, of the placement's fixed
cost op_fixed_o (its decode loop, charged once per placement whatever its rate),
and of its worst-case draw on the power budgets (phi_o on-power + peak_o, the
steady power at its SLO capacity: budgets are checked on that draw, whatever
the rates; families/serving/verify.py). Shares of one GPU add up to at most one and
every placement counts its fixed cost and its peak once, so this pooled problem
is a relaxation of the fleet problem: every plan's cost is at least its value.
Pricing the coupling resources (GPUs of each class: lambda_c per GPU; memory:
mu_c per GB; node and cluster power budgets: nu_b per W) splits it into one
choice per unit, the op and class of least priced cost per request/s:

    kappa(o, c) = (phi_o (on_cost + lambda_c + nu_c on_power) + op_fixed_o
                   + nu_c peak_o + mu_c k_o mem_o) / top_o + op_cost_o,
    L(lambda, mu, nu) = sum_u rate_u min kappa - sum_c (lambda_c n_c + mu_c M_c n_c)
                        - sum_b nu_b B_b,

a valid lower bound for any non-negative prices (op_cost_o is the marginal
cost per req/s; on_cost, op_fixed and op_cost are in the objective's units, the
power terms in W). Prices follow the projected
subgradient with Polyak's step theta (UB - L) / |g|^2 (theta halves after
STALL_ITERATIONS iterations without a better L). At the best prices the
integral per-unit cover bound (``solvers.unit_bound.grid_cover_bound``) is evaluated
too. Primal repair: the choices of the last iterations are packed first-fit
(by share and memory, one placement per unit per GPU) into GPU configurations,
which with the single-placement columns at the top clock form a small integer
program that routes rates and picks counts within every cap and budget. If
that program has no plan (the packed columns cannot serve the demand together,
which proves nothing about the instance), the time left goes to column
generation and the better of the two bounds is kept.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import Duals, shared_column, tp_column
from energyopt.families.serving.formulations.knapsack import (
    greedy_configuration,
    item_values,
    repair_and_fill,
)
from energyopt.families.serving.solvers.backend import finish_plan
from energyopt.families.serving.solvers.colgen import COLUMNS_PER_ROUND
from energyopt.families.serving.solvers.configurations import solve_configurations
from energyopt.families.serving.solvers.highs_direct import solve_master_mip
from energyopt.families.serving.solvers.unit_bound import best_unit_bound
from energyopt.formulations.errors import FormulationNotApplicable
from energyopt.perf.oppoints import OpTable
from energyopt.progress import Progress
from energyopt.solvers.presets import SolverPreset
from energyopt.solvers.result import INFEASIBLE, NO_SOLUTION, Result, status_at, stop_reason
from energyopt.solvers.result import relative_gap as rel_gap_of
from energyopt.solvers.subgradient import PolyakControl, projected_step
from energyopt.spec.plan import Plan

STALL_ITERATIONS = 5
REPAIR_ITERATIONS = 8
"""How many of the last iterations' choices are packed into repair columns."""


@dataclass
class PricedOps:
    """Every (op, class) pair a unit can choose, as arrays."""

    op: NDArray[np.int64]
    cls: NDArray[np.int64]
    unit: NDArray[np.int64]
    gpus_per_rps: NDArray[np.float64]  # phi_o / top_o (GPUs per req/s)
    on_cost_per_rps: NDArray[np.float64]  # (phi_o on_cost + op_fixed_o) / top_o + op_cost_o
    on_power_per_rps: NDArray[np.float64]  # worst-case draw (phi_o on_power + peak_o) / top_o, W
    mem_per_rps: NDArray[np.float64]  # GB per req/s (all GPUs of a TP group)


def priced_ops(table: OpTable, costs: Any, classes: list[GpuClass]) -> PricedOps:
    """The pooled relaxation's choices, each charged per req/s of its unit (module
    docstring): 1 / top_o of a placement, top_o the most one placement of op o
    carries (``OpTable.top_rps``)."""
    rows: list[tuple[int, int]] = []
    for c in classes:
        t = table.type_names.index(c.type_name)
        for o in np.flatnonzero(table.gpu_type == t).tolist():
            if int(table.tp[o]) <= c.size:
                rows.append((o, c.index))
    op = np.asarray([r[0] for r in rows], dtype=np.int64)
    cls = np.asarray([r[1] for r in rows], dtype=np.int64)
    missing = set(range(len(table.units))) - set(table.unit[op].tolist())
    if missing:
        names = ", ".join(
            f"{table.units[u].workload}:{table.units[u].phase}" for u in sorted(missing)
        )
        raise FormulationNotApplicable(
            f"no class of interchangeable GPUs can host {names} on its own"
        )
    type_of = [table.type_names[int(t)] for t in table.gpu_type[op]]
    cap_units = np.asarray([table.share_capacity[n] for n in type_of], dtype=np.float64)
    tp = table.tp[op].astype(np.float64)
    phi = np.where(tp > 1, tp, table.share[op] / cap_units)
    cap = table.capacity_rps[op]
    unit_rate = np.asarray([u.rate_rps for u in table.units], dtype=np.float64)[table.unit[op]]
    top = np.where(unit_rate > 0, np.minimum(cap, unit_rate), cap)  # OpTable.top_rps
    clock = table.clock_mhz[op]
    on_cost = np.asarray([costs.on_cost[(n, int(f))] for n, f in zip(type_of, clock, strict=True)])
    on_power = np.asarray(
        [table.on_power[(n, int(f))] for n, f in zip(type_of, clock, strict=True)]
    )
    return PricedOps(
        op=op,
        cls=cls,
        unit=table.unit[op].astype(np.int64),
        gpus_per_rps=phi / top,
        on_cost_per_rps=(phi * on_cost + costs.op_fixed[op]) / top + costs.op_cost[op],
        on_power_per_rps=(phi * on_power + table.peak_power_w[op]) / top,
        mem_per_rps=table.memory_gb[op] * tp / top,
    )


@dataclass
class Prices:
    """Resource prices: per GPU of a class, per GB of a class, per W of a budget row."""

    gpu: NDArray[np.float64]
    mem: NDArray[np.float64]
    budget: NDArray[np.float64]


def _budget_rows(problem: Problem, classes: list[GpuClass]) -> tuple[list[float], list[list[int]]]:
    """(budget W per row, rows of each class): node budgets, then the cluster's."""
    cluster = problem.instance.cluster
    budgets: list[float] = []
    index: dict[str, int] = {}
    for n in cluster.nodes:
        if n.power_budget_w is not None:
            index[n.name] = len(budgets)
            budgets.append(float(n.power_budget_w))
    top = None
    if cluster.power_budget_w is not None:
        top = len(budgets)
        budgets.append(float(cluster.power_budget_w))
    rows = []
    for c in classes:
        mine = [index[c.node]] if c.node is not None and c.node in index else []
        if top is not None:
            mine.append(top)
        rows.append(mine)
    return budgets, rows


@dataclass
class PriceRun:
    """Outcome of the subgradient loop."""

    bound: float  # best Lagrangian value (a valid lower bound)
    prices: Prices  # the prices that gave it
    recent: list[NDArray[np.int64]]  # the last iterations' choices (index into PricedOps)
    iterations: int
    ops: PricedOps
    budgets_w: list[float]
    class_budget: NDArray[np.float64]  # [class, budget row] membership
    timed_out: bool = False
    """The time limit, not ``iterations`` or a zero subgradient, ended the loop."""


def find_prices(
    problem: Problem,
    table: OpTable,
    prog: pat.PatternProgram,
    *,
    iterations: int,
    step: float,
    time_limit_s: float,
    note: Progress | None = None,
) -> PriceRun:
    """Projected subgradient on the pooled relaxation (see the module docstring)."""
    t0 = time.perf_counter()
    classes = prog.classes
    ops = priced_ops(table, prog.costs, classes)
    budgets, class_rows = _budget_rows(problem, classes)
    n_c = np.asarray([c.size for c in classes], dtype=np.float64)
    mem_c = np.asarray(
        [
            problem.gpu_type(c.type_name).memory_gb
            * (1.0 - problem.instance.options.memory_reserve_fraction)
            for c in classes
        ]
    )
    budget_w = np.asarray(budgets, dtype=np.float64)
    member = np.zeros((len(classes), len(budgets)))
    for c, rows in enumerate(class_rows):
        member[c, rows] = 1.0
    rates = np.asarray([u.rate_rps for u in table.units])
    prices = Prices(np.zeros(len(classes)), np.zeros(len(classes)), np.zeros(len(budgets)))

    def evaluate(p: Prices) -> tuple[float, NDArray[np.int64]]:
        nu_c = member @ p.budget if len(budgets) else np.zeros(len(classes))
        kappa = (
            ops.on_cost_per_rps
            + ops.gpus_per_rps * p.gpu[ops.cls]
            + ops.mem_per_rps * p.mem[ops.cls]
            + ops.on_power_per_rps * nu_c[ops.cls]
        )
        choice = np.full(len(table.units), -1, dtype=np.int64)
        order = np.lexsort((kappa, ops.unit))
        first = np.ones(len(order), dtype=bool)
        first[1:] = ops.unit[order][1:] != ops.unit[order][:-1]
        choice[ops.unit[order][first]] = order[first]
        value = float(np.dot(rates, kappa[choice]))
        value -= float(np.dot(p.gpu, n_c) + np.dot(p.mem, n_c * mem_c) + np.dot(p.budget, budget_w))
        return value, choice

    def subgradient(choice: NDArray[np.int64]) -> tuple[NDArray[np.float64], ...]:
        gpus = np.zeros(len(classes))
        mem = np.zeros(len(classes))
        power_c = np.zeros(len(classes))
        np.add.at(gpus, ops.cls[choice], rates * ops.gpus_per_rps[choice])
        np.add.at(mem, ops.cls[choice], rates * ops.mem_per_rps[choice])
        np.add.at(power_c, ops.cls[choice], rates * ops.on_power_per_rps[choice])
        return gpus - n_c, mem - n_c * mem_c, member.T @ power_c - budget_w

    # Polyak's target: a value no plan can beat from above (all GPUs on at the
    # top clock, every unit at its most power-hungry op).
    upper = float(
        sum(table.on_power[(c.type_name, max(table.clocks[c.type_name]))] * c.size for c in classes)
    ) + float(np.dot(rates, [ops.on_power_per_rps[ops.unit == u].max() for u in range(len(rates))]))
    best_l, best_prices = -np.inf, prices
    timed_out = False
    control = PolyakControl(theta=step, patience=STALL_ITERATIONS, rel_improvement=1e-9)
    recent: list[NDArray[np.int64]] = []
    it = 0
    sizes = (len(classes), len(classes), len(budgets))
    for it in range(iterations):
        value, choice = evaluate(prices)
        recent = [*recent, choice][-REPAIR_ITERATIONS:]
        if control.observe(value):
            best_l, best_prices = value, prices
        if note is not None and it % 10 == 0:
            note(f"shadow prices, iteration {it + 1}: Lagrangian bound {best_l:,.3f}")
        flat = np.concatenate([prices.gpu, prices.mem, prices.budget])
        g = np.concatenate(subgradient(choice))
        moved, norm = projected_step(
            flat, g, value, upper, control.theta, min_gap=1e-6 * abs(upper)
        )
        if norm <= 1e-18:
            break
        if time.perf_counter() > t0 + time_limit_s:
            timed_out = it + 1 < iterations
            break
        gpu, mem, budget = np.split(moved, np.cumsum(sizes)[:2])
        prices = Prices(gpu, mem, budget)
    return PriceRun(best_l, best_prices, recent, it + 1, ops, budgets, member, timed_out)


def solve_shadow_price(
    problem: Problem,
    table: OpTable,
    preset: SolverPreset,
    deadline: float,
    gap: float,
    note: Progress,
) -> Result[Plan]:
    """Lagrangian bound by elastic shadow prices, and a repaired plan."""
    t0 = time.perf_counter()
    prog = pat.prepare(problem, table, note, pricing="knapsack")
    classes = prog.classes
    run = find_prices(
        problem,
        table,
        prog,
        iterations=preset.iterations,
        step=preset.step,
        time_limit_s=0.3 * (deadline - t0),
        note=note,
    )
    best_l, best_prices, ops, budgets = run.bound, run.prices, run.ops, run.budgets_w
    member = run.class_budget
    rates = np.asarray([u.rate_rps for u in table.units])
    nu_c = member @ best_prices.budget if len(budgets) else np.zeros(len(classes))
    duals = Duals(np.zeros(len(table.units)), -best_prices.gpu, -nu_c)
    ub_deadline = time.perf_counter() + 0.25 * (deadline - time.perf_counter())
    unit_b, _ = best_unit_bound(
        table,
        prog.costs,
        classes,
        duals,
        budgets,
        list(-best_prices.budget),
        exact=False,
        deadline=ub_deadline,
    )
    cuts = (["subgradient"] if run.timed_out else []) + (
        ["unit bound"] if time.perf_counter() >= ub_deadline else []
    )
    bound = max(best_l, unit_b)
    note(
        f"shadow prices: Lagrangian bound {best_l:,.3f}, unit cover bound {unit_b:,.3f} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    for choice in run.recent:
        for col in _packed_columns(prog, ops, choice, rates):
            prog.add(col)
    for col in _priced_columns(prog, run):
        prog.add(col)
    im = pat.integer_model(prog, pyomo=False)
    out, values = solve_master_mip(
        im.master,
        time_limit_s=max(0.5, deadline - time.perf_counter()),
        rel_gap=gap,
        stop_at=bound / (1.0 - gap) if gap < 1 else None,
        progress=note,
        certified_bound=bound,
        max_nodes=preset.mip_nodes,
    )
    if out.time_limited:
        cuts.append("repair")
    if out.objective is None or values is None:
        # The packed columns cannot serve the demand together (this proves nothing
        # about the problem): complete by column generation, keeping the bound.
        note("repair: no plan over the packed columns; completing by column generation")
        res = solve_configurations(problem, table, preset, deadline, gap, note, exact=False)
        if res.status == INFEASIBLE:
            return res
        if res.plan is None or res.objective is None:
            return Result(NO_SOLUTION, None, bound, time.perf_counter() - t0, None, preset.name)
        bound = min(max(bound, res.bound or bound), res.objective)
        status = status_at(res.objective, bound, gap)
        plan = res.plan.model_copy(
            update={"bound": bound, "gap": rel_gap_of(res.objective, bound), "status": status}
        )
        return Result(status, res.objective, bound, time.perf_counter() - t0, plan, preset.name)
    wall = time.perf_counter() - t0
    im.values = values
    # The plan places no op that carries no rate: its objective is the master's less
    # the fixed parts of such ops, as the verifier prices it.
    objective = pat.integer_objective(prog, values)
    bound = min(bound, objective)
    status = status_at(objective, bound, gap)
    plan = finish_plan(
        problem, table, pat.decisions(prog, im), status, objective, bound, preset.name
    )
    note(f"repaired plan over {len(prog.columns)} columns: {objective:,.3f}")
    termination = stop_reason(cuts, rel_gap_of(objective, bound) <= gap, note)
    return Result(status, objective, bound, wall, plan, preset.name, [], termination=termination)


def _priced_columns(prog: pat.PatternProgram, run: PriceRun) -> list[Any]:
    """GPU configurations worth building at the best prices.

    Each unit's price per request/s is its least priced cost (what serving one
    more request/s costs it); with those prices and the GPU and budget prices, the
    greedy knapsack of column generation packs, per class and clock, up to
    COLUMNS_PER_ROUND configurations of disjoint units valued at those prices
    (whether or not they beat the pooled relaxation, which no configuration
    does by much): units paired on one GPU at one clock, which the per-unit
    choices alone never pair.
    """
    table, ops, p = prog.table, run.ops, run.prices
    nu_c = run.class_budget @ p.budget if len(run.budgets_w) else np.zeros(len(prog.classes))
    kappa = (
        ops.on_cost_per_rps
        + ops.gpus_per_rps * p.gpu[ops.cls]
        + ops.mem_per_rps * p.mem[ops.cls]
        + ops.on_power_per_rps * nu_c[ops.cls]
    )
    unit_price = np.full(len(table.units), np.inf)
    np.minimum.at(unit_price, ops.unit, kappa)
    duals = Duals(np.where(np.isfinite(unit_price), unit_price, 0.0), -p.gpu, -nu_c)
    columns: list[Any] = []
    for cls in prog.classes:
        for (type_name, clock), ks in prog.knapsacks.items():
            if type_name != cls.type_name or len(ks) == 0:
                continue
            values = item_values(cls, ks, table, prog.costs, duals)
            order = np.argsort(-values, kind="stable")
            left = values.copy()
            for _ in range(COLUMNS_PER_ROUND):
                _, chosen = greedy_configuration(ks, left)
                if not chosen:
                    break
                ops_found = repair_and_fill(ks, values, chosen, order, cls.power_cap_w)
                columns.append(shared_column(cls, table, prog.costs, clock, ops_found))
                left[np.isin(ks.units, ks.units[chosen])] = 0.0
    return columns


def _packed_columns(
    prog: pat.PatternProgram, ops: PricedOps, choice: NDArray[np.int64], rates: NDArray[np.float64]
) -> list[Any]:
    """GPU configurations that hold the priced choices.

    Each unit's choice becomes ceil(rate / capacity) slices, the last one the
    smallest share of the same unit and clock that holds the remainder. Slices of
    one class
    are packed first-fit decreasing by share, one placement per unit per GPU,
    within share capacity and memory; a GPU runs at the highest clock of its
    slices, and every slice on it takes the op of the same unit and share at that
    clock (at least the capacity it was chosen with).
    """
    table, costs, classes = prog.table, prog.costs, prog.classes
    op_at: dict[tuple[int, int, int, int], int] = {}
    single = np.flatnonzero(table.tp == 1)
    for o in single.tolist():
        key = (int(table.unit[o]), int(table.gpu_type[o]), int(table.clock_mhz[o]))
        op_at[(*key, int(table.share[o]))] = o
    slices: dict[int, list[int]] = defaultdict(list)
    columns = []
    for u, k in enumerate(choice.tolist()):
        o, c = int(ops.op[k]), int(ops.cls[k])
        cap = float(table.capacity_rps[o])
        uses = max(1, int(np.ceil(rates[u] / cap - 1e-9)))
        if int(table.tp[o]) > 1:
            columns.append(tp_column(classes[c], table, costs, o))
            continue
        rest = rates[u] - (uses - 1) * cap
        fits = [
            m
            for share in sorted({int(x) for x in table.share[single]})
            if (m := op_at.get((u, int(table.gpu_type[o]), int(table.clock_mhz[o]), share)))
            is not None
            and float(table.capacity_rps[m]) >= rest - 1e-9
        ]
        slices[c].extend([o] * (uses - 1) + [fits[0] if fits else o])
    for c, items in slices.items():
        cls = classes[c]
        cap_units = table.share_capacity[cls.type_name]
        usable = prog.problem.gpu_type(cls.type_name).memory_gb * (
            1.0 - prog.problem.instance.options.memory_reserve_fraction
        )

        def at_clock(o: int, clock: int) -> int | None:
            key = (int(table.unit[o]), int(table.gpu_type[o]), clock, int(table.share[o]))
            return op_at.get(key)

        bins: list[tuple[int, list[int]]] = []  # (clock, ops at that clock)
        order = sorted(items, key=lambda i: (-int(table.share[i]), -int(table.clock_mhz[i])))
        for o in order:
            placed = False
            for b, (clock, members) in enumerate(bins):
                if int(table.unit[o]) in {int(table.unit[m]) for m in members}:
                    continue
                new_clock = max(clock, int(table.clock_mhz[o]))
                moved = [at_clock(m, new_clock) for m in [*members, o]]
                if any(m is None for m in moved):
                    continue
                fitted = [int(m) for m in moved if m is not None]
                share = sum(int(table.share[m]) for m in fitted)
                mem = sum(float(table.memory_gb[m]) for m in fitted)
                if share <= cap_units and mem <= usable + 1e-9:
                    bins[b] = (new_clock, fitted)
                    placed = True
                    break
            if not placed:
                bins.append((int(table.clock_mhz[o]), [o]))
        for clock, members in bins:
            columns.append(shared_column(cls, table, costs, clock, tuple(sorted(members))))
    return columns
