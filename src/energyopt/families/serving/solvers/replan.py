"""Re-plan at once when some workloads' load leaves its band: warm-started from the plan
in force, changing only what must change.

``replan(problem, current, rates_rps)``:

1. **Surprised workloads**: those whose new rate (req/s) differs from the rate the
   plan in force routes to them (or the ones named). Every other workload stays at
   the plan's rate.
2. **Restricted instance**: the GPUs that hold a unit of a surprised workload (with
   the other units they hold, every member of a tensor-parallel group they are in,
   and every GPU of a disaggregated workload whose phases would otherwise be split
   unevenly), plus the GPUs the plan leaves off (spares). Each GPU that is on gets
   its current state (clock, placements); the objective becomes ``power_migration``
   with ``migration_penalty_w`` per placement moved off its GPU (instances with the
   ``gpus_on`` or ``edp`` objective keep theirs, without a penalty). Its workloads
   are the units those GPUs carry: the surprised ones at their new rates, the
   others at the rates they carry there now. Node and cluster power budgets are
   reduced by the worst-case draw of the GPUs that stay as they are.
3. That instance is solved with the preset (the configuration formulation where it
   applies, which handles current states; else the exact per-GPU MILP), its plan
   merged with the untouched GPUs of the plan in force, and the merged plan checked
   by the independent verifier on the **full** problem at the new rates: by default
   incrementally (``evaluate_plan_incremental``: every check, the queueing model run
   only for placements not verified before; the same verdict and figures as the
   full check, which ``full_verify`` runs; ``remember_plan_in_force``).
4. When the restricted instance has no plan (or its merge fails verification), the
   full problem at the new rates is solved with every GPU's current state and the
   same migration penalty (the full warm-started solve).

The reported objective is the verifier's, recomputed from the returned plan on the
full problem at the new rates (W for ``power``).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from scipy import sparse

from energyopt.backends.highs import mixed_lp, solve_mip
from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.assemble import (
    GpuDecision,
    assemble_plan,
    power_cap_w,
)
from energyopt.families.serving.remap import plan_rates_rps
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import (
    PlacementFigures,
    PlanEvaluation,
    evaluate_plan,
    evaluate_plan_incremental,
    learn_capacities,
)
from energyopt.perf.oppoints import OpTable, build_op_table
from energyopt.solvers.presets import SolverPreset, load_preset
from energyopt.spec.cluster import Cluster, CurrentPlacement, Gpu, GpuEntry, GpuState, Node
from energyopt.spec.plan import GpuPlan, Placement, Plan
from energyopt.spec.workload import Phase, Workload

DEFAULT_MIGRATION_PENALTY_W = 200.0
"""Cost of moving one placement off its GPU when the instance states none (W-equivalent):
about an H100's on-power at a mid clock, so a placement moves only when that saves at
least as much power (moving it also stops it while the weights load)."""

REPLAN_TIME_LIMIT_S = 5.0
"""Wall-clock limit of the restricted solve (s)."""

REPLAN_GAP = 1e-3
"""Relative gap of the restricted and of the full warm-started solve."""

FULL_TIME_LIMIT_S = 30.0
"""Wall-clock limit of the full warm-started solve, the fallback (s)."""

RATE_TOL = 1e-9
"""Relative change of a workload's rate below which it is not surprised."""

VERIFIED_POINTS = 50_000
"""Placements whose verified figures ``replan`` keeps between calls (a few MB); past
it they are all dropped and the next verification recomputes every placement."""

_verified = PlacementFigures()
"""Figures the verifier computed so far (``evaluate_plan_incremental``): the placements
of the plans in force and the SLO capacities of the points a re-plan may pick, so a
re-plan runs the performance model only for the placements it changes, and not its
SLO-capacity bisection. Keyed by everything the figures depend on, so any problem may
share it."""


def _evaluate(target: Problem, plan: Plan, full_verify: bool) -> PlanEvaluation:
    """The verifier's evaluation of ``plan`` on ``target``: every placement recomputed
    (``full_verify``), or those already verified taken from ``_verified``
    (``evaluate_plan_incremental``; the same verdict, problems and figures)."""
    if full_verify:
        return evaluate_plan(target, plan)
    if len(_verified) > VERIFIED_POINTS:
        _verified.capacity.clear()
        _verified.placements.clear()
    return evaluate_plan_incremental(target, plan, _verified)


def remember_plan_in_force(problem: Problem, plan: Plan) -> PlanEvaluation:
    """Verify ``plan`` on ``problem`` at the rates it routes (``target_problem`` with no
    change) and keep its placements' figures, and have the verifier compute the SLO
    capacity of every single-GPU operating point of ``problem`` (the points the
    surprise MILP picks from; rates do not change them), so that re-plans from it run
    the model only for the placements they change. Call it when a plan goes in force
    (about a second on fleet-16); a re-plan without it pays for the full
    verification. Returns the evaluation."""
    target = target_problem(problem, plan, {})
    ev = _evaluate(target, plan, full_verify=False)
    if target.instance.options.sharing.mode != "mig":
        learn_capacities(target, single_gpu_points(target), _verified)
    return ev


