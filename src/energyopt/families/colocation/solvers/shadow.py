"""Elastic shadow pricing: prices on SM share, job slots, memory and power per GPU type
and slot decompose the allocation into independent per-job choices; a repair turns
the priced choices into a feasible schedule.

Each iteration evaluates the Lagrangian dual (every job picks its cheapest
column at the current prices; ``colocation_lagrangian``), which is a certified
lower bound, then updates the prices by the Polyak subgradient rule. Every
``repair_every`` iterations the repair builds a plan at the current prices:

1. pairing: a training job a and an inference job b are paired when their best
   pair configuration, priced, costs less than their two best single-job
   configurations (``gain``); pairs are chosen by a maximum-gain assignment;
2. list scheduling: units (pairs and single jobs) in the order of the relaxed
   start slots then shortest first, and again longest first; each unit takes
   the configuration and start that minimize its objective plus its priced
   resource use (and, in a second pass, its objective alone); the best of the
   four schedules is kept.
"""

from __future__ import annotations

import time

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from energyopt.families.colocation.formulations.model import ColocationModel
from energyopt.families.colocation.formulations.relaxation import Relaxation, build_relaxation
from energyopt.families.colocation.formulations.schedule import (
    Schedule,
    group_configs,
    place_units,
    to_plan,
)
from energyopt.families.colocation.solvers.diagnose import diagnose, no_plan_status
from energyopt.families.colocation.solvers.lagrangian import Subgradient
from energyopt.families.colocation.solvers.result import (
    ColocationResult,
    colocation_result,
    nothing_runs,
)
from energyopt.families.colocation.spec import TrainingJob
from energyopt.perf.params import FloatArray
from energyopt.progress import Progress
from energyopt.solvers.result import FEASIBLE, NO_SOLUTION, OPTIMAL, Sense

IntArray = NDArray[np.int64]
CHUNK = 200_000


class UnitPricer:
    """Priced cost of unit configurations at every start slot under the relaxation's prices."""

    def __init__(self, model: ColocationModel, relax: Relaxation, prices: FloatArray) -> None:
        self.model = model
        slots, n_types = model.slots, len(model.table.type_names)
        y = prices
        per = n_types * slots

        def cum(block: FloatArray) -> FloatArray:
            return np.concatenate([np.zeros((*block.shape[:-1], 1)), np.cumsum(block, -1)], -1)

        self.share_slots = cum((y[0:per] + y[per : 2 * per]).reshape(n_types, slots))
        self.memory = cum(y[2 * per : 3 * per].reshape(n_types, slots))
        has_power = np.isfinite(model.power_cap_w)
        self.power = cum(y[3 * per : 3 * per + slots]) if has_power else np.zeros(slots + 1)
        problem = model.problem
        self.gpu_cap = model.gpu_cap.astype(np.float64)
        self.usable = np.asarray([problem.usable_memory_gb(t) for t in model.table.type_names])
        self.power_scale = max(model.power_cap_w, 1e-9) if has_power else 1.0

    def price(self, configs: IntArray, starts: IntArray) -> FloatArray:
        """Priced resource use of configurations ``configs`` started at ``starts``."""
        m = self.model
        u = m.table.units
        end = m.end_slot(configs, starts)
        t = u.type_index[configs]
        n = u.gpus[configs].astype(np.float64)
        g = self.gpu_cap[t]
        share = self.share_slots[t, end] - self.share_slots[t, starts]
        mem = self.memory[t, end] - self.memory[t, starts]
        pw = self.power[end] - self.power[starts]
        return np.asarray(
            n / g * share
            + n * u.memory_gb[configs] / (g * self.usable[t]) * mem
            + u.power_w[configs] / self.power_scale * pw
        )

    def table(self, configs: IntArray) -> FloatArray:
        """[config, start] objective plus priced use; inf where the start is not allowed."""
        m = self.model
        slots = m.slots
        c = np.repeat(configs, slots)
        k = np.tile(np.arange(slots, dtype=np.int64), len(configs))
        out = m.cost(c, k) + self.price(c, k)
        out = np.where(m.allowed(c, k), out, np.inf)
        return np.asarray(out.reshape(len(configs), slots))


def pairing(model: ColocationModel, pricer: UnitPricer) -> list[tuple[int, int]]:
    """(training, inference) pairs whose best pair configuration beats running apart."""
    u = model.table.units
    n_jobs = model.n_jobs
    best = np.full((n_jobs, n_jobs + 1), np.inf)  # [a, b + 1]; column 0: alone
    for lo in range(0, len(u), CHUNK):
        idx = np.arange(lo, min(lo + CHUNK, len(u)), dtype=np.int64)
        per_start = pricer.table(idx).min(axis=1)
        np.minimum.at(best, (u.job_a[idx], u.job_b[idx] + 1), per_start)
    alone = best[:, 0]
    training = [j for j, job in enumerate(model.problem.jobs) if isinstance(job, TrainingJob)]
    inference = [j for j in range(n_jobs) if j not in set(training)]
    if not training or not inference:
        return []
    gain = alone[training][:, None] + alone[inference][None, :]
    gain = gain - best[np.ix_(training, [b + 1 for b in inference])]
    gain = np.where(np.isfinite(gain), gain, -np.inf)
    weight = np.where(gain > 0, gain, 0.0)
    rows, cols = linear_sum_assignment(weight, maximize=True)
    return [(training[r], inference[c]) for r, c in zip(rows, cols, strict=True) if gain[r, c] > 0]


