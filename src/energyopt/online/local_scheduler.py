"""The phase-aware local scheduler of one serving instance: every iteration it sets
the decode batch limit and the prefill chunk from the queue it sees, starting from
the local-decision columns of the plan (``batch_limit``, ``prefill_tokens``;
tables/local.py) and its offline pass profiles (decode step and prefill chunk
latency and energy at the GPU's clock and the instance's share).

Rule, per iteration, with ``n`` requests decoding at mean context ``c``:

* The plan's settings are the floor: its ``prefill_tokens`` (the chunk with
  which the model meets both SLOs at the planned rate) and its ``batch_limit``
  (the largest batch whose iteration meets the TBT SLO at the planned rate).
* TTFT at risk: the oldest request without a first token has waited more than
  ``ttft_risk`` x the TTFT SLO. Then the chunk is the largest of the ladder
  ``chunk_tokens x 2**k`` (up to ``max_chunk``) above the plan's such that the
  iteration (decode step of ``n`` plus the chunk) stays within ``tbt_margin`` x
  the TBT SLO and its dynamic power within ``dynamic_limit_w``; the plan's chunk
  if none does. Otherwise the plan's chunk.
* TBT protection (``protect_tbt``): while requests decode and the iteration with
  the chunk chosen above (the plan's, when TTFT is not at risk) exceeds
  ``tbt_stall`` x the TBT SLO at the GPU's current clock (a clock below the
  plan's, or a batch above the planned one), the chunk is the largest rung below
  it whose iteration fits ``tbt_margin`` x the SLO, the ladder's smallest when
  none does: a long prompt
  is then prefilled over more iterations instead of stalling every decoding
  request past its TBT SLO.
* Batch limit: grows by one when the batch is at the limit and one more request
  still fits the TBT budget with the chosen chunk; shrinks by one, not below the
  plan's limit, when the current limit no longer fits.

Prefill and decode of a co-located instance share its SMs in time: the chunk sets
the prefill part of each iteration, ``prefill_fraction`` reports it (the
prefill/decode split of the SM time). Each ``step`` makes at most
``len(ladder) + 3`` profile lookups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PassLookup = Callable[..., tuple[float, float]]
"""(ms, J per GPU) of a pass: ``decode(batch, context)`` or ``prefill(tokens)``."""


@dataclass(frozen=True)
class LocalConfig:
    """Margins of the local scheduler (fractions of the SLOs)."""

    tbt_margin: float = 0.9
    ttft_risk: float = 0.3
    protect_tbt: bool = False  # shrink the chunk below the plan's when it stalls decode
    tbt_stall: float = 2.0  # an iteration this many TBT SLOs long stalls decode


def chunk_ladder(base_chunk: int, max_chunk: int) -> tuple[int, ...]:
    """Prefill chunk sizes tried (tokens): base / 4, base / 2, base, 2 base, ... up to
    ``max_chunk``."""
    rungs = {max(1, base_chunk // 4), max(1, base_chunk // 2), base_chunk}
    c = base_chunk
    while c * 2 <= max_chunk:
        c *= 2
        rungs.add(c)
    return tuple(sorted(r for r in rungs if r <= max(max_chunk, 1)))


class LocalScheduler:
    """Batch limit and prefill chunk of one instance, every iteration."""

    def __init__(
        self,
        *,
        batch_limit: int,
        prefill_tokens: int,
        base_chunk: int,
        max_chunk: int,
        max_batch: int,
        ttft_ms: float,
        tbt_ms: float,
        dynamic_limit_w: float = float("inf"),
        config: LocalConfig | None = None,
    ) -> None:
        cfg = config or LocalConfig()
        self.ladder = chunk_ladder(base_chunk, max_chunk)
        self.plan_chunk = min(max(prefill_tokens, base_chunk), self.ladder[-1])
        self.max_batch = max_batch
        self.plan_limit = max(1, min(batch_limit if batch_limit > 0 else max_batch, max_batch))
        self.limit = self.plan_limit
        self.ttft_ms = ttft_ms
        self.budget_ms = cfg.tbt_margin * tbt_ms
        self.risk_ms = cfg.ttft_risk * ttft_ms
        self.dynamic_limit_w = dynamic_limit_w
        self.protect_tbt = cfg.protect_tbt
        self.stall_ms = cfg.tbt_stall * tbt_ms
        self.prefill_fraction = 0.0
        self.lookups = 0

    def step(
        self,
        n: int,
        context: float,
        oldest_wait_ms: float,
        decode: PassLookup,
        prefill: PassLookup,
    ) -> tuple[int, int]:
        """(batch limit, prefill tokens) of the next iteration (see module docs)."""
        d_ms = d_j = 0.0
        if n:
            d_ms, d_j = decode(n, context)
            self.lookups += 1
        chunk = self.plan_chunk
        p_ms = prefill(chunk)[0]
        self.lookups += 1
        at_risk = oldest_wait_ms > self.risk_ms
        if at_risk:
            for rung in reversed(self.ladder):
                if rung <= chunk:
                    break
                r_ms, r_j = prefill(rung)
                self.lookups += 1
                total = d_ms + r_ms
                if n == 0 or (
                    total <= self.budget_ms and (d_j + r_j) * 1e3 / total <= self.dynamic_limit_w
                ):
                    chunk, p_ms = rung, r_ms
                    break
        if self.protect_tbt and n and not at_risk and d_ms + p_ms > self.stall_ms:
            for rung in reversed(self.ladder):
                if rung >= chunk:
                    continue
                chunk, p_ms = rung, prefill(rung)[0]
                self.lookups += 1
                if d_ms + p_ms <= self.budget_ms:
                    break
        if n:
            self._adapt_limit(n, context, p_ms, d_ms, decode)
        total = d_ms + p_ms
        self.prefill_fraction = p_ms / total if total > 0 else 0.0
        return self.limit, chunk

    def _adapt_limit(
        self, n: int, context: float, p_ms: float, d_ms: float, decode: PassLookup
    ) -> None:
        if n >= self.limit and self.limit < self.max_batch:
            up_ms = decode(self.limit + 1, context)[0]
            self.lookups += 1
            if up_ms + p_ms <= self.budget_ms:
                self.limit += 1
        elif d_ms + p_ms > self.budget_ms and self.limit > self.plan_limit:
            self.limit -= 1
