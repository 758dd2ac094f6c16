"""Task graphs (``kind: taskgraph``): each task's GPU and clock for minimum energy,
makespan, EDP, ED²P or energy within (1+ε) of the fastest schedule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from energyopt.families.contract import NotExportable, SolverEntry, Stated, TableFamily, given
from energyopt.families.taskgraph.formulations.loading import load_taskgraph
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule, totals
from energyopt.families.taskgraph.schedule import ScheduledTask, TaskGraphSchedule
from energyopt.families.taskgraph.spec import OBJECTIVE_UNITS, TaskGraphFile
from energyopt.progress import Progress
from energyopt.solvers.result import Result
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse
from energyopt.verify.violation import Violation

AUTO_CPSAT_TASKS = 40
"""``auto`` runs CP-SAT (warm-started by the list scheduler) up to this many tasks."""
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_GAP = 1e-4


def auto_solver(tg: TaskGraph) -> str:
    """The solver ``auto`` runs on ``tg``: cpsat up to ``AUTO_CPSAT_TASKS`` tasks."""
    return "cpsat" if tg.n_tasks <= AUTO_CPSAT_TASKS else "heuristic"


def _cpsat(
    tg: TaskGraph, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[Schedule]:
    from energyopt.families.taskgraph.solvers.cpsat import solve_cpsat

    return solve_cpsat(
        tg,
        time_limit_s=time_limit_s or DEFAULT_TIME_LIMIT_S,
        rel_gap=given(rel_gap, DEFAULT_GAP),
        progress=progress,
    )


def _heuristic(
    tg: TaskGraph, time_limit_s: float | None, rel_gap: float | None, progress: Progress
) -> Result[Schedule]:
    from energyopt.families.taskgraph.solvers.heuristic import solve_heuristic

    return solve_heuristic(tg, progress=progress, time_limit_s=time_limit_s or DEFAULT_TIME_LIMIT_S)


class TaskGraphFamily(TableFamily[TaskGraph, Schedule]):
    """Task-based multi-GPU applications with per-GPU DVFS."""

    kind = "taskgraph"
    title = "task graphs: placement and per-task clocks with transfers and DVFS costs"
    problem_model: type[BaseModel] = TaskGraphFile
    plan_model: type[BaseModel] = TaskGraphSchedule
    instances = ("instances/taskgraph/*.yaml",)
    names_result_by_request = False

    def load(self, path: str, catalogs: Sequence[str]) -> TaskGraph:
        tg = load_taskgraph(path, catalogs)
        problems = tg.spec.catalog_problems(path, {t.name: t for t in tg.types})
        if problems:
            raise SpecError(problems)
        return tg

    def summary(self, tg: TaskGraph) -> str:
        types = ", ".join(t.name for t in tg.types)
        edges = sum(len(p) for p in tg.preds)
        return (
            f"task graph: {tg.n_tasks} tasks, {edges} edges, {tg.n_gpus} GPUs ({types}), "
            f"objective {tg.objective}"
        )

    def show(self, tg: TaskGraph) -> list[str]:
        lines = [self.summary(tg), f"{'GPU':<10} {'type':<10} idle W"]
        for g, name in enumerate(tg.gpu_names):
            t = tg.gpu_type[g]
            lines.append(f"{name:<10} {tg.types[t].name:<10} {tg.idle_w[t]:.1f}")
        lines.append(
            f"{'task':<16} {'GPU type':<10} {'clocks':>6} {'fastest ms':>11} {'J above idle':>9}"
        )
        for i, name in enumerate(tg.task_names):
            for t, gtype in enumerate(tg.types):
                o = tg.options[t][i]
                if not o.dur:
                    lines.append(f"{name:<16} {gtype.name:<10} cannot run")
                    continue
                k = min(range(len(o.dur)), key=lambda j: o.dur[j])
                lines.append(
                    f"{name:<16} {gtype.name:<10} {len(o.dur):>6} {tg.ms(o.dur[k]):>11.3f} "
                    f"{o.dyn_j[k]:>12.4f}"
                )
        return lines

    def solvers(self) -> list[SolverEntry[TaskGraph, Schedule]]:
        return [
            SolverEntry(
                "auto",
                self.kind,
                "certified bound",
                f"cpsat up to {AUTO_CPSAT_TASKS} tasks, else heuristic (with its bound)",
                pick=auto_solver,
            ),
            SolverEntry(
                "cpsat",
                self.kind,
                "exact",
                "OR-Tools CP-SAT with intervals, warm-started by the list scheduler",
                ("time limit", "gap"),
                run=_cpsat,
            ),
            SolverEntry(
                "heuristic",
                self.kind,
                "certified bound",
                "HEFT placement, slack reclaiming, local search and per-GPU clocks; "
                "Lagrangian bound",
                ("time limit",),
                run=_heuristic,
            ),
        ]

    def headline(self, tg: TaskGraph) -> str:
        return f"{tg.source} ({tg.n_tasks} tasks, {tg.n_gpus} GPUs)"

    def verify(self, tg: TaskGraph, plan: Schedule) -> list[Violation]:
        from energyopt.families.taskgraph.verify import check_schedule

        return [Violation("schedule", "", v) for v in check_schedule(tg, plan).violations]

    def cost(self, tg: TaskGraph, plan: Schedule) -> float:
        from energyopt.families.taskgraph.verify import check_schedule

        return check_schedule(tg, plan).objective

    def objective_unit(self, tg: TaskGraph) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""
        return OBJECTIVE_UNITS[tg.objective]

    def report(self, tg: TaskGraph, result: Result[Schedule]) -> list[str]:
        assert result.plan is not None
        tot = totals(tg, result.plan)
        lines = [f"schedule for {tg.name} ({tg.source})"]
        header = f"{'GPU':<10} {'type':<8} {'tasks':>5} {'clock changes':>13} {'busy ms':>10}"
        lines.append(f"{header}  clocks MHz")
        for g, row in enumerate(tot.per_gpu):
            clocks = ", ".join(str(c) for c in row.clocks_mhz) or "-"
            lines.append(
                f"{tg.gpu_names[g]:<10} {tg.types[tg.gpu_type[g]].name:<8} {row.tasks:>5} "
                f"{row.clock_changes:>13} {tg.ms(row.busy):>10.3f}  {clocks}"
            )
        deadline = ""
        if tg.deadline is not None:
            deadline = (
                f" (deadline {tg.ms(tg.deadline):.3f} ms = (1 + epsilon) x reference "
                f"{tg.ms(tg.reference_makespan or 0):.3f} ms)"
            )
        lines.append(f"makespan {tot.makespan_ms:.3f} ms{deadline}")
        lines.append(
            f"energy {tot.energy_j:.4f} J (idle {tot.idle_j:.4f} J, tasks above idle "
            f"{tot.dyn_j:.4f} J, {tot.transitions} clock changes {tot.transition_j:.4f} J)"
        )
        unit = OBJECTIVE_UNITS[tg.objective]
        bound = "none" if result.bound is None else f"{result.bound:.6g} {unit}"
        gap = "n/a" if result.gap is None else f"{100 * result.gap:.3f}%"
        assert result.objective is not None
        lines.append(
            f"objective {tg.objective} {result.objective:.6g} {unit}, bound {bound}, gap {gap}, "
            f"status {result.status}"
        )
        lines.append(f"solver {result.solver} ({result.algorithm}), {result.wall_s:.2f} s")
        return lines

    def to_file(self, tg: TaskGraph, result: Result[Schedule]) -> BaseModel:
        s = result.plan
        assert s is not None
        return TaskGraphSchedule(
            name=tg.name,
            objective=tg.objective,
            objective_value=result.objective,
            objective_unit=OBJECTIVE_UNITS[tg.objective],
            bound=result.bound,
            gap=result.gap,
            status=str(result.status),
            solver=result.solver,
            makespan_ms=tg.ms(s.makespan(tg)),
            tasks=tuple(
                ScheduledTask(
                    task=name,
                    gpu=tg.gpu_names[s.gpu[i]],
                    clock_mhz=s.clock(tg, i),
                    start_ms=tg.ms(s.start[i]),
                    end_ms=tg.ms(s.end(tg, i)),
                )
                for i, name in enumerate(tg.task_names)
            ),
        )

    def from_file(self, tg: TaskGraph, data: Any, source: str) -> tuple[Schedule, Stated]:
        """The schedule of a file: tasks by name, GPUs by name, options by clock, and
        starts on the graph's time grid (SpecError naming the entry that does not fit)."""
        f = parse(TaskGraphSchedule, data, source)
        tasks = {n: i for i, n in enumerate(tg.task_names)}
        gpus = {n: g for g, n in enumerate(tg.gpu_names)}
        gpu = [-1] * tg.n_tasks
        option = [-1] * tg.n_tasks
        start = [0] * tg.n_tasks
        problems = []
        for k, row in enumerate(f.tasks):
            where = f"{source}: tasks[{k}]({row.task})"
            i = tasks.get(row.task)
            g = gpus.get(row.gpu)
            if i is None or g is None:
                what = "task" if i is None else "gpu"
                problems.append(f"{where}.{what}: not in the task graph")
                continue
            if gpu[i] != -1:
                problems.append(f"{where}.task: scheduled twice")
                continue
            clocks = tg.opts(i, g).clock_mhz
            if row.clock_mhz not in clocks:
                problems.append(
                    f"{where}.clock_mhz: {row.clock_mhz} MHz is not an option of this task on "
                    f"{row.gpu} (options: {', '.join(str(c) for c in clocks) or 'none'})"
                )
                continue
            gpu[i], option[i] = g, clocks.index(row.clock_mhz)
            start[i] = round(row.start_ms / tg.unit_ms)
            if abs(start[i] * tg.unit_ms - row.start_ms) > 1e-6 * max(1.0, row.start_ms):
                problems.append(
                    f"{where}.start_ms: {row.start_ms:g} ms is not on the graph's "
                    f"{tg.unit_ms:g} ms time grid"
                )
        missing = [tg.task_names[i] for i in range(tg.n_tasks) if gpu[i] == -1]
        if missing and not problems:
            problems.append(f"{source}: tasks: no entry for {', '.join(missing[:5])}")
        if problems:
            raise SpecError(problems)
        schedule = Schedule(tuple(gpu), tuple(option), tuple(start))
        return schedule, Stated(f.objective_value, f.bound, f.gap)

    def program(self, tg: TaskGraph) -> Any:
        raise NotExportable(
            "task graphs are solved as a CP-SAT scheduling model (intervals and no-overlap "
            "constraints), which has no MPS or LP form"
        )
