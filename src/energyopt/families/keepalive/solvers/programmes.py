"""The per-function dynamic programmes of the keep-alive Lagrangian and path
pricing: the prices of the coupling rows, each function's priced state costs, the
cheapest moves between states, and one function's cheapest feasible path within
free budgets (docs/formulations/keepalive.md).

Shared by ``solvers.lagrangian`` (dual points and repairs) and ``solvers.paths``
(column pricing); imports neither.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from energyopt.families.keepalive.formulations.model import FloatArray, IntArray, KeepAliveProblem

TOL = 1e-9
"""Relative slack of the repair's budget checks (float rounding only)."""
MAX_LATE_STATES = 20_000
"""Largest SLO allowance (late requests) the repair's exact programme tracks per
function; beyond it, or where the forecast is not whole requests (expected counts
from an inter-arrival histogram), the repair keeps the SLO by a penalty on late
requests."""
DENSE_CELLS = 4_000_000
"""Largest array of every (state, state) arc the shortest paths hold at once (over
the functions, or one function's windows); past it the moves between nodes are
priced through ``best_moves`` instead."""
MAX_LATE_CELLS = 5_000_000
"""Largest programme over (late requests so far, state, window) the repair tracks
for one function (its predecessors are held for every cell); past it, the penalty."""


@dataclass(frozen=True)
class Prices:
    """Prices of the coupling rows: per node and window (N, T), per function (F,), one
    cap, and per memory cover and window (K, T) (``KeepAliveProblem.covers``)."""

    gpu: FloatArray
    host: FloatArray
    power: FloatArray
    slo: FloatArray
    cold: float
    cover: FloatArray

    @staticmethod
    def zero(p: KeepAliveProblem) -> Prices:
        shape = (p.n_nodes, p.n_windows)
        return Prices(
            np.zeros(shape),
            np.zeros(shape),
            np.zeros(shape),
            np.zeros(p.n_functions),
            0.0,
            np.zeros((len(p.covers), p.n_windows)),
        )

    def vector(self) -> FloatArray:
        return np.concatenate(
            [
                self.gpu.ravel(),
                self.host.ravel(),
                self.power.ravel(),
                self.slo,
                [self.cold],
                self.cover.ravel(),
            ]
        )

    @staticmethod
    def of(p: KeepAliveProblem, v: FloatArray) -> Prices:
        k = p.n_nodes * p.n_windows
        shape = (p.n_nodes, p.n_windows)
        cold = 3 * k + p.n_functions
        return Prices(
            v[:k].reshape(shape),
            v[k : 2 * k].reshape(shape),
            v[2 * k : 3 * k].reshape(shape),
            v[3 * k : cold],
            float(v[cold]),
            v[cold + 1 :].reshape(len(p.covers), p.n_windows),
        )


def cover_costs(p: KeepAliveProblem, cover: FloatArray) -> FloatArray:
    """(F, T, S) price of the memory covers each state of each window is a member of,
    at the cover prices ``cover`` (K, T), J (zero where no cover is priced). A
    cover's row is priced as scaled by ``Covers.scale``: J per GB of scale."""
    shape = (p.n_functions, p.n_windows, p.n_states)
    if not np.any(cover):
        return np.zeros(shape)
    per_state = p.covers.priced(cover * p.covers.scale[:, None])  # (F S, T)
    return np.ascontiguousarray(
        per_state.reshape(p.n_functions, p.n_states, p.n_windows).transpose(0, 2, 1)
    )


def priced_costs(p: KeepAliveProblem, y: Prices) -> tuple[FloatArray, FloatArray]:
    """(F, T, S) priced state costs (inf where not allowed) and (T, S) move factors."""
    node = p.node_of()
    dt = p.window_s
    factor = (1.0 + y.power[node, :] / dt).T  # (T, S)
    late = np.where(np.isfinite(p.slo_budget), y.slo, 0.0)[:, None, None] * (
        p.arrivals[:, :, None] * p.slow[:, None, :]
    )
    cold = y.cold * p.arrivals[:, :, None] * p.is_cold()[None, None, :]
    cost = (
        p.state_j * factor[None, :, :]
        + y.gpu[node, :].T[None, :, :] * p.gpu_gb[:, None, :]
        + y.host[node, :].T[None, :, :] * p.host_gb[:, None, :]
        + late
        + cold
        + cover_costs(p, y.cover)
    )
    return np.where(p.allowed[:, None, :], cost, np.inf), factor


