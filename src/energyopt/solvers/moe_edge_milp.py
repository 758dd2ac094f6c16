"""MoE placement, exact: every configuration's program with HiGHS.

Per configuration (dense GPU, clocks) the secant form of the SLO gives a relaxation
whose optimum bounds that configuration from below; a relaxed optimum that meets the
true (Cantelli) SLO is that configuration's optimum. Otherwise the tangent form at
the relaxed solution's variance (a restriction, so its plans meet the SLO) is solved,
moving the tangent to the new plan's variance up to ``TANGENT_ROUNDS`` times. The
bound is the least configuration bound; the plan the best one found.
"""

from __future__ import annotations

import time

import numpy as np

from energyopt.backends.highs import MipStatus, solve_mip
from energyopt.formulations.moe_edge.figures import figures
from energyopt.formulations.moe_edge.milp import (
    FORMULATION_NAME,
    Milp,
    SloForm,
    allowed,
    build_milp,
    constant_objective,
    item_objective,
    pair_saving,
    secant,
    tangent,
    v_max,
)
from energyopt.formulations.moe_edge.model import Config, ConfigCosts, IntArray, MoeEdgeProblem
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
from energyopt.spec.moe_edge import MoeEdgePlan

TANGENT_ROUNDS = 3


def unpriced_bound(p: MoeEdgeProblem, c: ConfigCosts) -> float:
    """A lower bound on configuration ``c``'s optimum without solving anything: every
    expert at its cheapest option, every pair saving taken (memory, SLO, TTFT and
    power rows dropped). Valid for the energy objective and for the latency one."""
    ok = allowed(p, c)
    obj = np.where(ok, item_objective(p, c), np.inf)
    return float(constant_objective(p, c) + obj.min(axis=1).sum() - pair_saving(p, c).sum())


def run_milp(
    milp: Milp, p: MoeEdgeProblem, time_limit_s: float, rel_gap: float, cutoff: float | None
) -> tuple[IntArray | None, float, bool]:
    """(choice or None, HiGHS bound, solved to optimality or proven infeasible)."""
    run = solve_mip(
        milp.lp(),
        time_limit_s=max(0.05, time_limit_s),
        rel_gap=rel_gap,
        objective_bound=cutoff if cutoff is not None and np.isfinite(cutoff) else None,
    )
    if run.status in (MipStatus.INFEASIBLE, MipStatus.CUT_OFF):
        return None, np.inf if cutoff is None else float(cutoff), True
    bound = run.dual_bound if np.isfinite(run.dual_bound) else -np.inf
    if run.col_value is None:
        return None, bound, run.optimal
    return milp.choice(np.round(run.col_value), p.n_items), bound, run.optimal


def solve_milp(
    p: MoeEdgeProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-6,
    progress: Progress = quiet,
) -> Result[MoeEdgePlan]:
    """Exact within ``rel_gap`` over every configuration (or the best plan and bound at
    the time limit). Objective in J/token or ms/token."""
    t0 = time.perf_counter()
    configs = p.configs()
    best: tuple[float, Config, IntArray] | None = None
    bounds: list[float] = []
    all_done = True
    log: list[str] = []
    for n, config in enumerate(configs):
        left = time_limit_s - (time.perf_counter() - t0)
        c = p.costs(config)
        if c.gpu_free_gb[config.dense] < 0:
            bounds.append(np.inf)
            continue
        if left <= 0:
            all_done = False
            bounds.append(unpriced_bound(p, c))
            continue
        share = left / (len(configs) - n)
        cutoff = None if best is None else best[0]
        choice, bound, done = run_milp(
            build_milp(p, c, secant(v_max(c))), p, share, rel_gap, cutoff
        )
        bounds.append(max(bound, unpriced_bound(p, c)))
        all_done &= done
        rounds = 0
        form: SloForm
        while choice is not None:
            fig = figures(p, c, choice)
            if fig.feasible and (best is None or fig.objective < best[0]):
                best = (fig.objective, config, choice)
            if fig.feasible or rounds >= TANGENT_ROUNDS:
                break
            rounds += 1
            form = tangent(fig.var_ms2)
            choice, _, _ = run_milp(build_milp(p, c, form), p, max(0.05, share), rel_gap, None)
        progress(
            f"milp: config {n + 1}/{len(configs)} (dense {config.dense}, clocks "
            f"{config.clocks}): bound {bound:.6g}"
            + ("" if best is None else f", best {best[0]:.6g}")
        )
    bound = min(bounds) if bounds else -np.inf
    wall = time.perf_counter() - t0
    log.append(f"{len(configs)} configurations, {'all' if all_done else 'not all'} closed")
    bound_or_none = float(bound) if np.isfinite(bound) else None
    termination = Termination.CONVERGED if all_done else Termination.TIME_LIMIT
    if best is None:
        proven = all_done and not np.isfinite(bound) and bound > 0
        return Result(
            INFEASIBLE if proven else NO_SOLUTION,
            None,
            None,
            wall,
            None,
            "milp",
            log=log,
            diagnosis=_diagnosis(p) if proven else [],
            termination=Termination.INFEASIBLE if proven else termination,
            formulation=FORMULATION_NAME,
            algorithm="HiGHS branch and cut per configuration",
        )
    obj, config, choice = best
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
        algorithm="HiGHS branch and cut per configuration",
    )


def _diagnosis(p: MoeEdgeProblem) -> list[str]:
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
