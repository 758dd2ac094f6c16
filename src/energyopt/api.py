"""The public Python API: one entry point per verb, the same for every kind of problem.

``load`` reads a problem file (or the same document as a dict) of any kind,
``solve`` runs one of the family's solvers and certifies the result as
``energyopt solve`` does, ``verify`` runs the family's independent checker,
``compile`` and ``evaluate`` drive the table compiler and the simulator. Everything
goes through the family registry (``energyopt.families``), as every CLI verb does.

Errors: ``InputError`` (a ``ValueError``) for bad input, naming the field and the
file or ``<dict>``; ``MissingFileError`` (a ``FileNotFoundError``) for a file that
does not exist; both derive from ``EnergyoptError`` (``energyopt.spec.errors``).
docs/api.md shows an example per kind.
"""

from __future__ import annotations

import functools
import math
import os
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import ValidationError

from energyopt.families import AnyFamily, Stated, certify, check_stated, families, solver_entry
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import Result as SolverResult
from energyopt.solvers.result import Status
from energyopt.spec.errors import (
    EnergyoptError,
    InputError,
    MissingFileError,
    NvmlError,
    SolverError,
    SpecError,
)
from energyopt.spec.io import in_memory, read_data, validation_problems
from energyopt.verify.violation import Violation

if TYPE_CHECKING:
    from energyopt.families.serving.loop import EvaluationResult

__all__ = [
    "DICT_SOURCE",
    "EnergyoptError",
    "InputError",
    "MissingFileError",
    "NvmlError",
    "Result",
    "SolverError",
    "SpecError",
    "Status",
    "Verification",
    "Violation",
    "compile",
    "evaluate",
    "kinds",
    "load",
    "report",
    "solve",
    "verify",
]

PlanT = TypeVar("PlanT")

PathLike = str | os.PathLike[str]
"""A file name: a str or a ``pathlib.Path``."""

DICT_SOURCE = "<dict>"
"""How errors name a document given as a dict instead of a file."""

CERTIFY_GAP = 1e-4
"""The relative gap at which a certified result counts as optimal when ``solve`` is
given no ``gap`` (as ``energyopt solve`` without ``--gap``)."""

TABLE_KINDS = ("plans", "oppoints")
"""The compile spec kinds ``compile`` builds tables of (over a serving instance)."""

OTHER_TABLES = {
    "collective": (
        "the runtime policy table and the NCCL tuner config come from "
        "energyopt.families.collective.tables "
        "(python -m energyopt.families.collective.tables FILE --policy P.eot)"
    ),
}
"""Kinds whose tables another compiler builds, and where it is."""


@dataclass
class Result(SolverResult[PlanT]):
    """The certified outcome of ``solve``, the same for every kind.

    The fields of ``energyopt.solvers.result.Result``: ``status`` (``Status``:
    optimal, feasible, infeasible, no_solution), ``plan`` (the family's plan object,
    None when there is none), ``objective`` (the plan's own cost in ``unit``,
    recomputed by the family's verifier), ``bound`` (a valid bound on the optimum:
    lower for ``sense`` min, upper for max; None when the solver has none), ``gap``
    (relative, a fraction), ``wall_s`` (seconds), ``solver``, ``log`` and
    ``diagnosis`` (text lines), ``termination``, ``formulation``, ``algorithm``,
    ``fallback`` and ``certified``; plus the problem's ``kind`` and the ``unit`` of its
    objective (``W``, ``J``, ``s mean JCT``, ...)."""

    kind: str = ""
    unit: str = ""

    @classmethod
    def of(cls, result: SolverResult[PlanT], kind: str, unit: str) -> Result[PlanT]:
        """``result`` (a solver's result) with the problem's ``kind`` and objective ``unit``."""
        values = {f.name: getattr(result, f.name) for f in fields(result)}
        return cls(**values, kind=kind, unit=unit)


@dataclass(frozen=True)
class Verification:
    """What the family's independent verifier found in a plan.

    ``violations``: every constraint the plan breaks, and every objective, bound or
    gap it states that is not its own (a plan file's, or a ``Result``'s); empty when
    the plan is valid. ``objective``: the plan's own cost in ``unit``, recomputed
    from the plan, when it breaks no constraint (None otherwise)."""

    kind: str
    violations: tuple[Violation, ...]
    objective: float | None
    unit: str
    sense: Literal["min", "max"]

    @property
    def ok(self) -> bool:
        """True when the plan breaks nothing and states no figure that is not its own."""
        return not self.violations

    def __str__(self) -> str:
        if self.ok:
            return f"feasible; objective {self.objective:,.6g} {self.unit}, recomputed"
        lines = [f"{len(self.violations)} violation(s):"]
        lines += [f"  - {v}" for v in self.violations]
        return "\n".join(lines)


