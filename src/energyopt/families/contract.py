"""The contract every problem family implements, and what the registry stores.

A family is one kind of problem file (``kind:`` at the top of the file): its
loader, its plan type and plan file format, its solvers, its independent verifier
and its report. The command line, the result handling and the tables reach a
family only through this contract (docs/families.md shows how to add one).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, cast

from pydantic import BaseModel

from energyopt.progress import Progress
from energyopt.solvers.result import Result
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse
from energyopt.verify.violation import Violation

Guarantee = Literal["exact", "certified bound", "heuristic"]
"""exact: optimal within the requested gap at termination, or a proof of
infeasibility; certified bound: every plan comes with a valid bound and its gap;
heuristic: a plan, no bound."""

ProblemT = TypeVar("ProblemT")
PlanT = TypeVar("PlanT")


SolverRun = Callable[[ProblemT, float | None, float | None, Progress], Result[PlanT]]
"""What runs one solver: (problem, time limit in s, relative gap, progress) -> its
result; a time limit or gap of None is the solver's own default."""


@dataclass(frozen=True)
class SolverEntry(Generic[ProblemT, PlanT]):
    """One solver of one family, as ``--solver NAME`` selects it: its name, its
    guarantee and what runs it. ``run`` is the callable that solves; an entry
    with ``pick`` instead (``auto``) names, for a problem, the entry that runs.
    An entry with neither is solved by its family's own ``solve``."""

    name: str
    family: str
    guarantee: Guarantee
    description: str
    features: tuple[str, ...] = ()
    available: Callable[[], bool] = field(default=lambda: True, compare=False)
    run: SolverRun[ProblemT, PlanT] | None = field(default=None, compare=False)
    pick: Callable[[ProblemT], str] | None = field(default=None, compare=False)


def find_solver(
    kind: str, entries: Sequence[SolverEntry[ProblemT, PlanT]], name: str | None
) -> SolverEntry[ProblemT, PlanT]:
    """The entry called ``name`` (None: the default, the first listed); SpecError
    naming ``--solver`` and listing the family's solvers otherwise."""
    if name is None:
        return entries[0]
    for entry in entries:
        if entry.name == name:
            return entry
    names = ", ".join(e.name for e in entries)
    raise SpecError([f"--solver: no solver {name!r} for {kind} problems; available: {names}"])


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
    instances: tuple[str, ...]
    """The family's bundled problem files, as globs relative to the repository root
    (tests/test_family_contract.py runs every family's contract on them)."""

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

    def solvers(self) -> list[SolverEntry[ProblemT, PlanT]]:
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


def given(value: float | None, default: float) -> float:
    """``value``, or ``default`` where it is None (a time limit in s, a gap)."""
    return default if value is None else value


ProblemC = TypeVar("ProblemC", contravariant=True)


class LimitedSolver(Protocol[ProblemC, PlanT]):
    """A solver function that takes a time limit (s) and a relative gap."""

    def __call__(
        self, problem: ProblemC, /, *, time_limit_s: float, rel_gap: float, progress: Progress
    ) -> Result[PlanT]: ...


def limited(
    solvers: Callable[[], Mapping[str, LimitedSolver[ProblemT, PlanT]]],
    name: str,
    time_limit_s: float,
    rel_gap: float,
    check: Callable[[ProblemT, str], None] | None = None,
) -> SolverRun[ProblemT, PlanT]:
    """What runs the solver function ``solvers()[name]`` (``solvers`` imports the
    solver modules when a solve starts), with ``time_limit_s`` s and ``rel_gap``
    where the call gives None, after ``check(problem, name)`` (which raises
    SpecError where that solver cannot take the problem)."""

    def run(
        problem: ProblemT, limit_s: float | None, gap: float | None, progress: Progress
    ) -> Result[PlanT]:
        solve = solvers()[name]
        if check is not None:
            check(problem, name)
        return solve(
            problem,
            time_limit_s=limit_s or time_limit_s,
            rel_gap=given(gap, rel_gap),
            progress=progress,
        )

    return run


