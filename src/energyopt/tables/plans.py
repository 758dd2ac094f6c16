"""Plan table (kind ``plans``): solve every cell of a grid of scaled instances and
store each cell's fleet decision.

Cells are solved in parallel by local processes. Each finished cell is written
to ``OUTPUT.cells/cell-<n>.json`` at once, so an interrupted compile resumes
without solving them again (the directory holds a fingerprint of the spec, the
base instance and the preset; a mismatch is an error, not a silent mix).
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from energyopt.catalog.problem import Problem, load_problem, resolve
from energyopt.perf.oppoints import units_of
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import FEASIBLE, INFEASIBLE, NO_SOLUTION, OPTIMAL
from energyopt.spec.errors import SpecError
from energyopt.spec.plan import Plan
from energyopt.tables.format import Axis, ColumnData
from energyopt.tables.spec import CompileSpec

KIND = "plans"
STATUS_CODES = {OPTIMAL: 0, FEASIBLE: 1, INFEASIBLE: 2, NO_SOLUTION: 3}
"""Cell status codes; -1 (the fallback) means no decision: key outside the grid."""
Say = Callable[[str], None]


@dataclass(frozen=True)
class Cell:
    """One grid cell: its position and the rate multiplier of every workload."""

    number: int
    position: tuple[int, ...]
    keys: dict[str, float]
    scales: dict[str, float]  # workload -> multiplier


def grid_axes(spec: CompileSpec) -> list[Axis]:
    """The scale axes: ``load_scale`` then ``scale.<workload>`` per workload_scale entry."""
    axes = [Axis("load_scale", "ceil", tuple(float(v) for v in spec.load_scale))]
    for name, values in spec.workload_scale.items():
        axes.append(Axis(f"scale.{name}", "ceil", tuple(float(v) for v in values)))
    return axes


def cells_of(spec: CompileSpec, problem: Problem) -> list[Cell]:
    """Every cell, in C order of the axes."""
    axes = grid_axes(spec)
    names = [w.name for w in problem.instance.workloads]
    unknown = [k for k in spec.workload_scale if k not in names]
    if unknown:
        raise SpecError([f"workload_scale: unknown workload(s) {unknown}; known: {names}"])
    out = []
    ranges = [range(len(a.values)) for a in axes]
    for n, pos in enumerate(itertools.product(*ranges)):
        keys = {a.name: float(a.values[i]) for a, i in zip(axes, pos, strict=True)}
        scales = {w: keys["load_scale"] * keys.get(f"scale.{w}", 1.0) for w in names}
        out.append(Cell(n, tuple(pos), keys, scales))
    return out


def scaled_problem(problem: Problem, scales: dict[str, float]) -> Problem:
    """``problem`` with every workload's rate multiplied by its scale."""
    inst = problem.instance
    workloads = tuple(
        w.model_copy(update={"rate_rps": w.rate_rps * scales.get(w.name, 1.0)})
        for w in inst.workloads
    )
    base_dir = Path(problem.source).parent
    return resolve(inst.model_copy(update={"workloads": workloads}), problem.source, base_dir)


