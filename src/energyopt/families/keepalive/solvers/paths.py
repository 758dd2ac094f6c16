"""The path master of the keep-alive Lagrangian: one of each function's paths,
chosen jointly within the node budgets, the SLOs and the cold-start cap.

The greedy repair places functions one at a time and can fail where no order
works: on tight node budgets the MILP's plan moves functions between nodes and
states in turn, which no function placed alone chooses (on four of four tight
variants of the bundled two-node instance that the MILP solves, the repair found
nothing). The master picks one path per function with all functions at once,

    min  sum_{f,k} E_fk x_fk
    s.t. sum_k x_fk = 1                                    every function f
         sum_{f,k} use_fk(n, t) x_fk <= budget(n, t)       GPU GB, host GB, power W
         sum_{f,k} cold_fk x_fk <= cold cap,               x binary,

over paths that keep their function's SLO alone. Its columns are the subgradient's
shortest paths and the repairs' plans, then column generation on its LP (with
elastic budget rows, so that it is feasible from the start): the LP's row duals
price the budgets and the cap, and each function's cheapest path at those prices
that keeps its SLO (the repair's exact programme over late requests, budgets left
open) enters where its reduced cost is negative. Then the 0/1 master over every
column, with HiGHS on a node limit (counted work; the time limit is a safety net).
Its plans are plans of the keep-alive MILP, checked by the same verifier; its
bound holds for its columns only and is not reported.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from energyopt.backends.highs import LpValues, WarmLp, binary_lp, mixed_lp, solve_mip
from energyopt.families.keepalive.formulations.model import FloatArray, IntArray, KeepAliveProblem
from energyopt.families.keepalive.solvers.programmes import (
    OutOfTime,
    Prices,
    one_function,
    priced_costs,
)

PATHS_PER_FUNCTION = 32
"""Distinct paths per function taken from the subgradient and the repairs (the
first ones offered); column generation adds its own past this."""
ROOT_ROUNDS = 100
"""Column generation rounds on the master's LP before the dive, at most."""
PRICING_ROUNDS = 25
"""Column generation rounds after each of the dive's steps, at most."""
TOTAL_ROUNDS = 1_000
"""LP solves (each with one pricing pass over the functions) the column generation
and the dive may take together; the time limit is a safety net."""
DIVE_BACKTRACKS = 50
"""Forcings the dive may undo (ruling the forced state out instead) before it gives up."""
MASTER_NODES = 2_000
"""HiGHS branch-and-bound nodes the 0/1 master may take."""
MAX_NONZEROS = 5_000_000
"""Largest master (matrix entries) that is built; past it the master is skipped."""
TOL = 1e-9


@dataclass(frozen=True)
class PathColumn:
    """One function's path (T states) and its column: energy J, rows and amounts."""

    function: int
    path: IntArray
    energy_j: float
    rows: IntArray
    amounts: FloatArray


class PathPool:
    """Distinct SLO-keeping paths per function, as master columns. Rows: one per
    function (choose one), then GPU GB, host GB and power W per node and window,
    then the cold-start cap."""

    def __init__(self, p: KeepAliveProblem) -> None:
        self.p = p
        self.columns: list[PathColumn] = []
        self._keys: list[set[bytes]] = [set() for _ in range(p.n_functions)]
        self.n_rows = p.n_functions + 3 * p.n_nodes * p.n_windows + 1
        self.nonzeros = 0

    def offer(self, states: IntArray) -> None:
        """Add each row of ``states`` (F, T) to its function's paths while it has
        fewer than PATHS_PER_FUNCTION."""
        for f, row in enumerate(states):
            if len(self._keys[f]) < PATHS_PER_FUNCTION:
                self.add(f, row)

    def add(self, f: int, path: IntArray) -> PathColumn | None:
        """The new column of function f's ``path``; None when it is already held or
        breaks the function's SLO on its own."""
        key = np.ascontiguousarray(path, dtype=np.int64).tobytes()
        if key in self._keys[f]:
            return None
        col = _column(self.p, f, np.array(path, dtype=np.int64))
        if col is None:
            return None
        self._keys[f].add(key)
        self.columns.append(col)
        self.nonzeros += len(col.rows)
        return col

    def size(self) -> int:
        """Paths held over all functions."""
        return len(self.columns)

    def covers_every_function(self) -> bool:
        """Whether every function has at least one path."""
        return all(self._keys)

    def row_bounds(self) -> tuple[FloatArray, FloatArray]:
        """Lower and upper sides of every row."""
        p = self.p
        k = p.n_nodes * p.n_windows
        caps = np.concatenate(
            [
                np.repeat(p.gpu_cap, p.n_windows),
                np.repeat(p.host_cap, p.n_windows),
                np.repeat(p.power_cap, p.n_windows),
            ]
        )
        lo = np.concatenate([np.ones(p.n_functions), np.full(3 * k, -np.inf), [-np.inf]])
        hi = np.concatenate([np.ones(p.n_functions), caps * (1 + TOL) + TOL, [p.cold_cap]])
        return lo, hi


