"""Serving (``kind: serving``, the default): LLM workloads on a GPU fleet, minimum
power (or another objective of ``options.objective``) under TTFT/TBT SLOs and caps."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from energyopt.catalog.problem import Problem, load_problem
from energyopt.families.contract import SolverEntry, SolverRun, TableFamily
from energyopt.progress import Progress
from energyopt.solvers.result import Result
from energyopt.spec.errors import SpecError
from energyopt.spec.instance import Instance
from energyopt.spec.plan import Plan
from energyopt.verify.violation import Violation

DEFAULT_SOLVER = "auto"
"""The preset ``solve`` runs without ``--solver``: the method the instance's shape calls
for (``solvers/auto.toml``; ``benchmarks/serving_auto.py`` compares it with every
preset)."""
EXACT_FORMULATIONS = ("auto", "pattern", "per_gpu", "plain")
SERVING_UNITS = {
    "power": "W",
    "power_migration": "W (power + migration penalty)",
    "gpus_on": "GPUs on + power / fleet TDP",
    "edp": "W (delay-weighted)",
}
"""The unit of each serving objective (families/serving/formulations/costs.py)."""


def load_instance(
    path: str | Path, catalogs: Sequence[str] = (), check_slos: bool = True
) -> Problem:
    """The problem of a serving instance file, checked as every command needs it:
    schema, catalog names, catalog-dependent ranges and (``check_slos``) SLOs that
    some GPU can meet. SpecError naming the file and the field otherwise."""
    from energyopt.perf.reachability import unreachable_slos

    problem = load_problem(path, catalogs)
    if check_slos:
        problems = unreachable_slos(problem)
        if problems:
            raise SpecError([f"{path}: {p}" for p in problems])
    return problem


def preset_entry(name: str) -> SolverEntry[Problem, Plan]:
    """The solver entry of the preset called ``name`` (or in the TOML file of that
    path): exact where its formulation is one of ``EXACT_FORMULATIONS``, a
    certified bound otherwise."""
    from energyopt.solvers.presets import load_preset

    p = load_preset(name)
    exact = p.formulation in EXACT_FORMULATIONS
    guarantee: Literal["exact", "certified bound"] = "exact" if exact else "certified bound"
    features = (f"backend {p.backend}", f"formulation {p.formulation}")
    return SolverEntry(name, "serving", guarantee, p.description, features, run=_runs(name))


def _runs(preset: str) -> SolverRun[Problem, Plan]:
    """What runs the preset ``preset`` (a name or a TOML file's path), read when it
    runs; a time limit or gap of None is the preset's."""

    def run(
        problem: Problem, time_limit_s: float | None, rel_gap: float | None, progress: Progress
    ) -> Result[Plan]:
        from energyopt.families.serving.solvers.solve import solve
        from energyopt.solvers.presets import load_preset

        return solve(
            problem,
            load_preset(preset),
            time_limit_s=time_limit_s,
            rel_gap=rel_gap,
            progress=progress,
        )

    return run


class ServingFamily(TableFamily[Problem, Plan]):
    """Serving instances; solvers are the presets in ``solvers/*.toml``."""

    kind = "serving"
    title = "LLM serving: placement, SM shares and clocks under TTFT/TBT SLOs"
    problem_model: type[BaseModel] = Instance
    plan_model: type[BaseModel] = Plan
    instances = (
        "instances/quickstart.yaml",
        "instances/fleet-*.yaml",
        "instances/disaggregated.yaml",
        "instances/hetero-migration.yaml",
        "instances/mig-a100.yaml",
        "instances/tensor-parallel.yaml",
    )
    """Every bundled serving file but ``infeasible.yaml`` (the diagnosis example)."""
    names_result_by_request = False

    def load(self, path: str, catalogs: Sequence[str]) -> Problem:
        return load_instance(path, catalogs)

    def load_for_plan(self, path: str, catalogs: Sequence[str]) -> Problem:
        """The instance a plan is checked against: unreachable SLOs are the plan's
        violations to report, not a reason to refuse the instance."""
        return load_instance(path, catalogs, check_slos=False)

    def summary(self, problem: Problem) -> str:
        inst = problem.instance
        return f"{len(problem.gpus)} GPUs, {len(inst.workloads)} workloads"

    def show(self, problem: Problem) -> list[str]:
        from energyopt.families.serving.report import format_problem
        from energyopt.perf.oppoints import build_op_table

        return format_problem(problem, build_op_table(problem))

    def solvers(self) -> list[SolverEntry[Problem, Plan]]:
        """One entry per preset in ``solvers/*.toml``, the default (``auto``) first."""
        from energyopt.solvers.presets import available_presets

        names = sorted(available_presets(), key=lambda n: (n != DEFAULT_SOLVER, n))
        return [preset_entry(name) for name in names]

    def entry(self, name: str | None) -> SolverEntry[Problem, Plan]:
        """A preset by name, or a preset file's path; SpecError listing the presets
        where ``name`` is neither."""
        from energyopt.solvers.presets import available_presets

        if name is None or name in available_presets():
            return super().entry(name)
        return preset_entry(name)

    def headline(self, problem: Problem) -> str:
        return str(problem.source)

    def verify(self, problem: Problem, plan: Plan) -> list[Violation]:
        from energyopt.families.serving.verify import evaluate_plan
        from energyopt.spec.checks import plan_problems

        mode = problem.instance.options.sharing.mode
        structural = plan_problems(plan, problem.catalog.gpus, "", mode)
        if structural:
            return [Violation("plan", "", line.removeprefix(": ")) for line in structural]
        return evaluate_plan(problem, plan).violations

    def cost(self, problem: Problem, plan: Plan) -> float:
        from energyopt.families.serving.verify import evaluate_plan

        return evaluate_plan(problem, plan).objective

    def objective_unit(self, problem: Problem) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""
        return SERVING_UNITS[problem.instance.options.objective]

    def report(self, problem: Problem, result: Result[Plan]) -> list[str]:
        from energyopt.families.serving.report import format_plan, format_totals
        from energyopt.families.serving.verify import evaluate_plan

        assert result.plan is not None
        ev = evaluate_plan(problem, result.plan)
        lines = [f"plan for {problem.instance.name} ({problem.source})"]
        lines += format_plan(problem, result.plan, ev)
        lines += format_totals(problem, result.plan, ev, result)
        return lines

    def program(self, problem: Problem) -> Any:
        from energyopt.families.serving.formulations.per_gpu import build_per_gpu
        from energyopt.perf.oppoints import build_op_table

        return build_per_gpu(problem, build_op_table(problem)).model
