"""Workloads: a model served at a request rate, with token lengths and latency SLOs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.llm import MAX_TOKENS

MAX_TP = 64
"""Largest tensor-parallel group size (GPUs of one node)."""
MAX_TOKEN_CV = 10.0
"""Largest coefficient of variation of a token distribution (a log-normal of sigma 2.15)."""
MIN_RATE_RPS = 1e-6
"""Lowest request rate of a workload, req/s: one request in 11.6 days. A rate of
1e-300 req/s made the covering bound's grid step underflow (an internal error on
fleet-10240) and serves no one."""


class TokenDist(Spec):
    """Token-count distribution of prompts or outputs (tokens)."""

    mean: float = Field(gt=0, le=MAX_TOKENS, description="mean tokens per request")
    max: int | None = Field(
        default=None, gt=0, le=MAX_TOKENS, description="largest tokens per request"
    )
    cv: float = Field(
        default=0.0,
        ge=0.0,
        le=MAX_TOKEN_CV,
        description=(
            "coefficient of variation of tokens per request (standard deviation / mean; "
            "0: every request the mean). The queueing model reads the prompts': a "
            "log-normal spread of this cv (docs/performance-model.md, §4)"
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> TokenDist:
        if self.max is not None and self.max < self.mean:
            raise ValueError("max is below mean")
        return self


class Slo(Spec):
    """Latency SLO: TTFT and TBT must hold at the stated percentile of requests/tokens."""

    ttft_ms: float = Field(gt=0, le=1e12, description="time to first token, ms")
    tbt_ms: float = Field(gt=0, le=1e12, description="time between tokens, ms")
    percentile: float = Field(default=90.0, ge=50.0, lt=100.0, description="e.g. 90 or 99")

    @property
    def quantile(self) -> float:
        """The percentile as a fraction in [0.5, 1)."""
        return self.percentile / 100.0


Phase = Literal["both", "prefill", "decode"]


class Workload(Spec):
    """A stream of requests to one model."""

    name: str = Field(min_length=1)
    model: str = Field(min_length=1, description="name of a catalog LLM")
    rate_rps: float = Field(
        ge=MIN_RATE_RPS,
        le=1_000_000,
        description="mean arrival rate, requests per second (at least one request in 11.6 days)",
    )
    prompt_tokens: TokenDist
    output_tokens: TokenDist
    slo: Slo
    disaggregated: bool = Field(
        default=False, description="place prefill and decode as separate units"
    )
    tensor_parallel: tuple[Annotated[int, Field(gt=0, le=MAX_TP)], ...] | None = Field(
        default=None,
        min_length=1,
        description="allowed TP group sizes; default: 1, 2, 4, 8 where needed",
    )

    @model_validator(mode="after")
    def _check(self) -> Workload:
        sizes = self.tensor_parallel or ()
        if len(set(sizes)) != len(sizes):
            raise ValueError("tensor_parallel: a size is given twice")
        return self

    def phases(self) -> tuple[Phase, ...]:
        """The placement units of this workload."""
        return ("prefill", "decode") if self.disaggregated else ("both",)
