"""Check a serving plan against the instance using the performance model directly.

Nothing here reads a solver's model: capacities, latencies, memory and power are
recomputed from the plan's own settings (GPU type, clock, share, rate, TP size).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.assemble import power_cap_w
from energyopt.perf.energy import design_batches, line_and_worst_case, service_latency_ms
from energyopt.perf.oppoints import op_spec, share_options
from energyopt.perf.params import FloatArray, OpParams, OpSpec, build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.perf.queueing import metrics_at, slo_capacity
from energyopt.spec.cluster import Gpu
from energyopt.spec.plan import GpuPlan, Placement, Plan
from energyopt.spec.workload import Phase
from energyopt.verify.violation import Violation

REL_TOL = 1e-6
ABS_RATE_TOL = 1e-6


Report = Callable[[Violation], None]


@dataclass
class PlacementCheck:
    """A placement (a TP group counted once) and the GPUs it occupies."""

    gpus: list[Gpu]
    plan: GpuPlan
    placement: Placement
    spec: OpSpec | None = None


@dataclass
class PlanEvaluation:
    """Recomputed figures of a plan."""

    violations: list[Violation] = field(default_factory=list)
    gpu_power_w: dict[str, float] = field(default_factory=dict)
    """Predicted power of each GPU that is on at the planned rates (W)."""
    gpu_worst_w: dict[str, float] = field(default_factory=dict)
    """Worst-case draw of each GPU that is on (W): on-power plus each placement's
    steady power at its SLO capacity, the most it may carry. Caps, power limits and
    budgets are checked on it."""
    total_power_w: float = 0.0
    gpus_on: int = 0
    served_rps: dict[str, float] = field(default_factory=dict)
    headroom: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    """(GPU, workload:phase) -> (TTFT, TBT) at the planned rate as fractions of the SLO."""
    static_power_w: float = 0.0
    """Power of the GPUs that are on with nothing running, at their clocks (W)."""
    delay_weighted_w: float = 0.0
    """Dynamic power, each placement's weighted by its unloaded latency over the same
    unit's at the type's max clock on a full GPU (the ``edp`` objective's term, W;
    computed for instances with that objective only)."""
    moved: int = 0
    """Current (GPU, unit) placements that the plan does not keep on their GPU."""
    objective: float = 0.0
    """The instance's objective evaluated on the plan (see ``plan_objective``)."""


def verify_plan(problem: Problem, plan: Plan) -> list[Violation]:
    """Every constraint the plan breaks; empty when it is feasible."""
    return evaluate_plan(problem, plan).violations


def evaluate_plan(problem: Problem, plan: Plan) -> PlanEvaluation:
    """Recompute power, service and SLO headroom, and list violations."""
    return _evaluate(problem, plan, None)


@dataclass
class PlacementFigures:
    """Figures the verifier computed before, for ``evaluate_plan_incremental``.

    Operating points are keyed by ``OpParams.row_keys`` (every parameter bitwise:
    workload, SLO, GPU type, clock, share; the rate is not one of them), each key
    holding the point's profile alive, as its ``id`` is part of the key."""

    capacity: dict[bytes, tuple[float, object]] = field(default_factory=dict)
    """Point -> (SLO capacity req/s, profile)."""
    placements: dict[bytes, tuple[bool, float, float, float, float, float, float]] = field(
        default_factory=dict
    )
    """(point, rate, workload rate) -> (stable, TTFT ms, TBT ms, decode batch, memory
    bytes per GPU, dynamic power W, worst-case draw W) of a placement."""

    def __len__(self) -> int:
        return len(self.capacity) + len(self.placements)


def learn_capacities(
    problem: Problem,
    points: Sequence[tuple[str, Phase, str, int, int]],
    verified: PlacementFigures,
) -> None:
    """Compute and keep in ``verified`` the SLO capacity of each single-GPU MPS
    placement of ``points`` ((workload, phase, GPU type, clock MHz, share %)) that it
    lacks, the placements' points built as ``evaluate_plan`` builds them; one run of
    the model over all of them."""
    usable = 1.0 - problem.instance.options.memory_reserve_fraction
    specs: list[OpSpec] = []
    for name, phase, type_name, clock, share in points:
        gtype = problem.gpu_type(type_name)
        frac = share / 100.0
        specs.append(
            op_spec(
                problem,
                problem.instance.workload(name),
                phase,
                gtype,
                clock,
                (share, None, frac, frac, gtype.memory_gb * usable),
                1,
            )
        )
    if not specs:
        return
    params = build_params(specs)
    _capacities(params, params.row_keys(), verified)


