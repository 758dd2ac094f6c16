"""Branch-and-price for the configuration formulation (``formulation = "branch_price"``).

Column generation (``colgen.generate_columns`` / ``price_round``) runs at every node
of a best-bound branch-and-bound tree over the configuration master, in one warm LP
(``branch_lp.BranchLp``) whose branching rows change bounds from node to node.

Branching rule: on integer aggregates of the column counts, in this order -

1. the number of configurations of a class that hold a unit (``("held", c, u)``),
2. the number of GPUs of a class at a clock (``("gpus", c, f)``),
3. the number of configurations of a class that hold one op (``("op", c, o)``),

the most fractional one of the first kind that has any (ties by key). Holding
counts come first because the LP's weakness is fractional hosting: a unit served by
0.3 of a GPU pays 0.3 of its static power. On fleet-64 the bound rose faster per
node that way (before the cover cuts: 6,846 W after 200 nodes, against 6,765 W
after 700 nodes with GPU counts first; root LP 6,735 W). Why aggregates:
each is a sum of column counts, so a bound on it is one row of the master, and its
price enters pricing without changing the pricing problem's form: a GPU-count price
is a constant per (class, clock) in the configuration's base cost, a holding price
is a per-item bonus, which both the enumerated pricing and the knapsack DP take.
Branching on a single column's count would not have that property (a forbidden
column comes back from pricing), and Ryan-Foster pairs would make the knapsack
quadratic. Both children of a node partition its plans (aggregate <= floor, >=
ceil), so no plan is lost. A node whose aggregates are all integral while some
count is fractional (possible: the aggregates do not determine the counts) is not
branched further; it stays open with its bound (an unresolved leaf), which keeps
the global bound valid.

Cuts: the LP pays a unit's static power by fractions of GPUs; Chvatal-Gomory cover
cuts (``cover_cuts``) on the number of configurations that hold each op are
separated at the root (CUT_ROUNDS rounds; NODE_CUT_ROUNDS at every other node) and
hold in the whole tree. On fleet-64 they raise the root bound from 6,735 W to
6,914 W (the unit bound there is 7,090 W); separating once more at every node made
nodes about ten times slower (100 nodes in about 110 s against 10 s) for 4 W more
bound after 25 nodes (6,921 W against 6,917 W), so it is off.

Bounds: a node's bound is the best Lagrangian bound of its column generation (the
node LP's value corrected by the most negative reduced cost per class, valid even
when pricing stops early) and never below its parent's. The global bound is the
least bound of the open nodes and unresolved leaves, never above the incumbent,
and at least the unit-decomposition bound computed from the root prices.

Clock-pool bounds: where the pool relaxation applies (``packing_bound.applies``) and
the root leaves the gap open, the relaxation is first solved as MILPs over the
placements a Lagrangian bound keeps below rising thresholds (``pool_prune``;
``_pool_ladder``), before any integer master: on fleet-64 the second, over 106 of
1,219 placements, proves the relaxation's optimum, whose point packs into the
optimum plan, 7,746.85 W (3-7 CPU-s for both with the prices; the whole MILP at
the integer master's cut-off took 15-21 CPU-s after 7-9 for the integer master).
Where they leave the gap open, the relaxation is solved as a whole MILP
(``pool_milp``) right after the root's integer master, with the value that closes
the gap as its cut-off, before the tree. Where it does not finish, the tree
follows, and after it the Lagrangian bound of the same relaxation
(``packing_bound.pool_bound``).

Primal side: residual packing (``residual_pack``) at the root, the LP dive
(``lp_dive``) at the root and every DIVE_EVERY nodes (it
dives from that node's LP, so it starts from a different point each time), an
integer LP solution found at a node, and the integer master (HiGHS, warm-started
from the incumbent) over every column after the root cuts and, at the end, over the
columns some node LP used. Where the tree runs, its main gain is that last solve: on
fleet-64 (before the clock-pool MILP closed its gap ahead of the tree) its columns
gave a better plan than any column set column generation alone reaches.

The fleet-64 figures above were measured under the per-request power model, before
a placement paid its decode loop's fixed part (perf/energy.py ``power_line``); the
choices they support stand, the numbers are not today's.

Limits: the search stops when the gap is closed, after ``preset.nodes`` nodes, or at
the time limit. Every effort in it is counted (cut rounds, nodes, column generation
rounds per node, HiGHS branch-and-bound nodes for the integer master and the clock-pool
MILP, HiGHS nodes and search branches of each pruned MILP), so with a time limit
that is not reached the same instance gives the same plan and bound on a quiet or
a loaded machine. The time limit is a safety net, shared out as: root
column generation up to ROOT_SHARE of it, the unit bound UNIT_BOUND_SHARE of what is
left, root cuts up to CUT_SHARE, the pruned clock-pool MILPs up to LADDER_SHARE,
the whole one up to POOL_MILP_SHARE, the tree up to TREE_SHARE, each integer
master MIP_TIME_SHARE of what is left. Objective values and bounds are in the
instance's objective units (W for power).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers import packing_bound, pool_milp, pool_prune
from energyopt.families.serving.solvers.backend import finish_plan
from energyopt.families.serving.solvers.branch_lp import AggKey, Bounds, BranchLp
from energyopt.families.serving.solvers.colgen import MAX_ROUNDS, generate_columns
from energyopt.families.serving.solvers.configurations import solve_configurations
from energyopt.families.serving.solvers.cover_cuts import separate
from energyopt.families.serving.solvers.highs_direct import padded_start
from energyopt.families.serving.solvers.lp_dive import lp_dive
from energyopt.families.serving.solvers.pattern_root import solve_root
from energyopt.families.serving.solvers.residual_pack import residual_pack
from energyopt.families.serving.solvers.restricted_master import (
    RESTRICTED_MASTER_COLUMNS,
    solve_restricted,
    with_start_columns,
)
from energyopt.families.serving.verify import evaluate_plan
from energyopt.formulations.errors import BackendFailure
from energyopt.perf.oppoints import OpTable
from energyopt.progress import Progress
from energyopt.solvers.presets import SolverPreset
from energyopt.solvers.result import (
    FEASIBLE,
    INFEASIBLE,
    NO_SOLUTION,
    Result,
    Termination,
    relative_gap,
    status_at,
)
from energyopt.spec.plan import Plan

NODE_ROUNDS = 40
"""Column generation rounds per node at most (the node's bound stays valid below it)."""
DIVE_EVERY = 10
"""An LP dive from the node LP every this many nodes (and at the root)."""
ROOT_DIVE_SHARE = 0.3
"""Share of the time left that the root dive may take (a safety net: on fleet-64 it
takes 0.03 s; on fleet-10240 each of its LP solves takes 2-4 s, and with the whole
time left it ran past the limit)."""
MIP_NODES = 200
"""HiGHS branch-and-bound nodes of the root integer master (after the cuts)."""
FINAL_MIP_NODES = 200
"""HiGHS nodes of the final integer master, over the columns some node LP used and
the incumbent's (over all 2,176 columns of fleet-64's tree, 200 nodes took 85 s)."""
INTEGRAL_TOL = 1e-6
CUT_ROUNDS = 10
"""Rounds of cover-cut separation at the root at most (``cover_cuts``)."""
NODE_CUT_ROUNDS = 0
"""Rounds of cover-cut separation at each other node at most (see the docstring)."""
KIND_ORDER = ("held", "gpus", "op")
ROOT_SHARE = 0.5
"""Root column generation stops at this share of the time limit (a safety net)."""
CUT_SHARE = 0.6
"""Root cut rounds stop at this share of the time limit (a safety net)."""
TREE_SHARE = 0.85
"""The tree stops at this share of the time limit, leaving the rest to the final
integer master."""
MIP_TIME_SHARE = 0.25
"""Share of the time left that one integer master solve may take (safety net)."""
EXACT_FINISH_CONFIGS = 5_000
"""Listed configurations up to which a gap the tree leaves goes to the exact
configuration solve (on the bundled 4-GPU disaggregated instance, 135 of them: after
the clock-pool MILP (1,045.9 W) and 200 nodes the gap to the 1,048.4 W plan is
0.24 %, and the exact solve proves that plan optimal in under 1 s; fleet-64's 30,484
are past it)."""
POOL_MILP_SHARE = 0.75
"""The clock-pool MILP (``pool_milp``) stops at this share of the time limit (a safety
net; on fleet-64 it starts at 12 s and takes 23-28 s on a quiet 2-core machine)."""
POOL_MILP_PLACEMENTS = 5_000
"""Placements (ops in classes) up to which the clock-pool MILP is tried (fleet-64: 1,221)."""
TARGET_MARGIN = 1e-2
"""The clock-pool MILP's target lies this share of the gap tolerance inside it, so
that a bound it proves closes the gap despite rounding (at 1e-3 of a 1e-4 gap the
margin equalled the MILP's own tolerance taken off its bound, and quickstart's
proved target missed the gap by 1e-9 and went on to the tree)."""
LADDER_FIRST = 1.0
"""The first pruned clock-pool MILP's threshold lies this many gap tolerances above
the Lagrangian bound (``pool_prune``); each further one twice as far."""
LADDER_LAST = 0.1
"""The pruned MILPs stop at a threshold this share above the Lagrangian bound."""
LADDER_KEPT = 250
"""... or once a threshold keeps more than this many placements: the MILP's time
grows fast with them (fleet-64: 58 kept, 0.3 CPU-s; 106, 2.1; 365, 11.8; on
fleet-256, 480 of 2,438 kept ran past the time limit's share on a loaded machine
and left the integer master too little time: 1.18 % instead of 0.43 %), and the
whole MILP at the integer master's cut-off serves better there."""
LADDER_NODES = 5_000
"""HiGHS nodes of one pruned MILP at most (fleet-64: 78 at its second threshold)."""
LADDER_SHARE = 0.5
"""The pruned MILPs stop at this share of the time limit (a safety net)."""
POOL_NOTE_EVERY = 10
"""Clock-pool bound rounds between progress lines (a round takes about 1 s on fleet-64)."""


@dataclass(order=True)
class Node:
    """An open node: its bound (objective units), creation order and restrictions."""

    bound: float
    seq: int
    depth: int = field(compare=False)
    bounds: Bounds = field(compare=False)


@dataclass
class Incumbent:
    """The best plan so far: its objective (that of the plan its values make,
    ``pattern.integer_objective``) and integer-master values (columns in the
    program's order, padded with zeros for columns generated later)."""

    objective: float = math.inf
    values: NDArray[np.float64] | None = None
    found: str = ""

    def offer(self, objective: float, values: NDArray[np.float64], how: str) -> bool:
        if objective < self.objective - 1e-9 * max(1.0, abs(objective)):
            self.objective, self.values, self.found = objective, values, how
            return True
        return False


def _served(tree: BranchLp, artificial_rps: float, x: NDArray[np.float64]) -> bool:
    """No demand unserved and no branching or cut row on its slack."""
    return artificial_rps <= 1e-6 and tree.slack(x) <= 1e-6


def _positive(tree: BranchLp, x: NDArray[np.float64]) -> set[int]:
    """Columns whose count is positive at tree LP values ``x``."""
    z = x[np.asarray(tree.mp.z_var, dtype=np.int64)]
    return {int(j) for j in np.flatnonzero(z > 1e-9)}


def _is_integral(tree: BranchLp, x: NDArray[np.float64]) -> bool:
    z = x[np.asarray(tree.mp.z_var, dtype=np.int64)]
    return bool(np.all(np.abs(z - np.round(z)) <= INTEGRAL_TOL))


def choose_branch(aggregates: dict[AggKey, float]) -> tuple[AggKey, float] | None:
    """The aggregate to branch on (see the module docstring) and its value, or None."""
    for kind in KIND_ORDER:
        best: tuple[float, AggKey, float] | None = None
        for key in sorted(k for k in aggregates if k[0] == kind):
            v = aggregates[key]
            frac = v - math.floor(v + INTEGRAL_TOL)
            if frac <= INTEGRAL_TOL or frac >= 1.0 - INTEGRAL_TOL:
                continue
            score = abs(frac - 0.5)
            if best is None or score < best[0]:
                best = (score, key, v)
        if best is not None:
            return best[1], best[2]
    return None


def _dive(tree: BranchLp, deadline: float) -> tuple[float, NDArray[np.float64]] | None:
    """(objective, integer-master values) of an LP dive from the current node LP."""
    try:
        ok = lp_dive(tree, deadline)
        lp = tree.solve() if ok else None
    except BackendFailure:
        lp = None
    finally:
        tree.reset_counts()
    if lp is None or not _served(tree, lp.artificial_rps, lp.x):
        return None
    return lp.objective, tree.integer_values(lp.x)


def _repair(
    prog: pat.PatternProgram,
    inc: Incumbent,
    gap: float,
    lower: float,
    deadline: float,
    note: Progress,
    *,
    max_nodes: int,
    only: set[int] | None = None,
) -> None:
    """Integer master over the generated columns (those in ``only`` and the
    incumbent's when given, else all), at most ``max_nodes`` HiGHS nodes, from the
    incumbent."""
    picked = (
        list(range(len(prog.columns)))
        if only is None
        else with_start_columns(prog, only, inc.values)
    )
    left = max(0.5, MIP_TIME_SHARE * (deadline - time.perf_counter()))
    out, expanded = solve_restricted(
        prog,
        picked,
        inc.values,
        time_limit_s=left,
        rel_gap=min(gap, 1e-4),
        stop_at=lower / (1.0 - gap) if gap < 1 else None,
        max_nodes=max_nodes,
    )
    if out.objective is None or expanded is None:
        return
    if inc.offer(out.objective, expanded, f"integer master over {len(picked)} columns"):
        note(f"branch-and-price: integer master plan {out.objective:,.3f}")


def _cut_rounds(
    prog: pat.PatternProgram,
    tree: BranchLp,
    deadline: float,
    seen: set[tuple[int, float]],
    *,
    rounds: int,
    colgen_rounds: int,
) -> tuple[float, int]:
    """Add violated cover cuts (``cover_cuts``; global, so they hold in every node)
    and re-generate columns, ``rounds`` times at most: (the best bound seen, from
    ``prog.bound`` on, and the number of cuts added). ``seen``: cuts already added."""
    bound = prog.bound
    added = 0
    for _ in range(rounds):
        if time.perf_counter() > deadline:
            break
        lp = prog.lp
        assert lp is not None
        held = np.zeros(len(prog.table))
        for (kind, _, op), value in tree.aggregates(lp.x).items():
            if kind == "op":
                held[op] += value
        cuts = separate(prog.table, held, seen)
        if not cuts:
            break
        for cut in cuts:
            tree.add_cut(cut.coef, cut.lo)
        added += len(cuts)
        prog.bound = -math.inf
        generate_columns(prog, None, deadline=deadline, session=tree, max_rounds=colgen_rounds)
        bound = max(bound, prog.bound)
    return bound, added


def _pool_bound(
    problem: Problem, prog: pat.PatternProgram, deadline: float, note: Progress
) -> tuple[float, bool]:
    """The clock-pool bound (``packing_bound``) where it applies, else -inf, and
    whether the time limit stopped it (the bound then depends on the machine)."""
    if not packing_bound.applies(problem, prog.table, prog.costs):
        return -math.inf, False
    pools = packing_bound.build_pools(problem, prog.table, prog.costs, prog.classes)

    def progress(rounds: int, best: float, lp: float) -> None:
        if rounds % POOL_NOTE_EVERY == 0:
            note(f"branch-and-price: clock-pool round {rounds}, bound {best:,.3f}, LP {lp:,.3f}")

    found = packing_bound.pool_bound(pools, deadline=deadline, trace=progress)
    if found.converged:
        why = "converged"
    elif found.rounds >= packing_bound.MAX_ROUNDS:
        why = "round limit"
    else:
        why = "time limit"
    note(
        f"branch-and-price: clock-pool bound {found.bound:,.3f} ({why} after {found.rounds} "
        f"rounds; master LP {found.lp:,.3f})"
    )
    return found.bound, why == "time limit"


def _pool_milp(
    problem: Problem,
    prog: pat.PatternProgram,
    incumbent: float,
    gap: float,
    deadline: float,
    note: Progress,
) -> tuple[float, bool, bool, tuple[float, Plan] | None]:
    """The clock-pool relaxation as a MILP (``pool_milp``) with the value that closes
    the gap as its target, where it applies; else -inf. Returns the bound, whether the
    search finished, whether the time limit cut it, and the plan its best point
    packs into (cost, plan; verified), if any."""
    if not packing_bound.applies(problem, prog.table, prog.costs):
        return -math.inf, False, False, None
    pools = packing_bound.build_pools(problem, prog.table, prog.costs, prog.classes)
    if len(pools.unit) > POOL_MILP_PLACEMENTS:
        return -math.inf, False, False, None
    target = incumbent - (1.0 - TARGET_MARGIN) * gap * abs(incumbent)
    left = deadline - time.perf_counter()
    if left <= 0:
        return -math.inf, False, True, None
    note(
        f"branch-and-price: clock-pool MILP ({len(pools.unit)} placements, "
        f"{pools.n_pools} pools), target {target:,.3f}"
    )
    found = pool_milp.pool_milp_bound(pools, target, time_limit_s=left)
    note(f"branch-and-price: clock-pool MILP bound {found.bound:,.3f} ({found.status})")
    packed = None
    if found.point is not None:
        packed = _packed_pool_plan(problem, prog, pools, found.point, found.bound, gap)
        if packed is not None:
            note(f"branch-and-price: the clock-pool point packs into a plan of {packed[0]:,.3f}")
    return found.bound, found.finished, found.time_cut, packed


def _pool_ladder(
    problem: Problem,
    prog: pat.PatternProgram,
    lower: float,
    gap: float,
    deadline: float,
    note: Progress,
) -> tuple[float, tuple[float, Plan] | None]:
    """The clock-pool MILP over the placements the Lagrangian bound keeps below a
    threshold (``pool_prune``), at thresholds LADDER_FIRST gap tolerances above that
    bound and twice as far each time, before any integer master. Stops once a
    packed point closes the gap with the bound proved, a MILP finds a point below
    its threshold (the relaxation's optimum), does not finish, or the threshold
    passes LADDER_LAST or keeps more than LADDER_KEPT placements. Returns
    the bound proved (-inf where none) and the best packed plan (cost, plan;
    verified), if any."""
    if not packing_bound.applies(problem, prog.table, prog.costs):
        return -math.inf, None
    pools = packing_bound.build_pools(problem, prog.table, prog.costs, prog.classes)
    if len(pools.unit) > POOL_MILP_PLACEMENTS or not len(pools.unit):
        return -math.inf, None
    prices = pool_prune.best_prices(pools)
    base = prices.bound
    if not math.isfinite(base):
        return -math.inf, None
    proved = -math.inf
    best: tuple[float, Plan] | None = None
    step = LADDER_FIRST * gap
    while step <= LADDER_LAST and time.perf_counter() < deadline:
        threshold = base + step * max(1.0, abs(base))
        keep = pool_prune.kept_placements(pools, prices, threshold)
        if keep.sum() > LADDER_KEPT:
            break
        found = pool_milp.pool_milp_bound(
            pools,
            threshold,
            time_limit_s=deadline - time.perf_counter(),
            nodes=LADDER_NODES,
            keep=keep,
        )
        proved = max(proved, found.bound)
        below = found.point is not None and found.point.objective <= threshold
        packed = None
        if found.point is not None and (
            below or relative_gap(found.point.objective, max(lower, proved)) <= gap
        ):
            # packed and verified only where the plan may close the gap (a plan
            # costs at most its point's objective)
            packed = _packed_pool_plan(problem, prog, pools, found.point, found.bound, gap)
        if packed is not None and (best is None or packed[0] < best[0]):
            best = packed
        note(
            f"branch-and-price: pruned clock-pool MILP below {threshold:,.3f} "
            f"({int(keep.sum())} of {len(keep)} placements): bound {found.bound:,.3f} "
            f"({found.status})" + (f", plan {packed[0]:,.3f}" if packed is not None else "")
        )
        closed = best is not None and relative_gap(best[0], max(lower, proved)) <= gap
        if closed or below or not found.finished:
            break
        step *= 2.0
    return proved, best


def _packed_pool_plan(
    problem: Problem,
    prog: pat.PatternProgram,
    pools: packing_bound.Pools,
    point: pool_milp.PoolPoint,
    bound: float,
    gap: float,
) -> tuple[float, Plan] | None:
    """The pool MILP's point placed GPU by GPU (``pool_milp.pack_point``), as a
    verified plan with its own cost; None where it does not pack or verify."""

    decisions = pool_milp.pack_point(problem, prog.table, pools, prog.classes, point)
    if decisions is None:
        return None
    plan = finish_plan(problem, prog.table, decisions, FEASIBLE, math.inf, None, "")
    ev = evaluate_plan(problem, plan)
    if ev.violations:
        return None
    known = min(bound, ev.objective)
    status = status_at(ev.objective, known, gap) if math.isfinite(known) else FEASIBLE
    plan = plan.model_copy(
        update={
            "objective": ev.objective,
            "bound": known if math.isfinite(known) else None,
            "gap": relative_gap(ev.objective, known) if math.isfinite(known) else None,
            "status": str(status),
        }
    )
    return ev.objective, plan


def _exact_finish(
    problem: Problem,
    table: OpTable,
    preset: SolverPreset,
    deadline: float,
    gap: float,
    note: Progress,
) -> tuple[Result[Plan] | None, float, bool]:
    """Where the tree leaves a gap and every configuration is listed (at most
    ``EXACT_FINISH_CONFIGS``): the exact configuration solve (reduced-cost
    filtering over the listed configurations, as ``highs-pattern``). Returns its
    result, the bound it proves for the whole problem (-inf when none) and whether
    the time limit cut it short."""

    def prefixed(line: str) -> None:
        note(f"exact finish: {line}")

    result = solve_configurations(problem, table, preset, deadline, gap, prefixed, exact=True)
    if result.status == INFEASIBLE:
        return None, math.inf, False
    proved = result.bound if result.bound is not None else -math.inf
    return result, proved, result.termination == Termination.TIME_LIMIT


def solve_branch_price(
    problem: Problem,
    table: OpTable,
    preset: SolverPreset,
    deadline: float,
    gap: float,
    note: Progress,
) -> Result[Plan]:
    """Branch-and-price over the configuration formulation (module docstring):
    the best plan found and the global bound, in objective units (W for power)."""
    t0 = time.perf_counter()
    limit = deadline - t0
    root = solve_root(
        problem,
        table,
        note,
        colgen_deadline=t0 + ROOT_SHARE * limit,
        deadline=deadline,
        exact_unit_bound=True,
        make_session=BranchLp,
    )
    if root is None:
        return Result(INFEASIBLE, None, None, time.perf_counter() - t0, None, preset.name, [])
    prog, tree, unit_bound = root.prog, root.session, root.unit_bound
    assert tree is not None and prog.lp is not None
    root_bound = prog.bound
    note(
        f"branch-and-price root: LP bound {root_bound:,.3f} ({len(prog.columns)} columns), "
        f"unit bound {unit_bound:,.3f}"
    )
    seen: set[tuple[int, float]] = set()
    before = root_bound
    root_bound, cuts = _cut_rounds(
        prog, tree, t0 + CUT_SHARE * limit, seen, rounds=CUT_ROUNDS, colgen_rounds=MAX_ROUNDS
    )
    note(
        f"branch-and-price: {cuts} cover cuts, root bound {before:,.3f} -> {root_bound:,.3f} "
        f"({len(prog.columns)} columns)"
    )
    inc = Incumbent()
    packed = residual_pack(tree, prog)
    if packed is not None:
        inc.offer(pat.integer_objective(prog, packed[1]), packed[1], "residual packing")
    dived = _dive(tree, time.perf_counter() + ROOT_DIVE_SHARE * (deadline - time.perf_counter()))
    if dived is not None:
        inc.offer(pat.integer_objective(prog, dived[1]), dived[1], "root dive")
    lower = max(root_bound, unit_bound)
    pool_plan: tuple[float, Plan] | None = None
    if relative_gap(inc.objective, lower) > gap:
        laddered, pool_plan = _pool_ladder(
            problem, prog, lower, gap, t0 + LADDER_SHARE * limit, note
        )
        unit_bound = max(unit_bound, laddered)
        lower = max(lower, unit_bound)
        if pool_plan is not None and pool_plan[0] < inc.objective - 1e-9 * abs(inc.objective):
            bound = min(lower, pool_plan[0])
            if relative_gap(pool_plan[0], bound) <= gap:
                return _pool_result(pool_plan, bound, gap, t0, preset, note, Termination.CONVERGED)
    used = _positive(tree, prog.lp.x)
    # Over every column of a large master HiGHS overruns its time (see
    # restricted_master.RESTRICTED_MASTER_COLUMNS): there, the root LP's columns and the
    # incumbent's only.
    large = len(prog.columns) >= RESTRICTED_MASTER_COLUMNS
    if relative_gap(inc.objective, lower) > gap:  # the ladder's bound may have closed it
        _repair(
            prog,
            inc,
            gap,
            lower,
            deadline,
            note,
            max_nodes=MIP_NODES,
            only=set(used) if large else None,
        )
    pool_done = pool_cut = False
    if inc.values is not None and relative_gap(inc.objective, max(lower, unit_bound)) > gap:
        pooled, pool_done, pool_cut, found_plan = _pool_milp(
            problem, prog, inc.objective, gap, t0 + POOL_MILP_SHARE * limit, note
        )
        unit_bound = max(unit_bound, pooled)
        if found_plan is not None and (pool_plan is None or found_plan[0] < pool_plan[0]):
            pool_plan = found_plan
        if pool_plan is not None and pool_plan[0] < inc.objective - 1e-9 * abs(inc.objective):
            bound = min(max(lower, unit_bound), pool_plan[0])
            if relative_gap(pool_plan[0], bound) <= gap:
                return _pool_result(pool_plan, bound, gap, t0, preset, note, Termination.CONVERGED)
    heap: list[Node] = [Node(root_bound, 0, 0, {})]
    leaves: list[float] = []
    seq, nodes = 1, 0
    termination = Termination.TIME_LIMIT if pool_cut else Termination.CONVERGED
    while heap:
        open_low = min(heap[0].bound, min(leaves, default=math.inf))
        if relative_gap(inc.objective, max(open_low, unit_bound)) <= gap:
            break
        if nodes >= preset.nodes:
            termination = Termination.EFFORT_LIMIT
            break
        if time.perf_counter() > t0 + TREE_SHARE * limit:
            termination = Termination.TIME_LIMIT
            break
        node = heapq.heappop(heap)
        if node.bound >= inc.objective - 1e-9 * max(1.0, abs(inc.objective)):
            continue
        nodes += 1
        tree.set_node(node.bounds)
        prog.bound = -math.inf
        try:
            generate_columns(prog, None, deadline=deadline, session=tree, max_rounds=NODE_ROUNDS)
        except BackendFailure:
            leaves.append(node.bound)
            continue
        bound, _ = _cut_rounds(
            prog, tree, deadline, seen, rounds=NODE_CUT_ROUNDS, colgen_rounds=NODE_ROUNDS
        )
        lp = prog.lp
        assert lp is not None
        used.update(_positive(tree, lp.x))
        bound = max(node.bound, bound)
        if bound >= inc.objective - 1e-9 * max(1.0, abs(inc.objective)):
            continue
        if _is_integral(tree, lp.x) and _served(tree, lp.artificial_rps, lp.x):
            values = tree.integer_values(lp.x)
            inc.offer(pat.integer_objective(prog, values), values, f"node {nodes} LP")
            if prog.bound < lp.objective - 1e-6 * max(1.0, abs(lp.objective)):
                leaves.append(bound)  # integral, but pricing did not prove it optimal
            continue
        if nodes % DIVE_EVERY == 0:
            dived = _dive(tree, deadline)
            if dived is not None:
                priced = pat.integer_objective(prog, dived[1])
                if inc.offer(priced, dived[1], f"dive at node {nodes}"):
                    note(f"branch-and-price: node {nodes}, dive plan {priced:,.3f}")
        pick = choose_branch(tree.aggregates(lp.x))
        if pick is None:
            leaves.append(bound)
            continue
        key, value = pick
        lo, hi = node.bounds.get(key, (-math.inf, math.inf))
        for child in ((lo, float(math.floor(value))), (float(math.ceil(value)), hi)):
            bounds = dict(node.bounds)
            bounds[key] = child
            heapq.heappush(heap, Node(bound, seq, node.depth + 1, bounds))
            seq += 1
        if nodes % 25 == 0:
            low = min(heap[0].bound, min(leaves, default=math.inf))
            note(
                f"branch-and-price: {nodes} nodes, {len(heap)} open, bound {low:,.3f}, "
                f"incumbent {inc.objective:,.3f}, {len(prog.columns)} columns"
            )
    tree_bound = min(
        heap[0].bound if heap else math.inf, min(leaves, default=math.inf), inc.objective
    )
    if inc.values is not None and relative_gap(inc.objective, max(tree_bound, unit_bound)) > gap:
        _repair(
            prog,
            inc,
            gap,
            max(tree_bound, unit_bound),
            deadline,
            note,
            max_nodes=FINAL_MIP_NODES,
            only=used,
        )
        tree_bound = min(tree_bound, inc.objective)
    better: Result[Plan] | None = None
    # No plan and the tree not closed (its node LPs still lean on artificial
    # demand): the exact solve either finds a plan or proves there is none.
    unresolved = inc.values is None and bool(heap or leaves)
    if (
        (
            unresolved
            or (
                inc.values is not None
                and relative_gap(inc.objective, max(tree_bound, unit_bound)) > gap
            )
        )
        and prog.enumerated
        and sum(len(c) for c in prog.configs.values()) <= EXACT_FINISH_CONFIGS
    ):
        better, proved, cut = _exact_finish(problem, table, preset, deadline, gap, note)
        unit_bound = max(unit_bound, proved)
        if cut:
            termination = Termination.TIME_LIMIT
        if better is not None and (
            better.objective is None
            or better.objective >= inc.objective - 1e-9 * abs(inc.objective)
        ):
            better = None
    best_value = inc.objective if better is None or better.objective is None else better.objective
    if (
        not pool_done
        and inc.values is not None
        and relative_gap(best_value, max(tree_bound, unit_bound)) > gap
    ):
        pooled, time_cut = _pool_bound(problem, prog, deadline, note)
        unit_bound = max(unit_bound, pooled)
        if time_cut:
            termination = Termination.TIME_LIMIT
    bound = max(tree_bound, unit_bound, root_bound)
    if pool_plan is not None and pool_plan[0] < best_value - 1e-9 * abs(best_value):
        return _pool_result(pool_plan, min(bound, pool_plan[0]), gap, t0, preset, note, termination)
    wall = time.perf_counter() - t0
    if termination == Termination.EFFORT_LIMIT and relative_gap(best_value, bound) <= gap:
        # The tree stopped on its node limit, and a later step (the exact finish,
        # the pool bound) closed the gap: the run stopped on its own rule.
        termination = Termination.CONVERGED
    if better is not None and better.plan is not None and better.objective is not None:
        bound = min(bound, better.objective)
        status = status_at(better.objective, bound, gap)
        note(
            f"branch-and-price: {nodes} nodes ({termination}); best plan "
            f"{better.objective:,.3f} (exact finish), bound {bound:,.3f}"
        )
        plan = better.plan.model_copy(
            update={
                "bound": bound,
                "gap": relative_gap(better.objective, bound),
                "status": str(status),
                "solver": preset.name,
            }
        )
        return Result(
            status, better.objective, bound, wall, plan, preset.name, [], termination=termination
        )
    note(
        f"branch-and-price: {nodes} nodes ({termination}), {len(heap)} open, "
        f"{len(leaves)} unresolved leaves, {len(prog.columns)} columns; best plan "
        f"{inc.objective:,.3f} ({inc.found or 'none'}), bound {bound:,.3f}"
    )
    if inc.values is None:
        if (not heap and not leaves) or unit_bound == math.inf:
            return Result(INFEASIBLE, None, None, wall, None, preset.name, [])
        known = bound if math.isfinite(bound) else None
        return Result(
            NO_SOLUTION, None, known, wall, None, preset.name, [], termination=termination
        )
    bound = min(bound, inc.objective)
    im = pat.integer_model(prog, pyomo=False)
    im.values = padded_start(inc.values, len(im.master.cost))
    status = status_at(inc.objective, bound, gap) if math.isfinite(bound) else FEASIBLE
    plan = finish_plan(
        problem, table, pat.decisions(prog, im), status, inc.objective, bound, preset.name
    )
    return Result(
        status, inc.objective, bound, wall, plan, preset.name, [], termination=termination
    )


def _pool_result(
    pool_plan: tuple[float, Plan],
    bound: float,
    gap: float,
    t0: float,
    preset: SolverPreset,
    note: Progress,
    termination: Termination,
) -> Result[Plan]:
    """The packed clock-pool plan as the search's result, at ``bound``."""
    objective, plan = pool_plan
    status = status_at(objective, bound, gap) if math.isfinite(bound) else FEASIBLE
    known = bound if math.isfinite(bound) else None
    note(
        f"branch-and-price: best plan {objective:,.3f} (packed clock-pool point), "
        f"bound {bound:,.3f}"
    )
    plan = plan.model_copy(
        update={
            "bound": known,
            "gap": relative_gap(objective, bound) if known is not None else None,
            "status": str(status),
            "solver": preset.name,
        }
    )
    wall = time.perf_counter() - t0
    return Result(status, objective, known, wall, plan, preset.name, [], termination=termination)
