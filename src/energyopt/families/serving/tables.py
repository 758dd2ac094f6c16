"""Plan table (kind ``plans``): solve every cell of a grid of scaled instances and
store each cell's fleet decision.

Cells are solved in parallel: the compiling process solves cells itself while
``workers - 1`` spawned processes solve others, each taking the next unsolved cell
when it is free (or on a Dask cluster). Each finished cell is written
to ``OUTPUT.cells/cell-<n>.json`` at once, so an interrupted compile resumes
without solving them again (the directory holds a fingerprint of the spec, the
base instance, the preset and ``VERSION``; a mismatch is an error, not a silent mix).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from energyopt.backends.highs import single_threaded_highs
from energyopt.catalog.problem import Problem, load_problem
from energyopt.families.serving.dask_client import DASK_CONNECT_TIMEOUT_S, connect, distributed
from energyopt.perf.oppoints import units_of
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL
from energyopt.spec.errors import SpecError
from energyopt.spec.io import write_text_atomic
from energyopt.spec.plan import Plan
from energyopt.tables.format import Axis, ColumnData, write_table
from energyopt.tables.local import local_decisions, unit_label
from energyopt.tables.spec import CompileSpec, SloTier
from energyopt.tables.variants import variant

KIND = "plans"
STATUS_CODES = {OPTIMAL: 0, FEASIBLE: 1, INFEASIBLE: 2, NO_SOLUTION: 3}
"""Cell status codes; -1 (the fallback) means no decision: key outside the grid."""
Say = Callable[[str], None]


@dataclass(frozen=True)
class Cell:
    """One grid cell: its position, its keys and the change of the base instance it
    stands for (JSON-able: ``scales`` per workload, ``tier``, ``gpu_type``)."""

    number: int
    position: tuple[int, ...]
    keys: dict[str, float | str]
    change: dict[str, Any]

    @property
    def scales(self) -> dict[str, float]:
        """Rate multiplier of every workload."""
        return dict(self.change["scales"])


def grid_axes(spec: CompileSpec) -> list[Axis]:
    """The cell axes: ``slo_tier`` and ``gpu_type`` (when the spec lists them), then
    ``load_scale`` and ``scale.<workload>`` per workload_scale entry."""
    axes = []
    if spec.slo_tiers:
        axes.append(Axis("slo_tier", "category", tuple(t.name for t in spec.slo_tiers)))
    if spec.gpu_types:
        axes.append(Axis("gpu_type", "category", tuple(spec.gpu_types)))
    axes.append(Axis("load_scale", "ceil", tuple(float(v) for v in spec.load_scale)))
    for name, values in spec.workload_scale.items():
        axes.append(Axis(f"scale.{name}", "ceil", tuple(float(v) for v in values)))
    return axes


def cells_of(spec: CompileSpec, problem: Problem) -> list[Cell]:
    """Every cell, in C order of the axes."""
    axes = grid_axes(spec)
    names = [w.name for w in problem.instance.workloads]
    tiers = {t.name: t for t in spec.slo_tiers}
    out = []
    ranges = [range(len(a.values)) for a in axes]
    for n, pos in enumerate(itertools.product(*ranges)):
        keys = {a.name: a.values[i] for a, i in zip(axes, pos, strict=True)}
        load = float(keys["load_scale"])
        scales = {w: load * float(keys.get(f"scale.{w}", 1.0)) for w in names}
        tier = tiers.get(str(keys.get("slo_tier")))
        change = {
            "scales": scales,
            "tier": None if tier is None else tier.model_dump(mode="json"),
            "gpu_type": keys.get("gpu_type"),
        }
        out.append(Cell(n, tuple(pos), keys, change))
    return out


def scaled_problem(problem: Problem, scales: dict[str, float]) -> Problem:
    """``problem`` with every workload's rate multiplied by its scale."""
    return variant(problem, scales=scales)


def cell_problem(problem: Problem, change: dict[str, Any]) -> Problem:
    """The instance a cell stands for (see ``Cell.change``)."""
    tier = change.get("tier")
    return variant(
        problem,
        scales=change.get("scales"),
        tier=None if tier is None else SloTier.model_validate(tier),
        gpu_type=change.get("gpu_type"),
    )


@functools.lru_cache(maxsize=8)
def _base_problem(base: str, mtime_ns: int, size: int) -> Problem:
    """The base instance, read once per process while the file is unchanged."""
    del mtime_ns, size  # cache keys only
    return load_problem(base)


