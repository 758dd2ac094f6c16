"""Configurations of one GPU: a clock and a set of (unit, share) placements that fit.

Every non-empty set that fits is listed, not only the maximal ones: a placement
costs its fixed power while it carries a rate and its peak counts in the caps and
budgets (perf/energy.py ``power_line``), so a configuration with one placement
more is not a cheaper one. A set fits in share, memory, MIG instance counts and
the type's highest power limit in the worst case (on-power plus each placement's
peak power); a class with a lower cap excludes more at pricing
(``columns.price_configs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import OpTable

CAP_REL_TOL = 1e-9
"""A worst-case draw up to this share above a power limit still fits (rounding)."""

IntArray = NDArray[np.int64]
DEFAULT_MAX_CONFIGS = 60_000


@dataclass(frozen=True)
class ConfigSet:
    """All configurations of one (GPU type, clock), as a ragged array of ops."""

    type_name: str
    clock_mhz: int
    items: IntArray  # candidate ops (tp == 1) of this type and clock
    ptr: IntArray  # configuration j holds flat[ptr[j]:ptr[j + 1]]
    flat: IntArray  # op indices
    complete: bool  # False when enumeration stopped at the limit

    def __len__(self) -> int:
        return int(self.ptr.shape[0] - 1)

    def ops(self, j: int) -> IntArray:
        """Op indices of configuration j."""
        return self.flat[self.ptr[j] : self.ptr[j + 1]]


def enumerate_configs(
    problem: Problem,
    table: OpTable,
    type_name: str,
    clock_mhz: int,
    limit: int = DEFAULT_MAX_CONFIGS,
) -> ConfigSet:
    """Every non-empty set of placements that fits one GPU at this clock (up to
    ``limit``): share, memory, MIG instances, and the worst-case draw (W) within the
    type's highest power limit."""
    t = table.type_names.index(type_name)
    mask = (table.gpu_type == t) & (table.clock_mhz == clock_mhz) & (table.tp == 1)
    items = np.flatnonzero(mask)
    gtype = problem.gpu_type(type_name)
    opts = problem.instance.options
    mig = opts.sharing.mode == "mig" and bool(gtype.mig_profiles)
    cap_units = table.share_capacity[type_name]
    usable = gtype.memory_gb * (1.0 - opts.memory_reserve_fraction)
    unit = [int(table.unit[o]) for o in items]
    share = [int(table.share[o]) for o in items]
    mem = [0.0 if mig else float(table.memory_gb[o]) for o in items]
    prof = [table.mig_profile[o] for o in items]
    peak = [float(table.peak_power_w[o]) for o in items]
    on_power = table.on_power[(type_name, clock_mhz)]
    power_room = gtype.power_limit_max_w * (1 + CAP_REL_TOL) - on_power
    prof_limit = {p.name: p.max_instances for p in gtype.mig_profiles}
    n = len(items)
    found: list[list[int]] = []
    complete = True

    def fits(
        i: int,
        used_units: set[int],
        share_left: int,
        mem_left: float,
        power_left: float,
        counts: dict[str, int],
    ) -> bool:
        if unit[i] in used_units or share[i] > share_left or mem[i] > mem_left + 1e-9:
            return False
        if peak[i] > power_left:
            return False
        p = prof[i]
        return p is None or counts.get(p, 0) < prof_limit.get(p, 1)

    def dfs(
        start: int,
        chosen: list[int],
        used: set[int],
        share_left: int,
        mem_left: float,
        power_left: float,
        counts: dict[str, int],
    ) -> None:
        nonlocal complete
        for i in range(start, n):
            if len(found) >= limit:
                complete = False
                return
            if not fits(i, used, share_left, mem_left, power_left, counts):
                continue
            p = prof[i]
            if p is not None:
                counts[p] = counts.get(p, 0) + 1
            used.add(unit[i])
            chosen.append(i)
            found.append(list(chosen))
            dfs(
                i + 1,
                chosen,
                used,
                share_left - share[i],
                mem_left - mem[i],
                power_left - peak[i],
                counts,
            )
            chosen.pop()
            used.discard(unit[i])
            if p is not None:
                counts[p] -= 1

    if power_room >= 0:
        dfs(0, [], set(), cap_units, usable, power_room, {})
    lengths = np.asarray([len(c) for c in found], dtype=np.int64)
    ptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = (
        items[np.concatenate([np.asarray(c, dtype=np.int64) for c in found])]
        if found
        else np.zeros(0, dtype=np.int64)
    )
    return ConfigSet(type_name, clock_mhz, items, ptr, flat.astype(np.int64), complete)
