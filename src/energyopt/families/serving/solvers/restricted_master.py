"""The integer configuration master over a subset of the generated columns, with
its values mapped back to the layout over every column (``pattern.integer_model``:
per column its count, then its rates). Branch-and-price's repair and the colgen
integer solve on large masters use it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from energyopt.backends.pyomo_highs import MilpOutcome
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.formulations.master import build_master
from energyopt.families.serving.solvers.highs_direct import padded_start, solve_master_mip

RESTRICTED_MASTER_COLUMNS = 20_000
"""From this many generated columns on, the integer master of a decomposition
(colgen, branch-and-price's root repair) runs over the root LP's columns and the
incumbent's only: over all 32,111 columns of fleet-10240 HiGHS' root took 24 s
where 7 s were left (it does not stop at its time limit there), and it never
improved the first plan at that size."""


def column_offsets(prog: pat.PatternProgram) -> NDArray[np.int64]:
    """Start of each column's block (count, then rates) in the full layout, and the
    total size last."""
    sizes = np.asarray([1 + len(col.ops) for col in prog.columns], dtype=np.int64)
    return np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(sizes)])


def solve_restricted(
    prog: pat.PatternProgram,
    picked: list[int],
    start: NDArray[np.float64] | None,
    **mip: Any,
) -> tuple[MilpOutcome, NDArray[np.float64] | None]:
    """(outcome, values in the full layout, None without a plan) of the integer
    master over the columns ``picked`` (indices into ``prog.columns``), started
    from ``start`` (full layout, zero-padded if shorter); ``mip``: the options of
    ``solve_master_mip``. The outcome's objective is that of the plan the values
    make (``pattern.integer_objective``)."""
    offsets = column_offsets(prog)
    block = np.concatenate([np.arange(offsets[j], offsets[j + 1]) for j in picked])
    mp = build_master(
        prog.problem,
        prog.table,
        prog.costs,
        prog.classes,
        [prog.columns[j] for j in picked],
        artificials=False,
    )
    full = padded_start(start, int(offsets[-1])) if start is not None else None
    out, values = solve_master_mip(mp, start=full[block] if full is not None else None, **mip)
    if values is None:
        return out, None
    expanded = np.zeros(int(offsets[-1]))
    expanded[block] = values[: len(block)]
    # The plan places no op that carries no rate: its objective is the master's less
    # the fixed parts of such ops (pattern.integer_objective), never more.
    return replace(out, objective=pat.integer_objective(prog, expanded)), expanded


def with_start_columns(
    prog: pat.PatternProgram, only: set[int], start: NDArray[np.float64] | None
) -> list[int]:
    """The columns in ``only`` and those with a positive count in ``start`` (full
    layout), sorted."""
    keep = set(only)
    if start is not None:
        offsets = column_offsets(prog)
        full = padded_start(start, int(offsets[-1]))
        keep.update(j for j in range(len(prog.columns)) if full[offsets[j]] > 0.5)
    return sorted(keep)
