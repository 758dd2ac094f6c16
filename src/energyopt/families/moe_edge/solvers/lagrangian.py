"""MoE placement at full size: a Lagrangian bound with the memory rows (and the SLO,
TTFT and power rows) priced, and a price-directed repair heuristic.

Bound. Per configuration, the secant relaxation's rows are priced with multipliers
y >= 0; what is left separates per expert (each takes its cheapest priced option):

    L(y) = sum_i min_o (c_io + sum_r y_r a_rio) - sum_r y_r b_r - (pair savings),

a lower bound on the configuration's optimum for every y >= 0 (pair savings are taken
at their largest). The projected subgradient (``solvers.subgradient``) raises it. The
bound is the least configuration bound over every configuration.

Plan. The priced SLO, TTFT and power rows are kept as prices on the costs, the
memory rows exactly: with equal-sized experts the memory-only program is a
transportation problem whose LP vertex is integral. The side prices are scaled by
bisection until the plan meets the true SLO, TTFT and cap; a final pass moves single
experts and swaps pairs while the objective falls and the plan stays feasible.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np

from energyopt.backends.highs import quiet_highs
from energyopt.families.moe_edge.formulations.figures import Figures, figures
from energyopt.families.moe_edge.formulations.milp import (
    FORMULATION_NAME,
    allowed,
    build_milp,
    constant_objective,
    item_objective,
    pair_saving,
    secant,
    v_max,
    whole_experts,
    whole_gb,
)
from energyopt.families.moe_edge.formulations.model import (
    Config,
    ConfigCosts,
    FloatArray,
    IntArray,
    MoeEdgeProblem,
)
from energyopt.families.moe_edge.solvers.milp import (
    diagnosis,
    floor_bound,
    run_milp,
    solve_config,
    sound_bound,
)
from energyopt.families.moe_edge.spec import MoeEdgePlan
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    OPTIMAL,
    Result,
    Termination,
    status_at,
)
from energyopt.solvers.subgradient import PolyakControl, projected_step

ITERATIONS = 150
BISECTION_STEPS = 14
DOUBLINGS = 40
KELLEY_ITERATIONS = 80
BOX = 100.0


def _rows(p: MoeEdgeProblem, c: ConfigCosts) -> tuple[list[FloatArray], FloatArray, list[str]]:
    """The priced rows' coefficients (each (I, O)), right-hand sides and names; pair
    savings are taken at their largest (a relaxation)."""
    spec = p.spec
    w = p.expert_gb
    coefs: list[FloatArray] = []
    rhs: list[float] = []
    names: list[str] = []
    for g in range(p.n_gpus):
        a = np.zeros((p.n_items, p.n_options))
        a[:, g] = w
        coefs.append(a)
        rhs.append(whole_gb(float(c.gpu_free_gb[g]), w))
        names.append(f"gpu{g}")
    a = np.zeros((p.n_items, p.n_options))
    a[:, p.fetch] = w
    a[:, p.cpu] = w
    coefs.append(a)
    rhs.append(whole_gb(p.host_gb_free, w))
    names.append("host")
    form = secant(v_max(c))
    saved = float(c.pair_save_ms.sum())
    coefs.append(np.asarray(c.time_ms + p.kappa * form.slope * c.var_ms2))
    rhs.append(spec.slo.tbt_ms - c.dense_ms + saved)
    names.append("slo")
    if spec.slo.ttft_ms is not None:
        coefs.append(np.asarray(c.prefill_ms))
        rhs.append(spec.slo.ttft_ms - c.dense_prefill_ms)
        names.append("ttft")
    cap = spec.objective.power_cap_w
    if spec.objective.kind == "latency" and cap is not None:
        coefs.append(np.asarray(c.energy_j - cap * c.time_ms / 1e3))
        coef_w = -(c.static_w - cap) * c.pair_save_ms / 1e3
        rhs.append(cap * c.dense_ms / 1e3 - c.dense_j - float(np.minimum(coef_w, 0.0).sum()))
        names.append("power")
    return coefs, np.asarray(rhs, dtype=np.float64), names


@dataclass(frozen=True)
class _Dual:
    """L(y) of one configuration over unit-scaled rows."""

    obj: FloatArray
    stack: FloatArray
    b: FloatArray
    const: float
    size: FloatArray

    def __call__(self, y: FloatArray) -> tuple[float, FloatArray]:
        """(L(y), a subgradient)."""
        priced = self.obj + np.tensordot(y, self.stack, axes=1)
        pick = np.argmin(priced, axis=1)
        idx = np.arange(len(pick))
        value = float(priced[idx, pick].sum()) - float(y @ self.b) + self.const
        return value, self.stack[:, idx, pick].sum(axis=1) - self.b


def _dual(p: MoeEdgeProblem, c: ConfigCosts) -> _Dual:
    ok = allowed(p, c)
    coefs, rhs, _ = _rows(p, c)
    raw = np.stack([np.where(ok, a, 0.0) for a in coefs])  # (R, I, O)
    size = np.maximum(np.abs(raw).reshape(len(rhs), -1).max(axis=1), np.abs(rhs))
    size = np.where(size > 0, size, 1.0)
    return _Dual(
        obj=np.where(ok, item_objective(p, c), np.inf),
        stack=raw / size[:, None, None],
        b=rhs / size,
        const=constant_objective(p, c) - float(pair_saving(p, c).sum()),
        size=size,
    )


def lagrangian_bound(
    p: MoeEdgeProblem,
    c: ConfigCosts,
    target: float,
    iterations: int = ITERATIONS,
) -> tuple[float, FloatArray]:
    """(best L(y), its prices) for configuration ``c`` by projected subgradient;
    ``target`` is a value at or above the optimum for the Polyak step. Rows are
    scaled to unit size for the steps; the prices returned are unscaled."""
    dual = _dual(p, c)
    y = np.zeros(len(dual.b))
    ctrl = PolyakControl(patience=8)
    best, best_y = -np.inf, y.copy()
    scale = max(abs(target), 1e-9)
    for _ in range(iterations):
        value, g = dual(y)
        if not np.isfinite(value):
            return np.inf, y / dual.size
        if ctrl.observe(value):
            best, best_y = value, y.copy()
        aim = max(target, best + 1e-3 * scale)
        y, norm2 = projected_step(y, g, value, aim, ctrl.theta, min_gap=1e-4 * scale)
        if norm2 <= 1e-18:
            break
    return best, best_y / dual.size


def kelley_bound(
    p: MoeEdgeProblem,
    c: ConfigCosts,
    start: FloatArray,
    upper: float,
    rel_gap: float,
    iterations: int = KELLEY_ITERATIONS,
) -> float:
    """max L(y) by Kelley's cutting planes from the (unscaled) prices ``start``: each
    evaluation adds the cut theta <= L(y_k) + g_k (y - y_k); the prices stay in a box
    of ``BOX`` times ``upper`` (a plan's objective) per unit-scaled row. Every L(y_k)
    is a valid bound; the best is returned."""
    dual = _dual(p, c)
    n = len(dual.b)
    box = BOX * max(abs(upper), 1e-9)
    y = np.minimum(np.asarray(start * dual.size, dtype=np.float64), box)
    best = -np.inf
    h = quiet_highs()
    inf = highspy.kHighsInf
    # columns: y_1..y_n, theta; maximise theta
    h.addVars(n + 1, np.r_[np.zeros(n), -inf], np.r_[np.full(n, box), inf])
    h.changeColsCost(n + 1, np.arange(n + 1, dtype=np.int32), np.r_[np.zeros(n), -1.0])
    for _ in range(iterations):
        value, g = dual(y)
        if not np.isfinite(value):
            return np.inf
        best = max(best, value)
        # theta - g.y <= value - g.y_k
        h.addRow(
            -inf,
            value - float(g @ y),
            n + 1,
            np.arange(n + 1, dtype=np.int32),
            np.r_[-g, 1.0],
        )
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            break
        sol = np.asarray(h.getSolution().col_value)
        y, ceiling = sol[:n], float(sol[n])
        if ceiling - best <= rel_gap * max(abs(best), 1e-9):
            break
    return best


SIDE_ROWS = ("slo", "ttft", "power")


def _plan_at(p: MoeEdgeProblem, c: ConfigCosts, prices: FloatArray) -> IntArray | None:
    """The memory-exact plan with the side rows priced at ``prices`` (one per row of
    ``_rows``; memory rows' entries are ignored)."""
    coefs, _, names = _rows(p, c)
    extra = np.zeros((p.n_items, p.n_options))
    for k, name in enumerate(names):
        if name in SIDE_ROWS and prices[k] != 0.0:
            extra += prices[k] * np.where(np.isfinite(coefs[k]), coefs[k], 0.0)
    milp = build_milp(p, c, secant(v_max(c)), extra_cost=extra, side_rows=False, integer=False)
    choice, _, _ = run_milp(milp, p, 30.0, 1e-9, None)
    if choice is None or (choice < 0).any():
        return None
    return choice


def _violated(p: MoeEdgeProblem, f: Figures, names: list[str]) -> list[bool]:
    """Per row of ``_rows``, whether the plan breaks it (true SLO, TTFT, cap)."""
    spec = p.spec
    out = []
    for name in names:
        if name == "slo":
            out.append(f.tbt_at_percentile_ms > spec.slo.tbt_ms)
        elif name == "ttft":
            out.append(spec.slo.ttft_ms is not None and f.ttft_ms > spec.slo.ttft_ms)
        elif name == "power":
            cap = spec.objective.power_cap_w
            out.append(cap is not None and f.power_w > cap)
        else:
            out.append(False)
    return out


def repair(p: MoeEdgeProblem, c: ConfigCosts, prices: FloatArray) -> IntArray | None:
    """A feasible plan for configuration ``c`` from the Lagrangian prices, or None.

    Starting from the side rows' Lagrangian prices, the price of every row the plan
    breaks doubles (from a small floor) until the plan meets all of them; then each
    row's price is bisected down while the plan stays feasible (cheaper plans)."""
    _, _, names = _rows(p, c)
    side = np.array([prices[k] if n in SIDE_ROWS else 0.0 for k, n in enumerate(names)])
    scale = max(float(np.abs(item_objective(p, c)[np.isfinite(c.time_ms)]).max()), 1e-12)
    floor = np.array([1e-3 * scale if n in SIDE_ROWS else 0.0 for n in names])
    found: IntArray | None = None
    closest: tuple[float, IntArray] | None = None
    for _ in range(DOUBLINGS):
        trial = _plan_at(p, c, side)
        if trial is None:
            return None
        f = figures(p, c, trial)
        if f.feasible:
            found = trial
            break
        excess = _excess(p, f)
        if closest is None or excess < closest[0]:
            closest = (excess, trial)
        broken = np.array(_violated(p, f, names))
        if not broken.any():
            return None  # memory: the transportation plan always fits, so nothing to price
        side = np.where(broken, np.maximum(2.0 * side, floor), side)
    if found is None:
        # priced plans flip between extremes (experts of one kind share their costs'
        # proportions): walk from the closest one by the cheapest repairing moves
        assert closest is not None
        walked = greedy_feasible(p, c, closest[1])
        return None if walked is None else improve(p, c, walked)
    for k, name in enumerate(names):
        if name not in SIDE_ROWS or side[k] == 0.0:
            continue
        lo, hi = 0.0, float(side[k])
        for _ in range(BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            trial_prices = side.copy()
            trial_prices[k] = mid
            trial = _plan_at(p, c, trial_prices)
            if trial is not None and figures(p, c, trial).feasible:
                found, hi = trial, mid
            else:
                lo = mid
        side[k] = hi
    return improve(p, c, found)


def _excess(p: MoeEdgeProblem, f: Figures) -> float:
    """Sum of the relative amounts by which the plan breaks the TBT, TTFT and power rows."""
    spec = p.spec
    out = max(0.0, f.tbt_at_percentile_ms / spec.slo.tbt_ms - 1.0)
    if spec.slo.ttft_ms is not None:
        out += max(0.0, f.ttft_ms / spec.slo.ttft_ms - 1.0)
    cap = spec.objective.power_cap_w
    if spec.objective.kind == "latency" and cap is not None:
        out += max(0.0, f.power_w / cap - 1.0)
    return out


def greedy_feasible(p: MoeEdgeProblem, c: ConfigCosts, start: IntArray) -> IntArray | None:
    """Move one expert at a time, each time the move with the largest fall of the
    (linearised) relative excess per unit of objective it adds, until the plan is
    feasible; None when no move lowers the excess."""
    spec = p.spec
    ok = allowed(p, c)
    obj = np.where(ok, item_objective(p, c), np.inf)
    choice = start.copy()
    idx = np.arange(p.n_items)
    w = p.expert_gb
    cap = spec.objective.power_cap_w if spec.objective.kind == "latency" else None
    for _ in range(4 * p.n_items):
        f = figures(p, c, choice)
        if f.feasible:
            return choice
        sd = float(np.sqrt(max(f.var_ms2, 1e-18)))
        d_time = c.time_ms - c.time_ms[idx, choice][:, None]
        d_var = c.var_ms2 - c.var_ms2[idx, choice][:, None]
        fall = np.zeros_like(obj)
        if f.tbt_at_percentile_ms > spec.slo.tbt_ms:
            fall -= (d_time + p.kappa * d_var / (2.0 * sd)) / spec.slo.tbt_ms
        if spec.slo.ttft_ms is not None and f.ttft_ms > spec.slo.ttft_ms:
            fall -= (c.prefill_ms - c.prefill_ms[idx, choice][:, None]) / spec.slo.ttft_ms
        if cap is not None and f.power_w > cap:
            d_energy = c.energy_j - c.energy_j[idx, choice][:, None]
            fall -= (d_energy - cap * d_time / 1e3) / (cap * f.mean_ms / 1e3)
        room = np.array(
            [
                int((choice == g).sum()) + 1 <= whole_experts(float(c.gpu_free_gb[g]), w)
                for g in range(p.n_gpus)
            ]
        )
        movable = ok.copy()
        movable[:, : p.n_gpus] &= room[None, :]
        movable[idx, choice] = False
        added = obj - obj[idx, choice][:, None]
        score = np.where(movable & (fall > 1e-15), fall / np.maximum(added, 1e-12), -np.inf)
        score = np.where(movable & (fall > 1e-15) & (added <= 0), np.inf, score)
        best = int(np.argmax(score))
        if not np.isfinite(score.flat[best]) and score.flat[best] < 0:
            return None
        i, o = divmod(best, p.n_options)
        choice[i] = o
    return None


def improve(p: MoeEdgeProblem, c: ConfigCosts, choice: IntArray, passes: int = 3) -> IntArray:
    """Single moves and swaps that lower the objective and keep the plan feasible."""
    ok = allowed(p, c)
    obj = item_objective(p, c)
    best = choice.copy()
    fig = figures(p, c, best)
    for _ in range(passes):
        moved = False
        current = obj[np.arange(p.n_items), best]
        gain = current[:, None] - np.where(ok, obj, np.inf)  # (I, O) gain of moving i to o
        for i, o in zip(
            *np.unravel_index(np.argsort(-gain, axis=None)[:2000], gain.shape), strict=True
        ):
            if gain[i, o] <= 1e-12 * max(1.0, abs(fig.objective)):
                break
            trial = best.copy()
            trial[i] = o
            f = figures(p, c, trial)
            if not f.feasible and o < p.n_gpus:
                # make room: send the least valuable resident of o to i's old option
                on = np.flatnonzero(trial == o)
                on = on[on != i]
                if len(on):
                    loss = obj[on, best[i]] - obj[on, o]
                    j = on[np.argmin(np.where(ok[on, best[i]], loss, np.inf))]
                    if ok[j, best[i]]:
                        trial[j] = best[i]
                        f = figures(p, c, trial)
            if f.feasible and f.objective < fig.objective - 1e-12 * max(1.0, abs(fig.objective)):
                best, fig, moved = trial, f, True
                current = obj[np.arange(p.n_items), best]
                gain = current[:, None] - np.where(ok, obj, np.inf)
        if not moved:
            break
    return best


def solve_lagrangian(
    p: MoeEdgeProblem,
    *,
    time_limit_s: float = 60.0,
    rel_gap: float = 1e-4,
    progress: Progress = quiet,
) -> Result[MoeEdgePlan]:
    """Lagrangian bound and repaired plan over every configuration."""
    t0 = time.perf_counter()
    configs = p.iter_canonical_configs()
    count = p.n_canonical_configs()
    first = next(p.iter_canonical_configs())
    best: tuple[float, Config, IntArray] | None = None
    bounds: list[float] = []
    timed_out = False
    open_dense: set[int] = set()
    # time kept for the bound of configurations left unvisited (costs of one
    # configuration per clock of each GPU, per dense GPU), and the longest a
    # configuration took so far: one is not started unless it can end in time
    p.costs(first)  # the first call also warms up
    t1 = time.perf_counter()
    p.costs(p.max_clock_config(first.dense))
    per_costs_s = time.perf_counter() - t1
    _, dense_class = p.gpu_classes()
    dense_gpus = len([d for d in range(p.n_gpus) if dense_class[d] == d])
    floor_costs = dense_gpus * max(len(c) for c in p.clock_options)
    reserve_s = min(0.5 * time_limit_s, 2.0 * floor_costs * per_costs_s)
    slowest_s = 0.0
    for n, config in enumerate(configs):
        started = time.perf_counter()
        if started - t0 + slowest_s + reserve_s > time_limit_s and (n > 0 or best is not None):
            # out of time: the unpriced relaxation of every configuration left, with
            # each option at its least cost over the clocks, still bounds them
            timed_out = True
            open_dense.update(d for d in range(p.n_gpus) if dense_class[d] == d)
            break
        c = p.costs(config)
        if c.gpu_free_gb[config.dense] < 0:
            bounds.append(np.inf)
            continue
        target = best[0] if best is not None else abs(_rough(p, c)) * 1.5
        bound, prices = lagrangian_bound(p, c, target)
        if best is None or bound < best[0]:
            choice = repair(p, c, prices)
            f: Figures | None = None if choice is None else figures(p, c, choice)
            if choice is not None and f is not None and f.feasible:
                if best is None or f.objective < best[0]:
                    best = (f.objective, config, choice)
            elif best is None:
                # no plan yet and the repair found none here: the exact refinement
                # of this configuration in a share of the time left (small programs
                # whose prices lead the repair astray: one plan in thousands meets
                # the SLO)
                left = time_limit_s - (time.perf_counter() - t0)
                out = solve_config(
                    p,
                    c,
                    cutoff=None,
                    deadline=time.perf_counter() + left / max(count - n, 1),
                    rel_gap=rel_gap,
                )
                bound = max(bound, out.bound)
                if out.plan is not None:
                    best = (out.plan[0], config, out.plan[1])
            if best is not None and bound < best[0] * (1 - rel_gap):
                # again from these prices, now aiming at the best plan's objective
                bound = max(bound, kelley_bound(p, c, prices, best[0], rel_gap))
        bounds.append(bound)
        slowest_s = max(slowest_s, time.perf_counter() - started)
        progress(
            f"lagrangian: config {n + 1}/{count}: bound {bound:.6g}"
            + ("" if best is None else f", best {best[0]:.6g}")
        )
    bounds += [floor_bound(p, d) for d in sorted(open_dense)]
    bound = min(bounds) if bounds else -np.inf
    bound_or_none = float(bound) if np.isfinite(bound) else None
    wall = time.perf_counter() - t0
    termination = Termination.TIME_LIMIT if timed_out else Termination.CONVERGED
    log = [f"{count:,} configurations, {ITERATIONS} subgradient steps each"]
    if best is None:
        # every configuration's bound infinite: each is a proof (an expert with no
        # option, the dense part too large, or a refinement proven infeasible)
        proven = not timed_out and bool(bounds) and np.isposinf(bound)
        return Result(
            INFEASIBLE if proven else NO_SOLUTION,
            None,
            bound_or_none,
            wall,
            None,
            "lagrangian",
            log=log,
            diagnosis=diagnosis(p) if proven else [],
            termination=Termination.INFEASIBLE if proven else termination,
            formulation=FORMULATION_NAME,
            algorithm="Lagrangian (memory, SLO priced) + transportation repair",
        )
    obj, config, choice = best
    bound_or_none = sound_bound(obj, bound_or_none, log)
    status = FEASIBLE if bound_or_none is None else status_at(obj, bound_or_none, rel_gap)
    if termination == Termination.CONVERGED and status != OPTIMAL:
        # every configuration was visited but the plan is not within the gap: the
        # subgradient and cutting-plane iteration limits ended it, not convergence
        termination = Termination.EFFORT_LIMIT
    return Result(
        status,
        obj,
        bound_or_none,
        wall,
        p.plan_of(config, choice),
        "lagrangian",
        log=log,
        termination=termination,
        formulation=FORMULATION_NAME,
        algorithm="Lagrangian (memory, SLO priced) + transportation repair",
    )


def _rough(p: MoeEdgeProblem, c: ConfigCosts) -> float:
    """An objective scale: every expert at its dearest available option."""
    ok = allowed(p, c)
    obj = np.where(ok, item_objective(p, c), -np.inf)
    return constant_objective(p, c) + float(obj.max(axis=1).sum())