def single_gpu_points(problem: Problem) -> list[tuple[str, Phase, str, int, int]]:
    """(workload, phase, GPU type, clock MHz, share %) of every single-GPU operating
    point of ``problem``'s operating-point table: the points whose SLO capacity
    ``learn_capacities`` can compute ahead of a re-plan."""
    table = build_op_table(problem)
    return [
        (
            table.units[int(table.unit[o])].workload,
            table.units[int(table.unit[o])].phase,
            table.type_names[int(table.gpu_type[o])],
            int(table.clock_mhz[o]),
            int(table.share[o]),
        )
        for o in np.flatnonzero(table.tp == 1).tolist()
    ]


@dataclass(frozen=True)
class Replanned:
    """A surprise re-plan's answer.

    ``plan``: the verified plan at the new rates (None when neither solve found one);
    ``method``: ``restricted``, ``full`` (the fallback) or ``none``; ``objective``:
    the verifier's objective of ``plan`` on the full problem at the new rates (W for
    ``power``); ``power_w``: its total power there (W); ``moved``: placements of the
    plan in force that ``plan`` takes off their GPU; ``changed_gpus``: GPUs whose
    on-state, clock or placements (workload, phase, share, MIG profile) differ from
    the plan in force (a rate change alone is a routing change, not counted);
    ``solved_gpus``: GPUs in the instance that was solved; ``wall_s`` and ``cpu_s``:
    wall-clock and process CPU seconds of the whole call; ``notes``: why a fallback
    ran, or why there is no plan."""

    plan: Plan | None
    method: str
    objective: float | None
    power_w: float | None
    moved: int
    changed_gpus: tuple[str, ...]
    solved_gpus: int
    wall_s: float
    cpu_s: float
    notes: tuple[str, ...] = ()


def surprised_workloads(plan: Plan, rates_rps: dict[str, float]) -> list[str]:
    """Workloads of ``rates_rps`` whose rate (req/s) differs from what ``plan`` routes
    to them by more than ``RATE_TOL`` relative."""
    routed = plan_rates_rps(plan)
    out = []
    for name, rate in rates_rps.items():
        old = routed.get(name, 0.0)
        if abs(rate - old) > RATE_TOL * max(abs(old), 1.0):
            out.append(name)
    return out


def surprise_groups(plan: Plan, surprised: Iterable[str]) -> list[list[str]]:
    """The surprised workloads in groups that share no GPU of ``plan`` (each group is
    re-planned on its own, one after the other), in first-seen order."""
    hit = list(dict.fromkeys(surprised))
    parent = {w: w for w in hit}

    def root(w: str) -> str:
        while parent[w] != w:
            parent[w] = parent[parent[w]]
            w = parent[w]
        return w

    for gp in plan.gpus:
        here = [p.workload for p in gp.placements if p.workload in parent] if gp.on else []
        for w in here[1:]:
            parent[root(w)] = root(here[0])
    groups: dict[str, list[str]] = defaultdict(list)
    for w in hit:
        groups[root(w)].append(w)
    return list(groups.values())


def target_problem(problem: Problem, plan: Plan, rates_rps: dict[str, float]) -> Problem:
    """``problem`` with each workload's rate (req/s) set to ``rates_rps[name]`` where
    given, else to what ``plan`` routes to it (its base rate if the plan routes none).
    Raises ValueError naming a workload of ``rates_rps`` the problem lacks, or a rate
    that is not positive."""
    names = {w.name for w in problem.instance.workloads}
    unknown = sorted(set(rates_rps) - names)
    if unknown:
        raise ValueError(f"rates_rps: no workload {unknown} in {problem.source}")
    bad = sorted(n for n, r in rates_rps.items() if not r > 0)
    if bad:
        raise ValueError(f"rates_rps: rates of {bad} must be positive (req/s)")
    routed = plan_rates_rps(plan)
    workloads = tuple(
        w.model_copy(update={"rate_rps": rates_rps.get(w.name, routed.get(w.name, w.rate_rps))})
        for w in problem.instance.workloads
    )
    return problem.with_instance(problem.instance.model_copy(update={"workloads": workloads}))


