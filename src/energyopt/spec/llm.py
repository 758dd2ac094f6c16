"""LLM architecture specification."""

from __future__ import annotations

from pydantic import Field, model_validator

from energyopt.spec.base import Spec


class LlmModel(Spec):
    """A transformer LLM's architecture, enough to derive FLOPs, bytes and KV size."""

    name: str
    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    heads: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int | None = Field(default=None, gt=0, description="defaults to hidden/heads")
    intermediate_size: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    params_total_b: float = Field(gt=0, description="total parameters, billions")
    params_active_b: float = Field(gt=0, description="parameters used per token, billions")
    bytes_per_param: float = Field(default=2.0, gt=0, description="2 for BF16, 1 for FP8")
    kv_bytes_per_value: float = Field(default=2.0, gt=0)
    experts: int = Field(default=1, ge=1, description="MoE experts per layer (1 = dense)")
    experts_per_token: int = Field(default=1, ge=1)
    max_context: int = Field(default=8192, gt=0, description="tokens")
    sources: dict[str, str] = Field(default_factory=dict, description="field -> citation")

    @model_validator(mode="after")
    def _check(self) -> LlmModel:
        if self.kv_heads > self.heads:
            raise ValueError("kv_heads exceeds heads")
        if self.params_active_b > self.params_total_b:
            raise ValueError("params_active_b exceeds params_total_b")
        if self.experts_per_token > self.experts:
            raise ValueError("experts_per_token exceeds experts")
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
