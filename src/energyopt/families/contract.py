"""The contract every problem family implements, and what the registry stores.

A family is one kind of problem file (``kind:`` at the top of the file): its
loader, its plan type and plan file format, its solvers, its independent verifier
and its report. The command line, the result handling and the tables reach a
family only through this contract (docs/families.md shows how to add one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel

from energyopt.progress import Progress
from energyopt.solvers.result import Result
from energyopt.verify.violation import Violation

Guarantee = Literal["exact", "certified bound", "heuristic"]
"""exact: optimal within the requested gap at termination, or a proof of
infeasibility; certified bound: every plan comes with a valid bound and its gap;
heuristic: a plan, no bound."""

ProblemT = TypeVar("ProblemT")
PlanT = TypeVar("PlanT")


@dataclass(frozen=True)
class SolverEntry:
    """One solver of one family, as ``--solver NAME`` selects it."""

    name: str
    family: str
    guarantee: Guarantee
    description: str
    features: tuple[str, ...] = ()
    available: Callable[[], bool] = field(default=lambda: True, compare=False)


class NotExportable(Exception):
    """The family (or this instance) has no single mathematical program to export."""


class Family(Protocol[ProblemT, PlanT]):
    """A problem family. Objective values are in ``unit`` and minimised when
    ``sense`` is min, maximised when max."""

    kind: str
    title: str
    problem_model: type[BaseModel]
    """The problem file's schema (``energyopt schema KIND``)."""
    plan_model: type[BaseModel]
    """The plan file's schema (``energyopt schema KIND-plan``)."""

    def load(self, path: str, catalogs: Sequence[str]) -> ProblemT:
        """Read, validate and bind a file to its catalog; SpecError naming file and field."""
        ...

    def load_for_plan(self, path: str, catalogs: Sequence[str]) -> ProblemT:
        """The problem a plan file is checked against (may accept what ``load`` refuses
        because a plan's check reports it, e.g. serving's unreachable SLOs)."""
        ...

    def summary(self, problem: ProblemT) -> str:
        """One line for ``validate``."""
        ...

    def show(self, problem: ProblemT) -> list[str]:
        """The problem as ``show`` prints it."""
        ...

    def solvers(self) -> list[SolverEntry]:
        """Every solver of the family, the default first."""
        ...

    def solve(
        self,
        problem: ProblemT,
        solver: str,
        *,
        time_limit_s: float | None,
        rel_gap: float | None,
        progress: Progress,
    ) -> Result[PlanT]:
        """Run one of ``solvers()``; the result's objective is the plan's own cost."""
        ...

    def verify(self, problem: ProblemT, plan: PlanT) -> list[Violation]:
        """Every constraint ``plan`` breaks, by the family's independent checker."""
        ...

    def cost(self, problem: ProblemT, plan: PlanT) -> float:
        """The objective of ``plan``, recomputed by the verifier's arithmetic."""
        ...

    def sense(self, problem: ProblemT) -> Literal["min", "max"]:
        """Whether the problem's objective is minimised or maximised."""
        ...

    def objective_unit(self, problem: ProblemT) -> str:
        """The unit of ``cost`` and of a result's objective and bound (e.g. ``W``, ``J``)."""
        ...

    def report(self, problem: ProblemT, result: Result[PlanT]) -> list[str]:
        """The plan and its figures as ``solve`` prints them."""
        ...

    def to_file(self, problem: ProblemT, result: Result[PlanT]) -> BaseModel:
        """The plan file of a result (objective, bound, gap written once, from it)."""
        ...

    def from_file(self, problem: ProblemT, data: Any, source: str) -> tuple[PlanT, Stated]:
        """A plan read from file data, and the figures the file states."""
        ...

    def program(self, problem: ProblemT) -> Any:
        """The family's mathematical program as a Pyomo model; NotExportable if none."""
        ...

    def exports(self, problem: ProblemT) -> Mapping[str, Callable[[str], None]]:
        """Files other than the program that ``energyopt export`` writes, by file
        suffix: each writes ``problem``'s file of that kind to the path it is given."""
        ...


@dataclass(frozen=True)
class Stated:
    """Objective, bound and gap a plan file states (None where it states none)."""

    objective: float | None = None
    bound: float | None = None
    gap: float | None = None


PlanFileT = TypeVar("PlanFileT", bound=BaseModel)


def stamped(plan: PlanFileT, result: Result[Any]) -> PlanFileT:
    """``plan`` (a file model with objective, bound, gap, status and solver fields)
    carrying the figures of ``result``, written once from it."""
    return plan.model_copy(
        update={
            "objective": result.objective,
            "bound": result.bound,
            "gap": result.gap,
            "status": str(result.status),
            "solver": result.solver,
        }
    )
