"""MoE edge-serving file (``kind: moe-edge``): where each expert of a mixture-of-experts
model lives on a small server, and the GPUs' clocks.

Every expert of every MoE layer is, in the plan, in one of three places:

- resident on one of the server's GPUs (it holds GPU memory there and runs there);
- ``fetch``: kept in host memory and copied over the PCIe link of the GPU that holds
  the dense part (attention, router, embeddings, KV cache) whenever a decode step
  routes a token to it, then run there;
- ``cpu``: kept in host memory and run on the host CPU for the tokens routed to it.

The file gives the server (GPUs, their links, host memory and CPU), the model (a
catalog entry), the measured activation statistics (per layer, the share of tokens
that select each expert, optionally pairwise co-activation), the SLOs (time between
tokens at a percentile, optionally the mean time to first token) and the objective:
least energy per token, or least time per token under a power cap. Units are in the
field names; docs/formulations/moe-edge.md states the model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from energyopt.spec.base import Spec

MAX_GPUS = 8
MAX_LAYERS = 512
MAX_EXPERTS = 1024
MAX_MEMORY_GB = 1e5
MAX_POWER_W = 1e5
MAX_MS = 1e7
MAX_GBPS = 1e5
MIN_GBPS = 1e-3
"""Slowest link or CPU rate accepted (GB/s, GFLOP/s): keeps every time finite."""
PLACES_OFF_GPU = ("fetch", "cpu")
MEMORY_REL_TOL = 1e-9
"""Relative slack on every memory capacity (floating-point noise only): memory fits
when what it holds, GB, is at most ``memory_limit_gb(capacity)``. The one memory
rule of the program, the solvers' figures, the verifier and the test optimiser."""


def memory_limit_gb(capacity_gb: float) -> float:
    """The most GB that fit a memory of ``capacity_gb`` GB (``MEMORY_REL_TOL``)."""
    return capacity_gb * (1.0 + MEMORY_REL_TOL)
"""Placement names that are not GPUs (a GPU may not take them as its name)."""


class MoeGpu(Spec):
    """One GPU of the server and its host link."""

    name: str = Field(min_length=1)
    type: str = Field(min_length=1, description="catalog GPU type")
    memory_gb: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MEMORY_GB,
        description="GPU memory the model may use, GB; default the catalog's memory_gb",
    )
    pcie_gbps: float = Field(
        ge=MIN_GBPS, le=MAX_GBPS, description="achieved host-to-GPU copy bandwidth, GB/s"
    )
    clocks_mhz: tuple[int, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="SM clocks to consider, MHz; default three spread down to 45 % of the max",
    )


class MoeCpu(Spec):
    """The host CPU as it runs expert FFNs."""

    expert_gflops: float = Field(
        ge=MIN_GBPS, le=1e6, description="achieved GFLOP/s on an expert FFN (all cores)"
    )
    memory_bandwidth_gbps: float = Field(
        ge=MIN_GBPS,
        le=MAX_GBPS,
        description="achieved GB/s reading expert weights from host memory",
    )
    idle_w: float = Field(ge=0, le=MAX_POWER_W, description="CPU package power when idle, W")
    active_w: float = Field(
        ge=0, le=MAX_POWER_W, description="CPU package power while it runs an expert, W"
    )

    @model_validator(mode="after")
    def _check(self) -> MoeCpu:
        if self.active_w < self.idle_w:
            raise ValueError("active_w: must be at least idle_w")
        return self


class MoeServer(Spec):
    """An edge server: 1-8 GPUs, host memory, the CPU and the transfer costs."""

    name: str = Field(min_length=1)
    gpus: tuple[MoeGpu, ...] = Field(min_length=1, max_length=MAX_GPUS)
    host_memory_gb: float = Field(gt=0, le=MAX_MEMORY_GB, description="host memory for experts, GB")
    cpu: MoeCpu
    pcie_pj_per_bit: float = Field(
        default=10.0, ge=0, le=1e4, description="energy of moving one bit host -> GPU, pJ"
    )
    hop_ms: float = Field(
        default=0.02,
        ge=0,
        le=MAX_MS,
        description="time to move a token's activations between two devices, ms",
    )
    base_w: float = Field(
        default=0.0, ge=0, le=MAX_POWER_W, description="rest of the server while on, W"
    )

    @field_validator("gpus")
    @classmethod
    def _names(cls, gpus: tuple[MoeGpu, ...]) -> tuple[MoeGpu, ...]:
        seen: set[str] = set()
        for g in gpus:
            if g.name in PLACES_OFF_GPU:
                raise ValueError(f"{g.name!r} is reserved for a placement off the GPUs")
            if g.name in seen:
                raise ValueError(f"{g.name!r} is named twice")
            seen.add(g.name)
        return gpus


