"""MoE placement, exact: every configuration's program with HiGHS.

The TBT row, mean + kappa * sqrt(variance) <= tbt_ms, is not convex in the
placement, so per configuration (dense GPU, clocks) it is solved by refinement.
sqrt is taken as the chord of the piece of [0, V_max] that holds the variance (at
first one piece: the secant); every chord lies below sqrt, so the program is a
relaxation and its optimum bounds the configuration from below. A relaxed optimum
that meets the true (Cantelli) row is the configuration's optimum. One that breaks
it gets a breakpoint at its own variance (there the chord is sqrt itself, so the
refined program cuts it off) and an exclusion row (which cuts off that placement
and no other), and the program is solved again. Every placement cut off breaks the
true row, so no feasible plan is ever lost: the configuration ends optimal,
proven infeasible, or no better than the best plan (pruned), or it is left open
at the time limit with its last bound. The first time a relaxed optimum breaks the
row, the tangent form at its variance (a restriction: its plans meet the row) is
solved once for an early plan to prune with.

A configuration of at most ``ENUMERATE_PLANS`` placements (tiny instances) is
enumerated instead (``enumeration.py``): its bound is its exact optimum, not the
optimum less HiGHS' gap, so an instance made only of such configurations ends with
the bound equal to the objective, or proven infeasible.

Configurations that relabelling identical GPUs makes equal are solved once
(``MoeEdgeProblem.canonical_configs``), most promising (least unpriced bound)
first while their costs are cheap to list. The bound is the least configuration
bound; configurations the time limit leaves unvisited are bounded together per
dense GPU (``floor_bound``). The plan is the best one found.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from energyopt.backends.highs import MipStatus, solve_mip
from energyopt.families.moe_edge.formulations.figures import figures
from energyopt.families.moe_edge.formulations.milp import (
    FORMULATION_NAME,
    Milp,
    allowed,
    build_milp,
    constant_objective,
    item_objective,
    pair_saving,
    secant,
    tangent,
    v_max,
)
from energyopt.families.moe_edge.formulations.model import (
    Config,
    ConfigCosts,
    IntArray,
    MoeEdgeProblem,
    config_costs,
)
from energyopt.families.moe_edge.solvers.enumeration import enumerate_config, placement_count
from energyopt.families.moe_edge.spec import MoeEdgePlan
from energyopt.perf.power import gpu_on_power_w
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Result,
    Termination,
    relative_gap,
)

OBJECTIVE_SCALE = 1e4
"""The size HiGHS sees the objective at (its absolute gap is 1e-6)."""
SORTED_CONFIGS = 2048
"""Up to this many configurations, all are costed first and solved in order of their
unpriced bound (a good plan early prunes the rest); above it, in listed order."""
SORT_SHARE = 0.1
"""Share of the time limit that costing the configurations for that order may take."""
BREAK_TOL = 1e-9
"""Relative distance under which a new breakpoint is taken as an existing one."""
BOUND_TOL = 1e-9
ENUMERATE_PLANS = 1 << 18
"""A configuration of at most this many placements (262,144: every expert of a
2-layer, 4-expert model at one of 4 options is 65,536) is enumerated, not refined
with HiGHS: its exact optimum in well under a second."""
"""Relative amount by which a bound may exceed the plan's objective (rounding)."""


def algorithm(enumerate_up_to: int) -> str:
    """What ``solve_milp`` runs, in words."""
    text = "HiGHS branch and cut per configuration, TBT row refined to exactness"
    if enumerate_up_to > 0:
        text += f"; configurations of at most {enumerate_up_to:,} placements enumerated"
    return text


def sound_bound(objective: float, bound: float | None, log: list[str]) -> float | None:
    """``bound``, or None (logged) when it exceeds ``objective``: a bound above a
    verified plan is invalid, and must neither be reported nor make a status optimal."""
    if bound is not None and bound > objective + BOUND_TOL * max(abs(objective), 1e-9):
        log.append(f"invalid bound {bound:.9g} above the plan's objective {objective:.9g}: dropped")
        return None
    return bound


