"""Keep-alive (``kind: keepalive``): each serverless function warm, tepid or cold in
every window, on a node, for least energy within memory and power budgets, start
SLOs and an optional cold-start cap, or for most requests starting within their
SLO's limit per second (then least energy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel

from energyopt.families.contract import (
    LimitedSolver,
    SolverEntry,
    SolverRun,
    TableFamily,
    limited,
)
from energyopt.families.keepalive.formulations.model import KeepAliveProblem, load_keepalive
from energyopt.families.keepalive.spec import KeepAliveFile, KeepAlivePlan
from energyopt.solvers.result import Result
from energyopt.spec.errors import SpecError
from energyopt.verify.violation import Violation

AUTO_MILP_COLUMNS = 200_000
"""``auto`` solves the whole-horizon MILP up to this many columns, else Lagrangian."""
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_GAP = 1e-4


def auto_solver(p: KeepAliveProblem) -> str:
    """The solver ``auto`` runs on ``p``: milp for the throughput objective and up to
    ``AUTO_MILP_COLUMNS`` columns, else lagrangian."""
    from energyopt.families.keepalive.formulations.milp import milp_columns

    small = p.maximises_throughput or milp_columns(p) <= AUTO_MILP_COLUMNS
    return "milp" if small else "lagrangian"


def _refuse(p: KeepAliveProblem, solver: str) -> None:
    """SpecError naming ``--solver`` where ``solver`` cannot take ``p``: an energy-only
    solver on the throughput objective, or a MILP larger than it builds."""
    from energyopt.families.keepalive.formulations.milp import MAX_COLUMNS, milp_columns
    from energyopt.families.keepalive.solvers.milp import LOOKAHEAD

    if p.maximises_throughput and solver in ("lagrangian", "rolling"):
        raise SpecError(
            [
                f"--solver: {solver} minimises energy only; the throughput objective "
                f"of {p.source} is solved by milp (or auto)"
            ]
        )
    if solver == "lagrangian":
        return
    windows = p.n_windows if solver == "milp" else min(p.n_windows, LOOKAHEAD)
    columns = milp_columns(p, 0, windows)
    if columns > MAX_COLUMNS:
        raise SpecError(
            [
                f"--solver: {solver} would build a MILP of {columns:,} columns for "
                f"{p.source}, more than the {MAX_COLUMNS:,} it builds (HiGHS could not "
                "keep the time limit); "
                + (
                    "the throughput objective is solved by milp only: plan fewer "
                    "windows, nodes or functions at a time"
                    if p.maximises_throughput
                    else "use lagrangian or auto"
                )
            ]
        )


def _solvers() -> dict[str, LimitedSolver[KeepAliveProblem, KeepAlivePlan]]:
    """The keep-alive solver functions by entry name (imported on first use)."""
    from energyopt.families.keepalive.solvers import lagrangian, milp

    return {
        "milp": milp.solve_milp,
        "lagrangian": lagrangian.solve_lagrangian,
        "rolling": milp.solve_rolling,
    }


def _runs(solver: str) -> SolverRun[KeepAliveProblem, KeepAlivePlan]:
    """What runs the keep-alive solver ``solver`` once ``_refuse`` lets it."""
    return limited(_solvers, solver, DEFAULT_TIME_LIMIT_S, DEFAULT_GAP, _refuse)


class KeepAliveFamily(TableFamily[KeepAliveProblem, KeepAlivePlan]):
    """Tepid-aware keep-alive and placement of serverless containers."""

    kind = "keepalive"
    title = "keep-alive: serverless functions warm, tepid or cold per window, on nodes"
    problem_model: type[BaseModel] = KeepAliveFile
    plan_model: type[BaseModel] = KeepAlivePlan
    instances = ("instances/keepalive/*.yaml",)
    plan_states_unit = True

    def load(self, path: str, catalogs: Sequence[str]) -> KeepAliveProblem:
        return load_keepalive(path)

    def summary(self, p: KeepAliveProblem) -> str:
        cap = p.spec.objective.max_cold_start_rate
        objective: str = p.spec.objective.kind
        if p.maximises_throughput:
            objective = "throughput within the start SLO, then energy"
        if cap is not None:
            objective += f", cold starts <= {cap:g} per request"
        return (
            f"keep-alive: {p.n_functions} functions, {p.n_nodes} nodes, {p.n_windows} windows "
            f"of {p.window_s:g} s, {int(p.arrivals.sum()):,} requests, objective {objective}"
        )

    def show(self, p: KeepAliveProblem) -> list[str]:
        lines = [self.summary(p), f"{'node':<14} {'GPU GB':>8} {'host GB':>8} {'budget W':>9}"]
        for n in p.spec.nodes:
            lines.append(
                f"{n.name:<14} {n.gpu_memory_gb:>8g} {n.host_memory_gb:>8g} {n.power_budget_w:>9g}"
            )
        lines.append(
            f"{'function':<26} {'requests':>8} {'warm GB/W':>12} {'tepid GB/W':>12} "
            f"{'resume s':>8} {'cold s':>7} {'cold J':>8}  SLO"
        )
        for fn in p.spec.functions:
            tep = fn.tepid
            tepid = "-" if tep is None else f"{tep.host_memory_gb:g}h/{tep.power_w:g}"
            resume = "-" if tep is None else f"{tep.resume_s:g}"
            slo = fn.slo or p.spec.slo
            slo_text = (
                "none" if slo is None else f"p{slo.percentile:g} <= {slo.start_latency_s:g} s"
            )
            lines.append(
                f"{fn.name:<26} {sum(fn.window_arrivals(p.window_s)):>8,.0f} "
                f"{f'{fn.warm.gpu_memory_gb:g}/{fn.warm.power_w:g}':>12} {tepid:>12} "
                f"{resume:>8} {fn.cold_start.time_s:>7g} {fn.cold_start.energy_j:>8g}  {slo_text}"
            )
        return lines

    def solvers(self) -> list[SolverEntry[KeepAliveProblem, KeepAlivePlan]]:
        return [
            SolverEntry(
                "auto",
                self.kind,
                "certified bound",
                f"milp up to {AUTO_MILP_COLUMNS:,} columns, else lagrangian",
                pick=auto_solver,
            ),
            SolverEntry(
                "milp",
                self.kind,
                "exact",
                "whole-horizon arc-flow MILP with HiGHS; best plan and bound at the limit",
                ("time limit", "gap", "export"),
                run=_runs("milp"),
            ),
            SolverEntry(
                "lagrangian",
                self.kind,
                "certified bound",
                "Lagrangian on node budgets, SLOs and cap: per-function shortest paths, repair",
                ("time limit", "gap"),
                run=_runs("lagrangian"),
            ),
            SolverEntry(
                "rolling",
                self.kind,
                "heuristic",
                "rolling-horizon MILP (15 windows ahead, 5 kept per step); no bound",
                ("time limit",),
                run=_runs("rolling"),
            ),
        ]

    def headline(self, p: KeepAliveProblem) -> str:
        return f"{p.source} (keep-alive, {p.n_functions} functions)"

    def verify(self, p: KeepAliveProblem, plan: KeepAlivePlan) -> list[Violation]:
        from energyopt.families.keepalive.verify import evaluate_keepalive

        return evaluate_keepalive(p.spec, plan).violations

    def cost(self, p: KeepAliveProblem, plan: KeepAlivePlan) -> float:
        from energyopt.families.keepalive.verify import evaluate_keepalive

        ev = evaluate_keepalive(p.spec, plan)
        return ev.throughput_rps if p.maximises_throughput else ev.energy_j

    def sense(self, p: KeepAliveProblem) -> Literal["min", "max"]:
        return "max" if p.maximises_throughput else "min"

    def objective_unit(self, p: KeepAliveProblem) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""
        return "requests/s" if p.maximises_throughput else "J"

    def report(self, p: KeepAliveProblem, result: Result[KeepAlivePlan]) -> list[str]:
        from energyopt.families.keepalive.verify import evaluate_keepalive

        plan = result.plan
        assert plan is not None
        ev = evaluate_keepalive(p.spec, plan)
        lines = [f"keep-alive plan for {p.spec.name} ({p.source})"]
        lines.append(f"{'function':<26} {'warm':>5} {'tepid':>5} {'cold':>5}  late  nodes")
        for s in plan.functions:
            counts = {k: s.states.count(k) for k in ("warm", "tepid", "cold")}
            nodes = ", ".join(dict.fromkeys(s.nodes))
            lines.append(
                f"{s.function:<26} {counts['warm']:>5} {counts['tepid']:>5} {counts['cold']:>5}  "
                f"{ev.late.get(s.function, 0.0):>4g}  {nodes}"
            )
        rate = ev.cold_starts / ev.requests if ev.requests else 0.0
        lines.append(
            f"energy {ev.energy_j / 3.6e6:.4f} kWh ({ev.energy_j:,.0f} J: kept {ev.keep_j:,.0f}, "
            f"service {ev.serve_j:,.0f}, starts {ev.start_j:,.0f}, moves {ev.move_j:,.0f})"
        )
        lines.append(
            f"{ev.requests:,.0f} requests, {ev.cold_starts:,.0f} cold starts ({100 * rate:.2f}%), "
            f"{ev.tepid_starts:,.0f} tepid resumes; GPU memory-time "
            f"{ev.gpu_gb_s / 3600:,.1f} GB h"
        )
        lines.append(
            f"{ev.within_slo:,.1f} requests start within their SLO's limit: throughput "
            f"{ev.throughput_rps:.4f} requests/s"
        )
        unit, digits = ("requests/s", 6) if p.maximises_throughput else ("J", 1)
        bound = "none" if result.bound is None else f"{result.bound:,.{digits}f} {unit}"
        gap = "n/a" if result.gap is None else f"{100 * result.gap:.3f}%"
        lines.append(
            f"objective {result.objective:,.{digits}f} {unit}, bound {bound}, gap {gap}, "
            f"status {result.status}"
        )
        lines.append(f"solver {result.solver} ({result.algorithm}), {result.wall_s:.2f} s")
        return lines

    def program(self, p: KeepAliveProblem) -> Any:
        """The whole-horizon MILP the ``milp`` solver solves (a HiGHS model; for the
        throughput objective its first stage, fewest late requests)."""
        from energyopt.families.keepalive.formulations.milp import build_milp, highs_lp

        return highs_lp(build_milp(p, minimise="late" if p.maximises_throughput else "energy"))