def kinds() -> list[str]:
    """The kind of every problem family (the ``kind:`` of its files), serving first."""
    return [fam.kind for fam in families()]


def load(
    source: PathLike | Mapping[str, Any],
    *,
    kind: str | None = None,
    catalogs: Sequence[PathLike] = (),
) -> Any:
    """The problem object of a problem file or document, of any kind.

    ``source``: a file name (YAML, JSON or TOML by suffix, read as ``energyopt
    solve`` reads it) or the same document already parsed, as a mapping (paths it
    names are relative to the current directory). ``kind``: the family (``serving``,
    ``taskgraph``, ``colocation``, ``keepalive``, ``moe-edge`` or ``moe_edge``,
    ``serverless``, ``collective``); None reads it from the document's ``kind:`` as
    the CLI does (serving when absent). ``catalogs``: extra catalog files
    (``--catalog``).

    Raises ``MissingFileError`` for a file (or catalog) that does not exist and
    ``InputError`` for anything wrong in it, naming the field and the file or
    ``<dict>``."""
    cats = [os.fspath(c) for c in catalogs]
    for cat in cats:
        _require_file(cat)
    if isinstance(source, Mapping):
        with in_memory(DICT_SOURCE, dict(source)):
            return _load(DICT_SOURCE, kind, cats)
    if not isinstance(source, str | os.PathLike):
        raise InputError([f"source: expected a file name or a dict, got {type(source).__name__}"])
    path = str(Path(os.fspath(source)))  # as the loaders name it: ./x.yaml is x.yaml
    _require_file(path)
    return _load(path, kind, cats)


def _load(name: str, kind: str | None, catalogs: list[str]) -> Any:
    """``load`` of the file (or in-memory document) ``name``."""
    from energyopt.cli.problems import problem_family

    try:
        if kind is None:
            fam = problem_family(name, catalogs)
            return fam.load(name, catalogs)
        wanted = _kind_name(kind)
        data = read_data(name)
        stated = data.get("kind")
        if stated is not None and stated != wanted:
            raise InputError(
                [f"{name}: kind: the document is {stated!r}; load(kind={kind!r}) wants {wanted!r}"]
            )
        if stated is None and wanted != "serving":  # serving is the default of a file
            data = {"kind": wanted, **data}
        with in_memory(name, data):
            fam = problem_family(name, catalogs, wanted)
            return fam.load(name, catalogs)
    except ValidationError as exc:  # a model validated outside ``spec.io.parse``
        raise InputError(validation_problems(exc, name)) from None


def _kind_name(kind: str) -> str:
    """``kind`` as the documents spell it (``moe_edge`` is ``moe-edge``)."""
    names = kinds()
    if kind in names:
        return kind
    dashed = kind.replace("_", "-")
    return dashed if dashed in names else kind


def _require_file(path: str) -> None:
    """MissingFileError when nothing is at ``path`` (a dangling symlink included)."""
    if not os.path.exists(path):
        raise MissingFileError(path)


@functools.cache
def _declared_type(family_class: type, method: str, parameter: str) -> type | None:
    """The class a family's ``method`` declares for ``parameter`` (``return``: what it
    returns), None where it declares no class."""
    hint = typing.get_type_hints(getattr(family_class, method)).get(parameter)
    return hint if isinstance(hint, type) else None


def family_of(problem: Any) -> AnyFamily:
    """The family whose ``load`` returns ``problem``'s type; InputError otherwise."""
    found = families()
    for fam in found:
        cls = _declared_type(type(fam), "load", "return")
        if cls is not None and isinstance(problem, cls):
            return fam
    raise InputError(
        [
            f"problem: a {type(problem).__name__} is not a problem of any kind "
            f"({', '.join(f.kind for f in found)}); energyopt.load reads one"
        ]
    )