def _column(p: KeepAliveProblem, f: int, path: IntArray) -> PathColumn | None:
    """Column of function f's path: energy, and its entries in the choice row, the
    budget rows and the cold-cap row; None when the path alone breaks f's SLO."""
    late = float((p.arrivals[f] * p.slow[f, path]).sum())
    budget = p.slo_budget[f]
    if np.isfinite(budget) and late > budget * (1 + TOL) + TOL:
        return None
    t = np.arange(p.n_windows)
    prev = np.concatenate([[p.source_state], path[:-1]])
    energy_t = p.state_j[f, t, path] + p.move_j(f, prev, path)
    cold = float((p.arrivals[f] * p.is_cold()[path]).sum())
    cell = p.node_of()[path] * p.n_windows + t
    k = p.n_nodes * p.n_windows
    first = p.n_functions
    rows = np.concatenate([[f], first + cell, first + k + cell, first + 2 * k + cell])
    amounts = np.concatenate([[1.0], p.gpu_gb[f, path], p.host_gb[f, path], energy_t / p.window_s])
    if cold > 0:
        rows = np.concatenate([rows, [first + 3 * k]])
        amounts = np.concatenate([amounts, [cold]])
    keep = amounts > 0
    return PathColumn(f, path, float(energy_t.sum()), rows[keep], amounts[keep])


