"""The placement program of one configuration (docs/formulations/moe-edge.md, §3).

Columns: x[i, o] = 1 when expert i takes option o (only options that exist and fit
somewhere), then w[p, v] = 1 when both experts of co-activated pair p sit on the
same remote device v (a GPU other than the dense one, or the CPU), which saves one
activation round trip. Rows:

- assignment: every expert takes exactly one option;
- memory: the experts resident on each GPU fit its free memory; fetched and CPU
  experts fit host memory;
- SLO: mean step time + kappa * sqrt(variance) <= tbt_ms, with sqrt(V) replaced by
  a linear function ``s * V + s0`` (``SloForm``): a secant below sqrt on [0, V_max]
  (a relaxation, for bounds) or a tangent above it (a restriction, for plans); or,
  given breakpoints 0 = v_0 < ... < v_K = V_max, by the chord of sqrt on the piece
  that holds V (a relaxation that is exact at every breakpoint): binaries z_j pick
  the piece, continuous nu_j carry V on it (v_j z_j <= nu_j <= v_{j+1} z_j,
  sum nu_j = V), and sqrt(V) >= sum_j (a_j z_j + b_j nu_j);
- TTFT: the mean prefill time of a prompt <= ttft_ms (when the file sets it);
- power cap (latency objective): step energy <= cap x step time;
- pair links: w[p, v] <= the share of each expert of p on v;
- exclusions: a placement the solver has ruled out (one that breaks the true SLO),
  sum_i x[i, choice_i] <= I - 1, which cuts off that placement and no other.

Objective: energy per token, J (energy), or the expected step time, ms (latency).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import highspy
import numpy as np
import scipy.sparse as sp

from energyopt.families.moe_edge.formulations.model import (
    BoolArray,
    ConfigCosts,
    FloatArray,
    IntArray,
    MoeEdgeProblem,
)

FORMULATION_NAME = "MoE expert placement MILP (generalised assignment, memory, Cantelli TBT SLO)"


@dataclass(frozen=True)
class SloForm:
    """sqrt(V) taken as ``slope * V + offset``."""

    slope: float
    offset: float
    kind: str


def secant(v_max: float) -> SloForm:
    """sqrt(V) >= V / sqrt(V_max) on [0, V_max]: the relaxation."""
    return SloForm(1.0 / np.sqrt(v_max) if v_max > 0 else 0.0, 0.0, "secant")


def tangent(at_v: float) -> SloForm:
    """sqrt(V) <= a / 2 + V / (2 a) with a = sqrt(at_v): the restriction."""
    a = max(float(np.sqrt(max(at_v, 0.0))), 1e-6)
    return SloForm(1.0 / (2.0 * a), a / 2.0, "tangent")


def v_max(c: ConfigCosts) -> float:
    """Largest variance any placement can have under ``c``."""
    v = np.where(np.isfinite(c.var_ms2), c.var_ms2, 0.0)
    return float(v.max(axis=1).sum())


def allowed(p: MoeEdgeProblem, c: ConfigCosts) -> BoolArray:
    """(I, O) True where the option exists: GPUs with room for one expert, host with room."""
    ok = np.isfinite(c.time_ms)
    w = p.expert_gb
    for g in range(p.n_gpus):
        if whole_experts(float(c.gpu_free_gb[g]), w) < 1:
            ok[:, g] = False
    if whole_experts(p.host_gb_free, w) < 1:
        ok[:, p.fetch] = False
        ok[:, p.cpu] = False
    return np.asarray(ok, dtype=np.bool_)


def item_objective(p: MoeEdgeProblem, c: ConfigCosts) -> FloatArray:
    """(I, O) each option's objective coefficient (J per token, or ms)."""
    if p.spec.objective.kind == "energy":
        return np.asarray(c.energy_j / p.spec.batch)
    return np.asarray(c.time_ms)


def constant_objective(p: MoeEdgeProblem, c: ConfigCosts) -> float:
    return c.dense_j / p.spec.batch if p.spec.objective.kind == "energy" else c.dense_ms


def pair_saving(p: MoeEdgeProblem, c: ConfigCosts) -> FloatArray:
    """(P,) objective saved when a pair shares a remote device."""
    if p.spec.objective.kind == "energy":
        return np.asarray(c.static_w * c.pair_save_ms / 1e3 / p.spec.batch)
    return np.asarray(c.pair_save_ms)


def whole_experts(capacity_gb: float, expert_gb: float) -> int:
    """The most experts of ``expert_gb`` GB each that fit ``capacity_gb`` GB (-1 when
    the capacity is negative: not even none fit). The one memory rule of the program,
    the figures and the heuristics; the capacities it is given already hold the
    verifier's slack (``memory_limit_gb``), so it adds none."""
    if capacity_gb < 0:
        return -1
    return int(np.floor(capacity_gb / expert_gb))


def whole_gb(capacity_gb: float, expert_gb: float) -> float:
    """Memory of the most whole experts that fit ``capacity_gb`` (every expert has one
    size, so this changes no 0/1 solution and makes the memory-only LP's vertices integral)."""
    return (
        float(whole_experts(capacity_gb, expert_gb) * expert_gb)
        if capacity_gb > 0
        else capacity_gb
    )