class OutOfTime(Exception):
    """The deadline passed inside a repair's dynamic programme."""


def best_moves(
    p: KeepAliveProblem, value: FloatArray, same: FloatArray, enter: FloatArray
) -> tuple[FloatArray, IntArray]:
    """The cheapest way into every state from the (B, S) costs ``value`` of the
    window before: (B, S) costs and the state each comes from.

    ``same`` (B or 1, 3, 3, N): cost of the move from kind a to kind b on node n;
    ``enter`` (B or 1, 3, N): cost of entering kind b on node n from any other node
    (inf: impossible). A move between nodes costs the same whatever it leaves, so it
    comes from the cheapest state on any other node: O(B S) instead of O(B S^2).
    """
    n = p.n_nodes
    b_dim = value.shape[0]
    kinds = value.reshape(b_dim, 3, n)
    total = kinds[:, :, None, :] + same  # (B, from kind, to kind, N)
    from_kind = np.argmin(total, axis=1)  # (B, to kind, N)
    best = np.take_along_axis(total, from_kind[:, None], axis=1)[:, 0]
    arg = from_kind * n + np.arange(n)[None, None, :]
    if n > 1:
        rows = np.arange(b_dim)
        node_best = kinds.min(axis=1)  # (B, N)
        node_kind = kinds.argmin(axis=1)
        first = np.argmin(node_best, axis=1)
        second_pool = node_best.copy()
        second_pool[rows, first] = np.inf
        second = np.argmin(second_pool, axis=1)
        mine = np.arange(n)[None, :] == first[:, None]
        other = np.where(mine, second[:, None], first[:, None])  # (B, N) best other node
        other_value = node_best[rows[:, None], other]
        cross = other_value[:, None, :] + enter  # (B, 3, N)
        cross_arg = (node_kind[rows[:, None], other] * n + other)[:, None, :]
        pick = cross < best
        best = np.where(pick, cross, best)
        arg = np.where(pick, cross_arg, arg)
    return best.reshape(b_dim, 3 * n), arg.reshape(b_dim, 3 * n).astype(np.int64)


def by_kind(p: KeepAliveProblem, row: FloatArray) -> FloatArray:
    """A (..., S) array as (..., 3, N)."""
    return row.reshape(*row.shape[:-1], 3, p.n_nodes)


