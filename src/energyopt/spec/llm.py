"""LLM architecture specification."""

from __future__ import annotations

from pydantic import Field, model_validator

from energyopt.spec.base import Spec

MAX_TOKENS = 100_000_000
"""Most tokens of one context, prompt or output (far above any model's window)."""


class LlmModel(Spec):
    """A transformer LLM's architecture, enough to derive FLOPs, bytes and KV size."""

    name: str = Field(min_length=1)
    layers: int = Field(gt=0, le=10_000)
    hidden_size: int = Field(gt=0, le=1_000_000)
    heads: int = Field(gt=0, le=10_000)
    kv_heads: int = Field(gt=0, le=10_000)
    head_dim: int | None = Field(
        default=None, gt=0, le=100_000, description="defaults to hidden/heads"
    )
    intermediate_size: int = Field(gt=0, le=10_000_000)
    vocab_size: int = Field(gt=0, le=100_000_000)
    params_total_b: float = Field(gt=0, le=1_000_000, description="total parameters, billions")
    params_active_b: float = Field(
        gt=0, le=1_000_000, description="parameters used per token, billions"
    )
    bytes_per_param: float = Field(default=2.0, gt=0, le=8, description="2 for BF16, 1 for FP8")
    kv_bytes_per_value: float = Field(default=2.0, gt=0, le=8)
    experts: int = Field(
        default=1, ge=1, le=100_000, description="MoE experts per layer (1 = dense)"
    )
    experts_per_token: int = Field(default=1, ge=1, le=100_000)
    max_context: int = Field(default=8192, gt=0, le=MAX_TOKENS, description="tokens")
    sources: dict[str, str] = Field(default_factory=dict, description="field -> citation")

    @model_validator(mode="after")
    def _check(self) -> LlmModel:
        if self.kv_heads > self.heads:
            raise ValueError("kv_heads exceeds heads")
        if self.params_active_b > self.params_total_b:
            raise ValueError("params_active_b exceeds params_total_b")
        if self.experts_per_token > self.experts:
            raise ValueError("experts_per_token exceeds experts")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) is not a multiple of kv_heads ({self.kv_heads})"
            )
        if self.head_dim is None and self.hidden_size < self.heads:
            raise ValueError("hidden_size is below heads: give head_dim")
        return self

    @property
    def head_dim_eff(self) -> int:
        """Dimension of one attention head."""
        return self.head_dim or self.hidden_size // self.heads

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights."""
        return self.params_total_b * 1e9 * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Bytes of KV cache one token of context occupies (all layers, K and V)."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim_eff * self.kv_bytes_per_value
