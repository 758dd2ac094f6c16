"""Cheap valid lower bounds on the makespan and energy of any schedule."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from energyopt.families.taskgraph.formulations.idle import ForcedIdle, forced_idle
from energyopt.families.taskgraph.formulations.model import TaskGraph, objective_value

Pricing = Callable[[np.ndarray], float]
"""The Lagrangian bound (J) as a function of the multipliers (J per grid unit)."""
GOLDEN_STEPS = 60
"""Golden-section steps per multiplier (the interval shrinks by 0.618 per step)."""
ASCENT_ROUNDS = 3
"""Rounds of coordinate ascent over the GPU types' multipliers."""


@dataclass(frozen=True)
class LowerBounds:
    """Bounds that every feasible schedule meets (units in names)."""

    makespan: int  # grid units
    dyn_j: float  # sum over tasks of the least above-idle energy of any option
    priced_j: float = 0.0  # the Lagrangian energy bound (J), see ``priced_energy_j``
    idle: ForcedIdle | None = None  # the graph's forced waits, see ``idle.forced_idle``

    def energy_j(self, tg: TaskGraph, makespan: int | None = None) -> float:
        """Least energy of a schedule of makespan >= ``makespan`` (default the bound), J."""
        m = self.makespan if makespan is None else max(makespan, self.makespan)
        return max(tg.idle_total_w * tg.ms(m) / 1e3 + self.dyn_j, self.priced_j)

    def objective(self, tg: TaskGraph, incumbent: float | None = None) -> float:
        """A lower bound on the optimum of the file's objective (in its unit).

        Energy and makespan bounds both hold and every objective is nondecreasing in
        both, so the objective at (makespan bound, energy bound) is one. For EDP and
        ED^2P, given the objective of a known schedule (``incumbent``), the larger of
        that and ``product_bound`` (the energy bound made to follow the makespan)."""
        plain = objective_value(tg.objective, tg.ms(self.makespan), self.energy_j(tg))
        if incumbent is None or tg.objective not in ("edp", "ed2p"):
            return plain
        return max(plain, product_bound(tg, self, incumbent))


def lower_bounds(tg: TaskGraph) -> LowerBounds:
    """Makespan >= the longest chain of fastest durations (no transfers) and >= the
    fastest GPU time the tasks take, forced waits included (``idle.forced_idle``:
    sum_i mult_i d_i + gaps <= G M), spread over all GPUs; energy >= idle power x that
    makespan plus every task's least above-idle energy (transitions cost >= 0), and
    >= the Lagrangian bound of ``priced_energy_j``."""
    fastest = []
    least_dyn = 0.0
    for i in range(tg.n_tasks):
        durs: list[int] = []
        dyns: list[float] = []
        for t in range(len(tg.types)):
            durs.extend(tg.options[t][i].dur)
            dyns.extend(tg.options[t][i].dyn_j)
        fastest.append(min(durs))
        least_dyn += min(dyns)
    finish = [0] * tg.n_tasks
    for i in tg.topo_order:
        finish[i] = fastest[i] + max((finish[p] for p, _ in tg.preds[i]), default=0)
    chain = max(finish)
    idle = forced_idle(tg)
    taken = sum(m * d for m, d in zip(idle.mult, fastest, strict=True)) + idle.gaps
    work = math.ceil(taken / tg.n_gpus)
    makespan = max(chain, work)
    return LowerBounds(makespan, least_dyn, priced_energy_j(tg, makespan, idle=idle), idle)


PRODUCT_INTERVALS = 40
"""Makespan intervals ``product_bound`` splits [bound, horizon] into (geometric)."""


def product_bound(tg: TaskGraph, lb: LowerBounds, incumbent: float) -> float:
    """Lower bound on the optimal EDP or ED^2P given a schedule of objective
    ``incumbent`` (J*s or J*s^2).

    An optimal schedule has objective <= ``incumbent`` and energy >= P M (every GPU
    idles at least until the makespan M), so M <= H with P H^2 = incumbent (EDP) or
    P H^3 = incumbent (ED^2P). [makespan bound, H] is cut into intervals [a, b]; a
    schedule whose makespan lies in [a, b] has energy >= E(a, b), the larger of
    P a + sum of least above-idle energies and the Lagrangian bound of
    ``priced_energy_j`` with M in [a, b], and so objective >= a E(a, b) (EDP) or
    a^2 E(a, b) (ED^2P). The least of these over the intervals bounds the optimum.
    Unlike the single point (makespan bound, energy bound), it charges a short
    makespan for the fast clocks it needs."""
    unit_s = tg.unit_ms / 1e3
    idle = tg.idle_total_w * unit_s  # J per grid unit
    power = 2 if tg.objective == "edp" else 3
    if idle <= 0 or incumbent <= 0:
        return 0.0
    horizon = (incumbent / (idle * unit_s ** (power - 1))) ** (1 / power) * (1 + 1e-9) + 1
    low = float(lb.makespan)
    if horizon <= low:
        return objective_value(tg.objective, tg.ms(low), lb.energy_j(tg))
    ratio = max((horizon / low) ** (1 / PRODUCT_INTERVALS), 1.0 + 1e-6)
    best = math.inf
    a = low
    while a < horizon:
        b = min(a * ratio, horizon)
        energy = max(
            idle * a + lb.dyn_j,
            priced_energy_j(tg, math.ceil(a - 1e-9), upper=math.floor(b), idle=lb.idle),
        )
        best = min(best, objective_value(tg.objective, tg.ms(a), energy))
        a = b if b > a else horizon
    return best


