"""Residual packing: its plans verify, cost what it says, never beat the brute-force
optimum, leave the root LP as it was, and stay close to the bound on a fleet where
rounding the LP up does not; colgen's restricted integer master gives verified plans."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from energyopt.catalog import Problem, load_problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers import configurations as serving_configurations
from energyopt.families.serving.solvers import residual_pack as rp
from energyopt.families.serving.solvers import solve as serving
from energyopt.families.serving.solvers.backend import finish_plan
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.families.serving.solvers.pattern_root import Root, solve_root
from energyopt.families.serving.solvers.residual_pack import residual_pack
from energyopt.families.serving.verify import evaluate_plan, verify_plan
from energyopt.formulations.errors import FormulationNotApplicable
from energyopt.perf.oppoints import OpTable, build_op_table
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import FEASIBLE, relative_gap

from .serving_exhaustive import shared_random_problems

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-6
RANDOM = shared_random_problems(5, 20)


def root_of(problem: Problem) -> Root[LpSession] | None:
    table = build_op_table(problem)
    t0 = time.perf_counter()
    return solve_root(
        problem,
        table,
        lambda _: None,
        colgen_deadline=t0 + 120.0,
        deadline=t0 + 240.0,
        exact_unit_bound=False,
        make_session=lambda prog: LpSession(
            prog.problem, prog.table, prog.costs, prog.classes, prog.columns
        ),
    )


def packed_plan(
    problem: Problem, tp_round_up_above: float = 0.0
) -> tuple[Root[LpSession], float, object] | None:
    """(root, objective, plan) of residual packing at the root LP, or None."""
    try:
        root = root_of(problem)
    except FormulationNotApplicable:
        return None
    if root is None:
        return None
    assert root.session is not None
    found = residual_pack(root.session, root.prog, tp_round_up_above=tp_round_up_above)
    if found is None:
        return None
    objective, values = found
    im = pat.integer_model(root.prog, pyomo=False)
    im.values = values
    plan = finish_plan(
        problem,
        root.prog.table,
        pat.decisions(root.prog, im),
        FEASIBLE,
        objective,
        None,
        "residual packing",
    )
    return root, objective, plan


@pytest.mark.parametrize("tp_round_up_above", [0.0, rp.TP_ROUND_UP_ABOVE])
@pytest.mark.parametrize("k", range(len(RANDOM)))
def test_a_packed_plan_verifies_and_never_beats_the_optimum(
    k: int, tp_round_up_above: float
) -> None:
    _, problem, opt = RANDOM[k]
    out = packed_plan(problem, tp_round_up_above)
    if out is None:
        return
    _, objective, plan = out
    assert opt.value is not None, "a plan for an instance the brute force calls infeasible"
    assert verify_plan(problem, plan) == []
    assert evaluate_plan(problem, plan).objective == pytest.approx(objective, rel=TOL)
    assert objective >= opt.value * (1 - TOL) - TOL


def test_random_tiny_instances_give_packed_plans() -> None:
    """The property test above is not vacuous: packing finds plans on most of them."""
    found = sum(packed_plan(problem) is not None for _, problem, opt in RANDOM if opt.value)
    assert found >= 5


def test_the_root_lp_is_left_as_it_was() -> None:
    problem = load_problem(ROOT / "instances" / "fleet-64.yaml")
    root = root_of(problem)
    assert root is not None and root.session is not None
    before = root.session.solve().objective
    assert residual_pack(root.session, root.prog) is not None
    mp = root.session.mp
    z = np.asarray(mp.z_var)
    after = root.session.solve()
    assert after.objective == pytest.approx(before, rel=1e-7)
    assert np.all(after.x[z] >= np.asarray(mp.lo)[z] - TOL)


def test_on_fleet_256_packing_is_within_four_percent_of_the_bound() -> None:
    """Packing the residuals into shared GPUs ends 3.2 % above the bound here; with
    covers that leave out each placement's fixed part (its decode loop's power) it
    ended 11.9 % above, a unit split into more, emptier placements."""
    problem = load_problem(ROOT / "instances" / "fleet-256.yaml")
    out = packed_plan(problem)
    assert out is not None
    root, objective, plan = out
    assert verify_plan(problem, plan) == []
    lower = max(root.prog.lower_bound, root.unit_bound)
    assert objective >= lower * (1 - TOL)
    assert relative_gap(objective, lower) <= 0.04


def test_a_lone_piece_moves_to_a_bin_of_another_clock_when_that_costs_less() -> None:
    """First fit packs each clock apart; consolidation then moves the piece alone at
    one clock into a bin of another clock with room (as its unit's op at that clock),
    saving a GPU's on-cost, and leaves the bins as they are where neither has room."""
    problem = load_problem(ROOT / "instances" / "fleet-16.yaml")
    root = root_of(problem)
    assert root is not None
    prog, table = root.prog, root.prog.table
    t = table.type_names.index("H100-SXM5-80GB")
    limits = {t: rp._limits(prog, t)}
    share_capacity, usable, power_cap = limits[t]
    single = (table.tp == 1) & (table.gpu_type == t) & (table.share == 25)
    u, v = 0, 1
    clocks = sorted(set(table.clock_mhz[single].tolist()))
    lone_clock, other_clock = clocks[0], clocks[-1]

    def op_of(unit: int, clock: int) -> int:
        ops = np.flatnonzero(single & (table.unit == unit) & (table.clock_mhz == clock))
        return int(ops[np.argmax(table.capacity_rps[ops])])

    lone_op, other_op = op_of(u, lone_clock), op_of(v, other_clock)
    caps = table.capacity_rps[[lone_op, op_of(u, other_clock)]]
    rate = 0.5 * float(caps.min())

    def bins(fill: int) -> list[tuple[int, int, rp.Bin]]:
        """The lone piece's bin and the other one, each with ``fill`` share units
        taken by something else."""
        lone = rp.Bin(fill, 0.0, table.on_power[(table.type_names[t], lone_clock)])
        lone.add(table, lone_op, rate)
        other = rp.Bin(fill, 0.0, table.on_power[(table.type_names[t], other_clock)])
        other.add(table, other_op, 1.0)
        return [(t, lone_clock, lone), (t, other_clock, other)]

    kept = rp._consolidate(prog, bins(0), limits)
    assert len(kept) == 1
    (_, clock, b) = kept[0]
    assert clock == other_clock
    assert sorted(int(table.unit[o]) for o in b.ops) == [u, v]
    assert all(int(table.clock_mhz[o]) == other_clock for o in b.ops)
    assert sorted(b.rates) == sorted([1.0, rate])
    assert b.share <= share_capacity and b.memory_gb <= usable + 1e-9
    assert b.power_w <= power_cap + 1e-9
    # no room left in either bin: both stay as they were
    full = rp._consolidate(prog, bins(share_capacity - 25), limits)
    assert [len(b.ops) for _, _, b in full] == [1, 1]


def test_the_restricted_integer_master_gives_a_verified_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """colgen's integer solve over the root LP's and the first plan's columns only
    (what masters of RESTRICTED_MASTER_COLUMNS or more get), forced on fleet-64, where
    neither first plan is within the 1 % target so the integer solve runs. The
    reduced-cost filter after it (whose solves are never restricted, and which would
    run to the time limit here) is switched off: the plan and bound checked are the
    restricted solve's."""
    monkeypatch.setattr(serving_configurations, "RESTRICTED_MASTER_COLUMNS", 0)
    monkeypatch.setattr(serving_configurations, "SLACK_STEPS", ())
    problem = load_problem(ROOT / "instances" / "fleet-64.yaml")
    result = serving.solve(problem, load_preset("colgen"), time_limit_s=20)
    assert result.plan is not None and result.objective is not None
    assert result.bound is not None
    assert verify_plan(problem, result.plan) == []
    assert evaluate_plan(problem, result.plan).objective == pytest.approx(result.objective, rel=TOL)
    assert result.objective >= result.bound * (1 - TOL)
    assert any("highs: incumbent" in line for line in result.log)


@pytest.mark.parametrize("case", range(len(RANDOM)))
def test_the_restricted_master_never_certifies_a_bound_above_the_optimum(
    case: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the restricted master forced on every integer solve (as masters of
    RESTRICTED_MASTER_COLUMNS or more get it) and a gap no first plan meets, colgen
    runs its reduced-cost filter to the full column set; the bound it reports then
    comes from an integer solve over every column within the slack, never from the
    restricted one: bound <= brute-force optimum <= plan."""
    monkeypatch.setattr(serving_configurations, "RESTRICTED_MASTER_COLUMNS", 0)
    _, problem, optimum = RANDOM[case]
    result = serving.solve(problem, load_preset("colgen"), time_limit_s=60, rel_gap=1e-9)
    if optimum.value is None:
        assert result.plan is None
        return
    assert result.plan is not None and result.objective is not None
    assert result.bound is not None
    assert verify_plan(problem, result.plan) == []
    assert result.bound <= optimum.value * (1 + TOL) + TOL
    assert result.objective >= optimum.value * (1 - TOL) - TOL


def test_clearing_prices_keep_the_covers_within_a_scarce_types_free_gpus() -> None:
    """With the type the covers want most cut to 60 % of what they take, its clearing
    price (0 in the LP, whose count rows do not bind) rises until the covers fit
    its free GPUs, and the packing at those prices costs less than at the LP's,
    where the units that come last find the type full."""
    problem = load_problem(ROOT / "instances" / "fleet-64.yaml")
    root = root_of(problem)
    assert root is not None and root.session is not None
    prog, table = root.prog, root.prog.table
    kept = rp._kept_counts(root.session, prog)
    assert kept is not None
    _, residual, free = kept
    zero = dict.fromkeys(table.type_names, 0.0)
    demand = rp._type_demand(prog, residual, zero)
    scarce = max(demand, key=lambda n: demand[n])
    room = int(0.6 * demand[scarce])
    assert room >= 1
    cut = dict(free)
    for c in prog.classes:
        if c.type_name == scarce:
            cut[c.index] = min(cut[c.index], room)
            room -= cut[c.index]
    room_left = {n: sum(cut[c.index] for c in prog.classes if c.type_name == n) for n in zero}
    assert demand[scarce] > room_left[scarce]
    prices = rp._clearing_prices(prog, residual, cut, zero)
    assert prices[scarce] > 0.0
    assert all(v >= 0.0 for v in prices.values())
    assert rp._type_demand(prog, residual, prices)[scarce] <= room_left[scarce] + 1e-9
    at_lp = rp._pack_at(zero, prog, residual, cut)
    at_clearing = rp._pack_at(prices, prog, residual, cut)
    assert at_clearing is not None
    assert at_lp is None or at_clearing[0] <= at_lp[0] + 1e-6


def test_clearing_prices_leave_the_lp_prices_where_every_type_has_room() -> None:
    problem = load_problem(ROOT / "instances" / "fleet-64.yaml")
    root = root_of(problem)
    assert root is not None and root.session is not None
    prog = root.prog
    kept = rp._kept_counts(root.session, prog)
    assert kept is not None
    _, residual, _ = kept
    lp = {n: 1.5 for n in prog.table.type_names}
    demand = rp._type_demand(prog, residual, lp)
    plenty = {c.index: int(np.ceil(sum(demand.values()))) + 1 for c in prog.classes}
    assert rp._clearing_prices(prog, residual, plenty, lp) == lp


def test_tp_counts_with_a_small_fraction_are_rounded_down_and_their_rate_covered() -> None:
    """Each LP TP count is kept rounded up, or rounded down where its fractional part
    is at most TP_ROUND_UP_ABOVE; the rate a rounded-down group no longer serves is
    left to the covers, so kept groups and residuals add up to every unit's rate.
    On fleet-256 (every unit has a single-GPU point) some counts are rounded down,
    so the rule is exercised."""
    problem = load_problem(ROOT / "instances" / "fleet-256.yaml")
    root = root_of(problem)
    assert root is not None and root.session is not None
    prog, table, mp = root.prog, root.prog.table, root.session.mp
    kept = rp._kept_counts(root.session, prog, rp.TP_ROUND_UP_ABOVE)
    assert kept is not None
    counts, residual, _ = kept
    lp = root.session.solve()
    z = lp.x[np.asarray(mp.z_var)]
    served = np.zeros(len(table.units))
    down = 0
    for j, col in enumerate(prog.columns[: len(z)]):
        if col.gpus_per_use == 1 or z[j] <= 1e-9:
            assert counts[j] == 0
            continue
        frac = z[j] - np.floor(z[j] + 1e-9)
        if frac <= rp.TP_ROUND_UP_ABOVE:
            assert counts[j] == np.floor(z[j] + 1e-9)
            down += frac > 1e-9
        else:
            assert counts[j] == np.ceil(z[j])
        for op, r, cap in zip(col.ops, mp.r_vars[j], col.capacity, strict=True):
            served[int(table.unit[op])] += min(float(lp.x[r]), counts[j] * cap)
    assert down >= 1
    rates = np.array([u.rate_rps for u in table.units])
    assert np.allclose(served + residual, rates, atol=1e-6)


def _choose_unit_by_unit(
    prog: pat.PatternProgram,
    residual: np.ndarray,
    free: dict[int, int],
    reserve: dict[str, int],
    count_price: dict[str, float],
) -> list[tuple[int, float]] | None:
    """``rp._choose`` as it was written before its covers were found in one pass:
    one ``_cover`` per unit, largest rate first, within each type's room."""
    table, costs = prog.table, prog.costs
    room = dict.fromkeys(table.type_names, 0.0)
    for c in prog.classes:
        room[c.type_name] += free[c.index]
    for name in room:
        room[name] = max(0.0, room[name] - reserve[name])
    type_cap = np.array([table.share_capacity[n] for n in table.type_names], dtype=np.float64)
    share_frac = table.share / type_cap[table.gpu_type]
    gpu_cost = np.array(
        [
            costs.on_cost[(table.type_names[int(t)], int(f))]
            + count_price[table.type_names[int(t)]]
            for t, f in zip(table.gpu_type, table.clock_mhz, strict=True)
        ]
    )
    fixed_all = np.where(share_frac <= 0.5 + 1e-9, share_frac, 1.0) * gpu_cost
    fixed_all = fixed_all + np.asarray(costs.op_fixed, dtype=np.float64)
    chosen: list[tuple[int, float]] = []
    for u in np.argsort(-residual, kind="stable").tolist():
        rate = float(residual[u])
        if rate <= rp.RESIDUAL_TOL:
            break
        ops = table.ops_of(u)
        ops = ops[table.tp[ops] == 1]
        left = np.array([room[table.type_names[t]] for t in table.gpu_type[ops]])
        ops = ops[share_frac[ops] <= left + 1e-9]
        while True:
            if ops.size == 0:
                return None
            pieces = rp._cover(
                rate, ops, table.capacity_rps[ops], fixed_all[ops], costs.op_cost[ops]
            )
            need: dict[int, float] = {}
            for op, _ in pieces:
                t = int(table.gpu_type[op])
                need[t] = need.get(t, 0.0) + float(share_frac[op])
            short = [t for t, v in need.items() if v > room[table.type_names[t]] + 1e-9]
            if not short:
                break
            ops = ops[~np.isin(table.gpu_type[ops], short)]
        for t, v in need.items():
            room[table.type_names[t]] -= v
        chosen.extend(pieces)
    return chosen


@pytest.mark.parametrize("name", ["fleet-64.yaml", "fleet-256.yaml"])
def test_covers_in_one_pass_are_the_unit_by_unit_covers(name: str) -> None:
    """``_choose`` (every unit's cover in one array pass, a unit covered on its own
    only where a type is short) picks the same pieces, in the same order, as one
    ``_cover`` per unit: at no GPU price, at prices that tie types, and with each
    type in turn cut to under half of what the covers take (so the walk runs out
    of it and covers the last units without it)."""
    problem = load_problem(ROOT / "instances" / name)
    root = root_of(problem)
    assert root is not None and root.session is not None
    prog, table = root.prog, root.prog.table
    kept = rp._kept_counts(root.session, prog)
    assert kept is not None
    _, residual, free = kept
    no_reserve = dict.fromkeys(table.type_names, 0)
    prices = [dict.fromkeys(table.type_names, 0.0), dict.fromkeys(table.type_names, 25.0)]
    prices.append({n: 10.0 * k for k, n in enumerate(table.type_names)})
    cases = [(free, p) for p in prices]
    demand = rp._type_demand(prog, residual, prices[0])
    for name_cut in table.type_names:
        room = int(0.4 * demand[name_cut])
        cut = dict(free)
        for c in prog.classes:
            if c.type_name == name_cut:
                cut[c.index] = min(cut[c.index], room)
                room -= cut[c.index]
        cases.append((cut, prices[0]))
    fallbacks = 0
    for free_at, price in cases:
        got = rp._choose(prog, residual, free_at, no_reserve, price)
        want = _choose_unit_by_unit(prog, residual, free_at, no_reserve, price)
        assert got == want
        unlimited = _choose_unit_by_unit(
            prog, residual, {c.index: 10**9 for c in prog.classes}, no_reserve, price
        )
        fallbacks += want != unlimited
    assert fallbacks >= 1  # some case ran a type out


def test_covers_of_stacked_units_are_each_units_cover() -> None:
    """``_covers`` gives each unit ``_cover``'s pieces, on random points with many
    exact ties (costs and capacities on a coarse grid) and units of several sizes."""
    rng = np.random.default_rng(7)
    n_ops = 400
    cap = rng.integers(1, 6, n_ops).astype(np.float64) * 0.5
    fixed = rng.integers(0, 4, n_ops).astype(np.float64)
    per_rps = rng.integers(0, 3, n_ops).astype(np.float64) * 0.25
    rates: list[float] = []
    unit_ops: list[np.ndarray] = []
    for k in range(300):
        size = int(rng.choice([1, 2, 5, 9]))
        unit_ops.append(np.sort(rng.choice(n_ops, size, replace=False)).astype(np.int64))
        rates.append(float(rng.integers(1, 40)) * 0.25 if k % 3 else float(rng.uniform(0.1, 12)))
    got = rp._covers(rates, unit_ops, cap, fixed, per_rps)
    for rate, ops, pieces in zip(rates, unit_ops, got, strict=True):
        assert pieces == rp._cover(rate, ops, cap[ops], fixed[ops], per_rps[ops])


def _brute_force_move(
    table: OpTable,
    bins: list[tuple[int, int, rp.Bin]],
    state: rp._BinArrays,
    candidates: list[tuple[int, int]],
    source: int,
    rate: float,
    smallest: int,
    limits: tuple[int, float, float],
    piece_cost: Callable[[int, float], float],
) -> tuple[float, int, int] | None:
    """``_cheapest_move`` by trying every candidate against every bin: the least cost,
    then the first bin, then the first candidate."""
    share_capacity, usable, power_cap = limits
    t = bins[source][0]
    best: tuple[float, int, int, int] | None = None  # (cost, bin, candidate order, op)
    for k, (f, op) in enumerate(candidates):
        if float(table.capacity_rps[op]) < rate - rp.RESIDUAL_TOL:
            continue
        cost = piece_cost(op, rate)
        for j, (tj, fj, bj) in enumerate(bins):
            if tj != t or fj != f or j == source or not state.alive[j]:
                continue
            if bj.share + smallest > share_capacity:
                continue
            fits = bj.fits(table, op, share_capacity, usable, power_cap)
            if fits and (best is None or (cost, j, k) < best[:3]):
                best = (cost, j, k, op)
    return None if best is None else (best[0], best[1], best[3])


def test_consolidation_moves_are_the_brute_force_cheapest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each move the consolidation makes on fleet-256's packing (at no GPU price and
    at a price that makes it move more) is the one found by trying every
    candidate against every bin of the type."""
    problem = load_problem(ROOT / "instances" / "fleet-256.yaml")
    root = root_of(problem)
    assert root is not None and root.session is not None
    prog, table = root.prog, root.prog.table
    kept = rp._kept_counts(root.session, prog)
    assert kept is not None
    _, residual, free = kept
    fast = rp._cheapest_move
    calls = [0, 0]

    def checked(
        table_: OpTable,
        bins: list[tuple[int, int, rp.Bin]],
        state: rp._BinArrays,
        open_idx: dict[tuple[int, int], np.ndarray],
        candidates: list[tuple[int, int]],
        source: int,
        rate: float,
        smallest: int,
        limits: tuple[int, float, float],
        piece_cost: Callable[[int, float], float],
    ) -> tuple[float, int, int] | None:
        got = fast(
            table_, bins, state, open_idx, candidates, source, rate, smallest, limits, piece_cost
        )
        want = _brute_force_move(
            table_, bins, state, candidates, source, rate, smallest, limits, piece_cost
        )
        assert got == want
        calls[0] += 1
        calls[1] += got is not None
        return got

    monkeypatch.setattr(rp, "_cheapest_move", checked)
    for price in (0.0, 40.0):
        prices = dict.fromkeys(table.type_names, price)
        chosen = rp._choose(prog, residual, free, dict.fromkeys(table.type_names, 0), prices)
        assert chosen is not None
        rp._pack(prog, chosen, dict(free))
    assert calls[1] >= 2 and calls[0] > calls[1]  # moves found and moves refused
