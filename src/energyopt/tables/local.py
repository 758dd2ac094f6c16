"""Phase-aware local decisions of a fleet plan: what each GPU's own scheduler needs to keep
TTFT and TBT at the SLO at its planned rate (see docs/tables.md, kind ``plans``).

Per placement (a unit on a GPU, at that GPU's clock and the placement's share):

* ``prefill_tokens``: the per-iteration prefill token budget. Co-located prefill and
  decode: the largest of ``chunk_tokens * 2**k`` (k = 0..CHUNK_DOUBLINGS, at most the
  mean prompt) with which the queueing model meets the SLO at the planned rate (k = 0,
  the chunk the plan was solved with, when none larger does). Prefill-only units run
  whole prompts; decode-only units none.
* ``batch_limit``: the largest decode batch n (1..options.max_batch) whose decode
  iteration, plus the prefill chunk the model charges to the TBT percentile at the
  planned rate, stays within the TBT SLO, and whose KV cache at full context (prompt +
  output tokens per request) fits the memory left to the placement. 0 for
  prefill-only units.
* ``prefill_share_pct`` / ``decode_share_pct``: the SM share each phase runs on (a
  disaggregated unit runs one phase on its share; a co-located unit runs both on one
  share, prefill first) and ``prefill_busy``: the fraction of the slice's time that
  prefill takes at the planned rate (rate x prefill time of a prompt).
* ``ttft_ms``, ``tbt_ms``: the model's percentiles at the planned rate and budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from energyopt.catalog.problem import Problem
from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.oppoints import op_spec, share_options
from energyopt.perf.params import BoolArray, FloatArray, OpParams, build_params
from energyopt.perf.queueing import decode_context, metrics_at
from energyopt.spec.plan import GpuPlan, Placement, Plan

CHUNK_DOUBLINGS = 6
"""Prefill budgets tried: chunk_tokens x 1, 2, 4, ... 64 (at most the mean prompt)."""
BISECTION_STEPS = 20
"""Integer bisection steps of the batch limit (enough for max_batch < 2**20)."""


@dataclass(frozen=True)
class LocalDecision:
    """The local scheduler's settings for one placement (units in the names)."""

    batch_limit: int
    prefill_tokens: int
    prefill_share_pct: int
    decode_share_pct: int
    prefill_busy: float
    ttft_ms: float
    tbt_ms: float


@dataclass(frozen=True)
class PlacedOp:
    """A placement of a plan with its performance-model input."""

    gpu: str
    label: str  # unit label: ``workload`` or ``workload:phase``
    placement: Placement
    available_gb: float  # memory the placement may hold per GPU (before other work)


def unit_label(pl: Placement) -> str:
    """``workload`` for a co-located unit, ``workload:phase`` for one phase."""
    return pl.workload if pl.phase == "both" else f"{pl.workload}:{pl.phase}"


def _share(
    problem: Problem, gp: GpuPlan, pl: Placement
) -> tuple[int, str | None, float, float, float]:
    """(share units, MIG profile, SM fraction, bandwidth fraction, memory GB) of ``pl``."""
    gtype = problem.gpu_type(gp.type)
    usable = gtype.memory_gb * (1.0 - problem.instance.options.memory_reserve_fraction)
    if pl.tp_size > 1:
        return (100, None, 1.0, 1.0, usable)
    if pl.mig_profile is not None:
        for option in share_options(problem, gtype):
            if option[1] == pl.mig_profile:
                return option
        raise ValueError(f"{gp.gpu}: unknown MIG profile {pl.mig_profile!r}")
    frac = pl.share_pct / 100.0
    return (pl.share_pct, None, frac, frac, usable)


def largest_ok(hi: FloatArray, test: Callable[[FloatArray], BoolArray]) -> FloatArray:
    """Per entry, the largest integer n in [0, hi] with ``test(n)`` true, for ``test``
    true up to a point and false above it; n = 0 needs no test."""
    lo = np.zeros_like(hi)
    top = hi + 1.0
    for _ in range(BISECTION_STEPS):
        active = top - lo > 1.0
        if not active.any():
            break
        mid = np.floor(0.5 * (lo + top))
        good = np.asarray(test(np.maximum(mid, 1.0)), dtype=bool)
        lo = np.where(active & good, mid, lo)
        top = np.where(active & ~good, mid, top)
    return lo


