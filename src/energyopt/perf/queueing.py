"""Queueing model of continuous batching: latency percentiles at a request rate,
and the SLO capacity (largest rate whose TTFT and TBT percentiles meet the SLO).

The model is written out in docs/performance-model.md. In short, for a placement
that serves rate lambda (requests/s) with prompts of P tokens and outputs of O:

* prefill busy fraction  rho_p = lambda * t_prefill(P)
* decode batch n: Little's law n = lambda * O * tau with mean TBT
  tau = t_decode(n) / (1 - rho_p) (prefill has priority, decode takes the rest)
* TBT percentile: t_decode(n), plus one prefill chunk when more than (1 - q) of
  iterations carry a chunk
* TTFT percentile: the prompt's chunks ride ceil(P / C) iterations, so its
  service time is S = t_prefill(P) + ceil(P / C) * t_decode(n); queueing for the
  prefill slot uses the M/M/1 waiting-time tail P(W > t) = rho * exp(-(1 - rho) t / S)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from energyopt.perf.forward import Pass, decode_pass, prefill_pass
from energyopt.perf.params import BoolArray, FloatArray, OpParams

BISECTION_STEPS = 48
CAPACITY_MARGIN = 1e-5
"""Capacity is reported this fraction below the threshold: the TBT percentile is a
step function of the rate, and solvers' feasibility tolerances are ~1e-7."""
MEM_PEAK_SIGMAS = 2.0
"""Concurrent requests held in memory: mean + 2 standard deviations (Poisson)."""


@dataclass(frozen=True)
class Metrics:
    """Steady-state behaviour of each op at its rate (arrays; inf where unstable)."""

    rate_rps: FloatArray
    batch: FloatArray  # mean concurrent decoding requests
    ttft_ms: FloatArray  # TTFT at the SLO percentile (0 for decode-only units)
    tbt_ms: FloatArray  # TBT at the SLO percentile (0 for prefill-only units)
    memory_bytes: FloatArray  # per GPU: weights + KV cache of requests held
    stable: BoolArray

    def meets_slo(self, p: OpParams, slack: float = 0.0) -> BoolArray:
        """Stable, within memory and max batch, and both percentiles within the SLO."""
        tol = 1.0 + slack
        return np.asarray(
            self.stable
            & (self.ttft_ms <= p.ttft_slo_ms * tol)
            & (self.tbt_ms <= p.tbt_slo_ms * tol)
            & (self.memory_bytes <= p.memory_bytes * tol)
            & (self.batch <= p.max_batch * tol)
        )


def chunk_tokens(p: OpParams) -> FloatArray:
    """Tokens of a prefill chunk (the whole prompt if it fits in one)."""
    return np.asarray(np.minimum(p.prompt_tokens, p.chunk_tokens))


def chunks_per_prompt(p: OpParams) -> FloatArray:
    """Iterations a prompt's prefill is spread over."""
    return np.asarray(np.ceil(p.prompt_tokens / p.chunk_tokens))


def decode_context(p: OpParams) -> FloatArray:
    """Mean context of a decoding request: prompt plus half the output (tokens)."""
    return np.asarray(p.prompt_tokens + 0.5 * p.output_tokens)


def _decode_ms(p: OpParams, batch: FloatArray) -> FloatArray:
    return decode_pass(p, np.maximum(batch, 1.0), decode_context(p)).ms


def _solve_batch(p: OpParams, k: FloatArray) -> FloatArray:
    """Smallest n >= 0 with n = k * t_decode(max(n, 1)) (k in 1/ms); inf if above max batch."""
    lo = np.zeros_like(k)
    hi = np.asarray(p.max_batch, dtype=np.float64).copy()
    over = hi - k * _decode_ms(p, hi) < 0
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        below = mid - k * _decode_ms(p, mid) < 0
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return np.where(over, np.inf, hi)


