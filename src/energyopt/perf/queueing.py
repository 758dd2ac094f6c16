"""Queueing model of continuous batching with chunked prefill: latency percentiles at
a request rate, and the SLO capacity (largest rate whose TTFT and TBT percentiles
meet the SLO).

It models the iteration policy the simulator runs (sim/server.py): every iteration
is one decode step of every decoding request plus one prefill chunk of up to C
tokens taken first come first served from the queued prompts (several short prompts
share a chunk; a long one spans several iterations). The model is written out in
docs/performance-model.md (§4). In short, for a placement at rate lambda (req/ms)
with prompts of P tokens, outputs of O tokens and chunk budget C:

* the prefill slot is a single server (M/D/1) whose customers are prompts: a prompt
  that finds no other prompt waiting takes ceil(P / C) iterations of its own, one
  that arrives behind others takes P / C iterations' worth of chunk budget (chunks
  are full); the utilisation rho solves rho = lambda * (S_full + (1 - rho) * D);
* the waiting time has the M/D/1 exponential tail (Cramér-Lundberg; exact to a
  percent at the 90th-99th percentiles), plus, when decode steps run, the rest of
  the decode-only iteration in flight (an arrival joins the next iteration);
* the decode batch n follows Little's law n = lambda * O * tau, with mean TBT
  tau = t_decode(n) / (1 - rho_p), rho_p the time share of prefill chunk passes;
* a token gap is one decode step at the batch it finds (Poisson around n, size
  biased), plus a prefill chunk for the share of iterations that carry one;
* prompts of spread lengths (``prompt_cv`` > 0, a log-normal of that coefficient of
  variation, taken at ``SPREAD_BANDS`` lengths): the wait has the M/G/1
  Cramér-Lundberg tail of the work ahead's spread service times, and the TTFT
  quantile is that of the wait plus the prompt's own prefill at each length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import lambertw, ndtr, ndtri

from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.params import BoolArray, FloatArray, OpParams

BISECTION_STEPS = 48
"""Bisection steps of the decode batch at a given rate."""
CAPACITY_STEPS = 34
"""Bisection steps of the SLO capacity. The bracket starts at ``rate_upper_bound`` and
ends within 2^-34 (6e-11) of it: under 1e-7 of the capacity wherever the capacity is
at least 1/1000 of that bound, far below ``CAPACITY_MARGIN``. Each step is a full
``metrics_at`` evaluation, and capacities take most of the time of building an
op-point table."""
QUANTILE_STEPS = 40
"""Bisection steps of the latency quantiles (each halves a bracket of at most one
decode step plus one chunk pass)."""
CAPACITY_MARGIN = 1e-5
"""Capacity is reported this fraction below the threshold: the TBT percentile rises
steeply where the share of iterations carrying a chunk crosses 1 - q, and solvers'
feasibility tolerances are ~1e-7."""
MEM_PEAK_SIGMAS = 2.0
"""Concurrent requests held in memory: mean + 2 standard deviations (Poisson)."""
STALL_SHARE_SAFETY = 2.0
"""Share of token gaps taken to carry a prefill chunk, as a multiple of its mean-rate
estimate: chunks cluster (prompts arrive in bursts, and the batch is larger while they
wait), and where the share crosses 1 - q the percentile jumps by a whole chunk pass,
so the model counts the stall from half the share on (docs/performance-model.md §4)."""
MAX_FEEDBACK = 0.9
"""Cap of the batch's self-amplification (a larger batch slows every step, so each
request decodes longer and the batch grows further)."""
HEAVY_TRAFFIC = 1e-4
"""Below this 1 - rho the M/D/1 decay rate is taken as its heavy-traffic limit."""
SPREAD_BANDS = ((0.0, 0.8, 8), (0.8, 0.98, 9), (0.98, 1.0, 4))
"""Prompt lengths a spread prompt distribution is taken at: (from, to, nodes) of its
quantile levels, each band cut into equal parts taken at their midpoints, finer in
the tail that the TTFT percentiles fall in (21 lengths, the last four within the top
2 %)."""
DECAY_STEPS = 60
"""Bisection steps of the M/G/1 decay rate of a spread service (``_mg1_tail``)."""


def _spread_nodes() -> tuple[FloatArray, FloatArray]:
    """(z, weight) of ``SPREAD_BANDS``: the standard normal quantile of each node's
    level and the probability the node stands for."""
    levels: list[float] = []
    weights: list[float] = []
    for lo, hi, k in SPREAD_BANDS:
        step = (hi - lo) / k
        levels += [lo + (i + 0.5) * step for i in range(k)]
        weights += [step] * k
    return np.asarray(ndtri(np.asarray(levels))), np.asarray(weights)


SPREAD_Z, SPREAD_WEIGHTS = _spread_nodes()


def prompt_lengths(mean: FloatArray, cv: FloatArray) -> FloatArray:
    """The ``SPREAD_BANDS`` prompt lengths (tokens; one row per node) of a log-normal
    of mean ``mean`` and coefficient of variation ``cv``, scaled so that their
    weighted mean is ``mean``."""
    sigma = np.sqrt(np.log1p(np.asarray(cv, dtype=np.float64) ** 2))
    shape = np.exp(sigma[None, :] * SPREAD_Z[:, None] - 0.5 * sigma[None, :] ** 2)
    shape = shape / (SPREAD_WEIGHTS @ shape)[None, :]
    return np.asarray(np.asarray(mean, dtype=np.float64)[None, :] * shape)


@dataclass(frozen=True)
class Metrics:
    """Steady-state behaviour of each op at its rate (arrays; inf where unstable)."""

    rate_rps: FloatArray
    batch: FloatArray  # mean concurrent decoding requests
    ttft_ms: FloatArray  # TTFT at the SLO percentile (0 for decode-only units)
    tbt_ms: FloatArray  # TBT at the SLO percentile (0 for prefill-only units)
    memory_bytes: FloatArray  # per GPU: weights + KV cache of requests held
    stable: BoolArray
    prefill_busy: FloatArray  # share of time a prompt is in prefill (rho_s; 0 without prefill)

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
    """Iterations the prefill of a prompt that waits behind no other is spread over."""
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


@dataclass(frozen=True)
class PrefillWork:
    """Chunk passes of one prompt (ms): alone, and as a share of full chunks."""

    alone_ms: FloatArray  # ceil(P / C) chunk passes, the last one partial
    full_ms: FloatArray  # (P / C) of a full chunk pass: the prompt's share when queued
    chunk_ms: FloatArray  # one pass of a full chunk of min(P, C) ... C tokens
    iterations_alone: FloatArray  # ceil(P / C)
    iterations_full: FloatArray  # P / C


def prefill_work(p: OpParams) -> PrefillWork:
    """The prefill chunk passes of a prompt (see ``PrefillWork``)."""
    c = p.chunk_tokens
    m = chunks_per_prompt(p)
    last = p.prompt_tokens - (m - 1.0) * c
    full = prefill_pass(p, c).ms
    alone = (m - 1.0) * full + prefill_pass(p, last).ms
    share = p.prompt_tokens / c
    # a prompt shorter than the chunk budget takes a whole chunk only when others wait
    return PrefillWork(
        alone_ms=np.asarray(alone),
        full_ms=np.asarray(np.minimum(share * full, alone)),
        chunk_ms=np.asarray(full),
        iterations_alone=m,
        iterations_full=np.asarray(np.minimum(share, m)),
    )


def _busy_fraction(lam: FloatArray, full: FloatArray, alone: FloatArray) -> FloatArray:
    """rho solving rho = lam * (full + (1 - rho) * (alone - full)): a prompt that finds
    no other waiting (probability 1 - rho) needs ``alone``, one behind others ``full``."""
    extra = alone - full
    return np.asarray(lam * (full + extra) / (1.0 + lam * extra))


def _md1_tail(rho: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(u, c) of the M/D/1 waiting-time tail P(W > x) ~ c exp(-u x / S) (S the service
    time): u > 0 solves rho (e^u - 1) = u, and c = (1 - rho) / (rho e^u - 1)."""
    r = np.clip(rho, 1e-12, 1.0 - 1e-12)
    branch = np.real(lambertw(-r * np.exp(-r), k=-1))
    u = np.where(1.0 - r < HEAVY_TRAFFIC, 2.0 * (1.0 - r), -branch - r)
    u = np.maximum(u, 1e-300)
    c = (1.0 - r) / np.maximum(r * np.exp(u) - 1.0, 1e-300)
    return np.asarray(u), np.asarray(np.minimum(c, 1.0))