def _capacities(params: OpParams, keys: list[bytes], verified: PlacementFigures) -> FloatArray:
    """The SLO capacity (req/s) of each point of ``params`` (``keys``: its row keys),
    from ``verified`` or from one run of the model over those it lacks (then kept)."""
    found: dict[bytes, float] = {}
    todo: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        known = verified.capacity.get(key)
        if known is not None:
            found[key] = known[0]
        else:
            todo.setdefault(key, i)
    if todo:
        rows = params.take(np.asarray(list(todo.values()), dtype=np.int64))
        capacity = slo_capacity(rows)
        for j, key in enumerate(todo):
            found[key] = float(capacity[j])
            verified.capacity[key] = (found[key], rows.profile[j])
    return np.asarray([found[key] for key in keys], dtype=np.float64)


def evaluate_plan_incremental(
    problem: Problem, plan: Plan, verified: PlacementFigures
) -> PlanEvaluation:
    """``evaluate_plan``, taking the performance figures of each placement whose
    operating point, rate and workload rate are in ``verified`` from there instead of
    running the queueing model for it; the placements not there are computed and
    added to ``verified``. Every check (per GPU: placements, clock, power limit,
    shares, latency, memory, cap; fleet: demand, budgets, counts, objective) is run
    on the figures as ``evaluate_plan`` runs it. The model is elementwise (one
    point's figures do not depend on the others computed with it), so the result
    equals ``evaluate_plan``'s when ``verified`` holds figures that model computed,
    as ``evaluate_plan_incremental`` stores them. The ``edp`` objective's delay
    weights need every placement's design batch: with it every figure is
    recomputed."""
    return _evaluate(problem, plan, verified)


def _evaluate(problem: Problem, plan: Plan, verified: PlacementFigures | None) -> PlanEvaluation:
    """``evaluate_plan``; with ``verified``, ``evaluate_plan_incremental``."""
    ev = PlanEvaluation()
    bad = ev.violations.append
    gpus = {g.id: g for g in problem.gpus}
    seen: set[str] = set()
    plans: dict[str, GpuPlan] = {}
    for gp in plan.gpus:
        if gp.gpu not in gpus:
            bad(Violation("unknown-gpu", gp.gpu, "the cluster has no GPU with this id"))
            continue
        if gp.gpu in seen:
            bad(Violation("duplicate-gpu", gp.gpu, "the plan lists this GPU twice"))
            continue
        seen.add(gp.gpu)
        plans[gp.gpu] = gp
        if gp.type != gpus[gp.gpu].type:
            bad(
                Violation(
                    "gpu-type", gp.gpu, f"plan says {gp.type}, cluster has {gpus[gp.gpu].type}"
                )
            )
    checks = _collect_placements(problem, plans, gpus, bad)
    _check_gpu_settings(problem, plans, gpus, bad)
    _check_shares(problem, plans, bad)
    if checks:
        _check_performance(problem, checks, plans, gpus, ev, verified)
    _check_demand(problem, checks, ev)
    _check_budgets(problem, ev)
    ev.gpus_on = sum(1 for gp in plans.values() if gp.on)
    ev.total_power_w = sum(ev.gpu_power_w.values())
    ev.moved = _moved_placements(problem, plans)
    ev.objective = plan_objective(problem, ev)
    return ev


def plan_objective(problem: Problem, ev: PlanEvaluation) -> float:
    """The instance's objective on an evaluated plan, from its recomputed figures.

    power           : total power (W).
    power_migration : total power + migration_penalty_w per current placement moved.
    gpus_on         : GPUs on + total power / the fleet's summed TDP.
    edp             : on-power + delay-weighted dynamic power (W).
    """
    opts = problem.instance.options
    if opts.objective == "gpus_on":
        scale = sum(problem.gpu_type(g.type).tdp_w for g in problem.gpus)
        return ev.gpus_on + ev.total_power_w / scale
    if opts.objective == "edp":
        return ev.static_power_w + ev.delay_weighted_w
    if opts.objective == "power_migration":
        return ev.total_power_w + opts.migration_penalty_w * ev.moved
    return ev.total_power_w


