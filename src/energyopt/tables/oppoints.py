"""Operating-point table (kind ``oppoints``): per workload, GPU type, clock, share and
current-load bucket, computed from the performance model without solving; and, per GPU
state summary (clock, SM share in use), where a new load fits.

Keys: ``slo_tier`` (when the spec lists tiers), ``workload`` (unit label, e.g. ``chat``
or ``chat:prefill``), ``gpu_type``, ``clock_mhz`` (exact), ``share`` (exact; MPS
percent or MIG compute slices), ``share_used`` (share units already in use on the
GPU, rounded UP) and ``load`` (requests/s, rounded UP to the next grid point).
Only single-GPU ops (tensor parallel 1) are tabulated. docs/tables.md has the columns.

A slice's power is its GPU share's on-power plus its power line (perf/energy.py
``power_line``) through the steady power at its SLO capacity and half of it: a
fixed part from the moment the slice is opened (its decode loop) plus a marginal
part per request/s. The line is anchored at the capacity, not at the base
instance's rate, because the table answers for every load up to the capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.perf.energy import power_line
from energyopt.perf.oppoints import build_op_table, op_spec, share_capacity, share_options
from energyopt.perf.params import FloatArray, OpParams, build_params
from energyopt.perf.queueing import metrics_at
from energyopt.tables.format import Axis, ColumnData
from energyopt.tables.spec import SloTier
from energyopt.tables.variants import one_gpu_per_type, variant

KIND = "oppoints"
VERSION = 2
"""Version of the kind's columns, ``meta.oppoints_version``. 2: a slice's power is a
fixed part (``fixed_w``) plus a marginal part per request/s (``marginal_w_per_rps``);
1 (no ``fixed_w``, no version in meta): energy per request at a design batch only."""
DEFAULT_LOAD_POINTS = 65
IntArray = NDArray[np.int64]


@dataclass(frozen=True)
class OpGrid:
    """The tabulated single-GPU ops, their params, and the axes."""

    axes: list[Axis]
    params: OpParams
    cell: list[tuple[int, int, int, int]]  # (workload, gpu type, clock, share) index per op
    capacity_rps: FloatArray
    fixed_w: FloatArray  # W of the op's power line while its slice is open
    marginal_j: FloatArray  # J per request (W per req/s) of the op's power line
    share_frac: FloatArray  # share units / GPU share capacity
    on_power_w: FloatArray  # on-power of the whole GPU at the op's clock
    type_capacity: list[int]  # share units one GPU of each type holds


def op_grid(problem: Problem) -> OpGrid:
    """Single-GPU ops of ``problem`` indexed by (workload, GPU type, clock, share).

    The clock and share axes are every candidate clock and share option of the
    types (they do not depend on the SLOs), so every SLO tier has the same axes."""
    ot = build_op_table(problem)
    labels = [u.label for u in ot.units]
    clocks = sorted({c for cs in ot.clocks.values() for c in cs})
    types = [problem.gpu_type(t) for t in ot.type_names]
    shares = sorted({s[0] for g in types for s in share_options(problem, g)})
    keep = np.flatnonzero(ot.tp == 1)
    best: dict[tuple[int, int, int, int], int] = {}
    for i in keep.tolist():
        cell = (
            int(ot.unit[i]),
            int(ot.gpu_type[i]),
            clocks.index(int(ot.clock_mhz[i])),
            shares.index(int(ot.share[i])),
        )
        # A +me MIG profile shares its base profile's share units: keep the larger capacity
        if cell not in best or ot.capacity_rps[i] > ot.capacity_rps[best[cell]]:
            best[cell] = int(i)
    cells = sorted(best)
    ops = [best[c] for c in cells]
    specs = []
    for i in ops:
        unit = ot.units[int(ot.unit[i])]
        gpu = types[int(ot.gpu_type[i])]
        share = next(
            s
            for s in share_options(problem, gpu)
            if s[0] == int(ot.share[i]) and s[1] == ot.mig_profile[i]
        )
        wl = problem.instance.workload(unit.workload)
        specs.append(op_spec(problem, wl, unit.phase, gpu, int(ot.clock_mhz[i]), share, 1))
    axes = [
        Axis("workload", "category", tuple(labels)),
        Axis("gpu_type", "category", tuple(ot.type_names)),
        Axis("clock_mhz", "exact", tuple(clocks)),
        Axis("share", "exact", tuple(shares)),
    ]
    idx = np.asarray(ops, dtype=np.int64)
    cap_units = np.asarray(
        [ot.share_capacity[ot.type_names[int(ot.gpu_type[i])]] for i in ops], dtype=np.float64
    )
    on_power = np.asarray(
        [ot.on_power[(ot.type_names[int(ot.gpu_type[i])], int(ot.clock_mhz[i]))] for i in ops],
        dtype=np.float64,
    )
    params = build_params(specs)
    capacity = ot.capacity_rps[idx] if ops else np.zeros(0)
    line = power_line(params, capacity)
    return OpGrid(
        axes=axes,
        params=params,
        cell=cells,
        capacity_rps=capacity,
        fixed_w=np.asarray(line.fixed_w, dtype=np.float64),
        marginal_j=np.asarray(line.marginal_j, dtype=np.float64),
        share_frac=ot.share[idx] / cap_units if ops else np.zeros(0),
        on_power_w=on_power,
        type_capacity=[share_capacity(problem, g) for g in types],
    )


def meets_slo_at(params: OpParams, rates: FloatArray) -> NDArray[np.bool_]:
    """Whether each op of ``params`` meets its SLO at each rate: shape (ops, rates)."""
    n, m = len(params), len(rates)
    if n == 0 or m == 0:
        return np.zeros((n, m), dtype=bool)
    rep = params.take(np.repeat(np.arange(n, dtype=np.int64), m))
    metrics = metrics_at(rep, np.tile(np.asarray(rates, dtype=np.float64), n))
    return metrics.meets_slo(rep).reshape(n, m)


def memory_gb_at(params: OpParams, rates: FloatArray) -> FloatArray:
    """Memory each op needs at each rate (GB per GPU): shape (ops, rates)."""
    n, m = len(params), len(rates)
    if n == 0 or m == 0:
        return np.zeros((n, m))
    rep = params.take(np.repeat(np.arange(n, dtype=np.int64), m))
    metrics = metrics_at(rep, np.tile(np.asarray(rates, dtype=np.float64), n))
    return np.asarray(metrics.memory_bytes.reshape(n, m) / 1e9)


def used_share_grid(problem: Problem) -> tuple[int, ...]:
    """Share units a GPU can have in use: every sum of share options up to the GPU's
    capacity, over the types of ``problem`` (0 included), ascending."""
    sums: set[int] = {0}
    for name in problem.gpu_types_used():
        gpu = problem.gpu_type(name)
        cap = share_capacity(problem, gpu)
        options = sorted({s[0] for s in share_options(problem, gpu)})
        reach = {0}
        frontier = [0]
        while frontier:
            x = frontier.pop()
            for s in options:
                if x + s <= cap and x + s not in reach:
                    reach.add(x + s)
                    frontier.append(x + s)
        sums |= reach
    return tuple(sorted(sums))


def _tier_columns(g: OpGrid, grid: FloatArray, step: float, used: Sequence[int]) -> dict[str, Any]:
    """Every column's array for one SLO tier."""
    nw, nt, nc, ns = (len(a.values) for a in g.axes)
    nl, nu = len(grid), len(used)
    capacity = np.zeros((nw, nt, nc, ns))
    fixed = np.full((nw, nt, nc, ns), np.nan)
    marginal = np.full((nw, nt, nc, ns), np.nan)
    safe_add = np.zeros((nw, nt, nc, ns, nl), dtype=np.uint8)
    power = np.full((nw, nt, nc, ns, nl), np.nan)
    best_clock = np.full((nw, nt, nl), -1, dtype=np.int64)
    best_share = np.full((nw, nt, nl), -1, dtype=np.int64)
    best_power = np.full((nw, nt, nl), np.nan)
    best_cap = np.zeros((nw, nt, nl))
    place_share = np.full((nw, nt, nc, nu, nl), -1, dtype=np.int64)
    place_power = np.full((nw, nt, nc, nu, nl), np.nan)
    place_memory = np.full((nw, nt, nc, nu, nl), np.nan)
    # an op covers a load when both the capacity and the model at that load agree
    covers = (grid[None, :] <= g.capacity_rps[:, None]) & meets_slo_at(g.params, grid)
    after = grid + step
    adds = (after[None, :] <= g.capacity_rps[:, None]) & meets_slo_at(g.params, after)
    # an open slice: its share of the on-power, its fixed part, its marginal part
    op_power = (
        g.share_frac[:, None] * g.on_power_w[:, None]
        + g.fixed_w[:, None]
        + grid[None, :] * g.marginal_j[:, None]
    )
    op_memory = memory_gb_at(g.params, grid)
    clocks = g.axes[2].values
    shares = g.axes[3].values
    used_arr = np.asarray(used, dtype=np.int64)
    for k, (w, t, c, s) in enumerate(g.cell):
        capacity[w, t, c, s] = g.capacity_rps[k]
        fixed[w, t, c, s] = g.fixed_w[k]
        marginal[w, t, c, s] = g.marginal_j[k]
        safe_add[w, t, c, s] = adds[k]
        power[w, t, c, s] = np.where(covers[k], op_power[k], np.nan)
        better = covers[k] & ~(op_power[k] >= best_power[w, t])  # NaN best: always better
        best_power[w, t] = np.where(better, op_power[k], best_power[w, t])
        best_clock[w, t] = np.where(better, clocks[c], best_clock[w, t])
        best_share[w, t] = np.where(better, shares[s], best_share[w, t])
        best_cap[w, t] = np.where(better, g.capacity_rps[k], best_cap[w, t])
        # a new slice of this op fits where its share is free: (used values, loads)
        free = (shares[s] + used_arr <= g.type_capacity[t])[:, None] & covers[k][None, :]
        cur = place_power[w, t, c]
        take = free & ~(op_power[k][None, :] >= cur)
        place_power[w, t, c] = np.where(take, op_power[k][None, :], cur)
        place_share[w, t, c] = np.where(take, shares[s], place_share[w, t, c])
        place_memory[w, t, c] = np.where(take, op_memory[k][None, :], place_memory[w, t, c])
    # the lowest clock at or above the current one where the new load fits
    raise_clock = np.full((nw, nt, nc, nu, nl), -1, dtype=np.int64)
    raise_share = np.full((nw, nt, nc, nu, nl), -1, dtype=np.int64)
    for c in range(nc - 1, -1, -1):
        fits = place_share[:, :, c] >= 0
        above_clock = raise_clock[:, :, c + 1] if c + 1 < nc else raise_clock[:, :, c]
        above_share = raise_share[:, :, c + 1] if c + 1 < nc else raise_share[:, :, c]
        raise_clock[:, :, c] = np.where(fits, clocks[c], above_clock)
        raise_share[:, :, c] = np.where(fits, place_share[:, :, c], above_share)
    return {
        "safe_add": safe_add,
        "power_w": power,
        "capacity_rps": capacity,
        "fixed_w": fixed,
        "marginal_w_per_rps": marginal,
        "best_clock_mhz": best_clock,
        "best_share": best_share,
        "best_power_w": best_power,
        "best_capacity_rps": best_cap,
        "place_share": place_share,
        "place_power_w": place_power,
        "place_memory_gb": place_memory,
        "raise_clock_mhz": raise_clock,
        "raise_share": raise_share,
    }


