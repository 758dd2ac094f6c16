"""The problem-family registry: the one place that lists the families.

Every command reaches a family through ``family_of_file`` / ``family`` and the
``Family`` contract (``families/contract.py``); ``certify`` and ``check_stated``
hold every family's results to the same rule: the reported objective is the
plan's own cost, recomputed by the family's verifier. docs/families.md shows how
to add a family.
"""

from __future__ import annotations

from typing import Any

from energyopt.families.collective import CollectiveFamily
from energyopt.families.colocation import ColocationFamily
from energyopt.families.contract import Family, NotExportable, SolverEntry, Stated
from energyopt.families.keepalive import KeepAliveFamily
from energyopt.families.moe_edge import MoeEdgeFamily
from energyopt.families.serverless import ServerlessFamily
from energyopt.families.serving import ServingFamily
from energyopt.families.taskgraph import TaskGraphFamily
from energyopt.solvers.result import OBJECTIVE_REL_TOL, Result, objective_tolerance, settle
from energyopt.solvers.serving import PlanVerificationError
from energyopt.spec.errors import SpecError
from energyopt.verify.violation import Violation

AnyFamily = Family[Any, Any]

_REGISTRY: dict[str, AnyFamily] = {}


def register(family: AnyFamily) -> None:
    """Make ``family`` reachable by its ``kind`` from every command."""
    if family.kind in _REGISTRY:
        raise ValueError(f"problem family {family.kind!r} is registered twice")
    _REGISTRY[family.kind] = family


for _f in (
    ServingFamily(),
    TaskGraphFamily(),
    ColocationFamily(),
    KeepAliveFamily(),
    MoeEdgeFamily(),
):
    register(_f)
register(ServerlessFamily())
register(CollectiveFamily())


def families() -> list[AnyFamily]:
    """Every registered family, serving first."""
    return list(_REGISTRY.values())


def family(kind: str) -> AnyFamily:
    """The family of ``kind``; SpecError listing the known kinds otherwise."""
    found = _REGISTRY.get(kind)
    if found is None:
        raise SpecError([f"kind: unknown problem family {kind!r}; known: {', '.join(_REGISTRY)}"])
    return found


def solver_entry(fam: AnyFamily, name: str | None) -> SolverEntry:
    """The family's solver called ``name`` (None: its default, the first listed)."""
    entries = fam.solvers()
    if name is None:
        return entries[0]
    for entry in entries:
        if entry.name == name:
            return entry
    if fam.kind == "serving":  # presets may also be given as a TOML file path
        return SolverEntry(name, fam.kind, "exact", f"preset file {name}")
    names = ", ".join(e.name for e in entries)
    raise SpecError([f"--solver: no solver {name!r} for {fam.kind} problems; available: {names}"])


def certify(fam: AnyFamily, problem: Any, result: Result[Any], rel_gap: float, note: Any) -> None:
    """Hold ``result`` to the contract (nothing to do once its solver has): the plan
    passes the family's verifier and the reported figures are its own (``settle``)."""
    if result.plan is None or result.certified:
        return
    violations = fam.verify(problem, result.plan)
    if violations:
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


__all__ = [
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
    "register",
    "solver_entry",
]