def _moved_placements(problem: Problem, plans: dict[str, GpuPlan]) -> int:
    """Current (workload, phase) pairs of each GPU that the plan does not place there
    as a single-GPU placement."""
    moved = 0
    for gpu in problem.gpus:
        if gpu.state is None:
            continue
        current = {(p.workload, p.phase) for p in gpu.state.placements}
        gp = plans.get(gpu.id)
        kept = set()
        if gp is not None and gp.on:
            kept = {(p.workload, p.phase) for p in gp.placements if p.tp_group is None}
        moved += len(current - kept)
    return moved


def _collect_placements(
    problem: Problem, plans: dict[str, GpuPlan], gpus: dict[str, Gpu], report: Report
) -> list[PlacementCheck]:
    units = {(w.name, ph) for w in problem.instance.workloads for ph in w.phases()}
    checks: list[PlacementCheck] = []
    groups: dict[str, list[tuple[GpuPlan, Placement]]] = defaultdict(list)
    for gp in plans.values():
        if not gp.on:
            if gp.placements:
                report(Violation("off-gpu-work", gp.gpu, "GPU is off but has placements"))
            continue
        for pl in gp.placements:
            if (pl.workload, pl.phase) not in units:
                report(
                    Violation(
                        "unknown-unit", gp.gpu, f"no unit {pl.workload}:{pl.phase} in the instance"
                    )
                )
                continue
            if pl.tp_group is None:
                if pl.tp_size != 1:
                    report(
                        Violation(
                            "tp-group",
                            gp.gpu,
                            f"{pl.workload}: tp_size {pl.tp_size} without a tp_group",
                        )
                    )
                    continue
                checks.append(PlacementCheck([gpus[gp.gpu]], gp, pl))
            else:
                groups[pl.tp_group].append((gp, pl))
    for gid, members in groups.items():
        first_gp, first = members[0]
        size = first.tp_size
        problems = []
        if len(members) != size:
            problems.append(f"has {len(members)} GPUs but tp_size {size}")
        if len({gpus[gp.gpu].node for gp, _ in members}) > 1:
            problems.append("spans more than one node")
        if len({gp.type for gp, _ in members}) > 1 or len({gp.clock_mhz for gp, _ in members}) > 1:
            problems.append("mixes GPU types or clocks")
        if len({(p.workload, p.phase, round(p.rate_rps, 9), p.tp_size) for _, p in members}) > 1:
            problems.append("members disagree on workload, rate or size")
        for gp, _ in members:
            if len(gp.placements) > 1:
                problems.append(f"member {gp.gpu} runs other work (TP GPUs are whole)")
        if problems:
            for text in problems:
                report(Violation("tp-group", gid, text))
            continue
        checks.append(PlacementCheck([gpus[gp.gpu] for gp, _ in members], first_gp, first))
    return checks


def _check_gpu_settings(
    problem: Problem, plans: dict[str, GpuPlan], gpus: dict[str, Gpu], report: Report
) -> None:
    for gp in plans.values():
        if not gp.on:
            continue
        gtype = problem.gpu_type(gpus[gp.gpu].type)
        if gp.clock_mhz is None or gp.clock_mhz not in gtype.sm_clocks_mhz():
            near = gtype.nearest_clocks_mhz(gp.clock_mhz or 0)
            report(
                Violation(
                    "clock",
                    gp.gpu,
                    f"{gp.clock_mhz} MHz is not a supported clock of {gtype.name}; nearest: {near}",
                )
            )
        cap = power_cap_w(problem, gpus[gp.gpu])
        limit = gp.power_limit_w
        if limit is None or not gtype.power_limit_min_w - 1e-9 <= limit <= cap + 1e-9:
            report(
                Violation(
                    "power-limit",
                    gp.gpu,
                    f"power limit {limit} W outside [{gtype.power_limit_min_w}, {cap}] W",
                )
            )


