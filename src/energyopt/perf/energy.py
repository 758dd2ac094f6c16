"""Power of a placement at a rate, and energy per request.

``steady_power_w`` is the one model of a placement's dynamic power: the power
its passes draw in steady state at a Poisson rate, from the same batch-level
physics the simulator runs (every iteration is one decode step of the batch
decoding then, plus one prefill chunk). A decode loop streams its weights every
step whatever its batch, so the power rises steeply while the loop starts to
run and then grows linearly with the rate. ``power_line`` states it as a fixed
part while placed plus a part per request/s, the form every formulation prices.
``energy_per_request_j`` (the per-request share at a fixed decode batch) remains
for the serverless family and the latency weights. See docs/performance-model.md §5.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.params import FloatArray, OpParams
from energyopt.perf.queueing import decode_context, metrics_at, slo_capacity

LINE_LOW_ANCHOR = 0.5
"""The power line passes through the steady power at its top rate and at this
fraction of it (the power is close to linear in the rate from about a fifth of
the capacity on, docs/performance-model.md §5)."""


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


def steady_power_w(p: OpParams, rate_rps: FloatArray) -> FloatArray:
    """Dynamic power (W, whole TP group) of each placement in steady state at its
    Poisson rate ``rate_rps`` (req/s); the simulator's mean draw above on-power.

    Prefill: a prompt that finds no other waiting (share 1 - rho_s of prompts) runs
    its ceil(P / C) chunk passes alone; one behind others fills P / C full chunks.
    Decode: each request takes O - 1 decode steps (its first token comes from its
    prefill), shared by the batch decoding then. With n the mean batch of the
    queueing model and Poisson occupancy, a step runs while something decodes
    (probability 1 - e^-n) at batch n_a = n / (1 - e^-n), so the decode loop runs
    lambda (O - 1) / n_a steps per second, each of energy E_step(n_a). Unstable
    points are charged the max batch. A latency margin (``Options.latency_margin``)
    hedges the SLOs against pass times the model may understate; the power is that
    of the modelled passes, so the batch here is the one without it.
    """
    rate = np.asarray(rate_rps, dtype=np.float64)
    met = metrics_at(p.replace(latency_margin=np.zeros_like(p.latency_margin)), rate)
    n = np.where(np.isfinite(met.batch), met.batch, p.max_batch)
    chunk = p.chunk_tokens
    prompt = p.prompt_tokens
    chunks = np.ceil(prompt / chunk)
    full_j = prefill_pass(p, chunk).energy_j * p.tp
    last_j = prefill_pass(p, prompt - (chunks - 1.0) * chunk).energy_j * p.tp
    alone_j = (chunks - 1.0) * full_j + last_j
    shared_j = np.minimum(prompt / chunk * full_j, alone_j)
    busy = met.prefill_busy
    prefill = (1.0 - busy) * alone_j + busy * shared_j
    active = -np.expm1(-np.maximum(n, 1e-12))
    n_active = np.maximum(n / active, 1.0)
    step_j = decode_pass(p, n_active, decode_context(p)).energy_j * p.tp
    decode = np.maximum(p.output_tokens - 1.0, 0.0) * step_j / n_active
    per_request = np.where(p.phase == 1, prefill, np.where(p.phase == 2, decode, prefill + decode))
    return np.asarray(np.where(rate > 0, rate * per_request, 0.0))


PEAK_WINDOW_S = 10.0
"""Window over which a power cap is held (s): a GPU's power limit acts on its
averaged draw, and the simulator's power meter bins by 10 s."""
PEAK_SIGMAS = 3.0
"""Poisson arrivals put up to this many standard deviations more requests into a
window than the mean rate does."""
STEADY_POWER_ERROR = 0.02
"""Largest error of ``steady_power_w`` against the simulated draw from a fifth of
the capacity up (1.7 % on the grid of docs/performance-model.md §5), added to the
worst case."""


WORST_CASE_GRID = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875)
"""Fractions of the capacity, besides 1, at which ``line_and_worst_case`` takes the
steady power for the worst case. The draw is not always highest at capacity: at a
low clock a larger decode batch makes a step compute-bound and longer, so the
weight streaming spreads over more time and the draw can fall as the rate rises
(by up to 14 % from its peak on the random points of tests/test_perf_model.py,
at 30-40 % of the max clock). On 1,142 such points the grid's maximum, with the
``STEADY_POWER_ERROR`` margin, was above the draw at every one of 25 rates up to
capacity (docs/performance-model.md §5)."""


