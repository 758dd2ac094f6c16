"""Operating-point table (kind ``oppoints``): per workload, GPU type, clock, share and
current-load bucket, computed from the performance model without solving.

Keys: ``workload`` (unit label, e.g. ``chat`` or ``chat:prefill``), ``gpu_type``,
``clock_mhz`` (exact), ``share`` (exact; MPS percent or MIG compute slices) and
``load`` (requests/s on that slice, rounded UP to the next grid point).
Only single-GPU ops (tensor parallel 1) are tabulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.perf.oppoints import build_op_table, op_spec, share_options
from energyopt.perf.params import FloatArray, OpParams, build_params
from energyopt.perf.queueing import metrics_at
from energyopt.tables.format import Axis, ColumnData

KIND = "oppoints"
DEFAULT_LOAD_POINTS = 65


@dataclass(frozen=True)
class OpGrid:
    """The tabulated single-GPU ops, their params, and the axes."""

    axes: list[Axis]
    params: OpParams
    cell: list[tuple[int, int, int, int]]  # (workload, gpu type, clock, share) index per op
    capacity_rps: FloatArray
    energy_j: FloatArray
    share_frac: FloatArray  # share units / GPU share capacity
    on_power_w: FloatArray  # on-power of the whole GPU at the op's clock


def op_grid(problem: Problem) -> OpGrid:
    """Single-GPU ops of ``problem`` indexed by (workload, GPU type, clock, share)."""
    ot = build_op_table(problem)
    labels = [u.label for u in ot.units]
    clocks = sorted({c for cs in ot.clocks.values() for c in cs})
    keep = np.flatnonzero(ot.tp == 1)
    shares = sorted({int(ot.share[i]) for i in keep})
    best: dict[tuple[int, int, int, int], int] = {}
    for i in keep.tolist():
        cell = (
            int(ot.unit[i]),
            int(ot.gpu_type[i]),
            clocks.index(int(ot.clock_mhz[i])),
            shares.index(int(ot.share[i])),
        )
        # MIG profiles with equal compute slices collapse to the largest capacity
        if cell not in best or ot.capacity_rps[i] > ot.capacity_rps[best[cell]]:
            best[cell] = int(i)
    cells = sorted(best)
    ops = [best[c] for c in cells]
    specs = []
    for i in ops:
        unit = ot.units[int(ot.unit[i])]
        type_name = ot.type_names[int(ot.gpu_type[i])]
        gpu = problem.gpu_type(type_name)
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
    return OpGrid(
        axes=axes,
        params=build_params(specs) if specs else build_params([]),
        cell=cells,
        capacity_rps=ot.capacity_rps[idx] if ops else np.zeros(0),
        energy_j=ot.energy_j[idx] if ops else np.zeros(0),
        share_frac=ot.share[idx] / cap_units if ops else np.zeros(0),
        on_power_w=on_power,
    )


def meets_slo_at(params: OpParams, rates: FloatArray) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Whether each op of ``params`` meets its SLO at each rate: shape (ops, rates)."""
    n, m = len(params), len(rates)
    if n == 0 or m == 0:
        return np.zeros((n, m), dtype=bool)
    rep = params.take(np.repeat(np.arange(n, dtype=np.int64), m))
    metrics = metrics_at(rep, np.tile(np.asarray(rates, dtype=np.float64), n))
    return metrics.meets_slo(rep).reshape(n, m)


def build_oppoint_columns(
    problem: Problem,
    load_points: int = DEFAULT_LOAD_POINTS,
    load_max_rps: float | None = None,
) -> tuple[list[Axis], dict[str, ColumnData], dict[str, Any]]:
    """Axes, columns and metadata of the operating-point table of ``problem``.

    The load grid is ``load_points`` evenly spaced rates from 0 to
    ``load_max_rps`` (default: the largest single-GPU SLO capacity), requests/s.
    """
    g = op_grid(problem)
    top = float(load_max_rps) if load_max_rps else float(np.max(g.capacity_rps, initial=1.0))
    grid = np.linspace(0.0, top, max(load_points, 2))
    step = float(grid[1] - grid[0])
    axes = [*g.axes, Axis("load", "ceil", tuple(float(x) for x in grid))]
    nw, nt, nc, ns = (len(a.values) for a in g.axes)
    nl = len(grid)
    capacity = np.zeros((nw, nt, nc, ns))
    marginal = np.full((nw, nt, nc, ns), np.nan)
    safe_add = np.zeros((nw, nt, nc, ns, nl), dtype=np.uint8)
    power = np.full((nw, nt, nc, ns, nl), np.nan)
    best_clock = np.full((nw, nt, nl), -1, dtype=np.int64)
    best_share = np.full((nw, nt, nl), -1, dtype=np.int64)
    best_power = np.full((nw, nt, nl), np.nan)
    best_cap = np.zeros((nw, nt, nl))
    # an op covers a load when both the capacity and the model at that load agree
    covers = (grid[None, :] <= g.capacity_rps[:, None]) & meets_slo_at(g.params, grid)
    after = grid + step
    adds = (after[None, :] <= g.capacity_rps[:, None]) & meets_slo_at(g.params, after)
    op_power = g.share_frac[:, None] * g.on_power_w[:, None] + grid[None, :] * g.energy_j[:, None]
    clocks = axes[2].values
    shares = axes[3].values
    for k, (w, t, c, s) in enumerate(g.cell):
        capacity[w, t, c, s] = g.capacity_rps[k]
        marginal[w, t, c, s] = g.energy_j[k]
        safe_add[w, t, c, s] = adds[k]
        power[w, t, c, s] = np.where(covers[k], op_power[k], np.nan)
        better = covers[k] & ~(op_power[k] >= best_power[w, t])  # NaN best: always better
        best_power[w, t] = np.where(better, op_power[k], best_power[w, t])
        best_clock[w, t] = np.where(better, clocks[c], best_clock[w, t])
        best_share[w, t] = np.where(better, shares[s], best_share[w, t])
        best_cap[w, t] = np.where(better, g.capacity_rps[k], best_cap[w, t])
    op_axes = ("workload", "gpu_type", "clock_mhz", "share")
    best_axes = ("workload", "gpu_type", "load")
    columns = {
        "safe_add": ColumnData(
            safe_add, (*op_axes, "load"), "<u1", 0, "1 if load + one step meets the SLO"
        ),
        "power_w": ColumnData(
            power,
            (*op_axes, "load"),
            "<f8",
            float("nan"),
            "W attributed at the load; NaN if not SLO-safe",
        ),
        "capacity_rps": ColumnData(capacity, op_axes, "<f8", 0.0, "requests/s"),
        "marginal_w_per_rps": ColumnData(
            marginal, op_axes, "<f8", float("nan"), "W per request/s (= J per request)"
        ),
        "best_clock_mhz": ColumnData(best_clock, best_axes, "<i8", -1, "MHz; -1 no decision"),
        "best_share": ColumnData(best_share, best_axes, "<i8", -1, "share units; -1 no decision"),
        "best_power_w": ColumnData(best_power, best_axes, "<f8", float("nan"), "W"),
        "best_capacity_rps": ColumnData(best_cap, best_axes, "<f8", 0.0, "requests/s"),
    }
    meta = {
        "instance": problem.instance.name,
        "source": problem.source,
        "load_step_rps": step,
        "load_max_rps": top,
        "share_units": {
            t: ("mig_slices" if problem.instance.options.sharing.mode == "mig" else "percent")
            for t in problem.gpu_types_used()
        },
        "tensor_parallel": 1,
    }
    return axes, columns, meta
