"""``energyopt validate|solve`` for task-graph files (``kind: taskgraph``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from energyopt.formulations.taskgraph.model import TaskGraph, load_taskgraph
from energyopt.formulations.taskgraph.schedule import Schedule, Totals
from energyopt.spec.errors import SpecError
from energyopt.spec.io import file_format, write_text_atomic
from energyopt.spec.taskgraph import OBJECTIVE_UNITS

SOLVERS = ("auto", "cpsat", "heuristic")
AUTO_CPSAT_TASKS = 40
"""``auto`` runs CP-SAT (warm-started by the list scheduler) up to this many tasks."""
DEFAULT_TIME_LIMIT_S = 60.0


def _load(path: str, catalogs: list[str]) -> TaskGraph:
    """The bound task graph, with measured points checked against the catalog."""
    tg = load_taskgraph(path, catalogs)
    problems = tg.spec.catalog_problems(path, {t.name: t for t in tg.types})
    if problems:
        raise SpecError(problems)
    return tg


def validate_file(path: str, catalogs: list[str]) -> str:
    """One-line summary of a valid task-graph file; SpecError otherwise."""
    tg = _load(path, catalogs)
    types = ", ".join(t.name for t in tg.types)
    edges = sum(len(p) for p in tg.preds)
    return (
        f"task graph: {tg.n_tasks} tasks, {edges} edges, {tg.n_gpus} GPUs ({types}), "
        f"objective {tg.objective}"
    )


def pick_solver(name: str | None, tg: TaskGraph) -> str:
    """``cpsat`` or ``heuristic`` from ``--solver`` (the serving default means auto)."""
    chosen = "auto" if name in (None, "highs-exact") else name
    if chosen not in SOLVERS:
        raise SpecError(
            [f"--solver: unknown solver {name!r} for task graphs; use {', '.join(SOLVERS)}"]
        )
    if chosen == "auto":
        return "cpsat" if tg.n_tasks <= AUTO_CPSAT_TASKS else "heuristic"
    return chosen


def solve_file(args: argparse.Namespace) -> int:
    """Solve, check and print a task-graph schedule; the CLI's exit code."""
    from energyopt.cli import EXIT_INFEASIBLE, EXIT_OK, EXIT_VIOLATION, _err, _progress
    from energyopt.solvers.taskgraph_cpsat import solve_cpsat
    from energyopt.solvers.taskgraph_heuristic import solve_heuristic
    from energyopt.verify.taskgraph import check_schedule

    tg = _load(args.file, args.catalog)
    solver = pick_solver(args.solver, tg)
    if args.output and file_format(Path(args.output)) == "toml":  # fail before the solve
        raise SpecError([f"{args.output}: write the schedule as .json or .yaml"])
    say = _progress(args.quiet)
    say(f"solving {args.file} ({tg.n_tasks} tasks, {tg.n_gpus} GPUs) with {solver}")
    if solver == "cpsat":
        result = solve_cpsat(
            tg,
            time_limit_s=args.time_limit or DEFAULT_TIME_LIMIT_S,
            rel_gap=args.gap if args.gap is not None else 1e-4,
            progress=say,
        )
    else:
        result = solve_heuristic(tg, progress=say)
    if result.schedule is None or result.totals is None:
        _err(f"{args.file}: no schedule ({result.status}) after {result.wall_s:.1f} s")
        for line in result.diagnosis:
            _err(f"  - {line}")
        return EXIT_INFEASIBLE
    check = check_schedule(tg, result.schedule)
    if check.violations:
        _err(f"{args.file}: the {solver} schedule breaks {len(check.violations)} constraint(s):")
        for line in check.violations:
            _err(f"  - {line}")
        return EXIT_VIOLATION
    print(f"schedule for {tg.name} ({args.file})")
    print("\n".join(format_schedule(tg, result.totals)))
    unit = OBJECTIVE_UNITS[tg.objective]
    bound = "none" if result.bound is None else f"{result.bound:.6g} {unit}"
    gap = "n/a" if result.gap is None else f"{100 * result.gap:.3f}%"
    print(
        f"objective {tg.objective} {check.objective:.6g} {unit}, bound {bound}, gap {gap}, "
        f"status {result.status}"
    )
    print(f"solver {solver}, {result.wall_s:.2f} s")
    if args.output:
        write_schedule(tg, result.schedule, check.objective, result.bound, args.output)
        print(f"schedule written to {args.output}")
    return EXIT_OK


def format_schedule(tg: TaskGraph, tot: Totals) -> list[str]:
    """Per-GPU lines and the totals of a schedule."""
    lines = [
        f"{'GPU':<10} {'type':<8} {'tasks':>5} {'clock changes':>13} {'busy ms':>10}  clocks MHz"
    ]
    for g, row in enumerate(tot.per_gpu):
        clocks = ", ".join(str(c) for c in row.clocks_mhz) or "-"
        lines.append(
            f"{tg.gpu_names[g]:<10} {tg.types[tg.gpu_type[g]].name:<8} {row.tasks:>5} "
            f"{row.clock_changes:>13} {tg.ms(row.busy):>10.3f}  {clocks}"
        )
    lines.append(
        f"makespan {tot.makespan_ms:.3f} ms"
        + (
            f" (deadline {tg.ms(tg.deadline):.3f} ms = (1 + epsilon) x reference "
            f"{tg.ms(tg.reference_makespan or 0):.3f} ms)"
            if tg.deadline is not None
            else ""
        )
    )
    lines.append(
        f"energy {tot.energy_j:.4f} J (idle {tot.idle_j:.4f} J, tasks above idle "
        f"{tot.dyn_j:.4f} J, {tot.transitions} clock changes {tot.transition_j:.4f} J)"
    )
    return lines


def schedule_data(
    tg: TaskGraph, s: Schedule, objective: float, bound: float | None
) -> dict[str, Any]:
    """The schedule as plain data (times in ms)."""
    return {
        "name": tg.name,
        "objective": tg.objective,
        "objective_value": objective,
        "objective_unit": OBJECTIVE_UNITS[tg.objective],
        "bound": bound,
        "makespan_ms": tg.ms(s.makespan(tg)),
        "tasks": [
            {
                "task": name,
                "gpu": tg.gpu_names[s.gpu[i]],
                "clock_mhz": s.clock(tg, i),
                "start_ms": tg.ms(s.start[i]),
                "end_ms": tg.ms(s.end(tg, i)),
            }
            for i, name in enumerate(tg.task_names)
        ],
    }


def write_schedule(
    tg: TaskGraph, s: Schedule, objective: float, bound: float | None, path: str
) -> None:
    """Write the schedule as JSON or YAML (by suffix)."""
    fmt = file_format(Path(path))
    data = schedule_data(tg, s, objective, bound)
    if fmt == "json":
        text = json.dumps(data, indent=2) + "\n"
    elif fmt == "yaml":
        text = yaml.safe_dump(data, sort_keys=False)
    else:
        raise SpecError([f"{path}: write the schedule as .json or .yaml"])
    write_text_atomic(path, text)
