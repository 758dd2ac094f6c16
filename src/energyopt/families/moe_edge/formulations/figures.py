"""What the solvers know of a placement under one configuration: its objective, the
SLO's left-hand sides and its memory, from the option costs (``model.py``). The
verifier recomputes all of it on its own (``families/moe_edge/verify.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from energyopt.families.moe_edge.formulations.milp import (
    constant_objective,
    item_objective,
    pair_saving,
    remote_options,
    whole_experts,
)
from energyopt.families.moe_edge.formulations.model import ConfigCosts, IntArray, MoeEdgeProblem

FEAS_TOL = 1e-7


@dataclass(frozen=True)
class Figures:
    objective: float
    mean_ms: float
    var_ms2: float
    tbt_at_percentile_ms: float
    """Cantelli's bound on the TBT percentile: mean + kappa * sd."""
    ttft_ms: float
    power_w: float
    gpu_gb: tuple[float, ...]
    host_gb: float
    feasible: bool


def shared_pairs(p: MoeEdgeProblem, c: ConfigCosts, choice: IntArray) -> IntArray:
    """Indices of co-activated pairs whose experts share one remote device."""
    if len(p.pair_q) == 0:
        return np.zeros(0, dtype=np.int64)
    a, b = choice[p.pair_a], choice[p.pair_b]
    remote = np.isin(a, remote_options(p, c))
    return np.asarray(np.flatnonzero((a == b) & remote), dtype=np.int64)


def figures(p: MoeEdgeProblem, c: ConfigCosts, choice: IntArray) -> Figures:
    idx = np.arange(p.n_items)
    shared = shared_pairs(p, c, choice)
    saved_ms = float(c.pair_save_ms[shared].sum())
    mean = c.dense_ms + float(c.time_ms[idx, choice].sum()) - saved_ms
    var = float(c.var_ms2[idx, choice].sum())
    energy = c.dense_j + float(c.energy_j[idx, choice].sum()) - c.static_w * saved_ms / 1e3
    obj = constant_objective(p, c) + float(item_objective(p, c)[idx, choice].sum())
    obj -= float(pair_saving(p, c)[shared].sum())
    tbt = mean + p.kappa * float(np.sqrt(max(var, 0.0)))
    ttft = c.dense_prefill_ms + float(c.prefill_ms[idx, choice].sum())
    power = energy / (mean / 1e3)
    w = p.expert_gb
    on_gpu = [int((choice == g).sum()) for g in range(p.n_gpus)]
    on_host = int(((choice == p.fetch) | (choice == p.cpu)).sum())
    gpu = tuple(float(n * w) for n in on_gpu)
    host = float(on_host * w)
    spec = p.spec
    ok = bool(np.isfinite(mean))
    ok &= tbt <= spec.slo.tbt_ms * (1 + FEAS_TOL)
    if spec.slo.ttft_ms is not None:
        ok &= ttft <= spec.slo.ttft_ms * (1 + FEAS_TOL)
    cap = spec.objective.power_cap_w
    if spec.objective.kind == "latency" and cap is not None:
        ok &= power <= cap * (1 + FEAS_TOL)
    # the program's memory rule, exactly (a slack here let repairs place an expert
    # the program and the verifier refuse)
    ok &= all(n <= whole_experts(float(f), w) for n, f in zip(on_gpu, c.gpu_free_gb, strict=True))
    ok &= on_host <= whole_experts(p.host_gb_free, w)
    return Figures(obj, mean, var, tbt, ttft, power, gpu, host, ok)