def one_function(
    p: KeepAliveProblem,
    f: int,
    cost: FloatArray,
    factor: FloatArray,
    free_gpu: FloatArray,
    free_host: FloatArray,
    free_power: FloatArray,
    late_penalty: float,
    deadline: float | None = None,
) -> IntArray | None:
    """Function f's cheapest path (by ``cost`` (T, S) and move ``factor``) that fits
    in the free budgets (N, T) and keeps its SLO; None if there is none. OutOfTime
    when ``deadline`` (perf_counter s) passes first."""
    n_t, n_s = p.n_windows, p.n_states
    node = p.node_of()
    dt = p.window_s
    fits = (
        p.allowed[f][None, :]
        & (p.gpu_gb[f][None, :] <= free_gpu[node, :].T * (1 + TOL) + TOL)
        & (p.host_gb[f][None, :] <= free_host[node, :].T * (1 + TOL) + TOL)
    )
    power_room = free_power[node, :].T * (1 + TOL) + TOL  # (T, S)
    lam = p.arrivals[f]
    slow = p.slow[f]
    budget = p.slo_budget[f]
    tracked = np.isfinite(budget) and float(lam.sum()) * slow.any() > budget
    whole = bool(np.all(lam == np.floor(lam)))  # expected counts from a histogram need not be
    too_wide = tracked and (np.floor(budget) + 1) * n_t * n_s > MAX_LATE_CELLS
    if tracked and (budget > MAX_LATE_STATES or not whole or too_wide):
        cost = cost + late_penalty * lam[:, None] * slow[None, :]
        tracked = False
    width = int(np.floor(budget + 1e-9)) + 1 if tracked else 1
    step = (
        (lam[:, None] * slow[None, :]).astype(np.int64)
        if tracked
        else np.zeros((n_t, n_s), np.int64)
    )
    same_j = p.same_j[f]  # (3, 3)
    enter_j = p.enter_j[f]  # (3,)
    dense: FloatArray | None = None
    if max(n_t, p.n_functions) * n_s * n_s <= DENSE_CELLS:
        # every window's arcs at once: (T, from, to), inf where the target does not
        # fit or the move breaks the target node's power budget
        moves = p.pair_moves_j[f]
        ok = fits[:, None, :] & (
            (p.state_j[f][:, None, :] + moves[None]) / dt <= power_room[:, None, :]
        )
        dense = np.where(ok, moves[None] * factor[:, None, :], np.inf)

    def arcs(t: int) -> tuple[FloatArray, FloatArray]:
        """Priced move costs into window t, on one node (1, 3, 3, N) and from another
        node (1, 3, N), inf where the target does not fit or the move breaks the
        target node's power budget."""
        held = by_kind(p, p.state_j[f, t])  # (3, N)
        room = by_kind(p, power_room[t])
        ok = by_kind(p, fits[t].astype(np.float64)) > 0
        scale = by_kind(p, factor[t])
        same_ok = ok[None] & ((held[None] + same_j[:, :, None]) / dt <= room[None])
        enter_ok = ok & ((held + enter_j[:, None]) / dt <= room)
        same = np.where(same_ok, same_j[:, :, None] * scale[None], np.inf)
        enter = np.where(enter_ok, enter_j[:, None] * scale, np.inf)
        return same[None], enter[None]

    def shifted(best: FloatArray, arg: IntArray, t: int) -> tuple[FloatArray, IntArray]:
        """Costs (width, S) after window t's late requests move each state's column
        of late counts down by its step, and the predecessors with them."""
        if not tracked:
            return best + cost[t][None, :], arg
        new = np.full((width, n_s), np.inf)
        new_arg = np.zeros((width, n_s), dtype=np.int64)
        for k in np.unique(step[t]):
            k = int(k)
            if k >= width:
                continue
            cols = step[t] == k
            new[k:, cols] = best[: width - k, cols] + cost[t, cols]
            new_arg[k:, cols] = arg[: width - k, cols]
        return new, new_arg

    _, enter0 = arcs(0)
    start = np.full((1, n_s), np.inf)
    start[0] = enter0[0].reshape(n_s) + cost[0]
    value = np.full((width, n_s), np.inf)
    for b in range(n_s):
        if step[0, b] < width:
            value[step[0, b], b] = start[0, b]
    backs: list[IntArray] = []
    for t in range(1, n_t):
        if deadline is not None and time.perf_counter() > deadline:
            raise OutOfTime
        if dense is not None:
            total = value[:, :, None] + dense[t][None]  # (late so far, from, to)
            best, arg = total.min(axis=1), np.argmin(total, axis=1)
        else:
            same, enter = arcs(t)
            best, arg = best_moves(p, value, same, enter)
        value, back = shifted(best, arg, t)
        backs.append(back)
    flat = int(np.argmin(value))
    if not np.isfinite(value.flat[flat]):
        return None
    v, b = divmod(flat, n_s)
    path = np.zeros(n_t, dtype=np.int64)
    path[-1] = b
    for t in range(n_t - 1, 0, -1):
        a = int(backs[t - 1][v, b])
        v -= int(step[t, b])
        b = a
        path[t - 1] = b
    return path