def _check_shares(problem: Problem, plans: dict[str, GpuPlan], report: Report) -> None:
    from energyopt.catalog.mig import layout_problem as mig_layout_problem

    sharing = problem.instance.options.sharing
    for gp in plans.values():
        if not gp.on or not gp.placements:
            continue
        gtype = problem.gpu_type(gp.type)
        if (
            sharing.mode == "mig"
            and gtype.mig_profiles
            and all(p.tp_group is None for p in gp.placements)
        ):
            names: list[str] = []
            for pl in gp.placements:
                try:
                    names.append(gtype.mig_profile(pl.mig_profile or "").name)
                except KeyError:
                    report(
                        Violation(
                            "mig", gp.gpu, f"{pl.workload}: unknown MIG profile {pl.mig_profile!r}"
                        )
                    )
            if len(names) == len(gp.placements):
                reason = mig_layout_problem(gtype, names)
                if reason is not None:
                    report(Violation("mig", gp.gpu, reason))
        else:
            total = sum(pl.share_pct for pl in gp.placements)
            if total > 100:
                report(Violation("share", gp.gpu, f"SM shares add up to {total}% (> 100%)"))
            units = [(pl.workload, pl.phase) for pl in gp.placements]
            if len(set(units)) != len(units):
                report(Violation("share", gp.gpu, "a unit is placed twice on one GPU"))


def _share_of(
    problem: Problem, gp: GpuPlan, pl: Placement
) -> tuple[int, str | None, float, float, float] | None:
    gtype = problem.gpu_type(gp.type)
    usable = 1.0 - problem.instance.options.memory_reserve_fraction
    if pl.tp_size > 1:
        return (100, None, 1.0, 1.0, gtype.memory_gb * usable)
    if pl.mig_profile is not None:
        for option in share_options(problem, gtype):
            if option[1] == pl.mig_profile:
                return option
        return None
    frac = pl.share_pct / 100.0
    return (pl.share_pct, None, frac, frac, gtype.memory_gb * usable)


def _check_performance(
    problem: Problem,
    checks: list[PlacementCheck],
    plans: dict[str, GpuPlan],
    gpus: dict[str, Gpu],
    ev: PlanEvaluation,
    verified: PlacementFigures | None = None,
) -> None:
    bad = ev.violations.append
    valid: list[PlacementCheck] = []
    for c in checks:
        share = _share_of(problem, c.plan, c.placement)
        if share is None or c.plan.clock_mhz is None:
            continue
        wl = problem.instance.workload(c.placement.workload)
        c.spec = op_spec(
            problem,
            wl,
            c.placement.phase,
            problem.gpu_type(c.plan.type),
            c.plan.clock_mhz,
            share,
            c.placement.tp_size,
        )
        valid.append(c)
    power: dict[str, float] = {}
    for gp in plans.values():
        if gp.on and gp.clock_mhz is not None:
            power[gp.gpu] = gpu_on_power_w(problem.gpu_type(gp.type), gp.clock_mhz)
    ev.static_power_w = sum(power.values())
    worst = dict(power)
    memory: dict[str, float] = defaultdict(float)
    if valid:
        params = build_params([c.spec for c in valid if c.spec is not None])
        rates = np.asarray([c.placement.rate_rps for c in valid], dtype=np.float64)
        edp = problem.instance.options.objective == "edp"
        if verified is None or edp:
            met = metrics_at(params, rates)
            stable, ttft_ms, tbt_ms = met.stable, met.ttft_ms, met.tbt_ms
            batch_n, memory_bytes = met.batch, met.memory_bytes
            dynamic, peak = _placement_power(problem, valid, params, rates)
        else:
            figures = _placement_figures(problem, valid, params, rates, verified)
            stable = np.asarray([f[0] for f in figures], dtype=np.bool_)
            ttft_ms, tbt_ms, batch_n, memory_bytes, dynamic, peak = (
                np.asarray([f[k] for f in figures], dtype=np.float64) for k in range(1, 7)
            )
        if edp:
            ref_params = _reference_params(problem, valid)
            batch, ref_batch = design_batches([params, ref_params])
            ratio = _delay_ratio(params, batch, ref_params, ref_batch)
            ev.delay_weighted_w = float(np.sum(dynamic * ratio))
        for i, c in enumerate(valid):
            pl = c.placement
            where = f"{'+'.join(g.id for g in c.gpus)} {pl.workload}:{pl.phase}"
            slo = problem.instance.workload(pl.workload).slo
            tol = 1.0 + REL_TOL
            if not stable[i]:
                bad(
                    Violation(
                        "capacity",
                        where,
                        f"{pl.rate_rps:.4g} req/s overloads this operating point "
                        "(queue grows without bound)",
                    )
                )
            elif ttft_ms[i] > slo.ttft_ms * tol:
                bad(
                    Violation(
                        "ttft",
                        where,
                        f"p{slo.percentile:g} TTFT {ttft_ms[i]:.1f} ms > "
                        f"SLO {slo.ttft_ms:g} ms at {pl.rate_rps:.4g} req/s",
                    )
                )
            elif tbt_ms[i] > slo.tbt_ms * tol:
                bad(
                    Violation(
                        "tbt",
                        where,
                        f"p{slo.percentile:g} TBT {tbt_ms[i]:.1f} ms > "
                        f"SLO {slo.tbt_ms:g} ms at {pl.rate_rps:.4g} req/s",
                    )
                )
            if batch_n[i] > problem.instance.options.max_batch * tol:
                bad(Violation("batch", where, f"decode batch {batch_n[i]:.0f} exceeds max_batch"))
            ttft_frac = ttft_ms[i] / slo.ttft_ms if pl.phase != "decode" else 0.0
            tbt_frac = tbt_ms[i] / slo.tbt_ms if pl.phase != "prefill" else 0.0
            for g in c.gpus:
                ev.headroom[(g.id, f"{pl.workload}:{pl.phase}")] = (
                    float(ttft_frac),
                    float(tbt_frac),
                )
                memory[g.id] += float(memory_bytes[i]) / 1e9
                if g.id in power:
                    power[g.id] += float(dynamic[i]) / len(c.gpus)
                    worst[g.id] += float(peak[i]) / len(c.gpus)
            if (
                pl.mig_profile is not None
                and c.spec is not None
                and memory_bytes[i] / 1e9 > c.spec.memory_gb * tol
            ):
                bad(
                    Violation(
                        "memory",
                        where,
                        f"needs {memory_bytes[i] / 1e9:.1f} GB, "
                        f"MIG instance has {c.spec.memory_gb:.1f} GB usable",
                    )
                )
    usable_frac = 1.0 - problem.instance.options.memory_reserve_fraction
    for gid, used in memory.items():
        gp = plans[gid]
        if any(p.mig_profile for p in gp.placements):
            continue
        usable = problem.gpu_type(gp.type).memory_gb * usable_frac
        if used > usable * (1.0 + REL_TOL):
            bad(Violation("memory", gid, f"placements need {used:.1f} GB, {usable:.1f} GB usable"))
    for gid, watts in worst.items():
        gp = plans[gid]
        cap = power_cap_w(problem, gpus[gid])
        if watts > cap * (1.0 + REL_TOL):
            bad(
                Violation(
                    "power-cap",
                    gid,
                    f"worst-case draw {watts:.0f} W (every placement at its capacity) "
                    f"exceeds the GPU cap {cap:.0f} W",
                )
            )
        elif gp.power_limit_w is not None and watts > gp.power_limit_w * (1.0 + REL_TOL):
            bad(
                Violation(
                    "power-limit",
                    gid,
                    f"worst-case draw {watts:.0f} W (every placement at its capacity) "
                    f"exceeds its power limit {gp.power_limit_w:.0f} W",
                )
            )
    ev.gpu_power_w = power
    ev.gpu_worst_w = worst


