"""The problem-family registry: the one place that lists the families.

Every command reaches a family through ``family_of_file`` / ``family`` and the
``Family`` contract (``families/contract.py``); ``certify`` and ``check_stated``
hold every family's results to the same rule: the reported objective is the
plan's own cost, recomputed by the family's verifier. docs/families.md shows how
to add a family.

The built-in families are listed by name (``BUILTIN``) and each is imported on the
first use of its kind: importing this module imports no family, formulation or
solver, so ``energyopt --help`` and a command on one kind stay quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from energyopt.spec.errors import SpecError

if TYPE_CHECKING:
    from energyopt.families.contract import Family, NotExportable, SolverEntry, Stated
    from energyopt.families.serving.solvers.solve import PlanVerificationError
    from energyopt.solvers.result import Result
    from energyopt.verify.violation import Violation

    AnyFamily = Family[Any, Any]

BUILTIN: dict[str, str] = {
    "serving": "energyopt.families.serving.family:ServingFamily",
    "taskgraph": "energyopt.families.taskgraph.family:TaskGraphFamily",
    "colocation": "energyopt.families.colocation.family:ColocationFamily",
    "keepalive": "energyopt.families.keepalive.family:KeepAliveFamily",
    "moe-edge": "energyopt.families.moe_edge.family:MoeEdgeFamily",
    "serverless": "energyopt.families.serverless.family:ServerlessFamily",
    "collective": "energyopt.families.collective.family:CollectiveFamily",
}
"""The families that ship: ``kind`` -> ``module:class``. A family's module (and the
formulations and solvers it imports) is imported on the first use of its kind, so a
command on one kind, or one that needs no family, does not import the others."""

_REGISTRY: dict[str, AnyFamily] = {}
"""The families in use: the built-in ones imported so far and every registered one."""


def register(family: AnyFamily) -> None:
    """Make ``family`` reachable by its ``kind`` from every command."""
    if family.kind in _REGISTRY or family.kind in BUILTIN:
        raise ValueError(f"problem family {family.kind!r} is registered twice")
    _REGISTRY[family.kind] = family


def _load(kind: str) -> AnyFamily:
    """The family of a known ``kind``, its module imported on first use."""
    found = _REGISTRY.get(kind)
    if found is not None:
        return found
    module, _, name = BUILTIN[kind].partition(":")
    made: AnyFamily = getattr(importlib.import_module(module), name)()
    return _REGISTRY.setdefault(kind, made)  # one instance per kind, even under threads


def kinds() -> list[str]:
    """Every family's ``kind``, in the order of ``families()``; imports no family."""
    return [*BUILTIN, *(k for k in _REGISTRY if k not in BUILTIN)]


def families() -> list[AnyFamily]:
    """Every registered family, serving first (imports every built-in family)."""
    return [_load(kind) for kind in kinds()]


def family(kind: str) -> AnyFamily:
    """The family of ``kind``; SpecError listing the known kinds otherwise."""
    if kind not in BUILTIN and kind not in _REGISTRY:
        raise SpecError([f"kind: unknown problem family {kind!r}; known: {', '.join(kinds())}"])
    return _load(kind)


def solver_entry(fam: AnyFamily, name: str | None) -> SolverEntry[Any, Any]:
    """The family's solver called ``name`` (None: its default, the first listed);
    SpecError naming ``--solver`` and listing the family's solvers otherwise. A
    family built on ``TableFamily`` looks it up itself (``entry``)."""
    from energyopt.families.contract import TableFamily, find_solver

    if isinstance(fam, TableFamily):
        return fam.entry(name)
    return find_solver(fam.kind, fam.solvers(), name)


def certify(fam: AnyFamily, problem: Any, result: Result[Any], rel_gap: float, note: Any) -> None:
    """Hold ``result`` to the contract (nothing to do once its solver has): the plan
    passes the family's verifier and the reported figures are its own (``settle``)."""
    from energyopt.solvers.result import settle

    if result.plan is None or result.certified:
        return
    violations = fam.verify(problem, result.plan)
    if violations:
        from energyopt.families.serving.solvers.solve import PlanVerificationError

        raise PlanVerificationError(
            f"{result.solver}: plan fails verification:\n" + "\n".join(str(v) for v in violations)
        )
    settle(result, fam.cost(problem, result.plan), rel_gap, note)


def check_stated(
    fam: AnyFamily,
    problem: Any,
    plan: Any,
    stated: Stated,
    sense: str,
    cost: float | None = None,
) -> list[Violation]:
    """Disagreements between the objective, bound and gap a plan file states and
    the plan's own cost (``cost``: ``fam.cost(problem, plan)`` where the caller has
    it already; computed here otherwise)."""
    from energyopt.solvers.result import OBJECTIVE_REL_TOL, objective_tolerance
    from energyopt.verify.violation import Violation

    if cost is None:
        cost = fam.cost(problem, plan)
    tol = objective_tolerance(cost)
    out: list[Violation] = []
    if stated.objective is not None and abs(stated.objective - cost) > tol:
        out.append(
            Violation(
                "objective",
                "plan",
                f"states objective {stated.objective:,.6g}; the plan's own cost is {cost:,.6g}",
            )
        )
    if stated.bound is not None:
        beyond = stated.bound > cost + tol if sense == "min" else stated.bound < cost - tol
        if beyond:
            out.append(
                Violation(
                    "bound",
                    "plan",
                    f"states bound {stated.bound:,.6g} beyond the plan's own cost {cost:,.6g}",
                )
            )
        elif stated.gap is not None:
            sign = 1.0 if sense == "min" else -1.0
            gap = max(0.0, sign * (cost - stated.bound)) / max(abs(cost), 1e-9)
            if abs(stated.gap - gap) > 1e-6 + OBJECTIVE_REL_TOL:
                out.append(
                    Violation(
                        "gap",
                        "plan",
                        f"states gap {stated.gap:.6%}; its objective and bound give {gap:.6%}",
                    )
                )
    return out


_LAZY: dict[str, str] = {
    "Family": "energyopt.families.contract",
    "NotExportable": "energyopt.families.contract",
    "SolverEntry": "energyopt.families.contract",
    "Stated": "energyopt.families.contract",
    "PlanVerificationError": "energyopt.families.serving.solvers.solve",
}
"""Names this module exports from others, imported on first use."""


def __getattr__(name: str) -> Any:
    """The names of ``_LAZY`` and ``AnyFamily``, imported on first use (PEP 562)."""
    if name == "AnyFamily":
        from energyopt.families.contract import Family

        value: Any = Family[Any, Any]
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "BUILTIN",
    "AnyFamily",
    "Family",
    "NotExportable",
    "PlanVerificationError",
    "SolverEntry",
    "Stated",
    "certify",
    "check_stated",
    "families",
    "family",
    "kinds",
    "register",
    "solver_entry",
]
