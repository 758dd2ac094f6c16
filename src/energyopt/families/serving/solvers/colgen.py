"""Column generation for the configuration master: solve its LP, price every class's
configurations (listed, or by knapsack), add the improving ones, repeat.

The program and its pricing problems are ``formulations.serving.pattern``; the LP
is held warm by ``master_lp.LpSession``. Objective values, bounds and reduced
costs are in the instance's objective units (W for power).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import (
    Column,
    Duals,
    base_cost,
    item_costs,
    price_configs,
    priced_column,
    shared_column,
    tp_column,
)
from energyopt.families.serving.formulations.configs import CAP_REL_TOL, ConfigSet
from energyopt.families.serving.formulations.costs import Costs
from energyopt.families.serving.formulations.knapsack import (
    COARSE_STEP_GB,
    IntArray,
    KnapsackItems,
    best_configuration,
    greedy_configurations,
    repair_and_fill,
)
from energyopt.families.serving.formulations.pattern import PatternProgram
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.perf.oppoints import OpTable

RC_TOL = 1e-6
"""A column enters when its reduced cost is below -RC_TOL x max(1, |LP value|)."""
COLUMNS_PER_ROUND = 8
"""Columns added per (class, clock) and round at most, from a listed set; from a
knapsack of at most FIXED_COLUMNS_UNITS units, at most this many greedy ones."""
FIXED_COLUMNS_UNITS = 1024
"""Up to this many units a knapsack pricing problem offers COLUMNS_PER_ROUND greedy
configurations per round (the bundled fleets keep their columns); above it, one
per UNITS_PER_COLUMN of its units."""
UNITS_PER_COLUMN = 4
"""Units of a knapsack pricing problem per greedy configuration of a round, above
FIXED_COLUMNS_UNITS units (the greedy configurations are on disjoint units, and
stop at the first that does not price out). With a fixed number per round each
round lowered the LP by about the same amount whatever the fleet, so the rounds
grew with the fleet and column generation grew quadratically; with one per 128
units it took about 105 rounds at 10,240 and at 25,600 GPUs (82 s of 232 at
25,600), with one per 4 units 5 rounds to the same LP optimum."""
MAX_ROUNDS = 500
EXACT = 2
"""Pricing effort whose knapsack is exact (see ``knapsack_price``)."""


def generate_columns(
    prog: PatternProgram,
    log: Callable[[str], None] | None = None,
    deadline: float | None = None,
    *,
    session: LpSession | None = None,
    max_rounds: int = MAX_ROUNDS,
    pricer: Pricer | None = None,
) -> str:
    """Column generation to LP optimality over all configurations
    (``deadline`` a ``time.perf_counter`` value), at most ``max_rounds`` rounds, in
    ``session`` (a new one over the program's columns when None; a given session
    must hold a prefix of ``prog.columns`` and keeps its rows and bounds).

    Sets ``prog.lp`` and ``prog.bound``: the best Lagrangian bound seen (the LP
    value corrected by the most negative reduced cost per class), valid even if
    pricing stopped early. Returns why it stopped: "converged" (no column prices
    out), "rounds" (``max_rounds``) or "time" (``deadline``). Knapsack-priced
    configurations are searched with the coarse DP first; the exact DP runs when
    the coarse one finds nothing (and at the time limit), so every bound reported
    comes from exact pricing. ``pricer`` solves the pricing problems (in this
    process when None; ``dask_pricing.DaskPricer`` spreads them over Dask workers
    with the same columns in the same order).
    """
    data = PricingData.of(prog)
    pricer = pricer or _PRICER.get()
    if session is None:
        session = LpSession(prog.problem, prog.table, prog.costs, prog.classes, prog.columns)
    for rnd in range(max_rounds):
        if len(session.mp.z_var) < len(prog.columns):
            session.add(prog.columns[len(session.mp.z_var) :])
        prog.lp = session.solve()
        effort = EXACT if prog.enumerated else 0
        added, best, bound = price_round(prog, effort=effort, pricer=pricer, data=data)
        while not added and effort < EXACT:
            effort += 1
            added, best, bound = price_round(prog, effort=effort, pricer=pricer, data=data)
        if bound is not None:
            prog.bound = max(prog.bound, bound)
        prog.rounds = rnd + 1
        if log and (rnd % 5 == 0 or added == 0):
            log(
                f"colgen round {rnd + 1}: LP {prog.lp.objective:,.2f}, "
                f"{len(prog.columns)} columns, best reduced cost {best:,.3f}"
            )
        if added == 0:
            return "converged"
        if deadline is not None and time.perf_counter() > deadline:
            if log:
                log("column generation stopped at the time limit; bound is the Lagrangian one")
            why = "time"
            break
    else:
        why = "rounds"
        if log:
            log(f"column generation stopped after {max_rounds} rounds; bound is Lagrangian")
    session.add(prog.columns[len(session.mp.z_var) :])
    prog.lp = session.solve()
    _, _, bound = price_round(prog, effort=EXACT, add=False, pricer=pricer, data=data)
    if bound is not None:
        prog.bound = max(prog.bound, bound)
    return why


@dataclass(frozen=True)
class PricingData:
    """What pricing reads that stays fixed while columns are generated: the
    operating points, objective coefficients, classes, listed configurations and
    knapsack items of a ``PatternProgram`` (shipped once to each Dask worker)."""

    table: OpTable
    costs: Costs
    classes: list[GpuClass]
    configs: dict[tuple[str, int], ConfigSet]
    knapsacks: dict[tuple[str, int], KnapsackItems]

    @classmethod
    def of(cls, prog: PatternProgram) -> PricingData:
        """The pricing data of ``prog`` (shared, not copied)."""
        return cls(prog.table, prog.costs, prog.classes, prog.configs, prog.knapsacks)


PricingTask = tuple[int, str, tuple[str, int]]
"""(class index, "configs" or "knapsack", (GPU type, clock MHz)): one pricing problem."""


@dataclass(frozen=True)
class Priced:
    """The answer of one pricing problem: ``low``, a lower bound on its least
    reduced cost (-inf when the pricing proved none), and ``found``, the improving
    columns (reduced cost below the round's tolerance) with their reduced costs,
    in the order they join the program (objective units, W for power)."""

    low: float
    found: list[tuple[float, Column]]


def pricing_tasks(data: PricingData) -> list[PricingTask]:
    """Every pricing problem of a round, in the order their columns are added: per
    class, its listed (type, clock) pairs, then its knapsack-priced ones."""
    tasks: list[PricingTask] = []
    for cls in data.classes:
        for (type_name, clock), cs in data.configs.items():
            if type_name == cls.type_name and len(cs) > 0:
                tasks.append((cls.index, "configs", (type_name, clock)))
        for (type_name, clock), ks in data.knapsacks.items():
            if type_name == cls.type_name and len(ks) > 0:
                tasks.append((cls.index, "knapsack", (type_name, clock)))
    return tasks


class Pricer(Protocol):
    """Solves a round's pricing problems; serial here, on Dask workers in
    ``dask_pricing``. Answers come back in the order of ``tasks``."""

    def price(
        self,
        data: PricingData,
        tasks: list[PricingTask],
        duals: Duals,
        effort: int,
        tol: float,
        build: bool,
    ) -> list[Priced]: ...


_PRICER: ContextVar[Pricer | None] = ContextVar("energyopt_pricer", default=None)


@contextmanager
def using_pricer(pricer: Pricer) -> Iterator[None]:
    """Column generation inside the block prices with ``pricer`` where its caller
    names none (``dask_pricing.pricing_on`` sets a Dask one this way)."""
    token = _PRICER.set(pricer)
    try:
        yield
    finally:
        _PRICER.reset(token)


class SerialPricer:
    """Prices every problem in this process, one after the other."""

    def price(
        self,
        data: PricingData,
        tasks: list[PricingTask],
        duals: Duals,
        effort: int,
        tol: float,
        build: bool,
    ) -> list[Priced]:
        return price_batch(data, tasks, duals, effort, tol, build)


def price_batch(
    data: PricingData,
    batch: list[PricingTask],
    duals: Duals,
    effort: int,
    tol: float,
    build: bool,
) -> list[Priced]:
    """``price_task`` on each problem of ``batch``, in order (in this process, or on a
    Dask worker for ``dask_pricing``)."""
    return [price_task(data, task, duals, effort, tol, build) for task in batch]


def price_task(
    data: PricingData,
    task: PricingTask,
    duals: Duals,
    effort: int,
    tol: float,
    build: bool = True,
) -> Priced:
    """Solve one pricing problem at ``duals`` (``knapsack_price``'s ``effort``):
    the columns whose reduced cost is below ``tol`` (at most COLUMNS_PER_ROUND of
    the listed configurations, least first; the knapsack's repaired
    configurations in the order found), built only when ``build``."""
    cls_index, kind, key = task
    cls = data.classes[cls_index]
    table, costs = data.table, data.costs
    clock = key[1]
    found: list[tuple[float, Column]] = []
    if kind == "configs":
        cs = data.configs[key]
        rc = price_configs(cls, cs, table, costs, duals)
        for j in np.argsort(rc)[:COLUMNS_PER_ROUND]:
            if rc[j] >= tol:
                break
            ops = tuple(int(o) for o in cs.ops(int(j)))
            col = priced_column(cls, table, costs, duals, clock, ops) if build else _NO_COLUMN
            found.append((float(rc[j]), col))
        return Priced(float(rc.min()), found)
    ks = data.knapsacks[key]
    ic = item_costs(cls, table, costs, duals, ks.items)
    best = ic.best
    values = np.asarray(-best, dtype=np.float64)
    base = base_cost(cls, table, costs, duals, clock)
    low, configurations = knapsack_price(ks, values, base, cls.power_cap_w, effort=effort)
    for ops in configurations:
        if not ops:
            continue
        at = np.searchsorted(ks.items, np.asarray(ops, dtype=np.int64))
        rc_found = _configuration_rc(cls, ks, best, base, at)
        if rc_found < tol:
            idle = tuple(
                o for o, i in zip(ops, at.tolist(), strict=True) if ic.idle[i] < ic.active[i]
            )
            col = shared_column(cls, table, costs, clock, ops, idle) if build else _NO_COLUMN
            found.append((rc_found, col))
    return Priced(low, found)


_NO_COLUMN = Column(-1, 0, (), 1, 0.0, 0.0, (), 0.0, False)
"""Stands for a column that was not built (a bound-only pricing round)."""


def _configuration_rc(
    cls: GpuClass, ks: KnapsackItems, best: NDArray[np.float64], base: float, at: IntArray
) -> float:
    """Reduced cost of the configuration of the items at positions ``at`` of ``ks``
    (``best``: each item's cost at its best, as ``columns.price_configs`` sums it;
    +inf over the class's power cap)."""
    start = np.zeros(1, dtype=np.int64)
    rc = base + float(np.add.reduceat(best[at], start)[0])
    worst = ks.on_power_w + float(np.add.reduceat(ks.peak_w[at], start)[0])
    return rc if worst <= cls.power_cap_w * (1 + CAP_REL_TOL) else float("inf")


def price_round(
    prog: PatternProgram,
    *,
    effort: int,
    add: bool = True,
    pricer: Pricer | None = None,
    data: PricingData | None = None,
) -> tuple[int, float, float | None]:
    """Price every class at the current duals: (columns added, best reduced cost,
    Lagrangian bound or None when some pricing was not exact). ``pricer`` solves
    the pricing problems (in this process when None); the columns join ``prog``
    in the same order whichever pricer solved them."""
    assert prog.lp is not None
    data = data or PricingData.of(prog)
    tasks = pricing_tasks(data)
    tol = -RC_TOL * max(1.0, abs(prog.lp.objective))
    answers = (pricer or SerialPricer()).price(data, tasks, prog.lp.duals, effort, tol, add)
    added = 0
    best = 0.0
    class_min = dict.fromkeys(range(len(data.classes)), 0.0)
    for (cls_index, _, _), answer in zip(tasks, answers, strict=True):
        class_min[cls_index] = min(class_min[cls_index], answer.low)
        for rc, col in answer.found:
            best = min(best, rc)
            if add:
                added += prog.add(col)
    for cls_index, ops in prog.tp_ops.items():
        cls = data.classes[cls_index]
        tp_rc = tp_reduced_costs(cls, data.table, data.costs, prog.lp.duals, ops)
        if tp_rc.size == 0:
            continue
        class_min[cls_index] = min(class_min[cls_index], float(tp_rc.min()))
        for j in best_per_unit(data.table, ops, tp_rc, tol):
            best = min(best, float(tp_rc[j]))
            if add:
                added += prog.add(tp_column(cls, data.table, data.costs, int(ops[j])))
    correction = sum(cls.size * class_min[cls.index] for cls in data.classes)
    bound = prog.lp.objective + correction if np.isfinite(correction) else None
    return added, best, bound


def tp_reduced_costs(
    cls: GpuClass, table: OpTable, costs: Costs, duals: Duals, ops: NDArray[np.int64]
) -> NDArray[np.float64]:
    """Reduced cost of the TP column of each op in ``ops`` for class ``cls`` at
    ``duals`` (objective units per group), its rate at its best: k GPUs on at the
    op's clock (``base_cost`` each) plus the op's own part as a configuration item
    (``item_costs``: fixed part, budget price of its peak, capacity times its
    rate's reduced cost where negative), as ``tp_column`` and the master price it."""
    k = np.asarray(table.tp[ops], dtype=np.float64)
    clocks = np.asarray(table.clock_mhz[ops], dtype=np.int64)
    base = np.zeros(len(ops))
    for clock in np.unique(clocks).tolist():
        base[clocks == clock] = base_cost(cls, table, costs, duals, int(clock))
    return np.asarray(k * base + item_costs(cls, table, costs, duals, ops).active)


def best_per_unit(
    table: OpTable, ops: NDArray[np.int64], rc: NDArray[np.float64], tol: float
) -> list[int]:
    """Positions in ``ops`` of each unit's least reduced cost among ``rc`` below
    ``tol`` (the first on ties), in the order of ``ops``."""
    below = np.flatnonzero(rc < tol)
    if below.size == 0:
        return []
    order = below[np.lexsort((below, rc[below]))]
    _, first = np.unique(np.asarray(table.unit)[ops[order]], return_index=True)
    return sorted(order[first].tolist())


def greedy_columns(ks: KnapsackItems) -> int:
    """Greedy configurations a knapsack pricing problem offers per round at most:
    COLUMNS_PER_ROUND up to FIXED_COLUMNS_UNITS units, above it one per
    UNITS_PER_COLUMN of its units."""
    units = len(np.unique(ks.units))
    if units <= FIXED_COLUMNS_UNITS:
        return COLUMNS_PER_ROUND
    return max(COLUMNS_PER_ROUND, units // UNITS_PER_COLUMN)


def knapsack_price(
    ks: KnapsackItems,
    values: NDArray[np.float64],
    base: float,
    power_cap_w: float,
    *,
    effort: int,
) -> tuple[float, list[tuple[int, ...]]]:
    """(lower bound on the class's least reduced cost at this clock, configurations
    worth pricing exactly), from the knapsack pricing problem
    (``pattern.knapsack_pricing``: ``values`` per item, ``base`` the cost of one
    GPU on with nothing placed; ``power_cap_w`` the class's cap, W).

    ``effort`` 0 picks up to ``greedy_columns(ks)`` greedy configurations on
    disjoint units, 1 runs the coarse DP (both fast and proving nothing: the first element
    is then -inf), 2 the exact DP that the bound comes from.
    """
    order = np.argsort(-values, kind="stable")
    if effort == 0:
        # Items of no positive value are never filled in: the fill scans the others.
        fill = order[: int(np.count_nonzero(values > 0))]
        return -np.inf, [
            repair_and_fill(ks, values, chosen, fill, power_cap_w)
            for chosen in greedy_configurations(ks, values, base, greedy_columns(ks))
        ]
    if effort >= EXACT:
        value, chosen = best_configuration(ks, values)
        low = base - value
    else:
        value, chosen = best_configuration(ks, values, step_gb=COARSE_STEP_GB, feasible=True)
        low = -np.inf
    if effort >= EXACT and not chosen:
        low = min(0.0, base)
    return low, ([repair_and_fill(ks, values, chosen, order, power_cap_w)] if chosen else [])