def solve_cell(
    base: str,
    change: dict[str, Any],
    solver: str,
    limit: float | None,
    gap: float | None,
) -> dict[str, Any]:
    """Solve one cell (runs in a worker process); a JSON-able record."""
    from energyopt.families.serving.solvers.solve import solve

    stat = os.stat(base)
    problem = cell_problem(_base_problem(base, stat.st_mtime_ns, stat.st_size), change)
    result = solve(problem, load_preset(solver), time_limit_s=limit, rel_gap=gap)
    return {
        "status": result.status,
        "objective": result.objective,
        "bound": result.bound,
        "gap": result.gap,
        "wall_s": result.wall_s,
        "plan": None if result.plan is None else result.plan.model_dump(mode="json"),
    }


VERSION = 2
"""Version of what a cell's plan means, ``meta.plans_version`` and part of the cells'
fingerprint. 2: each placement's power is its power line (a fixed part while
placed plus a part per req/s) and power limits hold the worst-case draw
(perf/energy.py); 1 (no version in meta): power at a fixed design batch, which
under-predicted a lightly loaded decode loop. Finished cells or a table of
another version are not mixed with this one's."""


def fingerprint(spec: CompileSpec, base: Path) -> str:
    """SHA-256 of what decides the cells: the spec, the base file, the preset and
    the plans' ``VERSION``."""
    preset = load_preset(spec.solver)
    h = hashlib.sha256()
    h.update(f"plans version {VERSION}".encode())
    h.update(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode())
    h.update(base.read_bytes())
    h.update(json.dumps(preset.model_dump(mode="json"), sort_keys=True).encode())
    return h.hexdigest()


def cells_dir(output: str | Path) -> Path:
    """Side directory of finished cells next to ``output``."""
    out = Path(output)
    return out.with_name(out.name + ".cells")


def _open_cells_dir(output: str | Path, print_: str) -> Path:
    folder = cells_dir(output)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / "fingerprint"
    if stamp.exists():
        if stamp.read_text().strip() != print_:
            raise SpecError(
                [
                    f"{folder}: finished cells of a different spec, base instance, "
                    f"solver preset or plans version (this energyopt: {VERSION}); "
                    "delete the directory to compile from scratch"
                ]
            )
    else:
        write_text_atomic(stamp, print_ + "\n")
    return folder


def _load_record(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None  # an unreadable record is solved again
    return data if isinstance(data, dict) and "status" in data else None


def _store(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def solve_cells(
    spec: CompileSpec,
    base: Path,
    problem: Problem,
    output: str | Path,
    workers: int = 1,
    say: Say | None = None,
    scheduler: Any = None,
) -> tuple[list[Cell], list[dict[str, Any]]]:
    """Solve every cell not already in the side directory; the cells and all records
    in cell order. ``problem`` is the base instance read from ``base``.

    ``scheduler``: a Dask distributed scheduler address (or cluster) to solve the
    cells on instead of local processes.
    """
    report = say or (lambda _: None)
    load_preset(spec.solver)  # fail early on an unknown preset
    cells = cells_of(spec, problem)
    folder = _open_cells_dir(output, fingerprint(spec, base))
    records: dict[int, dict[str, Any]] = {}
    for cell in cells:
        rec = _load_record(folder / f"cell-{cell.number}.json")
        if rec is not None:
            records[cell.number] = rec
    todo = [c for c in cells if c.number not in records]
    total = len(cells)
    if records:
        report(f"resuming: {len(records)} of {total} cells already solved in {folder}")
    start = time.perf_counter()

    def finish(cell: Cell, rec: dict[str, Any]) -> None:
        _store(folder / f"cell-{cell.number}.json", rec)
        records[cell.number] = rec
        keys = " ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in cell.keys.items()
        )
        obj = "-" if rec["objective"] is None else f"{rec['objective']:.6g}"
        gap = "-" if rec["gap"] is None else f"{100 * rec['gap']:.3f}%"
        report(
            f"{progress_bar(len(records), total)} cell {len(records)}/{total} ({keys}): "
            f"{rec['status']}, objective {obj}, gap {gap}, {rec['wall_s']:.2f} s "
            f"(elapsed {time.perf_counter() - start:.1f} s)"
        )

    args = (spec.solver, spec.time_limit_s, spec.rel_gap)
    if scheduler is not None:
        _solve_on_dask(scheduler, todo, str(base), args, finish)
    elif workers <= 1 or len(todo) <= 1:
        for cell in todo:
            finish(cell, solve_cell(str(base), cell.change, *args))
    else:
        _single_threaded_highs_here()
        _solve_in_parallel(todo, str(base), args, workers, finish)
    return cells, [records[c.number] for c in cells]


def progress_bar(done: int, total: int, width: int = 20) -> str:
    """``[#####...............]`` for ``done`` of ``total``."""
    filled = width * done // max(total, 1)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def _solve_in_parallel(
    todo: list[Cell],
    base: str,
    args: tuple[str, float | None, float | None],
    workers: int,
    finish: Callable[[Cell, dict[str, Any]], None],
) -> None:
    """Solve ``todo`` on this process and ``workers - 1`` spawned ones; each takes the
    next unsolved cell when it is free, so a slow cell does not hold others back.

    This process already has the solver imported, so it starts at once while the
    spawned processes import theirs. Spawn, not fork: a forked child of a process
    that already ran HiGHS inherits its thread pool's state and can spin forever.
    """
    queue = collections.deque(todo)
    lock = threading.Lock()
    failures: list[BaseException] = []

    def take() -> Cell | None:
        with lock:
            return queue.popleft() if queue and not failures else None

    def record(cell: Cell, rec: dict[str, Any]) -> None:
        with lock:
            finish(cell, rec)

    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=workers - 1, mp_context=context, initializer=single_threaded_highs
    )

    def feed() -> None:
        while (cell := take()) is not None:
            try:
                rec = pool.submit(solve_cell, base, cell.change, *args).result()
            except BaseException as exc:  # re-raised by the compiling thread
                failures.append(exc)
                return
            record(cell, rec)

    feeders = [threading.Thread(target=feed, daemon=True) for _ in range(workers - 1)]
    try:
        for thread in feeders:
            thread.start()
        while (cell := take()) is not None:
            record(cell, solve_cell(base, cell.change, *args))
        for thread in feeders:
            thread.join()
    except BaseException:
        with lock:
            queue.clear()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    if failures:
        raise failures[0]