def unpriced_bound(p: MoeEdgeProblem, c: ConfigCosts) -> float:
    """A lower bound on configuration ``c``'s optimum without solving anything: every
    expert at its cheapest option, every pair saving taken (memory, SLO, TTFT and
    power rows dropped). Valid for the energy objective and for the latency one."""
    ok = allowed(p, c)
    obj = np.where(ok, item_objective(p, c), np.inf)
    return float(constant_objective(p, c) + obj.min(axis=1).sum() - pair_saving(p, c).sum())


def floor_bound(p: MoeEdgeProblem, dense: int) -> float:
    """A lower bound on the optimum of every configuration with the dense part on GPU
    ``dense``, whatever the clocks, from the configurations that put every GPU at its
    k-th clock (its last where it has fewer), k = 1, 2, ...: an option's time and
    dynamic energy depend on one GPU's clock only, and these configurations give
    every GPU each of its clocks, so their least values over them are their least
    values over all; the server's static power is taken at its least (its largest
    where a pair's saving is subtracted). Rows dropped as in ``unpriced_bound``; inf
    when the dense part does not fit."""
    most = max(len(c) for c in p.clock_options)
    configs = [
        Config(dense, tuple(int(c[min(k, len(c) - 1)]) for c in p.clock_options))
        for k in range(most)
    ]
    server = p.spec.server
    on = [[gpu_on_power_w(gpu, clk) for clk in p.clock_options[g]] for g, gpu in enumerate(p.gpus)]
    rest = server.cpu.idle_w + server.base_w
    static_lo = sum(min(w) for w in on) + rest
    static_hi = sum(max(w) for w in on) + rest
    time_lo = dyn_lo = None
    dense_ms = dense_dyn = np.inf
    ok = None
    for config in configs:
        c = config_costs(p, config)
        if c.gpu_free_gb[dense] < 0:
            return np.inf
        dyn = c.energy_j - c.static_w * c.time_ms / 1e3
        time_lo = c.time_ms if time_lo is None else np.minimum(time_lo, c.time_ms)
        dyn_lo = dyn if dyn_lo is None else np.minimum(dyn_lo, dyn)
        dense_ms = min(dense_ms, c.dense_ms)
        dense_dyn = min(dense_dyn, c.dense_j - c.static_w * c.dense_ms / 1e3)
        ok = allowed(p, c)
    assert time_lo is not None and dyn_lo is not None and ok is not None
    save_ms = float(c.pair_save_ms.sum())
    batch = p.spec.batch
    if p.spec.objective.kind == "energy":
        items = np.where(ok, (dyn_lo + static_lo * time_lo / 1e3) / batch, np.inf)
        const = (dense_dyn + static_lo * dense_ms / 1e3) / batch
        saved = static_hi * save_ms / 1e3 / batch
    else:
        items = np.where(ok, time_lo, np.inf)
        const, saved = dense_ms, save_ms
    return float(const + items.min(axis=1).sum() - saved)