OP = ("workload", "gpu_type", "clock_mhz", "share")
STATE = ("workload", "gpu_type", "clock_mhz", "share_used", "load")
BEST = ("workload", "gpu_type", "load")
NAN = float("nan")
COLUMNS: dict[str, tuple[tuple[str, ...], str, float | int, str]] = {
    "safe_add": ((*OP, "load"), "<u1", 0, "1 if load + one step meets the SLO"),
    "power_w": ((*OP, "load"), "<f8", NAN, "W attributed at the load; NaN if not SLO-safe"),
    "capacity_rps": (OP, "<f8", 0.0, "requests/s"),
    "fixed_w": (OP, "<f8", NAN, "W of the slice's decode loop from the moment it is opened"),
    "marginal_w_per_rps": (OP, "<f8", NAN, "W per additional request/s (= J per request)"),
    "best_clock_mhz": (BEST, "<i8", -1, "MHz; -1 no decision"),
    "best_share": (BEST, "<i8", -1, "share units; -1 no decision"),
    "best_power_w": (BEST, "<f8", NAN, "W"),
    "best_capacity_rps": (BEST, "<f8", 0.0, "requests/s"),
    "place_share": (STATE, "<i8", -1, "share units for a new slice at this clock; -1 none"),
    "place_power_w": (STATE, "<f8", NAN, "W attributed to that slice at the load"),
    "place_memory_gb": (STATE, "<f8", NAN, "GB that slice needs at the load"),
    "raise_clock_mhz": (STATE, "<i8", -1, "MHz: lowest clock >= current that fits; -1 none"),
    "raise_share": (STATE, "<i8", -1, "share units at raise_clock_mhz; -1 none"),
}


