"""MoE placement by enumeration: every placement of one configuration, evaluated at
once with numpy.

Where a configuration has few placements (every expert at each option that exists
for it: on tiny instances 4^8 = 65,536), listing them all gives its exact optimum,
or proves it has no plan, with no tolerance of a MILP solver in between: the bound
of the configuration is its optimum itself. The figures are those of
``formulations/figures.py`` (the same sums, the same feasibility tolerance, the same
memory rule), and the plan returned is checked with ``figures`` once more.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from energyopt.families.moe_edge.formulations.figures import FEAS_TOL, figures
from energyopt.families.moe_edge.formulations.milp import (
    allowed,
    constant_objective,
    item_objective,
    pair_saving,
    remote_options,
    whole_experts,
)
from energyopt.families.moe_edge.formulations.model import (
    BoolArray,
    ConfigCosts,
    FloatArray,
    IntArray,
    MoeEdgeProblem,
)

CHUNK = 1 << 15
"""Placements evaluated per numpy pass (an array of CHUNK x experts)."""


@dataclass(frozen=True)
class Enumerated:
    """What enumerating one configuration established."""

    plan: tuple[float, IntArray] | None
    """The least-objective feasible placement (J/token or ms) and its options, or None."""
    complete: bool
    """Every placement was evaluated (False: the deadline came first)."""
    placements: int
    """Placements evaluated."""


def placement_count(p: MoeEdgeProblem, c: ConfigCosts) -> int:
    """How many placements configuration ``c`` has: the product over experts of the
    options that exist for them (0 when some expert has none). An exact integer."""
    counts = allowed(p, c).sum(axis=1)
    return math.prod(int(n) for n in counts)


def _options(ok: BoolArray) -> tuple[IntArray, IntArray, IntArray]:
    """(options table (I, max options), count per item, mixed-radix stride per item)."""
    counts = ok.sum(axis=1).astype(np.int64)
    table = np.zeros((ok.shape[0], max(int(counts.max(initial=1)), 1)), dtype=np.int64)
    for i in range(ok.shape[0]):
        opts = np.flatnonzero(ok[i])
        table[i, : len(opts)] = opts
    stride = np.ones(ok.shape[0], dtype=np.int64)
    for i in range(ok.shape[0] - 2, -1, -1):
        stride[i] = stride[i + 1] * counts[i + 1]
    return table, counts, stride


def enumerate_config(p: MoeEdgeProblem, c: ConfigCosts, deadline: float) -> Enumerated:
    """The exact optimum of configuration ``c`` over every placement (objective in
    J/token or ms), or None when no placement meets the memory, TBT, TTFT and power
    rows; ``deadline`` is a ``time.perf_counter()`` value checked between chunks.
    Meant for configurations of at most a few hundred thousand placements
    (``placement_count``)."""
    ok = allowed(p, c)
    total = placement_count(p, c)
    if total == 0:
        return Enumerated(None, True, 0)
    table, counts, stride = _options(ok)
    n_i = p.n_items
    rows = np.arange(n_i)[None, :]
    obj_io = np.where(ok, item_objective(p, c), 0.0)
    time_io = np.where(ok, c.time_ms, 0.0)
    var_io = np.where(ok, c.var_ms2, 0.0)
    energy_io = np.where(ok, c.energy_j, 0.0)
    prefill_io = np.where(ok, c.prefill_ms, 0.0)
    remote = np.zeros(p.n_options, dtype=bool)
    remote[remote_options(p, c)] = True
    save_obj = pair_saving(p, c)
    spec = p.spec
    cap = spec.objective.power_cap_w if spec.objective.kind == "latency" else None
    w = p.expert_gb
    gpu_room = [whole_experts(float(f), w) for f in c.gpu_free_gb]
    host_room = whole_experts(p.host_gb_free, w)
    best: tuple[float, IntArray] | None = None
    done = 0
    for start in range(0, total, CHUNK):
        if time.perf_counter() > deadline:
            return Enumerated(best, False, done)
        index = np.arange(start, min(start + CHUNK, total), dtype=np.int64)
        digit = (index[:, None] // stride[None, :]) % counts[None, :]
        choice = table[rows, digit]
        saved_ms = np.zeros(len(index))
        saved_obj = np.zeros(len(index))
        for k in range(len(p.pair_q)):
            a, b = choice[:, p.pair_a[k]], choice[:, p.pair_b[k]]
            shared = (a == b) & remote[a]
            saved_ms += shared * c.pair_save_ms[k]
            saved_obj += shared * save_obj[k]
        mean = c.dense_ms + time_io[rows, choice].sum(axis=1) - saved_ms
        var = var_io[rows, choice].sum(axis=1)
        feasible = mean + p.kappa * np.sqrt(np.maximum(var, 0.0)) <= spec.slo.tbt_ms * (
            1 + FEAS_TOL
        )
        if spec.slo.ttft_ms is not None:
            ttft = c.dense_prefill_ms + prefill_io[rows, choice].sum(axis=1)
            feasible &= ttft <= spec.slo.ttft_ms * (1 + FEAS_TOL)
        if cap is not None:
            energy = c.dense_j + energy_io[rows, choice].sum(axis=1) - c.static_w * saved_ms / 1e3
            feasible &= energy / (mean / 1e3) <= cap * (1 + FEAS_TOL)
        for g, room in enumerate(gpu_room):
            feasible &= (choice == g).sum(axis=1) <= room
        feasible &= ((choice == p.fetch) | (choice == p.cpu)).sum(axis=1) <= host_room
        done += len(index)
        if not feasible.any():
            continue
        objective: FloatArray = constant_objective(p, c) + obj_io[rows, choice].sum(axis=1)
        objective = objective - saved_obj
        candidates = np.flatnonzero(feasible)
        for j in candidates[np.argsort(objective[candidates], kind="stable")]:
            if best is not None and objective[j] >= best[0]:
                break
            # the figures the solvers share decide (their sums run in another order)
            fig = figures(p, c, choice[j])
            if fig.feasible:
                if best is None or fig.objective < best[0]:
                    best = (fig.objective, choice[j].copy())
                break
    return Enumerated(best, True, done)