def priced_energy_j(
    tg: TaskGraph, makespan_lb: int, upper: int | None = None, idle: ForcedIdle | None = None
) -> float:
    """Lagrangian lower bound on the energy of any feasible schedule (J).

    A schedule of makespan M (grid units) draws E = P M + sum_i dyn_i + transitions,
    P = every GPU's idle power (J per unit), and the tasks on the n_t GPUs of type t
    are busy for at most n_t M units in all (they do not overlap on a GPU). Pricing
    that busy time at lambda_t >= 0 J per unit:

        E >= sum_i min over (t, option) of (dyn + lambda_t dur) + (P - sum_t lambda_t n_t) M,

    and M >= ``makespan_lb`` where the bracket is >= 0, M <= the deadline (energy_within)
    or ``upper`` (grid units: for schedules of makespan at most that) where it is
    < 0, so every lambda gives a bound. At lambda_t = P / n_GPUs
    each task carries its share of the idle power for as long as it runs, which is
    what a slow clock costs; under a deadline a larger price forces the faster,
    costlier options.

    The GPU time the graph's shape leaves without tasks (``idle``, default
    ``idle.forced_idle(tg)``) adds one more row over all G GPUs,
    sum_i mult_i d_i + gaps <= G M, priced at mu >= 0: each task's price becomes
    dyn + lambda_t d + mu mult_i d, the bracket loses mu G and mu gaps is added. A task
    that runs alone (mult = G) then pays for the waits of every other GPU while it
    runs, which is what slows the chain of panel factorizations of a tiled Cholesky.

    The best multipliers are searched by coordinate ascent (golden section per
    multiplier on a concave function); any point it stops at is valid.
    """
    unit_s = tg.unit_ms / 1e3
    n_types = len(tg.types)
    counts = np.array([sum(1 for g in tg.gpu_type if g == t) for t in range(n_types)], float)
    idle_per_unit = tg.idle_total_w * unit_s  # J per grid unit, all GPUs
    n = tg.n_tasks
    width = max((len(o.dur) for per in tg.options for o in per), default=0)
    if n == 0 or width == 0:
        return 0.0
    dyn = np.full((n_types, n, width), np.inf)
    dur = np.zeros((n_types, n, width))
    for t in range(n_types):
        if counts[t] == 0:
            continue
        for i, o in enumerate(tg.options[t]):
            k = len(o.dur)
            dyn[t, i, :k] = o.dyn_j
            dur[t, i, :k] = o.dur
    deadline = tg.deadline
    if upper is not None:
        deadline = upper if deadline is None else min(deadline, upper)
    forced = forced_idle(tg) if idle is None else idle
    # one multiplier per GPU type, and one (the last) for the row over all GPUs
    # when the graph forces waits; ``capacity`` is the GPUs each row covers
    total_row = forced.any
    capacity = np.append(counts, float(tg.n_gpus)) if total_row else counts
    taken = dur * np.asarray(forced.mult, float)[None, :, None]
    gaps = float(forced.gaps)

    subsets = _clock_subsets(tg, dyn.shape[2], counts)

    def value(lam: np.ndarray) -> float:
        priced_all = dyn + lam[:n_types, None, None] * dur
        if total_row:
            priced_all = priced_all + lam[n_types] * taken
        if subsets is None:
            tasks = float(priced_all.min(axis=2).min(axis=0).sum())
        else:
            masks, extra = subsets
            change = tg.transition_j + lam[:n_types] * tg.transition  # J per change, per type
            per_combo = np.where(masks, priced_all[None], np.inf).min(axis=3).min(axis=1)
            tasks = float((per_combo.sum(axis=1) + extra @ change).min())
        if total_row:
            tasks += float(lam[n_types]) * gaps
        slope = idle_per_unit - float(lam @ capacity)
        if slope >= 0:
            return tasks + slope * makespan_lb
        if deadline is None:
            return -math.inf
        return tasks + slope * deadline

    lam = np.zeros(len(capacity))
    best = value(lam)
    for _ in range(ASCENT_ROUNDS):
        before = best
        for t in range(len(capacity)):
            if capacity[t] == 0:
                continue
            rest = float(lam @ capacity) - lam[t] * capacity[t]
            hi = max(idle_per_unit - rest, 0.0) / capacity[t]
            if deadline is not None:
                hi = _widened(value, lam, t, max(hi, idle_per_unit / capacity[t]))
            lam[t], got = _golden_max(value, lam, t, hi)
            best = max(best, got)
        if best <= before * (1 + 1e-12):
            break
    return best if math.isfinite(best) else 0.0