def solve(
    problem: Any,
    solver: str | None = None,
    time_limit: float | None = None,
    progress: Progress | None = None,
    *,
    gap: float | None = None,
    scheduler: str | None = None,
) -> Result[Any]:
    """The best plan of ``problem`` (from ``load``), certified as ``energyopt solve``
    certifies it: the plan has passed the family's independent verifier and the
    objective is the plan's own cost, recomputed from it (status and gap follow).

    ``solver``: a name from ``energyopt solvers`` (serving: also a preset TOML file);
    None is the family's default. ``time_limit``: seconds above 0 (None: the
    solver's default). ``progress``: called with one line of text per step (None:
    silent). ``gap``: relative gap to stop at, in [0, 1) (None: the solver's
    default). ``scheduler`` (serving only): column generation prices on this Dask
    cluster, an address (``tcp://host:8786``) or ``local:N`` for N local worker
    processes, as ``energyopt solve --scheduler`` (docs/formulations/serving.md,
    "Scaling"); None: in this process.

    A result without a plan (status ``infeasible``, proven, or ``no_solution``,
    nothing proven) is returned with its ``diagnosis``, not raised. Raises
    ``InputError`` for an unknown solver or a bad limit, ``SolverError`` when a
    solver fails (a plan that fails verification is a bug)."""
    fam = family_of(problem)
    if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
        raise InputError([f"time_limit: give a finite number of seconds above 0, got {time_limit}"])
    if gap is not None and not 0 <= gap < 1:
        raise InputError([f"gap: give a relative gap from 0 up to (not including) 1, got {gap}"])
    try:
        entry = solver_entry(fam, solver)
    except SpecError as exc:
        raise InputError([p.replace("--solver:", "solver:", 1) for p in exc.problems]) from None
    if scheduler is not None and fam.kind != "serving":
        raise InputError([f"scheduler: a {fam.kind} problem; the scheduler applies to serving"])
    from energyopt.families.serving.pricing_context import pricing_context

    say = progress if progress is not None else quiet
    try:
        with pricing_context(scheduler):
            raw = fam.solve(
                problem, entry.name, time_limit_s=time_limit, rel_gap=gap, progress=say
            )
    except SpecError as exc:
        if scheduler is None:
            raise
        raise InputError([p.replace("--scheduler", "scheduler", 1) for p in exc.problems]) from None
    certify(fam, problem, raw, gap if gap is not None else CERTIFY_GAP, say)
    return Result.of(raw, fam.kind, fam.objective_unit(problem))


def verify(problem: Any, plan: Any) -> Verification:
    """The family's independent verifier on ``plan`` for ``problem`` (from ``load``).

    ``plan``: the plan object of a ``Result`` or the ``Result`` itself (its stated
    objective, bound and gap are checked too), or a plan file (a file name, as
    ``solve -o`` writes it, or that document as a dict; the figures it states are
    checked as ``energyopt verify`` checks them)."""
    fam = family_of(problem)
    stated: Stated | None = None
    if isinstance(plan, SolverResult):
        if plan.plan is None:
            raise InputError([f"plan: the result has no plan (status {plan.status})"])
        stated = Stated(plan.objective, plan.bound, plan.gap)
        plan = plan.plan
    elif isinstance(plan, Mapping):
        plan, stated = _plan_file(fam, problem, dict(plan), DICT_SOURCE)
    elif isinstance(plan, str | os.PathLike):
        path = os.fspath(plan)
        _require_file(path)
        plan, stated = _plan_file(fam, problem, read_data(path), path)
    else:
        expected = _declared_type(type(fam), "verify", "plan")
        if expected is not None and not isinstance(plan, expected):
            raise InputError(
                [
                    f"plan: a {type(plan).__name__} is not a {fam.kind} plan "
                    f"(a {expected.__name__}, a Result or a plan file)"
                ]
            )
    violations = list(fam.verify(problem, plan))
    cost = None
    if not violations:
        cost = fam.cost(problem, plan)
        if stated is not None:
            violations = check_stated(fam, problem, plan, stated, fam.sense(problem), cost)
    return Verification(
        fam.kind, tuple(violations), cost, fam.objective_unit(problem), fam.sense(problem)
    )


def _plan_file(fam: AnyFamily, problem: Any, data: Any, source: str) -> tuple[Any, Stated]:
    try:
        plan, stated = fam.from_file(problem, data, source)
    except ValidationError as exc:
        raise InputError(validation_problems(exc, source, data)) from None
    return plan, stated


def report(problem: Any, result: SolverResult[Any]) -> str:
    """The plan and its figures as ``energyopt solve`` prints them."""
    if result.plan is None:
        raise InputError([f"result: no plan to report (status {result.status})"])
    return "\n".join(family_of(problem).report(problem, result))


