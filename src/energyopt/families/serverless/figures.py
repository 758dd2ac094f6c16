"""Per-option figures the serverless simulator and the rate-table compiler read,
precomputed from the performance model, and the plan's instance counts per pool.

* ``OptionTables`` / ``option_tables``: the pass times and energies of one
  (model, option): prefill time (s) and energy (J) at ``TOKEN_GRID`` log-spaced
  prompt lengths (tokens; interpolated in between), the decode step time (s) and
  energy (J) at every batch size, the KV budget (bytes), the batch at the planned
  SLO capacity, that capacity (requests/s), the power while on (W), the GPUs held
  and the cold-start load time (s). Energies are for the whole instance (all of
  its TP group's GPUs).
* ``decode_figures``: what a merge decision reads of a decode option (capacity
  requests/s, batch at capacity, KV budget bytes, holding cost per second in the
  objective's unit), the same figures a compiled rate table
  (``families/serverless/tables.py``) stores per (model, option).
* ``PoolKey`` / ``pool_order`` / ``plan_targets``: a pool's key (model, node,
  option, phase, link), a total order of keys, and the instances per pool in each
  epoch of a plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from energyopt.families.serverless.formulations.merge import DecodeFigures
from energyopt.families.serverless.formulations.model import (
    ServerlessProblem,
    instance_memory_gb,
    instance_op_spec,
    perf_options,
)
from energyopt.families.serverless.spec import ServerlessPlan
from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.params import OpSpec, build_params
from energyopt.perf.queueing import metrics_at
from energyopt.spec.workload import Phase

PoolKey = tuple[int, int, int, str, str | None]
"""(model, node, option, phase, link) of a pool."""


def pool_order(key: PoolKey) -> tuple[int, int, int, str, str]:
    """A total order of pool keys (the link may be None), the same in every process."""
    return key[0], key[1], key[2], key[3], key[4] or ""


TOKEN_GRID = 64
"""Prompt lengths at which prefill time is tabulated (log-spaced; interpolated)."""


@dataclass
class OptionTables:
    """Pass times and energies of one (model, option) from the performance model."""

    prompt_grid: np.ndarray
    prefill_s: np.ndarray
    prefill_j: np.ndarray
    step_s: np.ndarray
    """(max_batch + 1,): decode step at batch b, s (index 0 unused)."""
    step_j: np.ndarray
    kv_budget_bytes: float
    batch_at_capacity: float
    capacity_rps: float
    on_w: float
    gpus: float
    load_s: float


def option_tables(p: ServerlessProblem, m: int, o: int) -> OptionTables:
    """The performance model's pass tables of model m on option o."""
    opt = p.options[o]
    sm = p.spec.models[m]
    llm = p.llms[m]
    from energyopt.families.serverless.formulations.model import phase_workload

    wl = phase_workload(m, p.spec, sm.slo.ttft_ms)
    memory_gb = instance_memory_gb(p.gpu, p.spec, opt)
    options = perf_options(p.spec)

    def spec(phase: Phase) -> OpSpec:
        return instance_op_spec(p.gpu, llm, wl, phase, opt, p.spec, options)

    top = max(sm.prompt_tokens.max or 0, int(sm.prompt_tokens.mean * 20), 2)
    grid = np.unique(np.geomspace(1, top, TOKEN_GRID).round())
    pp = build_params([spec("prefill")] * len(grid))
    pre = prefill_pass(pp, grid)
    batches = np.arange(1, p.spec.options.max_batch + 1, dtype=np.float64)
    dp = build_params([spec("decode")] * len(batches))
    ctx = np.full(len(batches), sm.prompt_tokens.mean + 0.5 * sm.output_tokens.mean)
    dec = decode_pass(dp, batches, ctx)
    cap = float(p.cap_decode[m, o])
    one = build_params([spec("decode")])  # the batch at the planned (derated) capacity
    at_cap = metrics_at(one, np.array([cap])) if cap > 0 else None
    return OptionTables(
        prompt_grid=grid,
        prefill_s=pre.ms / 1e3,
        prefill_j=pre.energy_j * opt.tp,
        step_s=np.concatenate([[0.0], dec.ms / 1e3]),
        step_j=np.concatenate([[0.0], dec.energy_j * opt.tp]),
        kv_budget_bytes=max(memory_gb * 1e9 * opt.tp - llm.weight_bytes, 0.0),
        batch_at_capacity=float(at_cap.batch[0]) if at_cap is not None else 0.0,
        capacity_rps=cap,
        on_w=float(p.on_w[o]),
        gpus=opt.gpus,
        load_s=float(p.load_s[m, o]),
    )


def decode_figures(p: ServerlessProblem, m: int, o: int) -> DecodeFigures:
    """The decode figures of model m on option o from the performance model (what the
    rate table stores per (model, option))."""
    tab = option_tables(p, m, o)
    held = p.gpu_s_weight * tab.gpus + p.energy_weight * tab.on_w
    return DecodeFigures(tab.capacity_rps, tab.batch_at_capacity, tab.kv_budget_bytes, held)


def plan_targets(p: ServerlessProblem, plan: ServerlessPlan) -> list[dict[PoolKey, int]]:
    """Instances per pool in each epoch of ``plan``."""
    nodes = {n.name: i for i, n in enumerate(p.spec.nodes)}
    models = {sm.name: i for i, sm in enumerate(p.spec.models)}
    opts = {(o.share_pct, o.tp, o.clock_mhz): i for i, o in enumerate(p.options)}
    out: list[dict[PoolKey, int]] = [{} for _ in range(p.n_epochs)]
    for ep in plan.epochs:
        for pool in ep.pools:
            if pool.count <= 0:
                continue
            key = (
                models[pool.model],
                nodes[pool.node],
                opts[(pool.share_pct, pool.tp, pool.clock_mhz)],
                pool.phase,
                pool.link,
            )
            out[ep.epoch][key] = out[ep.epoch].get(key, 0) + pool.count
    return out