def solve_cell(
    base: str,
    scales: dict[str, float],
    solver: str,
    limit: float | None,
    gap: float | None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Solve one cell (runs in a worker process); a JSON-able record.

    ``threads`` caps the solver's threads (one per worker when cells run in parallel).
    """
    from energyopt.solvers.serving import solve

    problem = scaled_problem(load_problem(base), scales)
    preset = load_preset(solver)
    if threads is not None:
        preset = preset.model_copy(update={"threads": threads})
    result = solve(problem, preset, time_limit_s=limit, rel_gap=gap)
    return {
        "status": result.status,
        "objective": result.objective,
        "bound": result.bound,
        "gap": result.gap,
        "wall_s": result.wall_s,
        "plan": None if result.plan is None else result.plan.model_dump(mode="json"),
    }


def fingerprint(spec: CompileSpec, base: Path) -> str:
    """SHA-256 of what decides the cells: the spec, the base file and the preset."""
    preset = load_preset(spec.solver)
    h = hashlib.sha256()
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
                    f"{folder}: finished cells of a different spec, base instance or "
                    "solver preset; delete the directory to compile from scratch"
                ]
            )
    else:
        stamp.write_text(print_ + "\n")
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
    output: str | Path,
    workers: int = 1,
    say: Say | None = None,
    scheduler: Any = None,
) -> tuple[Problem, list[Cell], list[dict[str, Any]]]:
    """Solve every cell not already in the side directory; all records in cell order.

    ``scheduler``: a Dask distributed scheduler address (or cluster) to solve the
    cells on instead of local processes.
    """
    report = say or (lambda _: None)
    problem = load_problem(base)
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
        keys = " ".join(f"{k}={v:g}" for k, v in cell.keys.items())
        obj = "-" if rec["objective"] is None else f"{rec['objective']:.6g}"
        gap = "-" if rec["gap"] is None else f"{100 * rec['gap']:.3f}%"
        report(
            f"cell {len(records)}/{total} ({keys}): {rec['status']}, objective {obj}, "
            f"gap {gap}, {rec['wall_s']:.2f} s (elapsed {time.perf_counter() - start:.1f} s)"
        )

    args = (spec.solver, spec.time_limit_s, spec.rel_gap)
    if scheduler is not None:
        _solve_on_dask(scheduler, todo, str(base), args, finish)
    elif workers <= 1 or len(todo) <= 1:
        for cell in todo:
            finish(cell, solve_cell(str(base), cell.scales, *args))
    else:
        # spawn, not fork: a forked child of a process that already ran HiGHS
        # inherits its thread pool's state and can spin forever
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_single_threaded_highs
        ) as pool:
            pending: dict[Future[dict[str, Any]], Cell] = {
                pool.submit(solve_cell, str(base), c.scales, *args): c for c in todo
            }
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    finish(pending.pop(fut), fut.result())
    return problem, cells, [records[c.number] for c in cells]


def _single_threaded_highs() -> None:
    """Fix HiGHS' process-wide thread pool at one thread (worker processes run in
    parallel already); it must be the first HiGHS run of the process."""
    from energyopt.formulations.serving.master import quiet_highs

    h = quiet_highs()
    h.setOptionValue("threads", 1)
    h.addVars(1, np.zeros(1), np.ones(1))
    h.run()


def _solve_on_dask(
    scheduler: Any,
    todo: list[Cell],
    base: str,
    args: tuple[str, float | None, float | None],
    finish: Callable[[Cell, dict[str, Any]], None],
) -> None:
    """Solve cells on a Dask distributed cluster; each finished cell is stored at once."""
    try:
        dist: Any = importlib.import_module("distributed")  # partly typed: use it as Any
    except ImportError:
        raise SpecError(
            ["--scheduler needs dask.distributed: pip install 'energyopt[dask]'"]
        ) from None
    try:
        client = dist.Client(scheduler, timeout="30s")
    except OSError as exc:
        raise SpecError([f"--scheduler {scheduler}: cannot connect: {exc}"]) from None
    with client:
        futures = {client.submit(solve_cell, base, c.scales, *args, pure=False): c for c in todo}
        for fut in dist.as_completed(list(futures)):
            finish(futures[fut], fut.result())


def build_plan_columns(
    spec: CompileSpec, problem: Problem, cells: list[Cell], records: list[dict[str, Any]]
) -> tuple[list[Axis], dict[str, ColumnData], dict[str, Any]]:
    """Axes, columns and metadata of the plan table from the solved cells."""
    axes = grid_axes(spec)
    gpus = [g.id for g in problem.gpus]
    units = [u.label for u in units_of(problem)]
    axes += [Axis("gpu", "category", tuple(gpus)), Axis("unit", "category", tuple(units))]
    grid_shape = tuple(len(a.values) for a in axes[:-2])
    ng, nu = len(gpus), len(units)
    status = np.full(grid_shape, -1, dtype=np.int64)
    objective = np.full(grid_shape, np.nan)
    bound = np.full(grid_shape, np.nan)
    gap = np.full(grid_shape, np.nan)
    on = np.zeros((*grid_shape, ng), dtype=np.uint8)
    clock = np.full((*grid_shape, ng), -1, dtype=np.int64)
    limit = np.full((*grid_shape, ng), np.nan)
    power = np.zeros((*grid_shape, ng))
    share = np.zeros((*grid_shape, ng, nu), dtype=np.int64)
    rate = np.zeros((*grid_shape, ng, nu))
    tp_size = np.zeros((*grid_shape, ng, nu), dtype=np.int64)
    tp_group = np.full((*grid_shape, ng, nu), -1, dtype=np.int64)
    mig = np.full((*grid_shape, ng, nu), -1, dtype=np.int64)
    mig_names: list[str] = []
    for cell, rec in zip(cells, records, strict=True):
        p = cell.position
        status[p] = STATUS_CODES.get(rec["status"], 3)
        for arr, name in ((objective, "objective"), (bound, "bound"), (gap, "gap")):
            arr[p] = math.nan if rec[name] is None else rec[name]
        if rec["plan"] is None:
            continue
        plan = Plan.model_validate(rec["plan"])
        groups: dict[str, int] = {}
        for gp in plan.gpus:
            g = gpus.index(gp.gpu)
            on[(*p, g)] = gp.on
            clock[(*p, g)] = -1 if gp.clock_mhz is None else gp.clock_mhz
            limit[(*p, g)] = math.nan if gp.power_limit_w is None else gp.power_limit_w
            power[(*p, g)] = gp.predicted_power_w
            for pl in gp.placements:
                label = pl.workload if pl.phase == "both" else f"{pl.workload}:{pl.phase}"
                u = units.index(label)
                share[(*p, g, u)] = pl.share_pct
                rate[(*p, g, u)] = pl.rate_rps
                tp_size[(*p, g, u)] = pl.tp_size
                if pl.tp_group is not None:
                    tp_group[(*p, g, u)] = groups.setdefault(pl.tp_group, len(groups))
                if pl.mig_profile is not None:
                    if pl.mig_profile not in mig_names:
                        mig_names.append(pl.mig_profile)
                    mig[(*p, g, u)] = mig_names.index(pl.mig_profile)
    cell_axes = tuple(a.name for a in axes[:-2])
    per_gpu = (*cell_axes, "gpu")
    per_pl = (*cell_axes, "gpu", "unit")
    nan = float("nan")
    columns = {
        "status": ColumnData(
            status,
            cell_axes,
            "<i8",
            -1,
            "0 optimal 1 feasible 2 infeasible 3 no solution -1 no decision",
        ),
        "objective": ColumnData(objective, cell_axes, "<f8", nan),
        "bound": ColumnData(bound, cell_axes, "<f8", nan),
        "gap": ColumnData(gap, cell_axes, "<f8", nan, "relative"),
        "on": ColumnData(on, per_gpu, "<u1", 0, "1 on"),
        "clock_mhz": ColumnData(clock, per_gpu, "<i8", -1, "MHz; -1 off or default"),
        "power_limit_w": ColumnData(limit, per_gpu, "<f8", nan, "W; NaN none"),
        "predicted_power_w": ColumnData(power, per_gpu, "<f8", nan, "W"),
        "share_pct": ColumnData(share, per_pl, "<i8", 0, "MPS percent; 0 not placed"),
        "rate_rps": ColumnData(rate, per_pl, "<f8", 0.0, "requests/s"),
        "tp_size": ColumnData(tp_size, per_pl, "<i8", 0, "0 not placed"),
        "tp_group": ColumnData(tp_group, per_pl, "<i8", -1, "group number within the cell"),
        "mig_profile": ColumnData(mig, per_pl, "<i8", -1, "index into meta.mig_profiles"),
    }
    meta = {
        "instance": problem.instance.name,
        "source": problem.source,
        "solver": spec.solver,
        "time_limit_s": spec.time_limit_s,
        "rel_gap": spec.rel_gap,
        "mig_profiles": mig_names,
        "gpu_types": {g.id: g.type for g in problem.gpus},
    }
    return axes, columns, meta