class PathLp:
    """The master's LP over the pool, with elastic budget and cap rows (cost
    ``penalty`` per unit over a row), kept warm while columns enter and functions
    are fixed to one path."""

    def __init__(self, p: KeepAliveProblem, pool: PathPool) -> None:
        self.p, self.pool = p, pool
        lo, hi = pool.row_bounds()
        first = p.n_functions
        elastic = np.arange(first, pool.n_rows)
        self.n_slack = len(elastic)
        # Per unit over a row: more than any plan costs (each function's dearest
        # path), and no more, so that reduced costs keep their digits.
        dearest = np.zeros(p.n_functions)
        for col in pool.columns:
            dearest[col.function] = max(dearest[col.function], col.energy_j)
        penalty = 2.0 * float(dearest.sum()) + 1.0
        self.lp = WarmLp(
            mixed_lp(
                np.full(self.n_slack, penalty),
                sparse.csc_matrix(
                    (-np.ones(self.n_slack), (elastic, np.arange(self.n_slack))),
                    shape=(pool.n_rows, self.n_slack),
                ),
                lo,
                hi,
                np.zeros(self.n_slack),
                np.full(self.n_slack, np.inf),
                np.zeros(self.n_slack, dtype=np.bool_),
            )
        )
        self.in_lp = 0  # pool columns added to the LP (the pool's first ones)
        self.rounds_left = TOTAL_ROUNDS  # LP solves left, dive included (counted work)
        self.last: LpValues | None = None  # the latest LP solution
        # (function, window) -> the state the dive forced there, and (function,
        # window, state) it ruled out; columns that break either are held at 0 and
        # pricing only offers paths that keep both
        self.forced: dict[tuple[int, int], int] = {}
        self.banned: set[tuple[int, int, int]] = set()
        self._sync()

    def allows(self, col: PathColumn) -> bool:
        """Whether the column keeps every forced and ruled-out state of its function."""
        f = col.function
        if any(col.path[t] != s for (g, t), s in self.forced.items() if g == f):
            return False
        return not any(col.path[t] == s for g, t, s in self.banned if g == f)

    def _sync(self) -> None:
        for col in self.pool.columns[self.in_lp :]:
            hi = 1.0 if self.allows(col) else 0.0
            self.lp.add_col(col.energy_j, 0.0, hi, col.rows.astype(np.int32), col.amounts)
            self.in_lp += 1

    def _bounds(self) -> None:
        for i, col in enumerate(self.pool.columns[: self.in_lp]):
            self.lp.change_col_bounds(self.n_slack + i, 0.0, 1.0 if self.allows(col) else 0.0)

    def restrict(
        self, forced: dict[tuple[int, int], int], banned: set[tuple[int, int, int]]
    ) -> None:
        """Force and rule out exactly these states from now on."""
        self.forced, self.banned = dict(forced), set(banned)
        self._bounds()

    def price_out(self, deadline: float, rounds: int) -> tuple[LpValues | None, int]:
        """Column generation for the functions not fixed, up to ``rounds`` rounds:
        the last LP solution (None if HiGHS gave none) and the rounds run."""

        p = self.p
        first, k = p.n_functions, p.n_nodes * p.n_windows
        shape = (p.n_nodes, p.n_windows)
        sol: LpValues | None = None
        done = 0
        while done < rounds and self.rounds_left > 0 and time.perf_counter() < deadline:
            done += 1
            self.rounds_left -= 1
            sol = self.lp.solve()
            if not sol.optimal:
                return None, done
            y = sol.row_dual
            budget = np.maximum(0.0, -y[first:])  # prices of the <= rows, per unit
            prices = Prices(
                budget[:k].reshape(shape),
                budget[k : 2 * k].reshape(shape),
                budget[2 * k : 3 * k].reshape(shape),
                np.zeros(p.n_functions),
                float(budget[3 * k]),
                np.zeros((len(p.covers), p.n_windows)),
            )
            added = 0
            try:
                cheapest = cheapest_paths(p, prices, self.forced, self.banned, deadline)
            except OutOfTime:
                break
            for f, path in cheapest:
                cand = _column(p, f, path)
                if cand is None:
                    continue
                reduced = cand.energy_j - float(y[cand.rows] @ cand.amounts)
                if reduced < -1e-6 * max(1.0, abs(cand.energy_j)):
                    added += self.pool.add(f, path) is not None
            self._sync()
            if added == 0 or self.pool.nonzeros > MAX_NONZEROS:
                break
        return sol, done

    def pool_values(self, sol: LpValues) -> FloatArray:
        """The LP values of the pool columns the solution saw (columns priced in
        after it are not among them)."""
        return sol.col_value[self.n_slack :]

    def over_budget(self, sol: LpValues) -> bool:
        """Whether the LP solution leans on its elastic rows."""
        return float(sol.col_value[: self.n_slack].sum()) > 1e-7


def cheapest_paths(
    p: KeepAliveProblem,
    y: Prices,
    forced: dict[tuple[int, int], int] | None = None,
    banned: set[tuple[int, int, int]] | None = None,
    deadline: float | None = None,
) -> list[tuple[int, IntArray]]:
    """Each function's cheapest path at prices ``y`` that keeps its SLO (the repair's
    programme over late requests, no budget enforced), goes through the states
    ``forced`` on it and avoids those ``banned``; functions with no such path are
    left out. OutOfTime when ``deadline`` (perf_counter s) passes first."""

    open_gb = np.full((p.n_nodes, p.n_windows), np.inf)
    late_penalty = float(np.max(p.state_j)) + 1.0
    cost, factor = priced_costs(p, y)
    for (f, t), state in (forced or {}).items():
        keep = cost[f, t, state]
        cost[f, t, :] = np.inf
        cost[f, t, state] = keep
    for f, t, state in banned or ():
        cost[f, t, state] = np.inf
    out = []
    for f in range(p.n_functions):
        path = one_function(
            p, f, cost[f], factor, open_gb, open_gb, open_gb, late_penalty, deadline
        )
        if path is not None:
            out.append((f, path))
    return out


