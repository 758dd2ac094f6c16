"""Co-location instance files (``kind: colocation``) and co-location plans.

Training jobs with idle phases and offline inference jobs share a pool of GPUs.
A job runs alone on whole GPUs, or as one of a (training, inference) pair that
splits the same GPUs by MPS SM share. Units are in the field names (``_ms``,
``_s``, ``_gb``, ``_w``, ``_pct``, ``_mhz``).
"""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import Field, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.hardware import MAX_CLOCK_MHZ
from energyopt.spec.limits import over_limit
from energyopt.spec.llm import MAX_TOKENS

IdleKind = Literal["data_loading", "communication", "pipeline_bubble", "other"]
ColocationObjective = Literal["jct", "throughput"]


class IdlePhase(Spec):
    """A part of each training iteration in which the job issues no GPU kernels."""

    kind: IdleKind
    ms: float = Field(
        gt=0,
        le=86_400_000,
        description="ms per iteration; communication: at 2 GPUs, scaled by the ring "
        "factor 2(n-1)/n on n GPUs (0 on one GPU)",
    )


class TrainingJob(Spec):
    """Data-parallel training of a catalog LLM (sharded optimizer state, FSDP style)."""

    kind: Literal["training"]
    name: str = Field(min_length=1)
    model: str = Field(min_length=1, description="catalog LLM trained")
    tokens_per_iteration: int = Field(
        gt=0, le=1e12, description="global batch, tokens per iteration"
    )
    sequence_tokens: int = Field(
        default=2048, gt=0, le=MAX_TOKENS, description="tokens per sequence"
    )
    iterations: int = Field(gt=0, le=1e12, description="iterations to run (the job's work)")
    idle_phases: tuple[IdlePhase, ...] = Field(
        default=(), description="data loading, communication, pipeline bubbles per iteration"
    )
    min_gpus: int = Field(default=1, gt=0, le=65_536)
    max_gpus: int = Field(default=8, gt=0, le=65_536)
    state_bytes_per_param: float = Field(
        default=16.0,
        gt=0,
        le=1_000,
        description="weights+grads+Adam state bytes per parameter, sharded",
    )
    activation_gb: float = Field(
        default=8.0, ge=0, le=10_000, description="activations per GPU, GB"
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingJob:
        if self.min_gpus > self.max_gpus:
            raise ValueError("min_gpus exceeds max_gpus")
        if self.tokens_per_iteration < self.sequence_tokens:
            raise ValueError("tokens_per_iteration is below sequence_tokens")
        return self


class InferenceJob(Spec):
    """Offline (batch) inference of a catalog LLM: ``items`` prompts to complete."""

    kind: Literal["inference"]
    name: str = Field(min_length=1)
    model: str = Field(min_length=1, description="catalog LLM served")
    items: int = Field(gt=0, le=1e12, description="prompts to process (the job's work)")
    prompt_tokens: float = Field(gt=0, le=MAX_TOKENS, description="mean tokens per prompt")
    output_tokens: float = Field(gt=0, le=MAX_TOKENS, description="mean tokens generated")
    batch: int = Field(
        default=32, gt=0, le=1_000_000, description="sequences decoded together per GPU"
    )
    min_gpus: int = Field(default=1, gt=0, le=65_536, description="replicas (one per GPU)")
    max_gpus: int = Field(default=8, gt=0, le=65_536)

    @model_validator(mode="after")
    def _check(self) -> InferenceJob:
        if self.min_gpus > self.max_gpus:
            raise ValueError("min_gpus exceeds max_gpus")
        return self


Job = Annotated[TrainingJob | InferenceJob, Field(discriminator="kind")]


class GpuPool(Spec):
    """``count`` interchangeable GPUs of one catalog type; ids are ``name/0`` ..."""

    type: str = Field(min_length=1, description="catalog GPU type")
    count: int = Field(gt=0)
    name: str | None = Field(default=None, min_length=1, description="id prefix; default type")

    @model_validator(mode="after")
    def _check(self) -> GpuPool:
        message = over_limit("the GPU count", self.count, "gpus")
        if message:
            raise ValueError(message)
        return self

    @property
    def prefix(self) -> str:
        """Prefix of the GPU ids of this pool."""
        return self.name or self.type


class ColocationCluster(Spec):
    """The GPU pools and the cluster's power budget (W, all GPUs, idle ones included)."""

    pools: tuple[GpuPool, ...] = Field(min_length=1)
    power_budget_w: float | None = Field(default=None, gt=0, le=1e9)

    @model_validator(mode="after")
    def _check(self) -> ColocationCluster:
        message = over_limit("the cluster's GPU count", sum(p.count for p in self.pools), "gpus")
        if message:
            raise ValueError(message)
        prefixes = [p.prefix for p in self.pools]
        dup = sorted({p for p in prefixes if prefixes.count(p) > 1})
        if dup:
            raise ValueError(f"two pools share the id prefix {dup[0]!r}; give them names")
        return self

    def gpu_ids(self) -> list[tuple[str, str]]:
        """(GPU id, type) of every GPU, pool by pool."""
        return [(f"{p.prefix}/{i}", p.type) for p in self.pools for i in range(p.count)]


class ColocationOptions(Spec):
    """Decision space, time grid and objective."""

    objective: ColocationObjective = Field(
        default="jct", description="jct: mean completion time; throughput: jobs per hour"
    )
    share_levels_pct: tuple[int, ...] = Field(
        default=(25, 50, 75), description="SM share of the training job in a pair (MPS %)"
    )
    gpu_counts: tuple[int, ...] = Field(
        default=(1, 2, 4, 8),
        max_length=64,
        description="GPU counts a job may get (within its min..max)",
    )
    clocks_mhz: dict[str, tuple[Annotated[int, Field(gt=0, le=MAX_CLOCK_MHZ)], ...]] | None = Field(
        default=None, description="candidate SM clocks per GPU type (MHz)"
    )
    clock_count: int = Field(
        default=3, gt=0, le=64, description="candidate clocks per type otherwise"
    )
    slot_s: float = Field(
        ge=1,
        le=1e7,
        description="length of one time slot, s (at least 1; jobs hold GPUs for whole slots)",
    )
    slots: int = Field(default=12, gt=0, le=200, description="slots in the horizon")
    memory_reserve_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="part of GPU memory kept free"
    )

    @model_validator(mode="after")
    def _check(self) -> ColocationOptions:
        for level in self.share_levels_pct:
            if not 0 < level < 100:
                raise ValueError(f"share level {level} is outside 1..99")
        if not self.gpu_counts or min(self.gpu_counts) <= 0:
            raise ValueError("gpu_counts must be positive integers")
        if max(self.gpu_counts) > 65_536:
            raise ValueError("gpu_counts: at most 65536 GPUs per job")
        for type_name, clocks in (self.clocks_mhz or {}).items():
            if not clocks:
                raise ValueError(f"clocks_mhz.{type_name}: give at least one clock (MHz)")

        return self

    @property
    def horizon_s(self) -> float:
        """Planning horizon: slots x slot_s (s)."""
        return self.slots * self.slot_s


