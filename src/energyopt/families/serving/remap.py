"""Keep placements where they are across re-plans.

Identical GPUs of one node (same type and per-GPU cap) are interchangeable in
every formulation, so a solver may return the same configuration on a different
GPU than last epoch, which the simulator would pay for as a migration. Before a
plan is applied, its per-GPU settings are permuted among such GPUs to keep as
many placements, on-states and clocks in place as possible (greedy matching).
GPUs in tensor-parallel groups are left alone. The permuted plan is re-verified;
if the check fails the original is used.
"""

from __future__ import annotations

from collections import defaultdict

from energyopt.catalog.problem import Problem
from energyopt.families.serving.tables import scaled_problem
from energyopt.families.serving.verify import verify_plan
from energyopt.sim.engine import plan_units
from energyopt.spec.plan import GpuPlan, Plan

PLACEMENT_SCORE = 10
ON_SCORE = 2
CLOCK_SCORE = 1


def _config(gp: GpuPlan) -> set[tuple[str, str, int, str | None]]:
    return {(p.workload, p.phase, p.share_pct, p.mig_profile) for p in gp.placements}


def _score(new: GpuPlan, old: GpuPlan) -> int:
    score = PLACEMENT_SCORE * len(_config(new) & _config(old))
    if new.on and old.on:
        score += ON_SCORE + (CLOCK_SCORE if new.clock_mhz == old.clock_mhz else 0)
    elif not new.on and not old.on:
        score += ON_SCORE
    return score


def plan_rates_rps(plan: Plan) -> dict[str, float]:
    """Requests/s the plan routes to each workload (its prefill or whole units)."""
    rates: dict[str, float] = defaultdict(float)
    for _, pl in plan_units(plan):
        if pl.phase != "decode":
            rates[pl.workload] += pl.rate_rps
    return dict(rates)


def problem_at_plan_rates(problem: Problem, plan: Plan) -> Problem:
    """``problem`` with every workload's rate set to what ``plan`` routes to it."""
    rates = plan_rates_rps(plan)
    scales = {w.name: rates.get(w.name, 0.0) / w.rate_rps for w in problem.instance.workloads}
    if any(v <= 0 for v in scales.values()):
        return problem  # a workload the plan does not serve: verify against the base
    return scaled_problem(problem, scales)


def stabilize(problem: Problem, new: Plan, old: Plan | None) -> Plan:
    """``new`` with its GPU settings permuted within groups of identical GPUs to
    match ``old`` (see module docs). ``problem`` is the one ``new`` was planned for."""
    if old is None:
        return new
    prev = {gp.gpu: gp for gp in old.gpus}
    plans = {gp.gpu: gp for gp in new.gpus}
    groups: dict[tuple[str, str, float | None], list[str]] = defaultdict(list)
    for g in problem.gpus:
        gp = plans.get(g.id)
        before = prev.get(g.id)
        if gp is None or before is None:
            continue
        if any(p.tp_group for p in gp.placements) or any(p.tp_group for p in before.placements):
            continue
        groups[(g.node, g.type, g.power_cap_w)].append(g.id)
    moved = dict(plans)
    for ids in groups.values():
        if len(ids) < 2:
            continue
        pairs = sorted(
            ((_score(plans[a], prev[b]), a, b) for a in ids for b in ids),
            key=lambda x: (-x[0], ids.index(x[1]), ids.index(x[2])),
        )
        used_new: set[str] = set()
        used_old: set[str] = set()
        for _, a, b in pairs:
            if a in used_new or b in used_old:
                continue
            used_new.add(a)
            used_old.add(b)
            moved[b] = plans[a].model_copy(update={"gpu": b})
    out = new.model_copy(update={"gpus": tuple(moved[gp.gpu] for gp in new.gpus)})
    if out == new or verify_plan(problem, out):
        return new
    return out
