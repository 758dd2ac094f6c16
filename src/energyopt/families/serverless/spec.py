"""Serverless disaggregated LLM serving (``kind: serverless``): prefill and decode
functions provisioned jointly per planning epoch.

Each model is served by prefill instances and decode instances. An instance runs
on one GPU slice: an MPS share of one GPU (``share_pct`` percent of its SMs,
bandwidth and memory) or a tensor-parallel group of ``tp`` whole GPUs of one node,
at a locked SM clock. A prefill instance sends each prompt's KV cache to a decode
instance, over NVLink when both run on the same node and over the network
otherwise; the transfer adds to TTFT. Starting an instance loads its weights at
``cold_start.bandwidth_gbps`` and the slice is held while it loads. Decisions per
epoch: how many instances of each kind on each node, and how many requests per
second each node's prefill pool sends to each node's decode pool. Units are in the
field names; docs/formulations/serverless.md states the model.
"""

from __future__ import annotations

import itertools
from typing import Literal

from pydantic import Field, field_validator, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.workload import Slo, TokenDist

MAX_EPOCHS = 10_080
MAX_RATE_RPS = 1_000_000.0
MAX_GPUS_PER_NODE = 64

LinkKind = Literal["nvlink", "network"]
PhaseKind = Literal["prefill", "decode"]


class LinkSpec(Spec):
    """A point-to-point link: latency and bandwidth of one KV-cache send."""

    latency_us: float = Field(ge=0, le=1e6, description="fixed latency of one send, us")
    bandwidth_gbps: float = Field(gt=0, le=1e5, description="sustained bandwidth, GB/s")


class Links(Spec):
    """The two links a KV cache can take; default: the H100 fits of perf/kvtransfer.py."""

    nvlink: LinkSpec | None = Field(default=None, description="inside a node")
    network: LinkSpec | None = Field(default=None, description="across nodes")


class ColdStart(Spec):
    """Weight loading when an instance starts."""

    bandwidth_gbps: float = Field(
        gt=0, le=1e4, description="weights loaded per GPU at this rate, GB/s"
    )
    fixed_s: float = Field(default=0.0, ge=0, le=3600, description="container start, s")


class ServerlessModel(Spec):
    """One model served as a prefill function and a decode function."""

    name: str = Field(min_length=1)
    model: str = Field(min_length=1, description="name of a catalog LLM")
    prompt_tokens: TokenDist
    output_tokens: TokenDist
    slo: Slo
    demand_rps: tuple[float, ...] = Field(
        min_length=1, max_length=MAX_EPOCHS, description="mean requests per second per epoch"
    )
    decode_drain_s: float | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="how long a decode instance the plan removes stays held (its requests "
        "finish or migrate), s; default: output_tokens.mean x slo.tbt_ms",
    )

    @property
    def drain_s(self) -> float:
        """Seconds a removed decode instance is still billed."""
        if self.decode_drain_s is not None:
            return self.decode_drain_s
        return self.output_tokens.mean * self.slo.tbt_ms / 1e3

    @model_validator(mode="after")
    def _check(self) -> ServerlessModel:
        if any(d < 0 or d > MAX_RATE_RPS for d in self.demand_rps):
            raise ValueError(f"demand_rps: rates must lie in 0..{MAX_RATE_RPS:g}")
        return self


class ServerlessNode(Spec):
    """A node: GPUs of the file's GPU type, its NIC and an optional power cap."""

    name: str = Field(min_length=1)
    gpus: int = Field(gt=0, le=MAX_GPUS_PER_NODE)
    nic_gbps: float = Field(
        default=50.0, gt=0, le=1e5, description="network bandwidth each way, GB/s"
    )
    power_cap_w: float | None = Field(
        default=None, gt=0, le=1e7, description="power of the instances on the node, W"
    )