def _placement_power(
    problem: Problem,
    valid: list[PlacementCheck],
    params: OpParams,
    rates: FloatArray,
    capacity: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Each placement's dynamic power at its rate (its power line through the steady
    power at its top rate: its SLO capacity, or its workload's rate if less) and its
    worst-case draw at capacity (W, whole TP group), recomputed from the model
    (``capacity``: the points' SLO capacities, req/s, computed here when None)."""
    if capacity is None:
        first, inverse = params.distinct()
        capacity = slo_capacity(params.take(first))[inverse]
    unit_rate = np.asarray(
        [problem.instance.workload(c.placement.workload).rate_rps for c in valid],
        dtype=np.float64,
    )
    top = np.where(unit_rate > 0, np.minimum(capacity, unit_rate), capacity)
    top = np.where(capacity > 1e-9, top, 0.0)
    line, peak = line_and_worst_case(params, top, np.where(capacity > 1e-9, capacity, rates))
    dynamic = line.at(rates)
    return dynamic, np.maximum(peak, dynamic)


def _placement_figures(
    problem: Problem,
    valid: list[PlacementCheck],
    params: OpParams,
    rates: FloatArray,
    verified: PlacementFigures,
) -> list[tuple[bool, float, float, float, float, float, float]]:
    """Each placement's figures (``PlacementFigures.placements``) from ``verified``,
    or, for those not there, from one run of the model over them (then kept)."""
    unit_rate = np.asarray(
        [problem.instance.workload(c.placement.workload).rate_rps for c in valid],
        dtype=np.float64,
    )
    rows = params.row_keys()
    keys = [
        row + rates[i : i + 1].tobytes() + unit_rate[i : i + 1].tobytes()
        for i, row in enumerate(rows)
    ]
    found: dict[bytes, tuple[bool, float, float, float, float, float, float]] = {}
    todo: dict[bytes, int] = {}
    for i, key in enumerate(keys):
        known = verified.placements.get(key)
        if known is not None:
            found[key] = known
        else:
            todo.setdefault(key, i)
    if todo:
        index = np.asarray(list(todo.values()), dtype=np.int64)
        sub, at = params.take(index), rates[index]
        capacity = _capacities(sub, [rows[i] for i in index], verified)
        met = metrics_at(sub, at)
        dynamic, peak = _placement_power(
            problem, [valid[i] for i in index], sub, at, capacity=capacity
        )
        for j, key in enumerate(todo):
            found[key] = verified.placements[key] = (
                bool(met.stable[j]),
                float(met.ttft_ms[j]),
                float(met.tbt_ms[j]),
                float(met.batch[j]),
                float(met.memory_bytes[j]),
                float(dynamic[j]),
                float(peak[j]),
            )
    return [found[key] for key in keys]


def _reference_params(problem: Problem, valid: list[PlacementCheck]) -> OpParams:
    """Each placement's op at max clock on a full GPU (the EDP delay reference)."""
    usable = 1.0 - problem.instance.options.memory_reserve_fraction
    refs = []
    for c in valid:
        gtype = problem.gpu_type(c.plan.type)
        full = (100, None, 1.0, 1.0, gtype.memory_gb * usable)
        wl = problem.instance.workload(c.placement.workload)
        refs.append(
            op_spec(
                problem,
                wl,
                c.placement.phase,
                gtype,
                gtype.max_sm_clock_mhz,
                full,
                c.placement.tp_size,
            )
        )
    return build_params(refs)


def _delay_ratio(
    params: OpParams, batch: FloatArray, ref_params: OpParams, ref_batch: FloatArray
) -> FloatArray:
    """Each placement's unloaded latency over its unit's at max clock on a full GPU
    (``_reference_params``), both at their design batches."""
    ref = service_latency_ms(ref_params, ref_batch)
    latency = service_latency_ms(params, batch)
    return np.asarray(np.where(ref > 0, latency / np.where(ref > 0, ref, 1.0), 1.0))


def _check_demand(problem: Problem, checks: list[PlacementCheck], ev: PlanEvaluation) -> None:
    served: dict[str, float] = defaultdict(float)
    for c in checks:
        served[f"{c.placement.workload}:{c.placement.phase}"] += c.placement.rate_rps
    for wl in problem.instance.workloads:
        for phase in wl.phases():
            key = f"{wl.name}:{phase}"
            got = served.get(key, 0.0)
            ev.served_rps[key] = got
            if abs(got - wl.rate_rps) > max(ABS_RATE_TOL, REL_TOL * wl.rate_rps):
                ev.violations.append(
                    Violation(
                        "demand",
                        key,
                        f"plan routes {got:.6g} req/s, workload arrives at {wl.rate_rps:g} req/s",
                    )
                )


def _check_budgets(problem: Problem, ev: PlanEvaluation) -> None:
    cluster = problem.instance.cluster
    node_of = {g.id: g.node for g in problem.gpus}
    per_node: dict[str, float] = defaultdict(float)
    for gid, watts in ev.gpu_worst_w.items():
        per_node[node_of[gid]] += watts
    for node in cluster.nodes:
        if node.power_budget_w is not None and per_node[node.name] > node.power_budget_w * (
            1.0 + REL_TOL
        ):
            ev.violations.append(
                Violation(
                    "node-budget",
                    node.name,
                    f"GPUs may draw {per_node[node.name]:.0f} W (worst case), "
                    f"budget {node.power_budget_w:.0f} W",
                )
            )
    total = sum(per_node.values())
    if cluster.power_budget_w is not None and total > cluster.power_budget_w * (1.0 + REL_TOL):
        ev.violations.append(
            Violation(
                "cluster-budget",
                "cluster",
                f"GPUs may draw {total:.0f} W (worst case), budget {cluster.power_budget_w:.0f} W",
            )
        )