def price_paths(p: KeepAliveProblem, pool: PathPool, deadline: float) -> PathLp | None:
    """Column generation on the master's LP (None when a function has no path that
    keeps its SLO). Every function first gets its cheapest SLO-keeping path at zero
    prices, so that it has a column."""

    try:
        cheapest = cheapest_paths(p, Prices.zero(p), deadline=deadline)
    except OutOfTime:
        return None
    for f, path in cheapest:
        pool.add(f, path)
    if not pool.covers_every_function():
        return None
    lp = PathLp(p, pool)
    lp.last, _ = lp.price_out(deadline, ROOT_ROUNDS)
    return lp


def dive(lp: PathLp, deadline: float) -> IntArray | None:
    """From the priced LP: while its paths are fractional, force the (function,
    window) state with the largest fractional flow and price again, until the LP
    takes one whole path per function (a plan within every budget, the SLOs and the
    cap: F, T states), or it needs its elastic rows with no forcing left to undo, or
    the work or the time is up (None)."""
    p, pool, sol = lp.p, lp.pool, lp.last
    # Depth-first with few backtracks: ``stack`` the forcings in order, each with the
    # states ruled out under it; a forcing that leaves the LP needing its elastic
    # rows is undone (with what was ruled out under it) and its state ruled out.
    stack: list[tuple[tuple[int, int, int], list[tuple[int, int, int]]]] = []
    top_banned: list[tuple[int, int, int]] = []  # ruled out with no forcing above
    backtracks = 0
    while sol is not None and time.perf_counter() < deadline:
        if lp.over_budget(sol):
            if not stack or backtracks >= DIVE_BACKTRACKS:
                return None
            backtracks += 1
            undone, _ = stack.pop()
            (stack[-1][1] if stack else top_banned).append(undone)
            forced = {(f, t): state for (f, t, state), _ in stack}
            banned = set(top_banned) | {b for _, bans in stack for b in bans}
            lp.restrict(forced, banned)
            sol, _ = lp.price_out(deadline, PRICING_ROUNDS)
            continue
        x = lp.pool_values(sol)
        flow = np.zeros((p.n_functions, p.n_windows, p.n_states))
        t = np.arange(p.n_windows)
        for j in np.flatnonzero(x > 1e-9):
            col = pool.columns[j]
            flow[col.function, t, col.path] += x[j]
        fractional = np.where(flow < 1.0 - 1e-6, flow, 0.0)
        if float(fractional.max()) <= 1e-9:  # one whole path per function
            states = np.zeros((p.n_functions, p.n_windows), dtype=np.int64)
            for j in np.flatnonzero(x > 0.5):
                states[pool.columns[j].function] = pool.columns[j].path
            return states
        f, w, state = (int(i) for i in np.unravel_index(np.argmax(fractional), flow.shape))
        stack.append(((f, w, state), []))
        lp.restrict({**lp.forced, (f, w): state}, lp.banned)
        sol, _ = lp.price_out(deadline, PRICING_ROUNDS)
    return None


def solve_path_master(
    p: KeepAliveProblem, pool: PathPool, *, time_limit_s: float
) -> IntArray | None:
    """The cheapest choice of one pooled path per function within every budget, the
    SLOs and the cold cap (F, T states), or None when the pool holds none (or the
    node limit comes first, or the master would be over MAX_NONZEROS)."""
    if time_limit_s <= 0 or not pool.covers_every_function() or pool.nonzeros > MAX_NONZEROS:
        return None
    cols = pool.columns
    indptr = np.concatenate([[0], np.cumsum([len(c.rows) for c in cols])])
    matrix = sparse.csc_matrix(
        (
            np.concatenate([c.amounts for c in cols]),
            np.concatenate([c.rows for c in cols]),
            indptr,
        ),
        shape=(pool.n_rows, len(cols)),
    )
    lo, hi = pool.row_bounds()
    run = solve_mip(
        binary_lp(np.array([c.energy_j for c in cols]), matrix, lo, hi),
        time_limit_s=time_limit_s,
        rel_gap=1e-6,
        node_limit=MASTER_NODES,
    )
    if run.col_value is None:
        return None
    states = np.zeros((p.n_functions, p.n_windows), dtype=np.int64)
    for j in np.flatnonzero(run.col_value > 0.5):
        states[cols[j].function] = cols[j].path
    return states