def remote_options(p: MoeEdgeProblem, c: ConfigCosts) -> list[int]:
    return [g for g in range(p.n_gpus) if g != c.config.dense] + [p.cpu]


@dataclass(frozen=True)
class Milp:
    """Arrays of one configuration's program; x columns first (item ``item[j]``,
    option ``opt[j]``), then the pair columns."""

    cost: FloatArray
    constant: float
    matrix: sp.csc_matrix
    row_lo: FloatArray
    row_hi: FloatArray
    item: IntArray
    opt: IntArray
    n_x: int
    integer: bool
    col_hi: FloatArray | None = None
    """Upper bound of each column (default 1)."""
    continuous: BoolArray | None = None
    """Columns that stay continuous in the integer program (default none)."""

    def __len__(self) -> int:
        return len(self.cost)

    def lp(self) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        n = len(self.cost)
        lp.num_col_ = n
        lp.num_row_ = self.matrix.shape[0]
        lp.col_cost_ = self.cost
        lp.col_lower_ = np.zeros(n)
        lp.col_upper_ = np.ones(n) if self.col_hi is None else self.col_hi
        lp.row_lower_ = self.row_lo
        lp.row_upper_ = self.row_hi
        lp.offset_ = self.constant
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = self.matrix.indptr.astype(np.int32)
        lp.a_matrix_.index_ = self.matrix.indices.astype(np.int32)
        lp.a_matrix_.value_ = self.matrix.data.astype(np.float64)
        if self.integer:
            cont = np.zeros(n, dtype=bool) if self.continuous is None else self.continuous
            lp.integrality_ = [
                highspy.HighsVarType.kContinuous if k else highspy.HighsVarType.kInteger
                for k in cont
            ]
        return lp

    def choice(self, values: FloatArray, n_items: int) -> IntArray:
        """(I,) the option of each expert in a 0/1 solution."""
        out = np.full(n_items, -1, dtype=np.int64)
        x = np.asarray(values[: self.n_x])
        order = np.argsort(x)  # largest value per item wins
        out[self.item[order]] = self.opt[order]
        return out


