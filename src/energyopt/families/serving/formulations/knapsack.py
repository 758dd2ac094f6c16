"""Pricing a GPU configuration by dynamic programming instead of enumeration.

With many workloads the configurations of one GPU are too many to list (a GPU
with four 25 % slots and 128 workloads has millions). Pricing then solves, for one
GPU class and clock, the multiple-choice knapsack

    max  sum_o v_o x_o   s.t.  sum_o share_o x_o <= S,  sum_o mem_o x_o <= M,
                               at most one op per unit,  x binary,

where -v_o is what op o adds to the configuration's reduced cost at its best
(``columns.item_costs``: its fixed part and the budget price of its peak, plus its
capacity times its rate's reduced cost where negative, less the migration bonus of
a kept placement and the price of holding the op in a branch-and-price node; a kept
placement held idle where that is cheaper). Only items of positive value can lower
it. Memory is counted in steps of MEMORY_STEP_GB rounded down (capacity rounded
down too), and the GPU power cap (on-power plus each item's peak power) is
ignored: both only enlarge the feasible set, so ``base - value`` is a valid lower
bound on the class's most negative reduced cost at this clock (the Lagrangian
bound stays valid). The configuration the DP picks is then made exactly feasible
(items dropped, lowest value per GB, then per W, first, while memory or the power
cap is over) and filled with more items of positive value that fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.classes import GpuClass
from energyopt.families.serving.formulations.columns import Duals, item_costs
from energyopt.families.serving.formulations.configs import CAP_REL_TOL
from energyopt.families.serving.formulations.costs import Costs
from energyopt.perf.oppoints import OpTable

IntArray = NDArray[np.int64]
MEMORY_STEP_GB = 0.05
"""Memory resolution of the exact pricing DP (the one the bound comes from)."""
COARSE_STEP_GB = 1.0
"""Memory resolution of the fast pricing DP that only looks for improving columns."""


@dataclass(frozen=True)
class KnapsackItems:
    """The single-GPU ops of one (GPU type, clock), grouped by unit."""

    type_name: str
    clock_mhz: int
    items: IntArray  # op indices (tp == 1)
    units: IntArray  # unit of each item
    share_steps: IntArray  # share of each item in steps of ``step``
    mem_gb: NDArray[np.float64]  # memory of each item at capacity (GB)
    capacity_steps: int  # share capacity of a GPU in steps
    step: int  # share units per step
    memory_gb: float  # usable memory of a GPU (GB)
    peak_w: NDArray[np.float64]  # worst-case draw of each item: its peak power (W)
    on_power_w: float  # on-power of a GPU at the clock (W)
    power_cap_w: float  # the type's highest power limit (W); a class's cap may be lower

    def __len__(self) -> int:
        return int(self.items.shape[0])


def knapsack_items(problem: Problem, table: OpTable, type_name: str, clock: int) -> KnapsackItems:
    """Items of the pricing knapsack of one (GPU type, clock)."""
    t = table.type_names.index(type_name)
    mask = (table.gpu_type == t) & (table.clock_mhz == clock) & (table.tp == 1)
    items = np.flatnonzero(mask).astype(np.int64)
    cap_units = table.share_capacity[type_name]
    step = cap_units
    for o in items:
        step = gcd(step, int(table.share[o]))
    step = max(step, 1)
    gpu = problem.gpu_type(type_name)
    usable = gpu.memory_gb * (1.0 - problem.instance.options.memory_reserve_fraction)
    return KnapsackItems(
        type_name=type_name,
        clock_mhz=clock,
        items=items,
        units=table.unit[items].astype(np.int64),
        share_steps=(table.share[items] // step).astype(np.int64),
        mem_gb=np.asarray(table.memory_gb[items], dtype=np.float64),
        capacity_steps=cap_units // step,
        step=step,
        memory_gb=usable,
        peak_w=np.asarray(table.peak_power_w[items], dtype=np.float64),
        on_power_w=float(table.on_power[(type_name, clock)]),
        power_cap_w=float(gpu.power_limit_max_w),
    )


def item_values(
    cls: GpuClass, ks: KnapsackItems, table: OpTable, costs: Costs, duals: Duals
) -> NDArray[np.float64]:
    """How much each item can lower a configuration's reduced cost: minus its share
    of it at best (``columns.item_costs``); negative where it can only raise it."""
    best = item_costs(cls, table, costs, duals, ks.items).best
    return np.asarray(-best, dtype=np.float64)


def best_configuration(
    ks: KnapsackItems,
    values: NDArray[np.float64],
    *,
    step_gb: float = MEMORY_STEP_GB,
    feasible: bool = False,
) -> tuple[float, list[int]]:
    """(best value, its items) of the pricing knapsack with memory in ``step_gb`` steps.

    ``feasible=False`` rounds memory down: the value is an upper bound on the
    true best (valid for the Lagrangian bound), the items may exceed the true
    memory (see ``repair_and_fill``). ``feasible=True`` rounds item memory up: the
    items always fit, the value may fall short of the true best.
    """
    useful = np.flatnonzero(values > 0)
    if useful.size == 0:
        return 0.0, []
    S = ks.capacity_steps
    M = int(np.floor(ks.memory_gb / step_gb + 1e-9))
    scaled = ks.mem_gb / step_gb
    mem_w = (np.ceil(scaled - 1e-9) if feasible else np.floor(scaled + 1e-9)).astype(np.int64)
    groups: dict[int, list[int]] = {}
    for i in useful.tolist():
        if ks.share_steps[i] <= S and mem_w[i] <= M:
            groups.setdefault(int(ks.units[i]), []).append(i)
    dp = np.full((S + 1, M + 1), -np.inf)
    dp[0, 0] = 0.0
    choice: list[tuple[list[int], NDArray[np.int8]]] = []
    for members in groups.values():
        new = dp.copy()
        pick = np.full(dp.shape, -1, dtype=np.int8)
        for k, item in enumerate(members):
            s, m = int(ks.share_steps[item]), int(mem_w[item])
            src = dp[: S + 1 - s, : M + 1 - m] + values[item]
            view = new[s:, m:]
            better = src > view
            np.copyto(view, src, where=better)
            pick[s:, m:][better] = k
        choice.append((members, pick))
        dp = new
    flat = int(np.argmax(dp))
    best = float(dp.flat[flat])
    s, m = divmod(flat, M + 1)
    chosen: list[int] = []
    for members, pick in reversed(choice):
        k = int(pick[s, m])
        if k >= 0:
            item = members[k]
            chosen.append(item)
            s -= int(ks.share_steps[item])
            m -= int(mem_w[item])
    return best, chosen


def greedy_configuration(ks: KnapsackItems, values: NDArray[np.float64]) -> tuple[float, list[int]]:
    """(value, items) of a greedy configuration: items by value per share step, each
    taken while it fits (share, true memory, one per unit). Fast, proves nothing."""
    useful = np.flatnonzero(values > 0)
    if useful.size == 0:
        return 0.0, []
    density = values[useful] / np.maximum(ks.share_steps[useful], 1)
    order = useful[np.lexsort((-values[useful], -density))]
    chosen: list[int] = []
    used: set[int] = set()
    share, mem, total = 0, 0.0, 0.0
    for item in order.tolist():
        u = int(ks.units[item])
        s = int(ks.share_steps[item])
        if u in used or share + s > ks.capacity_steps:
            continue
        if mem + float(ks.mem_gb[item]) > ks.memory_gb + 1e-9:
            continue
        chosen.append(item)
        used.add(u)
        share += s
        mem += float(ks.mem_gb[item])
        total += float(values[item])
        if share >= ks.capacity_steps:
            break
    return total, chosen


def greedy_configurations(
    ks: KnapsackItems, values: NDArray[np.float64], base: float, limit: int
) -> list[list[int]]:
    """The items of up to ``limit`` greedy configurations on disjoint units: the
    first is ``greedy_configuration(ks, values)``, each next one the same greedy
    over the items of units no earlier one took, and the series stops at the first
    that is empty or does not lower the reduced cost (``base``, the cost of a GPU
    with nothing placed, minus its value is not negative).

    The same configurations as calling ``greedy_configuration`` with the taken
    units' values set to 0 each time (the order of the other items does not
    change), in one sort and one pass over a linked list of the items, where each
    item of a taken unit is unlinked once: a call per configuration sorted every
    item again (quadratic in the units of a pricing problem)."""
    useful = np.flatnonzero(values > 0)
    if useful.size == 0 or limit <= 0:
        return []
    density = values[useful] / np.maximum(ks.share_steps[useful], 1)
    order = useful[np.lexsort((-values[useful], -density))]
    items: list[int] = order.tolist()
    units: list[int] = ks.units[order].tolist()
    shares: list[int] = ks.share_steps[order].tolist()
    mems: list[float] = ks.mem_gb[order].tolist()
    vals: list[float] = values[order].tolist()
    n = len(items)
    capacity, memory = ks.capacity_steps, ks.memory_gb + 1e-9
    # No item fits once the share left is below the least share of any item, or
    # the memory left below the least memory: the walk stops there (it would only
    # skip the rest; on large pricing problems it walked the whole list per
    # configuration whenever a configuration ended not quite full).
    least_share, least_mem = min(shares), min(mems)
    link = list(range(1, n + 1))  # next position still listed; n ends the list
    head = 0
    gone: set[int] = set()  # units of earlier configurations
    found: list[list[int]] = []
    while len(found) < limit:
        chosen: list[int] = []
        used: set[int] = set()
        share, mem, total = 0, 0.0, 0.0
        prev, at = -1, head
        while at < n:
            u = units[at]
            if u in gone:  # a unit an earlier configuration took: unlink
                if prev < 0:
                    head = link[at]
                else:
                    link[prev] = link[at]
                at = link[at]
                continue
            if u not in used and share + shares[at] <= capacity and mem + mems[at] <= memory:
                chosen.append(items[at])
                used.add(u)
                share += shares[at]
                mem += mems[at]
                total += vals[at]
                if share >= capacity or (
                    share + least_share > capacity or mem + least_mem > memory
                ):
                    break
            prev, at = at, link[at]
        if not chosen or base - total >= 0:
            break
        found.append(chosen)
        gone |= used
    return found


def repair_and_fill(
    ks: KnapsackItems,
    values: NDArray[np.float64],
    chosen: list[int],
    order: IntArray | list[int],
    power_cap_w: float | None = None,
) -> tuple[int, ...]:
    """Make ``chosen`` fit the true memory and the power cap in the worst case
    (on-power plus each item's peak within ``power_cap_w``, W; the type's highest
    limit when None), then add items (in ``order``; an array or a list of item
    positions) of positive value that fit.

    Returns the op indices of the configuration, sorted.
    """
    cap = ks.power_cap_w if power_cap_w is None else min(power_cap_w, ks.power_cap_w)
    room = cap * (1 + CAP_REL_TOL) - ks.on_power_w
    picked = list(chosen)
    mem = float(ks.mem_gb[picked].sum()) if picked else 0.0
    while picked and mem > ks.memory_gb + 1e-9:
        worst = min(picked, key=lambda i: values[i] / max(float(ks.mem_gb[i]), 1e-9))
        picked.remove(worst)
        mem -= float(ks.mem_gb[worst])
    power = float(ks.peak_w[picked].sum()) if picked else 0.0
    while picked and power > room:
        worst = min(picked, key=lambda i: values[i] / max(float(ks.peak_w[i]), 1e-9))
        picked.remove(worst)
        mem -= float(ks.mem_gb[worst])
        power -= float(ks.peak_w[worst])
    share = int(ks.share_steps[picked].sum()) if picked else 0
    used = {int(ks.units[i]) for i in picked}
    if isinstance(order, np.ndarray):
        _fill(ks, values, order, room, picked, used, share, mem, power)
        return tuple(sorted(int(ks.items[i]) for i in picked))
    for i in order:
        if share >= ks.capacity_steps:
            break
        u = int(ks.units[i])
        if u in used or values[i] <= 0:
            continue
        s = int(ks.share_steps[i])
        if share + s > ks.capacity_steps or mem + float(ks.mem_gb[i]) > ks.memory_gb + 1e-9:
            continue
        if power + float(ks.peak_w[i]) > room:
            continue
        picked.append(i)
        used.add(u)
        share += s
        mem += float(ks.mem_gb[i])
        power += float(ks.peak_w[i])
    return tuple(sorted(int(ks.items[i]) for i in picked))


def _fill(
    ks: KnapsackItems,
    values: NDArray[np.float64],
    order: IntArray,
    room: float,
    picked: list[int],
    used: set[int],
    share: int,
    mem: float,
    power: float,
) -> None:
    """``repair_and_fill``'s fill over an array ``order``, appending to ``picked``:
    the same items as its loop over a list (the first item in order that fits,
    then the first after it, while share is left; an item that does not fit never
    fits later, as room only shrinks), each found by one pass of numpy over the
    rest of the order instead of a Python step per item (up to tens of thousands of
    items per configuration at 102,400 GPUs). ``room``: W of worst-case draw left
    above the on-power; ``share``, ``mem`` (GB), ``power`` (W): what ``picked``
    holds."""
    if share >= ks.capacity_steps or order.size == 0:
        return
    o = np.asarray(order, dtype=np.int64)
    o_share, o_mem, o_peak = ks.share_steps[o], ks.mem_gb[o], ks.peak_w[o]
    o_unit = ks.units[o]
    open_ = values[o] > 0
    for u in used:
        open_ &= o_unit != u
    pos = 0
    while share < ks.capacity_steps:
        fits = (
            open_[pos:]
            & (share + o_share[pos:] <= ks.capacity_steps)
            & (mem + o_mem[pos:] <= ks.memory_gb + 1e-9)
            & (power + o_peak[pos:] <= room)
        )
        hit = int(np.argmax(fits)) if fits.size else 0
        if fits.size == 0 or not fits[hit]:
            return
        at = pos + hit
        i = int(o[at])
        picked.append(i)
        used.add(int(o_unit[at]))
        open_ &= o_unit != o_unit[at]
        share += int(o_share[at])
        mem += float(o_mem[at])
        power += float(o_peak[at])
        pos = at + 1