def _document_kind(path: str, verb: str, wanted: Sequence[str]) -> str:
    """The ``kind:`` of the spec file ``path``; InputError naming the kind when it is
    not one of ``wanted`` (what ``energyopt.compile`` or ``evaluate``, ``verb``, takes)."""
    from energyopt.spec.io import data_kind

    _require_file(path)
    kind = data_kind(read_data(path), path)
    if kind in wanted:
        return kind
    what = " or ".join(f"kind: {k}" for k in wanted)
    spec = "compile spec" if verb == "compile" else "evaluation spec"
    if kind == "serving":
        why = f"this serving instance is the base a {spec} names"
    elif kind in OTHER_TABLES and verb == "compile":
        why = f"{kind} problems: {OTHER_TABLES[kind]}"
    elif kind in kinds():
        has = "lookup tables" if verb == "compile" else "evaluation specs"
        why = f"{kind} problems have no {has}"
    else:
        why = f"not kind: {kind}"
    raise InputError([f"{path}: kind: energyopt.{verb} takes a {spec} ({what}); {why}"])


def compile(  # the table compiler's verb, as ``energyopt compile``
    spec: PathLike,
    output: PathLike,
    *,
    workers: int = 1,
    scheduler: str | None = None,
    progress: Progress | None = None,
) -> str:
    """Compile the lookup table a compile spec (``kind: plans`` or ``oppoints``, over
    a serving instance) describes into the file ``output``; returns the table's kind.

    ``workers``: local solver processes for plan cells; ``scheduler``: the address of
    a Dask distributed scheduler to solve cells on instead. Resumable as ``energyopt
    compile`` is. InputError naming the kind for any other file (the problem
    families other than serving have no tables built here)."""
    from energyopt.families.serving.tables import compile_table

    path = os.fspath(spec)
    if not os.fspath(output).strip():
        raise InputError(["output: empty file name; give the table file to write"])
    if workers < 1:
        raise InputError([f"workers: give at least 1 worker process, got {workers}"])
    _document_kind(path, "compile", TABLE_KINDS)
    table = Path(os.fspath(output))
    return compile_table(path, table, workers=workers, say=progress or quiet, scheduler=scheduler)


def evaluate(
    spec: PathLike,
    *,
    planners: Sequence[str] | None = None,
    duration_s: float | None = None,
    yardstick: bool = False,
    catalogs: Sequence[PathLike] = (),
    output_dir: PathLike | None = None,
    plots: bool = False,
    progress: Progress | None = None,
) -> EvaluationResult:
    """Replay an evaluation spec's load (``kind: evaluate``, over a serving instance)
    against its planners in the simulator, as ``energyopt evaluate`` does; returns
    every planner's run (``energyopt.families.serving.loop.EvaluationResult``:
    ``runs``, each with its energy in J and SLO attainment; ``skipped``; ``failed``).

    ``planners``: run only these; ``duration_s``: override the spec's duration
    (seconds above 0); ``yardstick``: add the clairvoyant run; ``output_dir``: also
    write the CSV files there (and the plots with ``plots``; nothing is written
    without ``output_dir``). InputError naming the kind for any other file."""
    from energyopt.cli.documents import validate_evaluation
    from energyopt.families.serving.loop import CLAIRVOYANT, PlanningError, run_clairvoyant
    from energyopt.families.serving.loop import evaluate as run_evaluation
    from energyopt.spec.evaluation import load_evaluation

    path = os.fspath(spec)
    cats = [os.fspath(c) for c in catalogs]
    for cat in cats:
        _require_file(cat)
    _document_kind(path, "evaluate", ("evaluate",))
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise InputError([f"duration_s: give a finite number of seconds above 0, got {duration_s}"])
    validate_evaluation(path, cats)  # refuse what validate refuses, before any work
    ev = load_evaluation(path)
    if duration_s is not None:
        ev = ev.model_copy(update={"duration_s": duration_s})
    if yardstick and any(p.name == CLAIRVOYANT.name for p in ev.planners):
        raise InputError(
            [f"{path}: planners: a planner is named {CLAIRVOYANT.name}, the yardstick's name"]
        )
    say = progress or quiet
    only = list(planners) if planners is not None else None
    res = run_evaluation(ev, path, only=only, say=say, catalogs=cats)
    if yardstick:
        try:
            res.runs.append(run_clairvoyant(res, say=say))
        except PlanningError as exc:
            res.failed.append(str(exc))
    if output_dir is not None:
        from energyopt.families.serving.loop_report import write_csvs
        from energyopt.families.serving.plots import write_plots

        write_csvs(res, Path(output_dir))
        if plots:
            write_plots(res, Path(output_dir))
    return res