def build_milp(
    p: MoeEdgeProblem,
    c: ConfigCosts,
    slo: SloForm,
    *,
    extra_cost: FloatArray | None = None,
    side_rows: bool = True,
    integer: bool = True,
    breaks: Sequence[float] = (),
    exclude: Sequence[IntArray] = (),
) -> Milp:
    """The program of configuration ``c`` with the SLO's sqrt taken as ``slo``.

    ``extra_cost`` (I, O) is added to the x costs (prices of rows left out);
    ``side_rows=False`` leaves out the SLO, TTFT and power rows and the pairs (the
    memory-only transportation problem the heuristic solves). ``breaks`` (at least
    three increasing variances from 0, ms^2) takes sqrt as the chord of the piece
    that holds the variance instead of ``slo``; each (I,) placement of ``exclude``
    is cut off."""
    spec = p.spec
    ok = allowed(p, c)
    item, opt = np.nonzero(ok)
    n_x = len(item)
    obj = item_objective(p, c)
    cost = obj[item, opt].astype(np.float64)
    if extra_cost is not None:
        cost = cost + extra_cost[item, opt]
    rows: list[IntArray] = []
    cols: list[IntArray] = []
    vals: list[FloatArray] = []
    lo: list[float] = []
    hi: list[float] = []
    xcol = np.arange(n_x)
    # assignment
    rows.append(item.astype(np.int64))
    cols.append(xcol)
    vals.append(np.ones(n_x))
    lo += [1.0] * p.n_items
    hi += [1.0] * p.n_items
    r = p.n_items
    w = p.expert_gb
    for g in range(p.n_gpus):
        on = opt == g
        rows.append(np.full(int(on.sum()), r))
        cols.append(xcol[on])
        vals.append(np.full(int(on.sum()), w))
        lo.append(-np.inf)
        hi.append(whole_gb(float(c.gpu_free_gb[g]), w))
        r += 1
    host = (opt == p.fetch) | (opt == p.cpu)
    rows.append(np.full(int(host.sum()), r))
    cols.append(xcol[host])
    vals.append(np.full(int(host.sum()), w))
    lo.append(-np.inf)
    hi.append(whole_gb(p.host_gb_free, w))
    r += 1
    pair_cols: list[tuple[int, int, int]] = []
    if side_rows:
        remote = remote_options(p, c)
        for k in range(len(p.pair_q)):
            for v in remote:
                if ok[p.pair_a[k], v] and ok[p.pair_b[k], v]:
                    pair_cols.append((k, v, n_x + len(pair_cols)))
    n_pieces = len(breaks) - 1 if side_rows and len(breaks) >= 3 else 0
    z0 = n_x + len(pair_cols)
    # z_j at z0 + j, nu_j at z0 + n_pieces + j
    n = z0 + 2 * n_pieces
    pcost = np.array([-pair_saving(p, c)[k] for k, _, _ in pair_cols], dtype=np.float64)
    col_hi = np.ones(n)
    continuous = np.zeros(n, dtype=bool)
    if side_rows:
        kappa = p.kappa
        if n_pieces:
            slo_coef = np.asarray(c.time_ms[item, opt], dtype=np.float64)
        else:
            slo_coef = c.time_ms[item, opt] + kappa * slo.slope * c.var_ms2[item, opt]
        rows.append(np.full(n_x, r))
        cols.append(xcol)
        vals.append(slo_coef)
        if pair_cols:
            rows.append(np.full(len(pair_cols), r))
            cols.append(np.array([j for _, _, j in pair_cols]))
            vals.append(np.array([-c.pair_save_ms[k] for k, _, _ in pair_cols]))
        if n_pieces:
            vb = np.asarray(breaks, dtype=np.float64)
            root = np.sqrt(vb)
            slope = (root[1:] - root[:-1]) / (vb[1:] - vb[:-1])
            zc = z0 + np.arange(n_pieces)
            nc = zc + n_pieces
            rows.append(np.full(2 * n_pieces, r))
            cols.append(np.r_[zc, nc])
            vals.append(kappa * np.r_[root[:-1] - slope * vb[:-1], slope])
            lo.append(-np.inf)
            hi.append(spec.slo.tbt_ms - c.dense_ms)
            r += 1
            # the variance is carried by the pieces' nu columns
            rows += [np.full(n_x, r), np.full(n_pieces, r)]
            cols += [xcol, nc]
            vals += [np.asarray(c.var_ms2[item, opt], dtype=np.float64), -np.ones(n_pieces)]
            lo.append(0.0)
            hi.append(0.0)
            r += 1
            rows.append(np.full(n_pieces, r))
            cols.append(zc)
            vals.append(np.ones(n_pieces))
            lo.append(1.0)
            hi.append(1.0)
            r += 1
            for j in range(n_pieces):
                # v_j z_j <= nu_j <= v_{j+1} z_j
                rows.append(np.array([r, r, r + 1, r + 1]))
                cols.append(np.array([nc[j], zc[j], nc[j], zc[j]]))
                vals.append(np.array([1.0, -vb[j + 1], 1.0, -vb[j]]))
                lo += [-np.inf, 0.0]
                hi += [0.0, np.inf]
                r += 2
            col_hi[nc] = vb[1:]
            continuous[nc] = True
        else:
            lo.append(-np.inf)
            hi.append(spec.slo.tbt_ms - c.dense_ms - kappa * slo.offset)
            r += 1
        if spec.slo.ttft_ms is not None:
            rows.append(np.full(n_x, r))
            cols.append(xcol)
            vals.append(c.prefill_ms[item, opt])
            lo.append(-np.inf)
            hi.append(spec.slo.ttft_ms - c.dense_prefill_ms)
            r += 1
        cap = spec.objective.power_cap_w
        if spec.objective.kind == "latency" and cap is not None:
            rows.append(np.full(n_x, r))
            cols.append(xcol)
            vals.append(c.energy_j[item, opt] - cap * c.time_ms[item, opt] / 1e3)
            if pair_cols:
                rows.append(np.full(len(pair_cols), r))
                cols.append(np.array([j for _, _, j in pair_cols]))
                vals.append(
                    np.array(
                        [-(c.static_w - cap) * c.pair_save_ms[k] / 1e3 for k, _, _ in pair_cols]
                    )
                )
            lo.append(-np.inf)
            hi.append(cap * c.dense_ms / 1e3 - c.dense_j)
            r += 1
        for k, v, j in pair_cols:
            for member in (p.pair_a[k], p.pair_b[k]):
                sel = np.flatnonzero((item == member) & (opt == v))
                rows.append(np.array([r, r]))
                cols.append(np.array([j, int(sel[0])]))
                vals.append(np.array([1.0, -1.0]))
                lo.append(-np.inf)
                hi.append(0.0)
                r += 1
    if exclude:
        col_of = np.full((p.n_items, p.n_options), -1, dtype=np.int64)
        col_of[item, opt] = xcol
        for choice in exclude:
            picked = col_of[np.arange(p.n_items), np.asarray(choice, dtype=np.int64)]
            if (picked < 0).any():
                continue  # an option the program does not have: already cut off
            rows.append(np.full(p.n_items, r))
            cols.append(picked)
            vals.append(np.ones(p.n_items))
            lo.append(-np.inf)
            hi.append(p.n_items - 1.0)
            r += 1
    matrix = sp.csc_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, n)
    )
    return Milp(
        cost=np.concatenate([cost, pcost, np.zeros(2 * n_pieces)]),
        constant=constant_objective(p, c),
        matrix=matrix,
        row_lo=np.asarray(lo, dtype=np.float64),
        row_hi=np.asarray(hi, dtype=np.float64),
        item=item.astype(np.int64),
        opt=opt.astype(np.int64),
        n_x=n_x,
        integer=integer,
        col_hi=col_hi,
        continuous=continuous,
    )