def line_and_worst_case(
    p: OpParams, top_rps: FloatArray, capacity_rps: FloatArray
) -> tuple[PowerLine, FloatArray]:
    """``power_line`` at ``top_rps``, and the worst case at up to ``capacity_rps``,
    from one run of the queueing model over every rate both need.

    The worst case is the most a placement draws (W, whole TP group) over a
    ``PEAK_WINDOW_S`` window while the router sends it at most its SLO capacity on
    average: the highest steady power over the rates up to capacity (taken at
    capacity and at the fractions ``WORST_CASE_GRID`` of it), plus, at the power
    line's slope at capacity, the arrivals a Poisson count puts ``PEAK_SIGMAS``
    standard deviations above the mean in one window, and the steady model's own
    error (``STEADY_POWER_ERROR``). Caps, budgets and power limits hold this figure."""
    n = len(p)
    top = np.asarray(top_rps, dtype=np.float64)
    cap = np.asarray(capacity_rps, dtype=np.float64)
    rates = [top, LINE_LOW_ANCHOR * top, cap, LINE_LOW_ANCHOR * cap]
    rates += [f * cap for f in WORST_CASE_GRID if f != LINE_LOW_ANCHOR]
    power = steady_power_w(OpParams.concat([p] * len(rates)), np.concatenate(rates))
    curve = power.reshape(len(rates), n)
    at_top = _line_through(top, curve[0], curve[1])
    at_cap = _line_through(cap, curve[2], curve[3])
    burst = PEAK_SIGMAS * np.sqrt(np.maximum(cap, 0.0) / PEAK_WINDOW_S)
    peak = (curve[2:].max(axis=0) + at_cap.marginal_j * burst) * (1.0 + STEADY_POWER_ERROR)
    return at_top, np.asarray(np.where(cap > 0, peak, 0.0))


@dataclass(frozen=True)
class PowerLine:
    """A placement's dynamic power as priced by the formulations (whole TP group):
    ``fixed_w`` while it carries any rate plus ``marginal_j`` per request/s."""

    fixed_w: FloatArray  # W
    marginal_j: FloatArray  # J per request (= W per req/s)

    def at(self, rate_rps: FloatArray) -> FloatArray:
        """Power at ``rate_rps`` (W); 0 where the rate is 0."""
        rate = np.asarray(rate_rps, dtype=np.float64)
        return np.asarray(np.where(rate > 0, self.fixed_w + self.marginal_j * rate, 0.0))


def power_line(p: OpParams, top_rps: FloatArray) -> PowerLine:
    """The line through ``steady_power_w`` at ``top_rps`` and ``LINE_LOW_ANCHOR`` times
    it (its slope at least 0). ``steady_power_w`` is concave in the rate where it
    rises (it starts at 0), so the fixed part is never negative and the line lies
    above the curve below its low anchor: a placement run far below its top rate is
    over-, never under-charged. Where the draw falls between the anchors (a low
    clock, ``WORST_CASE_GRID``) the line is flat at the draw at the top rate.
    ``top_rps`` is the most the placement can carry: its capacity, or its
    workload's rate where that is less."""
    top = np.asarray(top_rps, dtype=np.float64)
    power = steady_power_w(OpParams.concat([p, p]), np.concatenate([top, LINE_LOW_ANCHOR * top]))
    return _line_through(top, power[: len(p)], power[len(p) :])


def _line_through(top: FloatArray, hi: FloatArray, lo: FloatArray) -> PowerLine:
    """The power line through ``hi`` W at ``top`` req/s and ``lo`` W at
    ``LINE_LOW_ANCHOR`` x ``top`` (slope clipped at 0, fixed part at 0)."""
    span = np.maximum(top - LINE_LOW_ANCHOR * top, 1e-300)
    slope = np.where(top > 0, np.maximum(hi - lo, 0.0) / span, 0.0)
    fixed = np.where(top > 0, np.maximum(hi - slope * top, 0.0), 0.0)
    return PowerLine(np.asarray(fixed), np.asarray(slope))


def service_latency_ms(p: OpParams, batch: FloatArray) -> FloatArray:
    """Unloaded latency of one request: prefill plus O decode steps at ``batch`` (ms)."""
    prefill = prefill_pass(p, p.prompt_tokens).ms
    decode = p.output_tokens * decode_pass(p, batch, decode_context(p)).ms
    return np.asarray(
        np.where(p.phase == 1, prefill, np.where(p.phase == 2, decode, prefill + decode))
    )


def energy_per_output_token_j(p: OpParams) -> FloatArray:
    """Dynamic energy per generated token (J): per request over output tokens
    (a prefill-only unit produces the first token)."""
    tokens = np.where(p.phase == 1, 1.0, p.output_tokens)
    return np.asarray(energy_per_request_j(p) / tokens)