class ColocationInstance(Spec):
    """A co-location problem: GPU pools, power budget, jobs and options."""

    kind: Literal["colocation"]
    name: str = Field(min_length=1)
    description: str = ""
    catalog: tuple[str, ...] = Field(
        default=(), description="extra catalog files, relative to the instance file"
    )
    cluster: ColocationCluster
    jobs: tuple[Job, ...] = Field(min_length=1)
    options: ColocationOptions

    @model_validator(mode="after")
    def _check(self) -> ColocationInstance:
        names = Counter(j.name for j in self.jobs)
        dup = sorted(n for n, k in names.items() if k > 1)
        if dup:
            raise ValueError(f"duplicate job names: {dup}")
        return self

    def job(self, name: str) -> TrainingJob | InferenceJob:
        """The job called ``name``."""
        for j in self.jobs:
            if j.name == name:
                return j
        raise KeyError(name)


class UnitJob(Spec):
    """A job of a unit and its MPS SM share on each of the unit's GPUs."""

    job: str = Field(min_length=1)
    share_pct: int = Field(gt=0, le=100)


class PlanUnit(Spec):
    """One job alone, or a (training, inference) pair, on the same GPUs at one clock."""

    gpu_type: str
    gpus: tuple[str, ...] = Field(min_length=1)
    clock_mhz: int = Field(gt=0, le=MAX_CLOCK_MHZ)
    start_s: float = Field(ge=0, le=1e10, description="planned start, s after 0")
    jobs: tuple[UnitJob, ...] = Field(min_length=1, max_length=2)


class ColocationPlan(Spec):
    """Which jobs run where, when, at which clock and share; the rest are not started."""

    kind: Literal["colocation-plan"] = "colocation-plan"
    instance: str
    units: tuple[PlanUnit, ...] = ()
    unscheduled: tuple[str, ...] = Field(
        default=(), description="jobs not started within the horizon (throughput objective)"
    )
    objective: float | None = Field(
        default=None, description="planning model's objective: mean JCT s, or jobs per hour"
    )
    bound: float | None = Field(default=None, description="valid bound, same unit")
    gap: float | None = None
    status: str = ""
    solver: str = ""