def repair(
    model: ColocationModel,
    relax: Relaxation,
    prices: FloatArray,
    choice: IntArray,
    groups: dict[tuple[int, int], IntArray],
) -> Schedule | None:
    """A feasible schedule from the priced choices (see the module docstring)."""
    pricer = UnitPricer(model, relax, prices)
    pairs = pairing(model, pricer)
    in_pair = {j for p in pairs for j in p}
    units: list[tuple[int, int]] = [
        *pairs,
        *[(j, -1) for j in range(model.n_jobs) if j not in in_pair],
    ]
    u = model.table.units

    def relaxed_start(job: int) -> int:
        return int(relax.start[choice[job]]) if choice[job] >= 0 else model.slots

    def shortest(unit: tuple[int, int]) -> float:
        configs = groups.get(unit)
        return float(u.span_s[configs].min()) if configs is not None and len(configs) else np.inf

    spt = sorted(units, key=lambda p: (min(relaxed_start(j) for j in p if j >= 0), shortest(p)))
    lpt = sorted(units, key=lambda p: -shortest(p))
    best: Schedule | None = None
    best_value = np.inf
    for order in (spt, lpt):
        for priced in (True, False):
            sched = place_units(model, order, groups, pricer.price if priced else None)
            if sched is not None and sched.objective(model) < best_value - 1e-12:
                best, best_value = sched, sched.objective(model)
    return best


def solve_shadow(
    model: ColocationModel,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-3,
    max_iterations: int = 300,
    repair_every: int = 10,
    progress: Progress | None = None,
) -> ColocationResult:
    """Shadow-price decomposition with repair; the plan, its objective and a certified bound."""
    say = progress or (lambda _line: None)
    t0 = time.perf_counter()
    sense: Sense = "min" if model.objective == "jct" else "max"
    relax = build_relaxation(model)
    missing = sorted(set(range(model.n_jobs)) - set(relax.job.tolist()))
    if missing and not relax.optional:
        return colocation_result(
            no_plan_status(model),
            None,
            None,
            sense,
            time.perf_counter() - t0,
            None,
            "shadow-price",
            [f"{len(missing)} jobs have no configuration in the horizon"],
            diagnose(model),
        )
    if len(relax) == 0:  # throughput, and no job fits anywhere
        return nothing_runs(model.problem, "shadow-price", time.perf_counter() - t0)
    say(
        f"shadow-price: {len(relax):,} job columns, {relax.usage.shape[0]} priced rows "
        f"({model.n_jobs} jobs, {len(model.table.units):,} unit configurations)"
    )
    groups = group_configs(model)
    sg = Subgradient(relax)
    best: Schedule | None = None
    upper = np.inf
    log: list[str] = []

    def consider(sched: Schedule | None) -> None:
        nonlocal best, upper
        if sched is not None:
            value = sched.objective(model)
            if value < upper - 1e-12:
                best, upper = sched, value

    consider(repair(model, relax, sg.prices, np.full(model.n_jobs, -1), groups))
    it = 0
    for it in range(1, max_iterations + 1):
        point = sg.step(upper)
        if it % repair_every == 0 or it == 1:
            consider(repair(model, relax, sg.prices, point.choice, groups))
            line = _line(model, it, upper, sg.best_value)
            say(line)
            log.append(line)
        if np.isfinite(upper) and _gap(upper, sg.best_value) <= rel_gap:
            break
        if sg.theta < 1e-4 or time.perf_counter() - t0 > time_limit_s:
            break
    if it % repair_every != 0:
        consider(repair(model, relax, sg.best_prices, sg.evaluate(sg.best_prices).choice, groups))
    wall = time.perf_counter() - t0
    bound = model.display_objective(sg.best_value) if np.isfinite(sg.best_value) else None
    if best is None:
        # The repair found nothing: no proof, unless a job cannot run at all.
        status = NO_SOLUTION if relax.optional else no_plan_status(model)
        diag = [] if relax.optional else diagnose(model)
        return colocation_result(status, None, bound, sense, wall, None, "shadow-price", log, diag)
    objective = model.display_objective(best.objective(model))
    if bound is not None:
        bound = min(bound, objective) if sense == "min" else max(bound, objective)
    status = OPTIMAL if _gap(upper, sg.best_value) <= 1e-9 else FEASIBLE
    log.append(f"{it} iterations, {wall:.1f} s")
    return colocation_result(
        status, objective, bound, sense, wall, to_plan(model, best), "shadow-price", log
    )


def _gap(upper: float, lower: float) -> float:
    return max(0.0, upper - lower) / max(abs(upper), 1e-9)


def _line(model: ColocationModel, it: int, upper: float, lower: float) -> str:
    inc = model.display_objective(upper) if np.isfinite(upper) else float("nan")
    bnd = model.display_objective(lower) if np.isfinite(lower) else float("nan")
    gap = _gap(upper, lower) if np.isfinite(upper) and np.isfinite(lower) else float("inf")
    return f"shadow-price: iteration {it}, plan {inc:,.3f}, bound {bnd:,.3f}, gap {100 * gap:.2f}%"