def _wait_quantile_ms(service_ms: FloatArray, rho: FloatArray, q: FloatArray) -> FloatArray:
    """Waiting time at quantile q of a single-server queue (M/M/1 tail), ms."""
    safe_rho = np.clip(rho, 1e-12, 1.0 - 1e-12)
    wait = service_ms * np.maximum(0.0, np.log(safe_rho / (1.0 - q))) / (1.0 - safe_rho)
    return np.asarray(np.where(rho < 1.0, wait, np.inf))


def metrics_at(p: OpParams, rate_rps: FloatArray) -> Metrics:
    """Latency percentiles, batch and memory of each op serving ``rate_rps``."""
    lam = np.asarray(rate_rps, dtype=np.float64) / 1e3  # requests per ms
    q = p.quantile
    has_prefill = p.phase != 2
    has_decode = p.phase != 1
    pre: Pass = prefill_pass(p, p.prompt_tokens)
    t_pf = np.where(has_prefill, pre.ms, 0.0)
    t_chunk = prefill_pass(p, chunk_tokens(p)).ms
    colocated = p.phase == 0
    rho_p = np.where(colocated, lam * t_pf, 0.0)
    decode_share = np.maximum(1.0 - rho_p, 1e-12)
    k = np.where(has_decode, lam * p.output_tokens / decode_share, 0.0)
    batch = np.where(has_decode, _solve_batch(p, k), 0.0)
    finite = np.isfinite(batch)
    t_dec = np.where(has_decode & finite, _decode_ms(p, np.where(finite, batch, 1.0)), 0.0)
    tau = t_dec / decode_share
    chunk_frac = np.minimum(1.0, lam * chunks_per_prompt(p) * tau)
    stall = np.where(colocated & (chunk_frac > 1.0 - q), t_chunk, 0.0)
    tbt = np.where(has_decode, t_dec + stall, 0.0)
    service = t_pf + np.where(colocated, chunks_per_prompt(p) * t_dec, 0.0)
    rho_s = lam * service
    ttft = np.where(has_prefill, service + _wait_quantile_ms(service, rho_s, q), 0.0)
    # memory: weights plus KV of the requests held (decode batch, or prompts in flight)
    in_prefill = np.where(has_prefill, lam * np.where(np.isfinite(ttft), ttft, 0.0), 0.0)
    held = np.where(has_decode, np.where(finite, batch, 0.0), 0.0) + in_prefill
    held_peak = held + MEM_PEAK_SIGMAS * np.sqrt(held)
    ctx = np.where(has_decode, p.prompt_tokens + p.output_tokens, p.prompt_tokens)
    memory = (p.weight_bytes + held_peak * ctx * p.kv_bytes_per_token) / p.tp
    stable = finite & (rho_p < 1.0) & np.where(has_prefill, rho_s < 1.0, True)
    return Metrics(
        rate_rps=np.asarray(rate_rps, dtype=np.float64),
        batch=np.asarray(batch),
        ttft_ms=np.asarray(ttft),
        tbt_ms=np.asarray(tbt),
        memory_bytes=np.asarray(memory),
        stable=np.asarray(stable),
    )


def rate_upper_bound(p: OpParams) -> FloatArray:
    """A rate no op can sustain (requests/s): prefill or decode saturation."""
    t_pf = prefill_pass(p, p.prompt_tokens).ms
    top = np.asarray(p.max_batch, dtype=np.float64)
    t_dec = decode_pass(p, top, decode_context(p)).ms
    decode_cap = top / (p.output_tokens * t_dec) * 1e3
    prefill_cap = 1e3 / t_pf
    return np.asarray(
        np.where(p.phase == 1, prefill_cap, np.where(p.phase == 2, decode_cap, prefill_cap))
    )


def slo_capacity(p: OpParams) -> FloatArray:
    """Largest rate (requests/s) at which each op meets its SLO; 0 where none does."""
    hi = rate_upper_bound(p)
    lo = np.zeros_like(hi)
    tiny = metrics_at(p, hi * 1e-9).meets_slo(p)
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        ok = metrics_at(p, mid).meets_slo(p)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.asarray(np.where(tiny, lo * (1.0 - CAPACITY_MARGIN), 0.0))