class InstanceOptions(Spec):
    """The instance sizes and clocks the solvers may choose from."""

    shares_pct: tuple[int, ...] = Field(
        default=(25, 50, 100),
        min_length=1,
        description="MPS shares of one GPU, percent; each divides the next and 100",
    )
    tp: tuple[int, ...] = Field(
        default=(1,), min_length=1, description="tensor-parallel sizes (whole GPUs)"
    )
    clocks_mhz: tuple[int, ...] | None = Field(
        default=None, min_length=1, description="locked SM clocks; default 3 spread"
    )
    max_batch: int = Field(default=256, gt=0, le=100_000, description="decode batch limit")
    memory_reserve_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="slice memory kept free (activations, runtime)"
    )
    load_fraction: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="an instance must meet its SLOs at 1 / load_fraction times its load "
        "(plan at this share of the modelled SLO capacity)",
    )

    @field_validator("shares_pct")
    @classmethod
    def _shares(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        shares = sorted(set(value))
        if len(shares) != len(value):
            raise ValueError("a share is given twice")
        if any(s <= 0 or s > 100 or 100 % s for s in shares):
            raise ValueError("every share must divide 100 (e.g. 25, 50, 100)")
        if any(b % a for a, b in itertools.pairwise(shares)):
            raise ValueError("each share must divide the next larger one")
        return value

    @field_validator("tp")
    @classmethod
    def _tp(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) != len(value) or any(t <= 0 or t & (t - 1) for t in value):
            raise ValueError("sizes must be distinct powers of two")
        return value

    @field_validator("clocks_mhz")
    @classmethod
    def _clocks(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("a clock is given twice")
        return value


class ServerlessObjective(Spec):
    """GPU-seconds (the serverless bill), energy, or ``gpu_seconds + energy_weight x J``."""

    kind: Literal["gpu_seconds", "energy", "weighted"] = "gpu_seconds"
    energy_weight_per_j: float = Field(
        default=0.0, ge=0, le=1e6, description="GPU-seconds one joule is worth (weighted)"
    )


class ServerlessFile(Spec):
    """A serverless prefill/decode provisioning problem."""

    kind: Literal["serverless"]
    name: str = Field(min_length=1)
    description: str = ""
    gpu: str = Field(min_length=1, description="catalog GPU type of every node")
    epoch_s: float = Field(gt=0, le=86_400, description="length of a planning epoch, s")
    nodes: tuple[ServerlessNode, ...] = Field(min_length=1, max_length=256)
    models: tuple[ServerlessModel, ...] = Field(min_length=1, max_length=64)
    cold_start: ColdStart
    links: Links = Links()
    options: InstanceOptions = InstanceOptions()
    objective: ServerlessObjective = ServerlessObjective()

    @model_validator(mode="after")
    def _check(self) -> ServerlessFile:
        for what, names in (
            ("nodes", [n.name for n in self.nodes]),
            ("models", [m.name for m in self.models]),
        ):
            if len(set(names)) != len(names):
                dup = next(n for n in names if names.count(n) > 1)
                raise ValueError(f"{what}: {dup!r} is named twice")
        lengths = {len(m.demand_rps) for m in self.models}
        if len(lengths) > 1:
            raise ValueError(
                f"models: every model's demand_rps must cover the same epochs ({sorted(lengths)})"
            )
        for i, node in enumerate(self.nodes):
            bad = [t for t in self.options.tp if t <= node.gpus and node.gpus % t]
            if bad:
                raise ValueError(
                    f"nodes[{i}]({node.name}).gpus: {node.gpus} is not a multiple of tp {bad[0]}"
                )
        return self


class Pool(Spec):
    """``count`` instances of one kind on one node in one epoch, serving ``rate_rps``
    together (split evenly). A prefill pool's ``link`` says where its KV caches go:
    ``nvlink`` to decode pools of its own node, ``network`` to other nodes."""

    model: str = Field(min_length=1)
    phase: PhaseKind
    node: str = Field(min_length=1)
    share_pct: int = Field(gt=0, le=100)
    tp: int = Field(gt=0, le=MAX_GPUS_PER_NODE)
    clock_mhz: int = Field(gt=0, le=10_000)
    link: LinkKind | None = Field(default=None, description="prefill pools only")
    count: int = Field(ge=0, le=100_000)
    rate_rps: float = Field(ge=0, le=MAX_RATE_RPS)


class Route(Spec):
    """Requests per second of a model prefilled on one node and decoded on another
    (or the same) node."""

    model: str = Field(min_length=1)
    prefill_node: str = Field(min_length=1)
    decode_node: str = Field(min_length=1)
    rate_rps: float = Field(ge=0, le=MAX_RATE_RPS)


class EpochPlan(Spec):
    """The pools and routes of one epoch."""

    epoch: int = Field(ge=0, le=MAX_EPOCHS)
    pools: tuple[Pool, ...] = ()
    routes: tuple[Route, ...] = ()


class ServerlessPlan(Spec):
    """A provisioning plan for every epoch, with the figures of the solve that made it."""

    UNCHECKED_NUMBERS = frozenset({"objective", "bound", "gap"})

    name: str = ""
    epochs: tuple[EpochPlan, ...] = Field(min_length=1, max_length=MAX_EPOCHS)
    objective: float | None = None
    objective_unit: str = ""
    bound: float | None = None
    gap: float | None = None
    status: str = ""
    solver: str = ""
