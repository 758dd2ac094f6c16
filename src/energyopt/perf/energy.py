"""Energy per request and power of a placement at a rate.

A placement's dynamic power is linear in its rate: rate x energy per request,
where the energy per request is one prefill plus O decode steps' share at the
op's design batch (the decode batch at its SLO capacity at the max clock, so the
accounting batch does not move with the clock). See docs/performance-model.md.
"""

from __future__ import annotations

import numpy as np

from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.params import FloatArray, OpParams
from energyopt.perf.queueing import decode_context, metrics_at, slo_capacity


def at_max_clock(p: OpParams) -> OpParams:
    """The same operating points with the GPU at its max clock."""
    return p.replace(clock_ratio=np.ones_like(p.clock_ratio))


def design_batch_of(batch_at_capacity: FloatArray) -> FloatArray:
    """The design batch (>= 1) from the decode batch an op at max clock runs at its
    SLO capacity (inf where unstable counts as 1)."""
    batch = np.asarray(batch_at_capacity, dtype=np.float64)
    return np.asarray(np.maximum(np.where(np.isfinite(batch), batch, 1.0), 1.0))


def design_batch(p: OpParams) -> FloatArray:
    """Decode batch at SLO capacity with the GPU at its max clock (>= 1)."""
    return design_batches([p])[0]


def design_batches(parts: list[OpParams]) -> list[FloatArray]:
    """``design_batch`` of each of ``parts``, from one run of the queueing model over
    the distinct operating points of all of them at max clock (a run costs about the
    same for a few points as for a few hundred: its bisections make thousands of
    vectorized passes)."""
    at_max = OpParams.concat([at_max_clock(p) for p in parts])
    first, inverse = at_max.distinct()
    rows = at_max.take(first)
    batch = design_batch_of(metrics_at(rows, slo_capacity(rows)).batch)[inverse]
    ends = np.cumsum([len(p) for p in parts])[:-1]
    return [np.asarray(b) for b in np.split(batch, ends)]


def energy_per_request_j(p: OpParams, batch: FloatArray | None = None) -> FloatArray:
    """Dynamic energy of one request over its TP group (J), at decode ``batch``."""
    n = design_batch(p) if batch is None else batch
    prefill = prefill_pass(p, p.prompt_tokens).energy_j * p.tp
    step = decode_pass(p, n, decode_context(p))
    decode = p.output_tokens * step.energy_j * p.tp / n
    return np.asarray(
        np.where(p.phase == 1, prefill, np.where(p.phase == 2, decode, prefill + decode))
    )


def service_latency_ms(p: OpParams, batch: FloatArray) -> FloatArray:
    """Unloaded latency of one request: prefill plus O decode steps at ``batch`` (ms)."""
    prefill = prefill_pass(p, p.prompt_tokens).ms
    decode = p.output_tokens * decode_pass(p, batch, decode_context(p)).ms
    return np.asarray(
        np.where(p.phase == 1, prefill, np.where(p.phase == 2, decode, prefill + decode))
    )


def placement_power_w(p: OpParams, rate_rps: FloatArray) -> FloatArray:
    """Dynamic power of each placement at its rate, summed over its TP group (W)."""
    return np.asarray(np.asarray(rate_rps, dtype=np.float64) * energy_per_request_j(p))


def energy_per_output_token_j(p: OpParams) -> FloatArray:
    """Dynamic energy per generated token (J): per request over output tokens
    (a prefill-only unit produces the first token)."""
    tokens = np.where(p.phase == 1, 1.0, p.output_tokens)
    return np.asarray(energy_per_request_j(p) / tokens)