class TableFamily(ABC, Generic[ProblemT, PlanT]):
    """The part of a family that is the same for every family: its solvers are a
    table of ``SolverEntry`` (``solvers()``), ``solve`` looks the name up there and
    runs the entry (``auto``: the entry its ``pick`` names for the problem), and
    its plan file is its plan model stamped with the result's figures.

    A subclass gives ``kind``, ``title``, the two models, ``instances``,
    ``solvers()`` (each entry with ``run`` or ``pick``), ``headline`` and the
    problem-specific members of ``Family``; it overrides what differs."""

    kind: str
    title: str
    problem_model: type[BaseModel]
    plan_model: type[BaseModel]
    instances: tuple[str, ...] = ()
    names_result_by_request: bool = True
    """True: a result's ``solver`` is the name asked for (``auto`` stays ``auto``);
    False: the one its solver gave it (the entry that ran, or a preset's name)."""
    plan_states_unit: bool = False
    """True: the plan file has an ``objective_unit`` field, set to ``objective_unit``."""

    @abstractmethod
    def solvers(self) -> list[SolverEntry[ProblemT, PlanT]]:
        """Every solver of the family, the default first."""

    def entry(self, name: str | None) -> SolverEntry[ProblemT, PlanT]:
        """The solver ``--solver NAME`` selects (None: the default); SpecError naming
        ``--solver`` and the family's solvers when it has none of that name."""
        return find_solver(self.kind, self.solvers(), name)

    @abstractmethod
    def headline(self, problem: ProblemT) -> str:
        """The problem in a few words for the progress line (its file first)."""

    @abstractmethod
    def load(self, path: str, catalogs: Sequence[str]) -> ProblemT:
        """Read, validate and bind a file to its catalog; SpecError naming file and field."""

    def load_for_plan(self, path: str, catalogs: Sequence[str]) -> ProblemT:
        """The problem a plan file is checked against: the one ``load`` reads."""
        return self.load(path, catalogs)

    def solve(
        self,
        problem: ProblemT,
        solver: str,
        *,
        time_limit_s: float | None,
        rel_gap: float | None,
        progress: Progress,
    ) -> Result[PlanT]:
        """Run the entry called ``solver`` (``time_limit_s`` in s and ``rel_gap``: None
        for the solver's default); SpecError when the family has no such solver."""
        asked = self.entry(solver)
        chosen = asked if asked.pick is None else self.entry(asked.pick(problem))
        if chosen.run is None:
            raise TypeError(f"{self.kind} solver {chosen.name!r} has nothing to run")
        progress(f"solving {self.headline(problem)} with {chosen.name}")
        result = chosen.run(problem, time_limit_s, rel_gap, progress)
        if chosen is not asked:
            result.algorithm = result.algorithm or chosen.name
        if self.names_result_by_request:
            result.solver = asked.name
        return result

    def sense(self, problem: ProblemT) -> Literal["min", "max"]:
        """Whether the objective is minimised (the default) or maximised."""
        return "min"

    @abstractmethod
    def objective_unit(self, problem: ProblemT) -> str:
        """The unit of the objective ``cost`` and ``solve`` report."""

    def to_file(self, problem: ProblemT, result: Result[PlanT]) -> BaseModel:
        """The plan (a plan-file model) stamped with the result's figures."""
        assert isinstance(result.plan, BaseModel)
        plan = stamped(result.plan, result)
        if self.plan_states_unit:
            plan = plan.model_copy(update={"objective_unit": self.objective_unit(problem)})
        return plan

    def from_file(self, problem: ProblemT, data: Any, source: str) -> tuple[PlanT, Stated]:
        """A plan file read as the plan model, and the figures it states."""
        plan: Any = parse(self.plan_model, data, source)
        return cast(PlanT, plan), Stated(plan.objective, plan.bound, plan.gap)

    def exports(self, problem: ProblemT) -> Mapping[str, Callable[[str], None]]:
        """Files other than the program that ``export`` writes: none by default."""
        return {}
