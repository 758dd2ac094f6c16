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

import math
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


FILL_TOL_RPS = 1e-6
"""Unserved rate below this (req/s) counts as served when a plan is filled."""


@dataclass(frozen=True)
class Filled:
    """A plan topped up by ``filled_plan`` and what it serves."""

    plan: Plan  # verified at its own rates (``served_rps``)
    served_rps: dict[str, float]  # req/s the plan routes to each workload
    gpus_filled: int  # GPUs the plan had off that now serve


def filled_plan(problem: Problem, plan: Plan) -> Filled | None:
    """``plan``, which serves part of ``problem``'s rates (an overloaded forecast
    backed off), topped up with instances on the GPUs it leaves off, so that it
    serves as much of the forecast as those GPUs carry; None where nothing is added.

    Each GPU the plan has off (in the problem's GPU order) is turned on at its
    type's top clock and filled like a residual-packing bin (share, memory and
    power cap on the worst-case draw respected; one op per workload): repeatedly,
    every workload with forecast not yet served (its rate in ``problem`` less what
    the plan routes to it, req/s) offers the single-GPU op of its top clock with
    the least share that carries all of that rate, or else the one that carries
    most, at the rate it takes (at most its SLO capacity, at most the rate left),
    and the op that raises its workload's served rate by the largest factor is
    placed (the most log(1 + taken / served so far); a workload served nothing
    first; ties: the first workload). So each GPU goes where it adds most to what
    a workload already gets, with diminishing returns (proportional fairness
    across the workloads' served rates). Workloads split into
    prefill and decode units, TP ops and MIG profiles are not filled.

    The result passes ``verify_plan`` at the rates it routes (``served_rps``); where
    a node or cluster power budget, or any other check, fails, the GPUs filled last
    are given back until it passes. Its objective is the verifier's at those rates
    (W for power); bound and gap are dropped (they were the backed-off problem's).
    Counted work only: the answer does not depend on the machine's load."""
    from energyopt.families.serving.formulations.assemble import GpuDecision, assemble_plan
    from energyopt.families.serving.formulations.assemble import power_cap_w as cap_of
    from energyopt.families.serving.remap import plan_rates_rps, problem_at_plan_rates
    from energyopt.families.serving.solvers.residual_pack import Bin

    settings = {gp.gpu: gp for gp in plan.gpus}
    off = [g for g in problem.gpus if g.id in settings and not settings[g.id].on]
    if not off:
        return None
    table = build_op_table(problem)
    served = plan_rates_rps(plan)
    workloads = [w for w in problem.instance.workloads if w.phases() == ("both",)]
    forecast = {w.name: w.rate_rps for w in workloads}
    left = {n: r - served.get(n, 0.0) for n, r in forecast.items()}
    unit_of = {(u.workload, u.phase): i for i, u in enumerate(table.units)}
    reserve = problem.instance.options.memory_reserve_fraction
    decisions: dict[str, GpuDecision] = {}
    for gpu in off:
        if gpu.type not in table.clocks:
            continue
        t = table.type_names.index(gpu.type)
        clock = max(table.clocks[gpu.type])
        share_capacity = table.share_capacity[gpu.type]
        memory = problem.gpu_type(gpu.type).memory_gb * (1.0 - reserve)
        power_cap = cap_of(problem, gpu)
        box = Bin(0, 0.0, table.on_power[(gpu.type, clock)])
        while True:
            best: tuple[float, int, str, float] | None = None  # (gain, op, workload, rps)
            for name, rate in forecast.items():
                need = left[name]
                u = unit_of.get((name, "both"))
                if need <= FILL_TOL_RPS or u is None or rate <= 0:
                    continue
                ops = [
                    int(o)
                    for o in table.ops_of(u)
                    if table.gpu_type[o] == t
                    and table.clock_mhz[o] == clock
                    and table.tp[o] == 1
                    and table.mig_profile[o] is None
                    and box.fits(table, int(o), share_capacity, memory, power_cap)
                ]
                if not ops:
                    continue
                enough = [o for o in ops if table.capacity_rps[o] >= need]
                if enough:
                    op = min(enough, key=lambda o: (int(table.share[o]), o))
                else:
                    op = max(ops, key=lambda o: (float(table.capacity_rps[o]), -o))
                take = min(float(table.capacity_rps[op]), need)
                have = rate - need  # req/s served so far
                gain = math.log1p(take / have) if have > FILL_TOL_RPS else math.inf
                if best is None or gain > best[0] * (1.0 + 1e-12):
                    best = (gain, op, name, take)
            if best is None:
                break
            _, op, name, take = best
            box.add(table, op, take)
            left[name] -= take
        if box.ops:
            decisions[gpu.id] = GpuDecision(clock, list(zip(box.ops, box.rates, strict=True)))
    order = [g.id for g in off if g.id in decisions]
    while order:
        kept = {gid: decisions[gid] for gid in order}
        assembled = assemble_plan(
            problem, table, kept, solver="", status="", objective=None, bound=None, gap=None
        )
        added = {gp.gpu: gp for gp in assembled.gpus if gp.gpu in kept}
        merged = plan.model_copy(
            update={
                "gpus": tuple(added.get(gp.gpu, gp) for gp in plan.gpus),
                "bound": None,
                "gap": None,
                "solver": f"{plan.solver} + fill",
            }
        )
        ev = evaluate_plan(problem_at_plan_rates(problem, merged), merged)
        if not ev.violations:
            return Filled(
                merged.model_copy(update={"objective": ev.objective}),
                plan_rates_rps(merged),
                len(order),
            )
        order.pop()  # give back the GPU filled last
    return None
