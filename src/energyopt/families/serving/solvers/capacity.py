"""A capacity test that does not read the clock: does a plan for these rates exist
that a fixed amount of counted work finds?

``packed_plan(problem)`` runs column generation on the configuration formulation
to convergence (or ``colgen.MAX_ROUNDS`` rounds), and, where the LP relaxation
serves every rate, packs an integer plan from the LP solution with residual
packing (``residual_pack``: its price scales and packing tries are counted, not
timed). Both steps stop on counted work only, so the answer (a verified plan, or
None) is the same on a quiet or a loaded machine and under any time limit.

What the answer means:

* the LP relaxation leaves demand unserved: no plan exists (the configuration LP
  relaxes every plan of the formulation; its artificials carry what no column
  mix can);
* a plan is returned: it passes the verifier, so the rates are servable;
* None with the LP serving every rate: undecided (a plan may exist that packing
  does not find; near the fleet's capacity the integer solve is what decides,
  and that is where solves end on the clock).

The epoch planner (``planners.SolverPlanner``) backs an overloaded forecast off to
the largest fraction this test passes on a fixed ladder of fractions, so the
fraction it settles on is a function of the forecast alone. Objective values are
the instance's objective units (W for power), rates req/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers.backend import finish_plan
from energyopt.families.serving.solvers.colgen import generate_columns
from energyopt.families.serving.solvers.diagnose import unservable_units
from energyopt.families.serving.solvers.highs_direct import padded_start
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.families.serving.solvers.residual_pack import residual_pack
from energyopt.families.serving.verify import evaluate_plan
from energyopt.perf.oppoints import build_op_table
from energyopt.solvers.result import FEASIBLE
from energyopt.spec.plan import Plan

SOLVER_NAME = "capacity test (column generation + residual packing)"


@dataclass(frozen=True)
class Capacity:
    """The capacity test's answer for one problem."""

    applies: bool  # False: the configuration formulation does not apply (no answer)
    lp_serves: bool  # the LP relaxation serves every rate (False proves no plan exists)
    plan: Plan | None  # a verified plan, objective its own (None: none found)
    objective: float | None = None  # the plan's objective (W for power)


def packed_plan(problem: Problem) -> Capacity:
    """The capacity test on ``problem`` (module docstring): a verified plan from
    column generation and residual packing, both run to their counted limits."""
    table = build_op_table(problem)
    if unservable_units(problem, table):
        return Capacity(True, False, None)
    try:
        pat.check_applicable(problem, table)
    except pat.PatternNotApplicable:
        return Capacity(False, False, None)
    prog = pat.prepare(problem, table)
    session = LpSession(problem, table, prog.costs, prog.classes, prog.columns)
    generate_columns(prog, None, session=session)
    assert prog.lp is not None
    if prog.lp.artificial_rps > 1e-6:
        return Capacity(True, False, None)
    packed = residual_pack(session, prog)
    if packed is None:
        return Capacity(True, True, None)
    objective, values = packed
    im = pat.integer_model(prog, pyomo=False)
    im.values = padded_start(values, len(im.master.cost))
    plan: Plan = finish_plan(
        problem, table, pat.decisions(prog, im), FEASIBLE, objective, None, SOLVER_NAME
    )
    ev = evaluate_plan(problem, plan)
    if ev.violations:  # packing broke a constraint the verifier checks: no answer
        return Capacity(True, True, None)
    plan = plan.model_copy(update={"objective": ev.objective, "bound": None, "gap": None})
    return Capacity(True, True, plan, ev.objective)