def _single_threaded_highs_here() -> None:
    """Run this process's HiGHS single-threaded too when it solves cells beside the
    workers (one core per worker), unless HiGHS already ran here: its thread pool
    is fixed at the first run, and changing it afterwards breaks every solve."""
    from energyopt.backends.highs import highs_started, single_threaded_highs

    if not highs_started():
        single_threaded_highs()


def _solve_on_dask(
    scheduler: Any,
    todo: list[Cell],
    base: str,
    args: tuple[str, float | None, float | None],
    finish: Callable[[Cell, dict[str, Any]], None],
) -> None:
    """Solve cells on a Dask distributed cluster; each finished cell is stored at once."""
    dist = distributed()
    client = connect(scheduler, DASK_CONNECT_TIMEOUT_S)
    with client:
        futures = {client.submit(solve_cell, base, c.change, *args, pure=False): c for c in todo}
        for fut in dist.as_completed(list(futures)):
            finish(futures[fut], fut.result())


PLAN_COLUMNS: dict[str, tuple[str, str, float | int, str]] = {
    # name: (keyed by: cell | gpu | unit, dtype, fallback, unit)
    "status": (
        "cell",
        "<i8",
        -1,
        "0 optimal 1 feasible 2 infeasible 3 no solution -1 no decision",
    ),
    "objective": ("cell", "<f8", math.nan, ""),
    "bound": ("cell", "<f8", math.nan, ""),
    "gap": ("cell", "<f8", math.nan, "relative"),
    "on": ("gpu", "<u1", 0, "1 on"),
    "clock_mhz": ("gpu", "<i8", -1, "MHz; -1 off or default"),
    "power_limit_w": ("gpu", "<f8", math.nan, "W; NaN none"),
    "predicted_power_w": ("gpu", "<f8", math.nan, "W"),
    "share_pct": ("unit", "<i8", 0, "MPS percent; 0 not placed"),
    "rate_rps": ("unit", "<f8", 0.0, "requests/s"),
    "tp_size": ("unit", "<i8", 0, "0 not placed"),
    "tp_group": ("unit", "<i8", -1, "group number within the cell"),
    "mig_profile": ("unit", "<i8", -1, "index into meta.mig_profiles"),
    "batch_limit": ("unit", "<i8", 0, "largest decode batch within the TBT SLO and memory"),
    "prefill_tokens": ("unit", "<i8", 0, "prefill tokens per iteration"),
    "prefill_share_pct": ("unit", "<i8", 0, "SM share prefill runs on (percent)"),
    "decode_share_pct": ("unit", "<i8", 0, "SM share decode runs on (percent)"),
    "prefill_busy": ("unit", "<f8", 0.0, "fraction of the slice's time in prefill"),
    "ttft_ms": ("unit", "<f8", math.nan, "ms, model percentile at the planned rate"),
    "tbt_ms": ("unit", "<f8", math.nan, "ms, model percentile at the planned rate"),
}