def build_oppoint_columns(
    problem: Problem,
    load_points: int = DEFAULT_LOAD_POINTS,
    load_max_rps: float | None = None,
    tiers: Sequence[SloTier] = (),
    gpu_types: Sequence[str] = (),
) -> tuple[list[Axis], dict[str, ColumnData], dict[str, Any]]:
    """Axes, columns and metadata of the operating-point table of ``problem``.

    The load grid is ``load_points`` evenly spaced rates from 0 to
    ``load_max_rps`` (default: the largest single-GPU SLO capacity over the tiers),
    requests/s. ``tiers`` adds a leading ``slo_tier`` axis to every column;
    ``gpu_types`` tabulates those types instead of the base fleet's.
    """
    base = one_gpu_per_type(problem, gpu_types) if gpu_types else problem
    variants = [variant(base, tier=t) for t in tiers] if tiers else [base]
    grids = [op_grid(v) for v in variants]
    used = used_share_grid(base)
    caps = [float(np.max(g.capacity_rps, initial=0.0)) for g in grids]
    top = float(load_max_rps) if load_max_rps else max(max(caps), 1.0)
    grid = np.linspace(0.0, top, max(load_points, 2))
    step = float(grid[1] - grid[0])
    per_tier = [_tier_columns(g, grid, step, used) for g in grids]
    axes = [
        *grids[0].axes,
        Axis("share_used", "ceil", tuple(float(u) for u in used)),
        Axis("load", "ceil", tuple(float(x) for x in grid)),
    ]
    lead: tuple[str, ...] = ()
    if tiers:
        axes.insert(0, Axis("slo_tier", "category", tuple(t.name for t in tiers)))
        lead = ("slo_tier",)
    columns = {}
    for name, (col_axes, dtype, fallback, unit) in COLUMNS.items():
        arr = np.stack([t[name] for t in per_tier]) if tiers else per_tier[0][name]
        columns[name] = ColumnData(arr, (*lead, *col_axes), dtype, fallback, unit)
    meta = {
        "instance": problem.instance.name,
        "source": problem.source,
        "load_step_rps": step,
        "load_max_rps": top,
        "share_units": {
            t: "percent" if cap == 100 else "mig_slices"
            for t, cap in zip(base.gpu_types_used(), grids[0].type_capacity, strict=True)
        },
        "share_capacity": dict(zip(base.gpu_types_used(), grids[0].type_capacity, strict=True)),
        "slo_tiers": [t.model_dump(mode="json") for t in tiers],
        "tensor_parallel": 1,
        "oppoints_version": VERSION,
    }
    return axes, columns, meta