def placed_ops(problem: Problem, plan: Plan) -> tuple[list[PlacedOp], OpParams, FloatArray]:
    """Every placement on an on GPU with its op params and planned rate (requests/s)."""
    usable_frac = 1.0 - problem.instance.options.memory_reserve_fraction
    placed: list[PlacedOp] = []
    specs = []
    for gp in plan.gpus:
        if not gp.on or gp.clock_mhz is None:
            continue
        gtype = problem.gpu_type(gp.type)
        for pl in gp.placements:
            share = _share(problem, gp, pl)
            wl = problem.instance.workload(pl.workload)
            specs.append(op_spec(problem, wl, pl.phase, gtype, gp.clock_mhz, share, pl.tp_size))
            mig = pl.mig_profile is not None and pl.tp_size == 1
            avail = share[4] if mig else gtype.memory_gb * usable_frac
            placed.append(PlacedOp(gp.gpu, unit_label(pl), pl, avail))
    rates = np.asarray([p.placement.rate_rps for p in placed], dtype=np.float64)
    return placed, build_params(specs), rates


def prefill_budget(p: OpParams, rates: FloatArray) -> FloatArray:
    """Prefill tokens per iteration (see the module docstring), per op."""
    prompt = np.ceil(p.prompt_tokens)
    best = np.minimum(p.chunk_tokens, prompt)
    for k in range(1, CHUNK_DOUBLINGS + 1):
        budget = np.minimum(p.chunk_tokens * 2.0**k, prompt)
        ok = metrics_at(p.replace(chunk_tokens=budget), rates).meets_slo(p)
        best = np.where(ok & (budget > best), budget, best)
    return np.asarray(np.where(p.phase == 1, prompt, np.where(p.phase == 2, 0.0, best)))


def local_decisions(problem: Problem, plan: Plan) -> dict[tuple[str, str], LocalDecision]:
    """(GPU id, unit label) -> the local decision of every placement of ``plan``."""
    placed, params, rates = placed_ops(problem, plan)
    if not placed:
        return {}
    budget = prefill_budget(params, rates)
    p = params.replace(chunk_tokens=np.where(params.phase == 0, budget, params.chunk_tokens))
    m = metrics_at(p, rates)
    ctx = decode_context(p)
    has_decode = p.phase != 1
    finite = np.isfinite(m.batch)
    step_ms = decode_pass(p, np.maximum(np.where(finite, m.batch, 1.0), 1.0), ctx).ms
    stall_ms = np.where(has_decode, np.maximum(m.tbt_ms - step_ms, 0.0), 0.0)
    # memory left to each placement: its slice (MIG, TP group) or the GPU less the others
    on_gpu: dict[str, float] = {}
    for op, mem in zip(placed, m.memory_bytes.tolist(), strict=True):
        on_gpu[op.gpu] = on_gpu.get(op.gpu, 0.0) + mem
    avail = np.asarray(
        [
            op.available_gb * 1e9
            - (0.0 if op.placement.mig_profile else on_gpu[op.gpu] - float(mem))
            for op, mem in zip(placed, m.memory_bytes.tolist(), strict=True)
        ]
    )
    full_ctx = p.prompt_tokens + p.output_tokens
    by_memory = np.floor((avail * p.tp - p.weight_bytes) / (full_ctx * p.kv_bytes_per_token))
    top = np.clip(np.minimum(p.max_batch, by_memory), 0.0, None)

    def fits_tbt(n: FloatArray) -> BoolArray:
        return np.asarray(decode_pass(p, n, ctx).ms + stall_ms <= p.tbt_slo_ms)

    limit = np.where(has_decode, largest_ok(top, fits_tbt), 0.0)
    busy = np.where(p.phase != 2, rates * prefill_pass(p, p.prompt_tokens).ms / 1e3, 0.0)
    out: dict[tuple[str, str], LocalDecision] = {}
    for i, op in enumerate(placed):
        share = op.placement.share_pct
        phase = op.placement.phase
        out[(op.gpu, op.label)] = LocalDecision(
            batch_limit=int(limit[i]),
            prefill_tokens=int(budget[i]),
            prefill_share_pct=share if phase != "decode" else 0,
            decode_share_pct=share if phase != "prefill" else 0,
            prefill_busy=float(busy[i]),
            ttft_ms=float(m.ttft_ms[i]),
            tbt_ms=float(m.tbt_ms[i]),
        )
    return out