class LayerActivation(Spec):
    """Measured routing of one MoE layer: the share of tokens that select each expert."""

    layer: int = Field(ge=0, lt=MAX_LAYERS)
    frequencies: tuple[float, ...] = Field(
        min_length=1,
        max_length=MAX_EXPERTS,
        description="per expert, tokens selecting it / tokens (sums to top-k)",
    )
    measured_layer: int | None = Field(
        default=None, ge=0, lt=MAX_LAYERS, description="the measured layer these shares copy"
    )

    @model_validator(mode="after")
    def _check(self) -> LayerActivation:
        if any(f < 0 or f > 1 for f in self.frequencies):
            raise ValueError("frequencies: every share must lie in 0..1")
        return self


class CoActivation(Spec):
    """Two experts a token selects together with the given probability."""

    a: tuple[int, int] = Field(description="(layer, expert)")
    b: tuple[int, int] = Field(description="(layer, expert)")
    probability: float = Field(gt=0, le=1, description="share of tokens selecting both")


class Activations(Spec):
    """Routing statistics of the workload."""

    source: str = Field(min_length=1, description="where the counts come from")
    layers: tuple[LayerActivation, ...] = Field(min_length=1, max_length=MAX_LAYERS)
    co_activation: tuple[CoActivation, ...] = Field(default=(), max_length=100_000)


class MoeSlo(Spec):
    """Time between tokens at a percentile, optionally the mean time to first token."""

    tbt_ms: float = Field(gt=0, le=MAX_MS, description="time-between-tokens limit, ms")
    percentile: float = Field(
        default=90.0, ge=50, lt=100, description="share of decode steps within tbt_ms, %"
    )
    ttft_ms: float | None = Field(
        default=None, gt=0, le=MAX_MS, description="limit on the mean time to first token, ms"
    )
    prompt_tokens: int = Field(default=128, gt=0, le=1_000_000, description="prompt length")


class MoeObjective(Spec):
    """Least energy per token, or least expected time per token under a power cap."""

    kind: Literal["energy", "latency"] = "energy"
    power_cap_w: float | None = Field(
        default=None, gt=0, le=MAX_POWER_W, description="average server power limit, W"
    )

    @model_validator(mode="after")
    def _check(self) -> MoeObjective:
        if self.kind == "latency" and self.power_cap_w is None:
            raise ValueError("power_cap_w: the latency objective needs a power cap")
        return self


class MoeEdgeFile(Spec):
    """A MoE edge-serving problem."""

    kind: Literal["moe-edge"]
    name: str = Field(min_length=1)
    description: str = ""
    model: str = Field(min_length=1, description="catalog MoE model")
    server: MoeServer
    batch: int = Field(default=1, ge=1, le=1024, description="sequences decoded per step")
    context_tokens: int = Field(
        default=512, ge=1, le=1_000_000, description="mean context of a decoding sequence"
    )
    reserve_gb: float = Field(
        default=1.0,
        ge=0,
        le=MAX_MEMORY_GB,
        description="activations and workspace on the dense GPU, GB",
    )
    cache_experts: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="expert slots on the dense GPU that hold fetched experts (the cache)",
    )
    activations: Activations
    slo: MoeSlo
    objective: MoeObjective = MoeObjective()


class MoeEdgePlan(Spec):
    """A placement: per layer and expert a GPU name, ``fetch`` or ``cpu``; the GPU that
    holds the dense part; each GPU's SM clock."""

    UNCHECKED_NUMBERS = frozenset({"objective", "bound", "gap"})

    name: str = ""
    dense_gpu: str = Field(min_length=1)
    clocks_mhz: dict[str, int] = Field(min_length=1)
    placement: tuple[tuple[str, ...], ...] = Field(
        min_length=1, description="per layer, per expert: a GPU name, fetch or cpu"
    )
    objective: float | None = Field(
        default=None, description="J per token (energy) or ms per token (latency)"
    )
    objective_unit: str = ""
    bound: float | None = None
    gap: float | None = None
    status: str = ""
    solver: str = ""