def _at(lam: np.ndarray, t: int, x: float) -> np.ndarray:
    out = lam.copy()
    out[t] = x
    return out


def _widened(value: Pricing, lam: np.ndarray, t: int, hi: float) -> float:
    """An upper end for lambda_t's search: doubled while the bound still rises there
    (concave: past a point where it falls, the maximum lies below it)."""
    for _ in range(60):
        if value(_at(lam, t, 2 * hi)) <= value(_at(lam, t, hi)):
            return 2 * hi
        hi *= 2
    return hi


def _golden_max(value: Pricing, lam: np.ndarray, t: int, hi: float) -> tuple[float, float]:
    """lambda_t in [0, hi] maximising the concave ``value`` (golden section), and its
    value; the current lambda_t is kept when it is better than the search's point."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = 0.0, hi
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = value(_at(lam, t, c)), value(_at(lam, t, d))
    for _ in range(GOLDEN_STEPS):
        if fc >= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = value(_at(lam, t, c))
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = value(_at(lam, t, d))
    x, fx = (c, fc) if fc >= fd else (d, fd)
    for y in (0.0, hi, float(lam[t])):
        fy = value(_at(lam, t, y))
        if fy > fx:
            x, fx = y, fy
    return x, float(fx)


SUBSET_COMBOS = 64
"""``priced_energy_j`` counts clock changes by clock subsets when there are at most
this many choices of a clock set per GPU type (one type of 6 clocks) ..."""
SUBSET_WORK = 200_000
"""... and choices x types x tasks x option slots stays below this (small graphs)."""


def _clock_subsets(
    tg: TaskGraph, width: int, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Every choice of a clock set S_t per GPU type, as (masks [choice, type, task,
    option slot]: the option's clock is in S_t; changes [choice, type]:
    max(0, |S_t| - n_t)); None when clock changes are free or the choices are too
    many.

    A schedule whose tasks on type t use the clocks S_t changes clock at least
    |S_t| - n_t times on the n_t GPUs of that type (each GPU that runs tasks at c
    clocks changes at least c - 1 times), and each change costs ``transition_j`` and
    stalls its GPU ``transition`` units, which the busy-time price covers as well."""
    if tg.transition <= 0 and tg.transition_j <= 0:
        return None
    n, n_types = tg.n_tasks, len(tg.types)
    clock_sets: list[list[int]] = []
    for t in range(n_types):
        if counts[t] == 0:
            clock_sets.append([])
            continue
        clock_sets.append(sorted({c for o in tg.options[t] for c in o.clock_mhz}))
    combos = 1
    for clocks in clock_sets:
        combos *= 2 ** len(clocks)
    if combos > SUBSET_COMBOS or combos * n_types * n * width > SUBSET_WORK:
        return None
    per_type: list[list[tuple[np.ndarray, int]]] = []
    for t, clocks in enumerate(clock_sets):
        choices = []
        for bits in range(2 ** len(clocks)):
            chosen = {c for j, c in enumerate(clocks) if bits >> j & 1}
            mask = np.zeros((n, width), dtype=bool)
            for i, o in enumerate(tg.options[t]):
                for k, c in enumerate(o.clock_mhz):
                    mask[i, k] = c in chosen
            choices.append((mask, max(0, len(chosen) - int(counts[t]))))
        per_type.append(choices)
    masks: list[np.ndarray] = []
    extra: list[list[int]] = []
    for combo in itertools.product(*per_type):
        stacked = np.stack([m for m, _ in combo])
        if not stacked.any(axis=(0, 2)).all():
            continue  # some task has no option in the chosen clocks
        masks.append(stacked)
        extra.append([c for _, c in combo])
    return np.stack(masks), np.array(extra, dtype=float)