def run_milp(
    milp: Milp, p: MoeEdgeProblem, time_limit_s: float, rel_gap: float, cutoff: float | None
) -> tuple[IntArray | None, float, bool]:
    """(choice or None, a lower bound on the program's optimum, solved within
    ``rel_gap`` or proven to hold nothing better than ``cutoff``).

    The objective is scaled to about ``OBJECTIVE_SCALE`` for HiGHS, whose absolute gap
    (1e-6) would otherwise stop it early on objectives of a few hundredths of a J
    per token. HiGHS may close a node within its gap of the incumbent (or of the
    cutoff), so the bound returned is at most the incumbent (cutoff) less the gap
    HiGHS was given: that much the optimum may lie below. Its dual bound holds only up
    to the cutoff, so the bound returned is at most the cutoff less that gap."""
    lp = milp.lp()
    size = max(abs(milp.constant), float(np.abs(milp.cost).max(initial=0.0)), 1e-12)
    scale = OBJECTIVE_SCALE / size
    lp.col_cost_ = np.asarray(milp.cost) * scale
    lp.offset_ = milp.constant * scale
    has_cutoff = cutoff is not None and np.isfinite(cutoff)
    # HiGHS measures its gap its own way: ask for half, so that ours is within rel_gap
    rel_gap = 0.5 * rel_gap
    run = solve_mip(
        lp,
        time_limit_s=max(0.05, time_limit_s),
        rel_gap=rel_gap,
        objective_bound=float(cutoff) * scale if has_cutoff and cutoff is not None else None,
    )
    if run.status in (MipStatus.INFEASIBLE, MipStatus.CUT_OFF):
        if cutoff is None or not has_cutoff:
            return None, np.inf, True
        return None, float(cutoff) - rel_gap * abs(float(cutoff)), True
    bound = run.dual_bound / scale if np.isfinite(run.dual_bound) else -np.inf
    if has_cutoff and cutoff is not None:
        # HiGHS prunes every node that cannot beat the cutoff, plans worth exactly the
        # cutoff included, and may then report a worse incumbent as optimal with its
        # dual bound equal to it: past the cutoff, its bound says nothing
        bound = min(bound, float(cutoff) - rel_gap * abs(float(cutoff)))
    if run.col_value is None:
        return None, bound, run.optimal
    if np.isfinite(run.objective):
        found = run.objective / scale
        bound = min(bound, found - rel_gap * abs(found))
    return milp.choice(np.round(run.col_value), p.n_items), bound, run.optimal


@dataclass
class ConfigOutcome:
    """What refining one configuration established."""

    bound: float
    """Lower bound on the configuration's optimum (inf: proven infeasible)."""
    plan: tuple[float, IntArray] | None
    """The best feasible placement found in it, with its objective."""
    closed: bool
    """Optimal within the gap, proven infeasible, or proven no better than the cutoff."""
    rounds: int
    """Programs solved."""
    enumerated: int = 0
    """Placements enumerated (0: the configuration was refined with HiGHS)."""


def solve_config(
    p: MoeEdgeProblem,
    c: ConfigCosts,
    *,
    cutoff: float | None,
    deadline: float,
    rel_gap: float,
    enumerate_up_to: int = 0,
) -> ConfigOutcome:
    """Refine configuration ``c``'s relaxation until its optimum meets the true TBT
    row, it is infeasible, or it cannot beat ``cutoff`` (the best objective found
    elsewhere); ``deadline`` is a ``time.perf_counter()`` value. A configuration of
    at most ``enumerate_up_to`` placements is enumerated instead: its bound is then
    its exact optimum (inf when it has no plan), whatever ``rel_gap``."""
    if enumerate_up_to > 0 and placement_count(p, c) <= enumerate_up_to:
        listed = enumerate_config(p, c, deadline)
        if listed.complete:
            exact = np.inf if listed.plan is None else listed.plan[0]
            return ConfigOutcome(exact, listed.plan, True, 0, listed.placements)
        return ConfigOutcome(unpriced_bound(p, c), listed.plan, False, 0, listed.placements)
    vm = v_max(c)
    breaks = [0.0, vm]
    exclude: list[IntArray] = []
    bound = unpriced_bound(p, c)
    found: tuple[float, IntArray] | None = None
    tangent_tried = False
    rounds = 0

    def best() -> float | None:
        if found is not None and (cutoff is None or found[0] < cutoff):
            return found[0]
        return cutoff

    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return ConfigOutcome(bound, found, False, rounds)
        limit = best()
        if limit is not None and relative_gap(limit, bound) <= rel_gap + 1e-12:
            return ConfigOutcome(bound, found, True, rounds)
        pieces = breaks if len(breaks) > 2 else ()
        milp = build_milp(p, c, secant(vm), breaks=pieces, exclude=exclude)
        choice, run_bound, done = run_milp(milp, p, left, rel_gap, limit)
        rounds += 1
        if choice is None:
            if done:  # infeasible, or nothing better than the cutoff
                return ConfigOutcome(max(bound, run_bound), found, True, rounds)
            return ConfigOutcome(max(bound, run_bound), found, False, rounds)
        if done:
            bound = max(bound, run_bound)
        fig = figures(p, c, choice)
        if fig.feasible:
            if found is None or fig.objective < found[0]:
                found = (fig.objective, choice)
            if done:
                return ConfigOutcome(bound, found, True, rounds)
            return ConfigOutcome(max(bound, run_bound), found, False, rounds)
        bound = max(bound, run_bound)
        exclude.append(choice)
        var = fig.var_ms2
        if 0.0 < var < vm and all(abs(var - b) > BREAK_TOL * max(vm, 1e-300) for b in breaks):
            breaks = sorted([*breaks, var])
        if not tangent_tried and deadline - time.perf_counter() > 0:
            tangent_tried = True
            plan, _, _ = run_milp(
                build_milp(p, c, tangent(var)),
                p,
                deadline - time.perf_counter(),
                rel_gap,
                best(),
            )
            rounds += 1
            if plan is not None:
                f = figures(p, c, plan)
                if f.feasible and (found is None or f.objective < found[0]):
                    found = (f.objective, plan)