def build_plan_columns(
    spec: CompileSpec, problem: Problem, cells: list[Cell], records: list[dict[str, Any]]
) -> tuple[list[Axis], dict[str, ColumnData], dict[str, Any]]:
    """Axes, columns and metadata of the plan table from the solved cells; the local
    decisions of each cell's plan are computed here from the performance model."""
    axes = grid_axes(spec)
    gpus = [g.id for g in problem.gpus]
    units = [u.label for u in units_of(problem)]
    cell_axes = tuple(a.name for a in axes)
    axes += [Axis("gpu", "category", tuple(gpus)), Axis("unit", "category", tuple(units))]
    grid_shape = tuple(len(a.values) for a in axes[:-2])
    shapes = {
        "cell": grid_shape,
        "gpu": (*grid_shape, len(gpus)),
        "unit": (*grid_shape, len(gpus), len(units)),
    }
    arrays: dict[str, Any] = {
        name: np.full(shapes[keyed], fallback, dtype=np.dtype(dtype))
        for name, (keyed, dtype, fallback, _) in PLAN_COLUMNS.items()
    }
    arrays["predicted_power_w"][...] = 0.0
    mig_names: list[str] = []
    for cell, rec in zip(cells, records, strict=True):
        p = cell.position
        arrays["status"][p] = STATUS_CODES.get(rec["status"], 3)
        for name in ("objective", "bound", "gap"):
            arrays[name][p] = math.nan if rec[name] is None else rec[name]
        if rec["plan"] is None:
            continue
        plan = Plan.model_validate(rec["plan"])
        local = local_decisions(cell_problem(problem, cell.change), plan)
        groups: dict[str, int] = {}
        for gp in plan.gpus:
            g = (*p, gpus.index(gp.gpu))
            arrays["on"][g] = gp.on
            arrays["clock_mhz"][g] = -1 if gp.clock_mhz is None else gp.clock_mhz
            arrays["power_limit_w"][g] = math.nan if gp.power_limit_w is None else gp.power_limit_w
            arrays["predicted_power_w"][g] = gp.predicted_power_w
            for pl in gp.placements:
                label = unit_label(pl)
                u = (*g, units.index(label))
                arrays["share_pct"][u] = pl.share_pct
                arrays["rate_rps"][u] = pl.rate_rps
                arrays["tp_size"][u] = pl.tp_size
                if pl.tp_group is not None:
                    arrays["tp_group"][u] = groups.setdefault(pl.tp_group, len(groups))
                if pl.mig_profile is not None:
                    if pl.mig_profile not in mig_names:
                        mig_names.append(pl.mig_profile)
                    arrays["mig_profile"][u] = mig_names.index(pl.mig_profile)
                decision = local.get((gp.gpu, label))
                if decision is not None:
                    for name, value in vars(decision).items():
                        arrays[name][u] = value
    keyed_axes = {
        "cell": cell_axes,
        "gpu": (*cell_axes, "gpu"),
        "unit": (*cell_axes, "gpu", "unit"),
    }
    columns = {
        name: ColumnData(arrays[name], keyed_axes[keyed], dtype, fallback, unit)
        for name, (keyed, dtype, fallback, unit) in PLAN_COLUMNS.items()
    }
    meta = {
        "instance": problem.instance.name,
        "source": problem.source,
        "solver": spec.solver,
        "time_limit_s": spec.time_limit_s,
        "rel_gap": spec.rel_gap,
        "mig_profiles": mig_names,
        "gpu_types": {g.id: g.type for g in problem.gpus},
        "slo_tiers": [t.model_dump(mode="json") for t in spec.slo_tiers],
        "plans_version": VERSION,
    }
    return axes, columns, meta


def compile_table(
    spec_path: str | Path,
    output: str | Path,
    workers: int = 1,
    say: Callable[[str], None] | None = None,
    scheduler: Any = None,
) -> str:
    """Compile the table a spec file describes into ``output``; returns its kind.

    Plan cells run on ``workers`` local processes, or on the Dask distributed
    cluster at ``scheduler`` (an address such as ``tcp://host:8786``) when given.
    """
    from energyopt.tables.oppoints import build_oppoint_columns
    from energyopt.tables.spec import load_checked

    spec, base, problem = load_checked(spec_path)
    if spec.kind == "oppoints":
        axes, columns, meta = build_oppoint_columns(
            problem, spec.load_points, spec.load_max_rps, spec.slo_tiers, spec.gpu_types
        )
    else:
        cells, records = solve_cells(spec, base, problem, output, workers, say, scheduler)
        axes, columns, meta = build_plan_columns(spec, problem, cells, records)
    write_table(output, spec.kind, axes, columns, meta)
    return spec.kind
