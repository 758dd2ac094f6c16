"""Chvatal-Gomory cover cuts for the configuration master.

Let y_o be the number of configurations (over all classes; a TP group counts once)
that hold op o, an integer in every plan. Unit u's rate lambda_u is routed over its
ops, each configuration serving at most c_o of it (``OpTable.capacity_rps``), so
sum_o c_o y_o >= lambda_u. For t > 0, rounding up gives the valid cut

    sum_o ceil(t c_o) y_o >= ceil(t lambda_u)

(the left side is an integer at least t lambda_u). The LP meets the unrounded
inequality; the cut removes its fractional hosting, e.g. a unit served by 1.6
configurations of its best op needs two. The multipliers tried are t = m/c for the
capacities c of the ops the LP uses and m in MULTIPLIERS. Coefficients are rounded
up after a 1e-9 allowance, the right side after 1e-6, so rounding errors of the
capacities cannot make a cut cut off a plan (with fewer than 1,000 placements of a
unit).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from energyopt.perf.oppoints import OpTable

VIOLATION_TOL = 1e-6
MULTIPLIERS = (1, 2, 3, 4, 5, 6, 8)
"""t = m / c for each capacity c the LP uses and each m here."""


@dataclass(frozen=True)
class CoverCut:
    """sum_o coef[o] y_o >= lo for one unit (coef zero off the unit's ops)."""

    unit: int
    capacity: float  # the c of t = 1/c, req/s
    coef: NDArray[np.float64]
    lo: float


def cover_cut(table: OpTable, unit: int, capacity: float) -> CoverCut:
    """The cut of ``unit`` with multiplier 1/``capacity`` (req/s)."""
    mine = table.unit == unit
    coef = np.zeros(len(table))
    coef[mine] = np.ceil(table.capacity_rps[mine] / capacity - 1e-9)
    rate = float(table.units[unit].rate_rps)
    return CoverCut(unit, capacity, coef, float(math.ceil(rate / capacity - 1e-6)))


def separate(
    table: OpTable, held: NDArray[np.float64], seen: set[tuple[int, float]]
) -> list[CoverCut]:
    """The most violated new cut of each unit at op counts ``held`` (y_o, per op), if
    any is violated by more than VIOLATION_TOL; ``seen`` (unit, capacity) are skipped
    and the cuts returned are added to it."""
    out: list[CoverCut] = []
    for u in range(len(table.units)):
        used = np.flatnonzero((table.unit == u) & (held > 1e-9))
        best: tuple[float, CoverCut] | None = None
        caps = sorted({float(table.capacity_rps[o]) for o in used})
        for c in sorted({c / m for c in caps for m in MULTIPLIERS}):
            if (u, c) in seen:
                continue
            cut = cover_cut(table, u, c)
            violation = cut.lo - float(cut.coef @ held)
            if violation > VIOLATION_TOL and (best is None or violation > best[0] + 1e-12):
                best = (violation, cut)
        if best is not None:
            seen.add((u, best[1].capacity))
            out.append(best[1])
    return out