def solve_milp(
    p: MoeEdgeProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
    enumerate_up_to: int = ENUMERATE_PLANS,
) -> Result[MoeEdgePlan]:
    """Exact within ``rel_gap`` over every configuration (or the best plan and bound at
    the time limit). Objective in J/token or ms/token. Configurations of at most
    ``enumerate_up_to`` placements are enumerated (their bound is their optimum, so
    an instance made only of them ends with the bound equal to the objective); 0
    refines every configuration with HiGHS."""
    t0 = time.perf_counter()
    count = p.n_canonical_configs()
    first = next(p.iter_canonical_configs())
    # time to keep for bounding, per dense GPU, what the time limit leaves unvisited
    p.costs(first)  # the first call also warms up
    t1 = time.perf_counter()
    p.costs(p.max_clock_config(first.dense))
    per_costs_s = time.perf_counter() - t1
    _, dense_class = p.gpu_classes()
    dense_gpus = [d for d in range(p.n_gpus) if dense_class[d] == d]
    floor_costs = len(dense_gpus) * max(len(c) for c in p.clock_options)
    reserve_s = min(0.5 * time_limit_s, 2.0 * floor_costs * per_costs_s)
    configs: Iterable[Config] = p.iter_canonical_configs()
    if count <= SORTED_CONFIGS:
        listed = list(configs)
        configs = listed
        costed = []
        for n, k in enumerate(listed):
            if time.perf_counter() - t0 > SORT_SHARE * time_limit_s:
                break  # costing them all would eat the time: keep the listed order
            costed.append((unpriced_bound(p, p.costs(k)), n, k))
        else:
            configs = [k for _, _, k in sorted(costed)]
    best: tuple[float, Config, IntArray] | None = None
    bounds: dict[Config, float] = {}
    unvisited = False
    left_open: list[Config] = []
    rounds = 0
    enumerated = listed_configs = 0
    log: list[str] = []
    # first pass: every configuration in a share of the time; second and later
    # passes: those left open, least bound first, in the time the first left over
    todo: Iterable[Config] = configs
    size = count
    passes = 0
    while True:
        passes += 1
        left_open = []
        listed = list(todo) if passes > 1 else []
        for n, config in enumerate(listed if passes > 1 else todo):
            if time.perf_counter() - t0 >= time_limit_s - reserve_s:
                if passes == 1:
                    unvisited = True
                else:
                    left_open += listed[n:]
                break
            c = p.costs(config)
            if c.gpu_free_gb[config.dense] < 0:
                bounds[config] = np.inf
                continue
            cutoff = None if best is None else best[0]
            pre = max(unpriced_bound(p, c), bounds.get(config, -np.inf))
            # a configuration cheap to enumerate is pruned only by a bound at the cutoff
            # itself, so that the run can end with the bound equal to the objective
            enumerable = enumerate_up_to > 0 and placement_count(p, c) <= enumerate_up_to
            prune_gap = 0.0 if enumerable else rel_gap
            if cutoff is not None and relative_gap(cutoff, pre) <= prune_gap + 1e-12:
                bounds[config] = pre
                continue
            left = time_limit_s - reserve_s - (time.perf_counter() - t0)
            # a share of the time left, more while few configurations remain; what a
            # configuration leaves unused goes to the later ones
            share = max(left / max(size - n, 1), min(left, 0.05))
            if best is None:
                share = max(share, 0.5 * left)  # a first plan matters more than an even split
            out = solve_config(
                p,
                c,
                cutoff=cutoff,
                deadline=time.perf_counter() + share,
                rel_gap=rel_gap,
                enumerate_up_to=enumerate_up_to,
            )
            rounds += out.rounds
            enumerated += out.enumerated
            listed_configs += out.enumerated > 0
            bounds[config] = max(pre, out.bound)
            if not out.closed:
                left_open.append(config)
            if out.plan is not None and (best is None or out.plan[0] < best[0]):
                best = (out.plan[0], config, out.plan[1])
            progress(
                f"milp: pass {passes}, config {n + 1}/{size} (dense {config.dense}, "
                f"clocks {config.clocks}): bound {bounds[config]:.6g}, {out.rounds} programs"
                + ("" if best is None else f", best {best[0]:.6g}")
            )
        if unvisited or not left_open or time.perf_counter() - t0 >= time_limit_s - reserve_s:
            break
        todo = sorted(left_open, key=lambda k: bounds[k])
        size = len(left_open)
    all_done = not unvisited and not left_open
    # configurations never reached: bounded together per dense GPU
    floors = [floor_bound(p, d) for d in dense_gpus] if unvisited else []
    bound_list = [*bounds.values(), *floors]
    bound = min(bound_list) if bound_list else -np.inf
    wall = time.perf_counter() - t0
    log.append(
        f"{count:,} configurations ({p.n_configs():,} before symmetry), "
        f"{rounds} programs in {passes} passes, "
        + (
            f"{enumerated:,} placements of {listed_configs} configurations enumerated, "
            if listed_configs
            else ""
        )
        + (
            "all closed"
            if all_done
            else f"{count - len(bounds) + len(left_open):,} left open or unvisited"
        )
    )
    bound_or_none = float(bound) if np.isfinite(bound) else None
    termination = Termination.CONVERGED if all_done else Termination.TIME_LIMIT
    if best is None:
        proven = all_done and not np.isfinite(bound) and bound > 0
        return Result(
            INFEASIBLE if proven else NO_SOLUTION,
            None,
            bound_or_none,
            wall,
            None,
            "milp",
            log=log,
            diagnosis=diagnosis(p) if proven else [],
            termination=Termination.INFEASIBLE if proven else termination,
            formulation=FORMULATION_NAME,
            algorithm=algorithm(enumerate_up_to),
        )
    obj, config, choice = best
    bound_or_none = sound_bound(obj, bound_or_none, log)
    status = (
        OPTIMAL
        if bound_or_none is not None and relative_gap(obj, bound_or_none) <= rel_gap + 1e-12
        else FEASIBLE
    )
    return Result(
        status,
        obj,
        bound_or_none,
        wall,
        p.plan_of(config, choice),
        "milp",
        log=log,
        termination=termination,
        formulation=FORMULATION_NAME,
        algorithm=algorithm(enumerate_up_to),
    )


def diagnosis(p: MoeEdgeProblem) -> list[str]:
    slo = p.spec.slo
    fits = [g for g in range(p.n_gpus) if p.costs(p.max_clock_config(g)).gpu_free_gb[g] >= 0]
    if not fits:
        return [
            "no GPU holds the dense part: its weights, the KV cache of batch x context_tokens, "
            "reserve_gb and the cache_experts slots exceed every GPU's memory"
        ]
    return [
        f"no placement and clocks meet the TBT SLO ({slo.tbt_ms:g} ms at p{slo.percentile:g}, "
        f"checked as mean + {p.kappa:.3g} sd) within the GPUs' and host memory"
        + ("" if slo.ttft_ms is None else f" and the TTFT limit {slo.ttft_ms:g} ms")
        + ("" if p.spec.objective.power_cap_w is None else " and the power cap")
    ]