def gpu_state(gp: GpuPlan) -> GpuState | None:
    """What ``gp`` runs, as a current state (None for a GPU that is off). Members of a
    tensor-parallel group are left out of the placements (no formulation keeps a group
    in place), and a unit placed twice (MIG) is listed once, the shares split evenly."""
    if not gp.on:
        return None
    units = list(dict.fromkeys((p.workload, p.phase) for p in gp.placements if p.tp_group is None))
    share = {(p.workload, p.phase): p.share_pct for p in gp.placements if p.tp_group is None}
    if sum(share[u] for u in units) > 100:
        even = max(1, 100 // max(len(units), 1))
        share = dict.fromkeys(units, even)
    return GpuState(
        on=True,
        clock_mhz=gp.clock_mhz,
        placements=tuple(
            CurrentPlacement(workload=w, phase=ph, share_pct=share[(w, ph)]) for w, ph in units
        ),
    )


def _penalty_w(problem: Problem, penalty_w: float | None) -> float:
    """The migration penalty a re-plan charges (W-equivalent per placement moved):
    ``penalty_w``, else the instance's, else ``DEFAULT_MIGRATION_PENALTY_W``; 0 for the
    ``gpus_on`` and ``edp`` objectives."""
    opts = problem.instance.options
    if opts.objective not in ("power", "power_migration"):
        return 0.0
    if penalty_w is not None:
        return float(penalty_w)
    return opts.migration_penalty_w or DEFAULT_MIGRATION_PENALTY_W


def _with_penalty(problem: Problem, penalty_w: float | None) -> Problem:
    """``problem`` priced as ``power_migration`` with ``penalty_w`` (the instance's own
    penalty where it has one, else ``DEFAULT_MIGRATION_PENALTY_W``); unchanged when its
    objective is ``gpus_on`` or ``edp``."""
    opts = problem.instance.options
    if opts.objective not in ("power", "power_migration"):
        return problem
    opts = opts.model_copy(
        update={
            "objective": "power_migration",
            "migration_penalty_w": _penalty_w(problem, penalty_w),
        }
    )
    return problem.with_instance(problem.instance.model_copy(update={"options": opts}))


def _sub_cluster(
    problem: Problem,
    plan: Plan,
    keep: set[str],
    fixed_worst_w: dict[str, float],
) -> tuple[Node, ...] | None:
    """The nodes of ``problem`` with only the GPUs of ``keep``, each with its current
    state from ``plan``, and each node's budget less the worst-case draw of its GPUs
    outside ``keep`` (``fixed_worst_w``, W); None when that leaves a budget at 0 W or
    less."""
    plans = {gp.gpu: gp for gp in plan.gpus}
    by_node: dict[str, list[GpuEntry]] = defaultdict(list)
    for g in problem.gpus:
        if g.id not in keep:
            continue
        gp = plans.get(g.id)
        by_node[g.node].append(
            GpuEntry(
                type=g.type,
                count=1,
                ids=(g.id,),
                power_cap_w=g.power_cap_w,
                state=gpu_state(gp) if gp is not None else None,
            )
        )
    used: dict[str, float] = defaultdict(float)
    for g in problem.gpus:
        if g.id not in keep:
            used[g.node] += fixed_worst_w.get(g.id, 0.0)
    nodes = []
    for node in problem.instance.cluster.nodes:
        entries = by_node.get(node.name)
        if not entries:
            continue
        budget = node.power_budget_w
        if budget is not None:
            budget -= used[node.name]
            if budget <= 0:
                return None
        nodes.append(Node(name=node.name, gpus=tuple(entries), power_budget_w=budget))
    return tuple(nodes)


def restricted_instance(
    problem: Problem,
    plan: Plan,
    target: Problem,
    surprised: Iterable[str],
    penalty_w: float | None = None,
    full_verify: bool = True,
) -> tuple[Problem, set[str]] | None:
    """The restricted instance of step 2 (module docs) and its GPU ids; None when the
    GPUs outside it leave no power budget for it. ``target``: the full problem at the
    new rates (``target_problem``); ``full_verify``: as ``replan``'s."""
    hit = set(surprised)
    on = [gp for gp in plan.gpus if gp.on]
    keep = {gp.gpu for gp in on if any(p.workload in hit for p in gp.placements)}
    groups: dict[str, set[str]] = defaultdict(set)
    gpus_of: dict[str, set[str]] = defaultdict(set)
    for gp in on:
        for p in gp.placements:
            gpus_of[p.workload].add(gp.gpu)
            if p.tp_group is not None:
                groups[p.tp_group].add(gp.gpu)
    disaggregated = {w.name for w in problem.instance.workloads if w.disaggregated}
    while True:  # close over TP groups and unevenly split disaggregated workloads
        grown = set(keep)
        for gp in on:
            if gp.gpu not in keep:
                continue
            for p in gp.placements:
                if p.tp_group is not None:
                    grown |= groups[p.tp_group]
        phase_rate: dict[tuple[str, str], float] = defaultdict(float)
        for pl in _units(plan, grown):
            phase_rate[(pl.workload, pl.phase)] += pl.rate_rps
        for name in disaggregated:
            pre, dec = phase_rate.get((name, "prefill"), 0.0), phase_rate.get((name, "decode"), 0.0)
            if abs(pre - dec) > 1e-9 * max(pre, dec, 1.0):
                grown |= gpus_of[name]
        if grown == keep:
            break
        keep = grown
    keep |= {gp.gpu for gp in plan.gpus if not gp.on}
    ev = _evaluate(target, plan, full_verify)
    fixed = {gid: w for gid, w in ev.gpu_worst_w.items() if gid not in keep}
    nodes = _sub_cluster(problem, plan, keep, fixed)
    if nodes is None or not nodes:
        return None
    cluster = problem.instance.cluster
    budget = cluster.power_budget_w
    if budget is not None:
        budget -= sum(fixed.values())
        if budget <= 0:
            return None
    carried: dict[str, float] = defaultdict(float)
    for pl in _units(plan, keep):
        if pl.phase != "decode":
            carried[pl.workload] += pl.rate_rps
    rates = {w.name: w.rate_rps for w in target.instance.workloads}
    in_groups = {p.workload for p in _units(plan, keep) if p.tp_group is not None}
    workloads = []
    for w in target.instance.workloads:
        rate = rates[w.name] if w.name in hit else carried.get(w.name, 0.0)
        if rate <= 0:
            continue
        update: dict[str, object] = {"rate_rps": rate}
        if w.name not in in_groups and _fits_one_gpu(problem, w, keep):
            update["tensor_parallel"] = (1,)
        workloads.append(w.model_copy(update=update))
    if not workloads:
        return None
    inst = target.instance.model_copy(
        update={
            "name": f"{target.instance.name}-replan",
            "cluster": cluster.model_copy(
                update={"nodes": nodes, "links": (), "power_budget_w": budget}
            ),
            "workloads": tuple(workloads),
        }
    )
    return _with_penalty(target.with_instance(inst), penalty_w), keep


def _fits_one_gpu(problem: Problem, workload: Workload, gpus: set[str]) -> bool:
    """Whether ``workload``'s weights fit the usable memory of one GPU of ``gpus``."""
    weights = problem.model_of(workload).weight_bytes
    usable = 1.0 - problem.instance.options.memory_reserve_fraction
    allowed = workload.tensor_parallel
    if allowed is not None and 1 not in allowed:
        return False
    return any(
        weights < problem.gpu_type(g.type).memory_gb * 1e9 * usable
        for g in problem.gpus
        if g.id in gpus
    )


def _units(plan: Plan, gpus: set[str]) -> list[Placement]:
    """Placements on ``gpus`` (a tensor-parallel group once, when any member is there)."""
    out: list[Placement] = []
    seen: set[str] = set()
    for gp in plan.gpus:
        if not gp.on or gp.gpu not in gpus:
            continue
        for p in gp.placements:
            if p.tp_group is not None:
                if p.tp_group in seen:
                    continue
                seen.add(p.tp_group)
            out.append(p)
    return out


def merge(current: Plan, part: Plan) -> Plan:
    """``current`` with the GPUs of ``part`` replaced by ``part``'s settings;
    tensor-parallel group ids of ``part`` that ``current`` keeps elsewhere are renamed."""
    mine = {gp.gpu for gp in part.gpus}
    taken = {
        p.tp_group
        for gp in current.gpus
        if gp.gpu not in mine
        for p in gp.placements
        if p.tp_group is not None
    }
    rename: dict[str, str] = {}
    for gp in part.gpus:
        for p in gp.placements:
            if p.tp_group is not None and p.tp_group in taken and p.tp_group not in rename:
                k = 0
                while f"{p.tp_group}.r{k}" in taken:
                    k += 1
                rename[p.tp_group] = f"{p.tp_group}.r{k}"
    new = {
        gp.gpu: gp.model_copy(
            update={
                "placements": tuple(
                    p.model_copy(update={"tp_group": rename.get(p.tp_group, p.tp_group)})
                    if p.tp_group is not None
                    else p
                    for p in gp.placements
                )
            }
        )
        for gp in part.gpus
    }
    return current.model_copy(update={"gpus": tuple(new.get(gp.gpu, gp) for gp in current.gpus)})


def moved_placements(old: Plan, new: Plan) -> int:
    """Single-GPU (workload, phase) placements of ``old`` that ``new`` does not keep on
    the same GPU (the verifier's ``moved`` with ``old`` as the current state)."""
    after = {gp.gpu: gp for gp in new.gpus}
    moved = 0
    for gp in old.gpus:
        if not gp.on:
            continue
        units = {(p.workload, p.phase) for p in gp.placements if p.tp_group is None}
        now = after.get(gp.gpu)
        kept: set[tuple[str, str]] = set()
        if now is not None and now.on:
            kept = {(p.workload, p.phase) for p in now.placements if p.tp_group is None}
        moved += len(units - kept)
    return moved


def _setting(gp: GpuPlan | None) -> tuple[object, ...]:
    if gp is None or not gp.on:
        return (False,)
    units = sorted(
        (p.workload, p.phase, p.share_pct, p.mig_profile or "", p.tp_size) for p in gp.placements
    )
    return (True, gp.clock_mhz, tuple(units))


def changed_gpus(old: Plan, new: Plan) -> tuple[str, ...]:
    """GPUs whose on-state, clock or placements (workload, phase, share, MIG profile,
    TP size) differ between ``old`` and ``new`` (rates aside)."""
    before = {gp.gpu: gp for gp in old.gpus}
    after = {gp.gpu: gp for gp in new.gpus}
    return tuple(
        g
        for g in dict.fromkeys([*before, *after])
        if _setting(before.get(g)) != _setting(after.get(g))
    )


def _with_states(problem: Problem, plan: Plan) -> Problem:
    """``problem`` with every GPU's current state taken from ``plan``."""
    states = {gp.gpu: gpu_state(gp) for gp in plan.gpus}
    nodes = []
    for node in problem.instance.cluster.nodes:
        entries = []
        for g in problem.gpus:
            if g.node != node.name:
                continue
            entries.append(
                GpuEntry(
                    type=g.type,
                    count=1,
                    ids=(g.id,),
                    power_cap_w=g.power_cap_w,
                    state=states.get(g.id),
                )
            )
        nodes.append(node.model_copy(update={"gpus": tuple(entries)}))
    cluster = problem.instance.cluster.model_copy(update={"nodes": tuple(nodes)})
    return problem.with_instance(problem.instance.model_copy(update={"cluster": cluster}))


def _final(
    plan: Plan, target: Problem, current: Plan, label: str, full_verify: bool
) -> tuple[Plan, list[str]]:
    """``plan`` with the verifier's per-GPU power and objective on ``target`` (the full
    problem at the new rates), and its violations there (``full_verify``: every
    placement recomputed, else ``evaluate_plan_incremental``). A GPU whose settings
    and placements are those of ``current`` keeps ``current``'s entry as it is."""
    ev = _evaluate(target, plan, full_verify)
    before = {gp.gpu: gp for gp in current.gpus}

    def priced(gp: GpuPlan) -> GpuPlan:
        old = before.get(gp.gpu)
        if old is not None and old.model_copy(update={"predicted_power_w": 0.0}) == (
            gp.model_copy(update={"predicted_power_w": 0.0})
        ):
            return old
        return gp.model_copy(update={"predicted_power_w": ev.gpu_power_w.get(gp.gpu, 0.0)})

    gpus = tuple(priced(gp) for gp in plan.gpus)
    out = plan.model_copy(
        update={
            "gpus": gpus,
            "objective": ev.objective,
            "bound": None,
            "gap": None,
            "solver": label,
            "status": "feasible",
            "instance": current.instance,
        }
    )
    return out, [str(v) for v in ev.violations]


def replan(
    problem: Problem,
    current: Plan,
    rates_rps: dict[str, float],
    *,
    surprised: Iterable[str] | None = None,
    preset: SolverPreset | str = "highs-exact",
    time_limit_s: float = REPLAN_TIME_LIMIT_S,
    rel_gap: float = REPLAN_GAP,
    migration_penalty_w: float | None = None,
    full_time_limit_s: float | None = FULL_TIME_LIMIT_S,
    full_verify: bool = False,
) -> Replanned:
    """A verified plan for ``rates_rps`` (req/s per workload; workloads not given stay
    at the rates ``current`` routes to them) that keeps every GPU not holding a
    surprised workload as ``current`` has it (module docs). ``surprised``: the
    workloads to re-plan (default: those whose rate changed); ``preset``: the solver
    preset of both solves; ``time_limit_s``: the restricted solve's limit (s);
    ``full_time_limit_s``: the fallback's (s; None: no fallback);
    ``migration_penalty_w``: W-equivalent per placement moved (default: the
    instance's, else ``DEFAULT_MIGRATION_PENALTY_W``); ``full_verify``: verify every
    placement of the plan returned with the performance model (``evaluate_plan``)
    rather than only those not verified before (``evaluate_plan_incremental``, the
    default: the same verdict and figures; ``remember_plan_in_force``)."""
    start, cpu0 = time.perf_counter(), time.process_time()
    chosen = load_preset(preset) if isinstance(preset, str) else preset
    target = target_problem(problem, current, rates_rps)
    hit = list(surprised) if surprised is not None else surprised_workloads(current, rates_rps)
    names = {w.name for w in problem.instance.workloads}
    unknown = sorted(set(hit) - names)
    if unknown:
        raise ValueError(f"surprised: no workload {unknown} in {problem.source}")
    notes: list[str] = []
    before = {gp.gpu for gp in current.gpus}
    missing = [g.id for g in problem.gpus if g.id not in before]
    if missing:  # a GPU the plan does not list is off
        current = current.model_copy(
            update={
                "gpus": current.gpus
                + tuple(
                    GpuPlan(gpu=g.id, type=g.type, on=False)
                    for g in problem.gpus
                    if g.id in missing
                )
            }
        )

    def done(plan: Plan | None, method: str, solved: int) -> Replanned:
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        if plan is None:
            return Replanned(None, method, None, None, 0, (), solved, wall, cpu, tuple(notes))
        return Replanned(
            plan,
            method,
            plan.objective,
            sum(gp.predicted_power_w for gp in plan.gpus),
            moved_placements(current, plan),
            changed_gpus(current, plan),
            solved,
            wall,
            cpu,
            tuple(notes),
        )

    if not hit:
        plan, bad = _final(current, target, current, "replan (nothing surprised)", full_verify)
        if not bad:
            return done(plan, "none", 0)
        notes.append("the plan in force fails at the new rates: " + "; ".join(bad[:3]))
    else:
        penalty = _penalty_w(problem, migration_penalty_w)
        staged: Plan | None = current
        decided: set[str] = set()
        hit_set = set(hit)
        together = set(hit) | {
            p.workload
            for gp in current.gpus
            if gp.on and any(q.workload in hit_set for q in gp.placements)
            for p in gp.placements
        }
        points = _mini_table(target, together)
        for group in surprise_groups(current, hit):
            assert staged is not None
            part, ids, why = surprise_milp(
                problem,
                staged,
                target,
                group,
                penalty_w=penalty,
                time_limit_s=time_limit_s,
                rel_gap=rel_gap,
                points=points,
                full_verify=full_verify,
            )
            decided |= ids
            if part is None:
                notes.append(why)
                staged = None
                break
            staged = merge(staged, part)
        if staged is not None:
            merged, bad = _final(staged, target, current, "replan (surprise MILP)", full_verify)
            if not bad:
                return done(merged, "restricted", len(decided))
            notes.append("surprise MILP's plan fails verification: " + "; ".join(bad[:3]))
        sub = restricted_instance(problem, current, target, hit, migration_penalty_w, full_verify)
        if sub is None:
            notes.append("restricted instance: no power budget left for the surprised GPUs")
        else:
            part_problem, keep = sub
            result = solve(part_problem, chosen, time_limit_s=time_limit_s, rel_gap=rel_gap)
            if result.plan is None:
                notes.append(f"restricted instance ({len(keep)} GPUs): {result.status}, no plan")
            else:
                merged, bad = _final(
                    merge(current, result.plan),
                    target,
                    current,
                    f"replan ({chosen.name})",
                    full_verify,
                )
                if not bad:
                    return done(merged, "restricted-exact", len(keep))
                notes.append("merged plan fails verification: " + "; ".join(bad[:3]))
    if full_time_limit_s is None:
        return done(None, "none", 0)
    full = _with_penalty(_with_states(target, current), migration_penalty_w)
    result = solve(full, chosen, time_limit_s=full_time_limit_s, rel_gap=rel_gap)
    if result.plan is None:
        notes.append(f"full warm-started solve: {result.status}, no plan")
        return done(None, "none", len(problem.gpus))
    plan, bad = _final(result.plan, target, current, f"replan full ({chosen.name})", full_verify)
    if bad:  # the solver verified it on ``full``: only a rate mismatch could get here
        notes.append("full plan fails verification: " + "; ".join(bad[:3]))
        return done(None, "none", len(problem.gpus))
    return done(plan, "full", len(problem.gpus))


MAX_CONFIGURATIONS = 20_000
"""Most configurations the surprise MILP lists per GPU or class; above it the general
restricted solve runs instead."""


@dataclass
class _Slot:
    """A GPU, or a class of interchangeable spare GPUs, of the surprise MILP.

    ``gpus``: its GPU ids (one for a GPU that holds a surprised unit); ``fixed``: the
    placements that stay, as (unit index, share, rate req/s); ``current``: the
    surprised units it holds now; ``configs``: (clock MHz, surprised ops, cost W,
    worst-case draw W) of each setting it may take."""

    gpus: list[str]
    gpu: Gpu
    fixed: list[tuple[int, int, float]]
    current: list[int]
    configs: list[tuple[int, tuple[int, ...], float, float]] = field(default_factory=list)
    fixed_ops: dict[int, list[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Partial:
    """A setting being built: its surprised ops so far, their share, the setting's
    cost (W), worst-case draw (W) and memory (GB)."""

    ops: tuple[int, ...]
    share: int
    cost: float
    worst: float
    memory: float


def _extend(
    table: OpTable,
    slot: _Slot,
    clock: int,
    choices: list[list[int]],
    free: int,
    cap_w: float,
    usable_gb: float,
    k: int,
    part: _Partial,
) -> bool:
    """Add to ``slot.configs`` every setting at ``clock`` that extends ``part`` with at
    most one op of each of the units ``k``, ``k + 1``, ... (``choices``: their ops);
    False once there are more than ``MAX_CONFIGURATIONS``."""
    if k == len(choices):
        if part.ops or slot.fixed:
            slot.configs.append((clock, part.ops, part.cost, part.worst))
        return len(slot.configs) <= MAX_CONFIGURATIONS
    if not _extend(table, slot, clock, choices, free, cap_w, usable_gb, k + 1, part):
        return False
    for o in choices[k]:
        nxt = _Partial(
            (*part.ops, o),
            part.share + int(table.share[o]),
            part.cost + float(table.fixed_w[o]),
            part.worst + float(table.peak_power_w[o]),
            part.memory + float(table.memory_gb[o]),
        )
        if nxt.share > free or nxt.worst > cap_w * (1 + 1e-9) or nxt.memory > usable_gb:
            continue
        if not _extend(table, slot, clock, choices, free, cap_w, usable_gb, k + 1, nxt):
            return False
    return True


def _settings(
    table: OpTable,
    slot: _Slot,
    op_at: dict[tuple[int, str, int, int], int],
    units: list[int],
    cap_w: float,
    usable_gb: float,
) -> bool:
    """Fill ``slot.configs`` and ``slot.fixed_ops``: at every candidate clock where its
    fixed placements keep their rates, every set of surprised ops (one per unit at
    most) that fits the free share, the memory and the cap on the worst-case draw;
    False when there are more than ``MAX_CONFIGURATIONS``."""
    type_name = slot.gpu.type
    free = table.share_capacity[type_name] - sum(s for _, s, _ in slot.fixed)
    for f in table.clocks.get(type_name, ()):
        ops = [op_at.get((u, type_name, f, s)) for u, s, _ in slot.fixed]
        held = [o for o in ops if o is not None]
        if len(held) < len(ops) or any(
            float(table.capacity_rps[o]) < rate * (1 - 1e-9)
            for o, (_, _, rate) in zip(held, slot.fixed, strict=True)
        ):
            continue
        on_w = table.on_power[(type_name, f)]
        base_cost = on_w + sum(
            table.power_w(o, rate) for o, (_, _, rate) in zip(held, slot.fixed, strict=True)
        )
        base_worst = on_w + sum(float(table.peak_power_w[o]) for o in held)
        base_mem = sum(float(table.memory_gb[o]) for o in held)
        if base_worst > cap_w * (1 + 1e-9) or base_mem > usable_gb:
            continue
        slot.fixed_ops[f] = held
        choices = [
            [o for s in range(1, free + 1) if (o := op_at.get((u, type_name, f, s))) is not None]
            for u in units
        ]

        start = _Partial((), 0, base_cost, base_worst, base_mem)
        if not _extend(table, slot, f, choices, free, cap_w, usable_gb, 0, start):
            return False
    return True


def _mini_table(target: Problem, names: set[str]) -> tuple[tuple[Workload, ...], OpTable]:
    """The workloads ``names`` of ``target`` (single-GPU placements only, where their
    weights fit one GPU) and their operating points."""
    everyone = {g.id for g in target.gpus}
    mini_wl = tuple(
        w.model_copy(update={"tensor_parallel": (1,)}) if _fits_one_gpu(target, w, everyone) else w
        for w in target.instance.workloads
        if w.name in names
    )
    mini = target.with_instance(target.instance.model_copy(update={"workloads": mini_wl}))
    return mini_wl, build_op_table(mini)


def surprise_milp(
    problem: Problem,
    current: Plan,
    target: Problem,
    surprised: Iterable[str],
    *,
    penalty_w: float,
    time_limit_s: float,
    rel_gap: float,
    points: tuple[tuple[Workload, ...], OpTable] | None = None,
    full_verify: bool = True,
) -> tuple[Plan | None, set[str], str]:
    """The fast restricted solve: (plan of the GPUs it decides, or None; the GPUs it
    decided over; why there is no plan).

    Every placement of a workload not in ``surprised`` stays as it is (share, rate).
    Free: the clock of each GPU that holds a surprised unit (among the clocks at
    which its other placements still hold their rates), the surprised units'
    placements there (share, rate; a current one removed costs ``penalty_w``, W),
    and new placements on the GPUs the plan leaves off. A configuration MILP solved
    by HiGHS directly: each GPU holding a surprised unit picks one setting (clock and
    surprised ops), each class of interchangeable spare GPUs (type and cap; and node
    where nodes have power budgets) an
    integer number of each setting; rates are split over the ops; rows for demand,
    node and cluster budgets (less what the GPUs left as they are may draw: their
    worst-case draw, from the verifier) and migration. Settings respect the free
    share, memory and the cap on the worst-case draw, as the per-GPU formulation's
    rows do. Single-GPU MPS placements only: with a surprised GPU in a
    tensor-parallel group, MIG sharing, or more than ``MAX_CONFIGURATIONS`` settings
    it returns None and the caller takes the general restricted solve. ``points``:
    ``_mini_table`` of a set of workloads holding these (built here otherwise);
    ``full_verify``: as ``replan``'s."""
    hit = set(surprised)
    opts = target.instance.options
    if opts.sharing.mode == "mig":
        return None, set(), "MIG sharing: the surprise MILP places MPS shares only"
    plans = {gp.gpu: gp for gp in current.gpus}
    held = [gp for gp in current.gpus if gp.on and any(p.workload in hit for p in gp.placements)]
    if any(p.tp_group is not None for gp in held for p in gp.placements):
        return None, set(), "a surprised GPU is in a tensor-parallel group"
    names = {p.workload for gp in held for p in gp.placements} | hit
    if points is None or not names <= {w.name for w in points[0]}:
        points = _mini_table(target, names)
    mini_wl, table = points
    unit_of = {(u.workload, u.phase): u.index for u in table.units}
    op_at: dict[tuple[int, str, int, int], int] = {}
    for o in np.flatnonzero(table.tp == 1).tolist():
        key = (
            int(table.unit[o]),
            table.type_names[int(table.gpu_type[o])],
            int(table.clock_mhz[o]),
            int(table.share[o]),
        )
        op_at[key] = o
    units = [u.index for u in table.units if u.workload in hit]
    by_id = {g.id: g for g in target.gpus}
    slots: list[_Slot] = []
    for gp in held:
        fixed = [
            (unit_of[(p.workload, p.phase)], p.share_pct, p.rate_rps)
            for p in gp.placements
            if p.workload not in hit
        ]
        cur = [unit_of[(p.workload, p.phase)] for p in gp.placements if p.workload in hit]
        slots.append(_Slot([gp.gpu], by_id[gp.gpu], fixed, cur))
    # Spare GPUs of one type and cap are interchangeable for single-GPU placements;
    # with node budgets, only within a node.
    per_node = any(n.power_budget_w is not None for n in target.instance.cluster.nodes)
    spare_classes: dict[tuple[str, str, float | None], list[str]] = defaultdict(list)
    for g in target.gpus:
        if not plans[g.id].on:
            spare_classes[(g.node if per_node else "", g.type, g.power_cap_w)].append(g.id)
    for ids in spare_classes.values():
        slots.append(_Slot(ids, by_id[ids[0]], [], []))
    usable = 1.0 - opts.memory_reserve_fraction
    for slot in slots:
        cap = power_cap_w(target, slot.gpu)
        memory = target.gpu_type(slot.gpu.type).memory_gb * usable
        if not _settings(table, slot, op_at, units, cap, memory):
            return None, set(), f"more than {MAX_CONFIGURATIONS:,} settings of {slot.gpu.id}"
        if slot.fixed and not slot.configs:
            return None, set(), f"{slot.gpu.id}: no clock holds its other placements"
    decided = {gid for s in slots for gid in s.gpus}

    cost: list[float] = []
    upper: list[float] = []
    integer: list[bool] = []

    def column(c: float, hi: float, is_int: bool) -> int:
        cost.append(c)
        upper.append(hi)
        integer.append(is_int)
        return len(cost) - 1

    count: dict[tuple[int, int], int] = {}  # (slot, config) -> column
    rate: dict[tuple[int, int, int], int] = {}  # (slot, config, op) -> column
    for i, slot in enumerate(slots):
        n = len(slot.gpus)
        for c, (_, ops, c_cost, _) in enumerate(slot.configs):
            count[(i, c)] = column(c_cost, float(n), True)
            for o in ops:
                rate[(i, c, o)] = column(float(table.marginal_j[o]), np.inf, False)
    moved: dict[tuple[int, int], int] = {}
    for i, slot in enumerate(slots):
        for u in slot.current:
            moved[(i, u)] = column(penalty_w, 1.0, False)

    data: list[tuple[int, int, float]] = []
    lo: list[float] = []
    hi: list[float] = []

    def add(terms: list[tuple[int, float]], low: float, high: float) -> None:
        k = len(lo)
        data.extend((k, col, v) for col, v in terms)
        lo.append(low)
        hi.append(high)

    inf = np.inf
    for i, slot in enumerate(slots):
        terms = [(count[(i, c)], 1.0) for c in range(len(slot.configs))]
        if terms:
            add(terms, 1.0 if slot.fixed else 0.0, float(len(slot.gpus)))
        for c, (_, ops, _, _) in enumerate(slot.configs):
            for o in ops:
                top = min(float(table.capacity_rps[o]), table.units[int(table.unit[o])].rate_rps)
                add([(rate[(i, c, o)], 1.0), (count[(i, c)], -top * (1.0 + 1e-6))], -inf, 0.0)
        for u in slot.current:
            keeps = [
                (count[(i, c)], 1.0)
                for c, (_, ops, _, _) in enumerate(slot.configs)
                if any(int(table.unit[o]) == u for o in ops)
            ]
            add([(moved[(i, u)], 1.0), *keeps], 1.0, inf)
    for u in units:
        terms = [(col, 1.0) for (_, _, o), col in rate.items() if int(table.unit[o]) == u]
        if not terms:
            return None, decided, f"{table.units[u].label}: no GPU offered can serve it"
        r_u = table.units[u].rate_rps
        add(terms, r_u, r_u)
    cluster = target.instance.cluster
    budgets = [n for n in cluster.nodes if n.power_budget_w is not None]
    if budgets or cluster.power_budget_w is not None:
        node_of = {g.id: g.node for g in target.gpus}
        outside: dict[str, float] = defaultdict(float)
        for gid, watts in _evaluate(target, current, full_verify).gpu_worst_w.items():
            if gid not in decided:
                outside[node_of[gid]] += watts

        def draws(node: str | None) -> list[tuple[int, float]]:
            """Worst-case draw terms of the slots of ``node`` (None: every slot)."""
            return [
                (count[(i, c)], cfg[3])
                for i, slot in enumerate(slots)
                if node is None or slot.gpu.node == node
                for c, cfg in enumerate(slot.configs)
            ]

        for node in budgets:
            assert node.power_budget_w is not None
            add(draws(node.name), -inf, node.power_budget_w - outside[node.name])
        if cluster.power_budget_w is not None:
            add(draws(None), -inf, cluster.power_budget_w - sum(outside.values()))

    n_cols = len(cost)
    matrix = sparse.csc_matrix(
        (
            np.asarray([d[2] for d in data], dtype=np.float64),
            (
                np.asarray([d[0] for d in data], dtype=np.int64),
                np.asarray([d[1] for d in data], dtype=np.int64),
            ),
        ),
        shape=(len(lo), n_cols),
    )
    lp = mixed_lp(
        np.asarray(cost),
        matrix,
        np.asarray(lo),
        np.asarray(hi),
        np.zeros(n_cols),
        np.asarray(upper),
        np.asarray(integer, dtype=np.bool_),
    )
    run = solve_mip(lp, time_limit_s=time_limit_s, rel_gap=rel_gap)
    if run.col_value is None:
        return None, decided, f"surprise MILP ({len(decided)} GPUs): {run.highs_status}"
    val = run.col_value
    decisions: dict[str, GpuDecision] = {}
    for i, slot in enumerate(slots):
        free_ids = list(slot.gpus)
        for c, (f, ops, _, _) in enumerate(slot.configs):
            k = round(float(val[count[(i, c)]]))
            if k <= 0:
                continue
            stay = [(o, r) for o, (_, _, r) in zip(slot.fixed_ops[f], slot.fixed, strict=True)]
            new = [(o, max(0.0, float(val[rate[(i, c, o)]])) / k) for o in ops]
            for _ in range(k):
                gid = free_ids.pop(0)
                decisions[gid] = GpuDecision(clock_mhz=f, ops=[*stay, *new])
    sub = target.with_instance(
        target.instance.model_copy(
            update={"cluster": _nodes_of(target, decided), "workloads": mini_wl}
        )
    )
    plan = assemble_plan(
        sub,
        table,
        decisions,
        solver="replan",
        status="feasible",
        objective=float(run.objective),
        bound=None,
        gap=None,
    )
    return plan, decided, ""


def _nodes_of(problem: Problem, keep: set[str]) -> Cluster:
    """``problem``'s cluster with only the GPUs of ``keep`` (no states)."""
    by_node: dict[str, list[GpuEntry]] = defaultdict(list)
    for g in problem.gpus:
        if g.id in keep:
            by_node[g.node].append(
                GpuEntry(type=g.type, count=1, ids=(g.id,), power_cap_w=g.power_cap_w)
            )
    nodes = tuple(
        Node(name=n.name, gpus=tuple(by_node[n.name]))
        for n in problem.instance.cluster.nodes
        if by_node.get(n.name)
    )
    return Cluster(nodes=nodes)