Curve = Callable[[FloatArray], FloatArray]


def _plus_residual(
    tail: Curve, area: Curve, residual_ms: FloatArray, residual_prob: FloatArray
) -> tuple[Curve, FloatArray]:
    """(P(W + R > x) as a function of x >= 0, the largest R in ms), for a wait W with
    tail ``tail`` (P(W > y)) and its integral from 0 ``area``, and R independent of
    W: 0 with probability 1 - ``residual_prob``, else uniform on [0, ``residual_ms``]
    (the rest of the decode-only iteration in flight, whose end a new prompt waits
    for)."""
    v = np.maximum(residual_ms, 0.0)
    has_v = (v > 0) & (residual_prob > 0)
    v_safe = np.where(has_v, v, 1.0)

    def excess(x: FloatArray) -> FloatArray:  # P(W + R > x)
        before = np.where(x >= v, area(x) - area(np.maximum(x - v, 0.0)), (v - x) + area(x))
        spread = before / v_safe
        with_r = residual_prob * spread + (1.0 - residual_prob) * tail(x)
        return np.asarray(np.where(has_v, with_r, tail(x)))

    return excess, np.asarray(np.where(has_v, v, 0.0))


def _mg1_tail(service_ms: FloatArray, rho: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(theta, c) of the M/G/1 waiting-time tail P(W > y) ~ c exp(-theta y) (1/ms) for
    service times ``service_ms`` (one row per ``SPREAD_WEIGHTS`` node) at utilisation
    ``rho``: theta > 0 solves lambda (E[e^(theta S)] - 1) = theta (Cramér-Lundberg),
    and c = (1 - rho) / (lambda E[S e^(theta S)] - 1). With every S equal this is
    ``_md1_tail``'s."""
    w = SPREAD_WEIGHTS[:, None]
    mean = np.sum(w * service_ms, axis=0)
    second = np.sum(w * service_ms**2, axis=0)
    r = np.clip(rho, 1e-12, 1.0 - 1e-12)
    lam = r / mean
    # e^x >= 1 + x + x^2 / 2 puts the root at or below 2 (1 - rho) / (lambda E[S^2])
    hi = 2.0 * (1.0 - r) / (lam * second)
    lo = np.zeros_like(hi)
    for _ in range(DECAY_STEPS):
        mid = 0.5 * (lo + hi)
        grow = np.sum(w * np.expm1(np.minimum(mid * service_ms, 700.0)), axis=0)
        below = lam * grow < mid
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    theta = np.maximum(hi, 1e-300)
    slope = lam * np.sum(w * service_ms * np.exp(np.minimum(theta * service_ms, 700.0)), axis=0)
    c = (1.0 - r) / np.maximum(slope - 1.0, 1e-300)
    return np.asarray(theta), np.asarray(c)


def _spread_ttft_quantile_ms(
    service_ms: FloatArray,
    rho: FloatArray,
    q: FloatArray,
    residual_ms: FloatArray,
    residual_prob: FloatArray,
    own_ms: FloatArray,
) -> FloatArray:
    """Quantile q of W + R + A (ms): W the M/G/1 wait for the prefill slot, its work
    ahead taking ``service_ms`` (one row per ``SPREAD_WEIGHTS`` node) at utilisation
    ``rho``, with P(W > y) = min(rho, c e^(-theta y)) (``_mg1_tail``: P(W > 0) is rho,
    and the Cramér-Lundberg tail beyond); R as in ``_plus_residual``; A the prompt's
    own prefill, ``own_ms`` at each node with its weight."""
    theta, c = _mg1_tail(service_ms, rho)
    r = np.clip(rho, 0.0, 1.0 - 1e-12)
    knee = np.maximum(np.log(np.maximum(c, 1e-300) / np.maximum(r, 1e-300)) / theta, 0.0)

    def tail(y: FloatArray) -> FloatArray:  # P(W > y), y >= 0
        return np.asarray(np.minimum(r, c * np.exp(-theta * y)))

    def area(a: FloatArray) -> FloatArray:  # integral of P(W > y) over [0, a], a >= 0
        flat = r * np.minimum(a, knee)
        beyond = c / theta * (np.exp(-theta * knee) - np.exp(-theta * np.maximum(a, knee)))
        return np.asarray(flat + beyond)

    excess, longest = _plus_residual(tail, area, residual_ms, residual_prob)

    def with_own(x: FloatArray) -> FloatArray:  # P(W + R + A > x)
        total = np.zeros_like(x)
        for weight, a in zip(SPREAD_WEIGHTS, own_ms, strict=True):
            y = x - a
            total += weight * np.where(y < 0.0, 1.0, excess(np.maximum(y, 0.0)))
        return total

    level = 1.0 - q
    w_alone = np.where(r > level, np.maximum(knee, np.log(c / level) / theta), 0.0)
    lo = np.asarray(own_ms.min(axis=0), dtype=np.float64)
    hi = np.asarray(w_alone + longest + own_ms.max(axis=0), dtype=np.float64)
    for _ in range(QUANTILE_STEPS):
        mid = 0.5 * (lo + hi)
        above = with_own(mid) > level
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return np.asarray(hi)


def _wait_quantile_ms(
    service_ms: FloatArray,
    rho: FloatArray,
    q: FloatArray,
    residual_ms: FloatArray,
    residual_prob: FloatArray,
) -> FloatArray:
    """Quantile q of W + R (ms): W the M/D/1 wait for the prefill slot (service time
    ``service_ms``, utilisation ``rho``), R independent, 0 with probability
    1 - ``residual_prob`` and else uniform on [0, ``residual_ms``] (the rest of the
    decode-only iteration in flight, whose end a new prompt waits for).

    Within one service time the M/D/1 waiting-time distribution is exact (Erlang):
    P(W > y) = 1 - (1 - rho) e^(lambda y), y < S; beyond it the exponential tail
    c e^(-u y / S) (``_md1_tail``), within a percent of the exact one there."""
    stable = rho < 1.0
    s = np.where(service_ms > 0, service_ms, 1.0)
    u, c = _md1_tail(rho)
    theta = u / s
    r = np.clip(rho, 0.0, 1.0 - 1e-12)
    lam = r / s

    def tail(y: FloatArray) -> FloatArray:  # P(W > y), y >= 0
        head = 1.0 - (1.0 - r) * np.exp(lam * np.minimum(y, s))
        return np.asarray(np.where(y < s, head, c * np.exp(-theta * y)))

    def area(a: FloatArray) -> FloatArray:  # integral of P(W > y) over [0, a], a >= 0
        b = np.minimum(a, s)
        head = b - (1.0 - r) * s * np.expm1(lam * b) / np.maximum(r, 1e-300)
        head = np.where(r > 1e-12, head, 0.0)
        beyond = c / theta * (np.exp(-theta * s) - np.exp(-theta * np.maximum(a, s)))
        return np.asarray(head + beyond)

    excess, longest = _plus_residual(tail, area, residual_ms, residual_prob)

    level = 1.0 - q
    in_head = np.log((1.0 - level) / (1.0 - r)) / np.maximum(lam, 1e-300)
    in_tail = np.log(np.maximum(c, 1e-300) / level) / theta
    w_alone = np.where(r > level, np.where(tail(s) > level, in_tail, in_head), 0.0)
    w_alone = np.maximum(w_alone, 0.0)
    lo = np.asarray(w_alone, dtype=np.float64)
    hi = np.asarray(w_alone + longest, dtype=np.float64)
    for _ in range(QUANTILE_STEPS):
        mid = 0.5 * (lo + hi)
        above = excess(mid) > level
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return np.asarray(np.where(stable, hi, np.inf))


def _gap_quantile_ms(
    mean_ms: FloatArray, sd_ms: FloatArray, stall_ms: FloatArray, share: FloatArray, q: FloatArray
) -> FloatArray:
    """Quantile q of a token gap N(mean, sd) plus ``stall_ms`` with probability ``share``."""
    sd = np.maximum(sd_ms, 1e-9 * np.maximum(mean_ms, 1.0))
    z = ndtri(q)
    lo = mean_ms + sd * z
    hi = lo + stall_ms
    level = 1.0 - q
    for _ in range(QUANTILE_STEPS):
        mid = 0.5 * (lo + hi)
        above = (
            share * ndtr((mean_ms + stall_ms - mid) / sd)
            + (1.0 - share) * ndtr((mean_ms - mid) / sd)
            > level
        )
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return np.asarray(hi)


def _backlog_swing(
    rho: FloatArray, service_ms: FloatArray, window_ms: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """(variance, lift) of the share of a decode residence (``window_ms``) during which
    the prefill slot is busy (its mean is rho).

    The busy indicator of an M/D/1 queue at utilisation rho has variance rho (1 - rho);
    it is taken as exponentially correlated over the queue's relaxation time
    rho S / (1 - rho)^2 (its heavy-traffic diffusion), so the variance of its average
    over the window is rho (1 - rho) g(x), g(x) = 2 (x - 1 + e^-x) / x^2, x = window /
    relaxation time. The lift is 1 - rho: through the long waits that make the TTFT
    tail the slot is busy all along, so the share rises from rho to 1.
    """
    r = np.clip(rho, 0.0, 1.0 - 1e-12)
    relax = np.maximum(r * service_ms / (1.0 - r) ** 2, 1e-300)
    x = np.minimum(np.maximum(window_ms, 0.0) / relax, 1e12)
    small = x < 1e-6
    xs = np.where(small, 1.0, x)
    g = np.where(small, 1.0 - x / 3.0, 2.0 * (xs - 1.0 + np.exp(-xs)) / xs**2)
    return np.asarray(r * (1.0 - r) * g), np.asarray(1.0 - r)


def _stall_ms(p: OpParams, rho: FloatArray, share: FloatArray, q: FloatArray) -> FloatArray:
    """The chunk pass that lengthens the token gaps in the tail (ms).

    A prompt of at least C tokens fills whole chunks. Shorter prompts share a chunk
    when several wait: among the iterations that carry a chunk, the gaps beyond the
    q-quantile are the top (1 - q) / share of them; j prompts wait with probability
    about rho^(j-1), so the chunk holds j = 1 + floor(ln((1 - q) / share) / ln rho)
    prompts, at most C tokens."""
    level = np.clip((1.0 - q) / np.maximum(share, 1e-300), 1e-300, 1.0)
    r = np.clip(rho, 1e-12, 1.0 - 1e-12)
    waiting = 1.0 + np.floor(np.log(level) / np.log(r))
    tokens = np.minimum(p.chunk_tokens, p.prompt_tokens * waiting)
    return np.asarray(prefill_pass(p, tokens).ms)


def metrics_at(p: OpParams, rate_rps: FloatArray) -> Metrics:
    """Latency percentiles, batch and memory of each op serving ``rate_rps``.

    With a latency margin m (``Options.latency_margin``) every pass is taken to last
    a = 1 + m times its modelled time. Scaling every time by a is the same queue at a
    times the rate on a clock a times slower, so the percentiles are a times those at
    rate a lambda, and the batch and memory those at rate a lambda.
    """
    rate = np.asarray(rate_rps, dtype=np.float64)
    stretch = 1.0 + p.latency_margin
    if not np.any(p.latency_margin > 0):
        return _metrics(p, rate)
    m = _metrics(p, rate * stretch)
    return Metrics(
        rate_rps=rate,
        batch=m.batch,
        ttft_ms=np.asarray(m.ttft_ms * stretch),
        tbt_ms=np.asarray(m.tbt_ms * stretch),
        memory_bytes=m.memory_bytes,
        stable=m.stable,
        prefill_busy=m.prefill_busy,
    )


def _metrics(p: OpParams, rate_rps: FloatArray) -> Metrics:
    """``metrics_at`` without the latency margin."""
    lam = np.asarray(rate_rps, dtype=np.float64) / 1e3  # requests per ms
    q = p.quantile
    has_prefill = p.phase != 2
    has_decode = p.phase != 1
    colocated = p.phase == 0
    work = prefill_work(p)
    alone_pf = np.where(has_prefill, work.alone_ms, 0.0)
    full_pf = np.where(has_prefill, work.full_ms, 0.0)
    # time share of chunk passes (prefill has priority; decode steps take the rest)
    rho_p = np.where(colocated, _busy_fraction(lam, full_pf, alone_pf), 0.0)
    decode_share = np.maximum(1.0 - rho_p, 1e-12)
    k = np.where(has_decode, lam * p.output_tokens / decode_share, 0.0)
    batch = np.where(has_decode, _solve_batch(p, k), 0.0)
    finite = np.isfinite(batch)
    n = np.where(finite, batch, 0.0)
    t_dec = np.where(has_decode & finite, _decode_ms(p, n), 0.0)
    # the prefill slot: an iteration carries one chunk and, colocated, a decode step
    t_step = np.where(colocated, t_dec, 0.0)
    alone = alone_pf + work.iterations_alone * t_step
    full = np.minimum(full_pf + work.iterations_full * t_step, alone)
    rho_s = np.where(has_prefill, _busy_fraction(lam, full, alone), 0.0)
    # The decode batch swings with the prefill backlog: while prompts wait, every
    # iteration carries a chunk, decoding requests stay longer and the batch grows.
    tau = t_dec / decode_share
    swing = np.where(colocated, lam * p.output_tokens * work.chunk_ms, 0.0)
    busy_share, busy_lift = _backlog_swing(
        rho_s, rho_s / np.maximum(lam, 1e-300), tau * p.output_tokens
    )
    gain = np.clip(k * (_decode_ms(p, n + 1.0) - t_dec), 0.0, MAX_FEEDBACK)
    n_busy = n + swing * busy_lift / (1.0 - gain)
    batch_var = (n + swing**2 * busy_share) / (1.0 - gain)
    # an iteration of the slot carries a decode step only while something decodes
    decoding = -np.expm1(-n_busy)
    t_busy = np.where(colocated & finite, _decode_ms(p, n_busy) * decoding, 0.0)
    alone_b = alone_pf + work.iterations_alone * t_busy
    full_b = np.minimum(full_pf + work.iterations_full * t_busy, alone_b)
    rho_s = np.where(has_prefill, _busy_fraction(lam, full_b, alone_b), 0.0)
    # Work ahead of a prompt of at least C tokens is served at the full-chunk rate (the
    # last chunk of the prompt ahead is topped up with the waiting prompt's first
    # tokens); a shorter prompt waits out the iterations ahead, shared only when
    # several prompts wait (the mean service).
    long_prompt = p.prompt_tokens >= p.chunk_tokens
    mean_service = np.where(lam > 0, rho_s / np.maximum(lam, 1e-300), alone_b)
    ahead = np.where(long_prompt, full_b, mean_service)
    busy_decoding = np.where(colocated, 1.0 - np.exp(-n), 0.0)
    wait = _wait_quantile_ms(ahead, lam * ahead, q, t_step, busy_decoding)
    wait = np.where(rho_s < 1.0, wait, np.inf)
    ttft = np.where(has_prefill, alone + wait, 0.0)
    spread = has_prefill & (p.prompt_cv > 0.0) & (rho_s < 1.0)
    if np.any(spread):
        ttft = _spread_ttft_ms(p, spread, ttft, ahead, lam * ahead, t_step, busy_decoding)
    # token gaps: a decode step at the batch a gap sees (size biased), plus a chunk
    per_prompt = work.iterations_full + (1.0 - rho_s) * (
        work.iterations_alone - work.iterations_full
    )
    chunk_share = np.where(
        colocated, np.minimum(1.0, STALL_SHARE_SAFETY * lam * per_prompt * tau), 0.0
    )
    step_seen = _decode_ms(p, n + 1.0)
    slope = _decode_ms(p, n + 2.0) - step_seen
    stall = np.where(colocated, _stall_ms(p, rho_s, chunk_share, q), 0.0)
    gap = _gap_quantile_ms(step_seen, slope * np.sqrt(batch_var), stall, chunk_share, q)
    tbt = np.where(has_decode & finite, gap, np.where(has_decode, np.inf, 0.0))
    # memory: weights plus KV of the requests held (decode batch, or prompts in flight)
    in_prefill = np.where(has_prefill, lam * np.where(np.isfinite(ttft), ttft, 0.0), 0.0)
    held = np.where(has_decode, n, 0.0) + in_prefill
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
        prefill_busy=np.asarray(np.clip(rho_s, 0.0, 1.0)),
    )


def _spread_ttft_ms(
    p: OpParams,
    rows: BoolArray,
    ttft_ms: FloatArray,
    ahead_ms: FloatArray,
    rho: FloatArray,
    t_step: FloatArray,
    busy_decoding: FloatArray,
) -> FloatArray:
    """``ttft_ms`` with the TTFT quantile of the ``rows`` whose prompts spread, over
    the ``prompt_lengths`` nodes: the work ahead of a prompt is taken in proportion to
    the length of the prompt it serves (``ahead_ms`` at the mean), and a prompt's own
    prefill is its chunk passes, each carrying a decode step only while something
    decodes (probability ``busy_decoding``: a long prompt spans many iterations, and
    at a small batch most of them run without one)."""
    idx = np.flatnonzero(rows)
    sub = p.take(idx)
    lengths = prompt_lengths(sub.prompt_tokens, sub.prompt_cv)
    own = np.empty_like(lengths)
    for k in range(lengths.shape[0]):
        work = prefill_work(sub.replace(prompt_tokens=lengths[k]))
        own[k] = work.alone_ms + work.iterations_alone * t_step[idx] * busy_decoding[idx]
    service = ahead_ms[idx][None, :] * lengths / sub.prompt_tokens[None, :]
    spread = _spread_ttft_quantile_ms(
        service, rho[idx], sub.quantile, t_step[idx], busy_decoding[idx], own
    )
    out = np.array(ttft_ms, dtype=np.float64)
    out[idx] = spread
    return out


def rate_upper_bound(p: OpParams) -> FloatArray:
    """A rate no op can sustain (requests/s): prefill or decode saturation."""
    work = prefill_work(p)
    top = np.asarray(p.max_batch, dtype=np.float64)
    t_dec = decode_pass(p, top, decode_context(p)).ms
    decode_cap = top / (p.output_tokens * t_dec) * 1e3
    prefill_cap = 1e3 / work.full_ms
    bound = np.where(p.phase == 2, decode_cap, prefill_cap) / (1.0 + p.latency_margin)
    return np.asarray(bound)


def slo_capacity(p: OpParams) -> FloatArray:
    """Largest rate (requests/s) at which each op meets its SLO; 0 where none does."""
    hi = rate_upper_bound(p)
    lo = np.zeros_like(hi)
    tiny = metrics_at(p, hi * 1e-9).meets_slo(p)
    for _ in range(CAPACITY_STEPS):
        mid = 0.5 * (lo + hi)
        ok = metrics_at(p, mid).meets_slo(p)
        lo = np.where(ok, mid, lo)
        hi = np.where(ok, hi, mid)
    return np.asarray(np.where(tiny, lo * (1.0 - CAPACITY_MARGIN), 0.0))
