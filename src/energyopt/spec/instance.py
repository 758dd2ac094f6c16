"""Instance: a fleet (cluster), the LLM workloads it serves and the model options.

This is the shared fleet model: the serving family decides a plan for it
(``energyopt.families.serving``), the performance model prices it, the simulator
core replays plans on it, NVML applies them, and the serverless family reuses its
``Options``."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.cluster import Cluster
from energyopt.spec.hardware import MAX_CLOCK_MHZ, GpuType
from energyopt.spec.limits import over_limit
from energyopt.spec.llm import MAX_TOKENS, LlmModel
from energyopt.spec.workload import Workload

Clock = Annotated[int, Field(gt=0, le=MAX_CLOCK_MHZ)]

Objective = Literal["power", "power_migration", "gpus_on", "edp"]
SharingMode = Literal["mps", "mig", "exclusive"]


class Sharing(Spec):
    """How SMs of one GPU are split between co-located units."""

    mode: SharingMode = "mps"
    levels_pct: tuple[int, ...] = Field(
        default=(25, 50, 75, 100), description="MPS active-thread percentages"
    )
    mig_profiles: tuple[Annotated[str, Field(min_length=1)], ...] | None = Field(
        default=None, min_length=1, description="MIG profiles allowed (mode mig); default all"
    )

    @model_validator(mode="after")
    def _check(self) -> Sharing:
        if not self.levels_pct:
            raise ValueError("levels_pct is empty")
        for level in self.levels_pct:
            if not 0 < level <= 100:
                raise ValueError(f"share level {level} is outside 1..100")
        return self

    def levels(self) -> tuple[int, ...]:
        """Share levels in percent, ascending; exclusive mode means 100 only."""
        if self.mode == "exclusive":
            return (100,)
        return tuple(sorted(set(self.levels_pct)))


class ProfileRef(Spec):
    """A measured latency profile (CSV) for one GPU type and model."""

    gpu: str = Field(min_length=1, description="catalog GPU type")
    model: str = Field(min_length=1, description="catalog LLM")
    file: str = Field(min_length=1, description="CSV path, relative to the instance file")
    clock_mhz: int | None = Field(
        default=None, gt=0, description="clock it was measured at; default: the GPU's default"
    )


class Options(Spec):
    """Decision space and objective."""

    clocks_mhz: dict[str, tuple[Clock, ...]] | None = Field(
        default=None, description="candidate SM clocks per GPU type (MHz)"
    )
    clock_count: int = Field(
        default=6,
        gt=0,
        le=64,
        description="candidate clocks per type when clocks_mhz is not given",
    )
    sharing: Sharing = Sharing()
    objective: Objective = "power"
    migration_penalty_w: float = Field(
        default=0.0, ge=0, le=1e9, description="cost of moving one placement, in W-equivalent"
    )
    chunk_tokens: int = Field(
        default=512, gt=0, le=MAX_TOKENS, description="chunked-prefill token budget"
    )
    memory_reserve_fraction: float = Field(
        default=0.1, ge=0, lt=1, description="part of GPU memory kept free (runtime, fragments)"
    )
    max_batch: int = Field(
        default=256, gt=0, le=1_000_000, description="largest decode batch per placement"
    )
    latency_margin: Annotated[float, Field(ge=0, le=10)] | Literal["calibrated"] = Field(
        default=0.0,
        description="plan as if every pass took (1 + margin) times its modelled time, which "
        "derates every operating point's SLO capacity; calibrated: each GPU type's measured "
        "latency error (efficiency.latency_error)",
    )

    @field_validator("clocks_mhz")
    @classmethod
    def _clock_lists(
        cls, clocks: dict[str, tuple[int, ...]] | None
    ) -> dict[str, tuple[int, ...]] | None:
        for type_name, values in (clocks or {}).items():
            if not values:
                raise ValueError(f"{type_name}: give at least one clock (MHz)")
            if len(set(values)) != len(values):
                raise ValueError(f"{type_name}: a clock is given twice")
        return clocks


_BY_NAME: dict[int, tuple[tuple[Workload, ...], dict[str, Workload]]] = {}
"""``Instance.workload``'s tables, by the id of the workload tuple (which each entry
holds, so the id stays its own), oldest first; the oldest goes past _BY_NAME_KEPT."""
_BY_NAME_KEPT = 16


class Instance(Spec):
    """A complete problem: what is there, what must be served, and how to decide."""

    kind: Literal["serving"] = Field(
        default="serving", description="problem family; other families have their own files"
    )
    name: str = Field(min_length=1)
    description: str = ""
    catalog: tuple[str, ...] = Field(
        default=(), description="extra catalog files, relative to the instance file"
    )
    gpu_types: tuple[GpuType, ...] = Field(default=(), description="inline catalog GPUs")
    models: tuple[LlmModel, ...] = Field(default=(), description="inline catalog LLMs")
    profiles: tuple[ProfileRef, ...] = Field(
        default=(), description="measured profiles that override the analytic latency model"
    )
    cluster: Cluster
    workloads: tuple[Workload, ...] = Field(min_length=1)
    options: Options = Options()

    @field_validator("workloads")
    @classmethod
    def _unique_names(cls, workloads: tuple[Workload, ...]) -> tuple[Workload, ...]:
        message = over_limit("the number of workloads", len(workloads), "workloads")
        if message:
            raise ValueError(message)
        names = Counter(w.name for w in workloads)
        dup = {n for n, k in names.items() if k > 1}
        if dup:
            raise ValueError(f"duplicate workload names: {sorted(dup)}")
        return workloads

    @field_validator("gpu_types", "models")
    @classmethod
    def _unique_entries(
        cls, entries: tuple[GpuType, ...] | tuple[LlmModel, ...]
    ) -> tuple[GpuType, ...] | tuple[LlmModel, ...]:
        names = Counter(e.name for e in entries)
        dup = sorted(n for n, k in names.items() if k > 1)
        if dup:
            raise ValueError(f"{dup[0]!r} is given twice")
        return entries

    @model_validator(mode="after")
    def _size(self) -> Instance:
        gpus = sum(e.count for n in self.cluster.nodes for e in n.gpus)
        message = over_limit(
            f"workloads x GPUs ({len(self.workloads)} x {gpus})",
            len(self.workloads) * gpus,
            "workload_gpus",
        )
        if message:
            raise ValueError(message)
        return self

    def workload(self, name: str) -> Workload:
        """The workload called ``name`` (names are unique). Looked up by name in a
        table made once per workload tuple: a scan per call made the plan's
        verification and the operating-point table quadratic in the workloads
        (10,000 at 102,400 GPUs)."""
        key = id(self.workloads)
        held = _BY_NAME.get(key)
        if held is None or held[0] is not self.workloads:
            held = (self.workloads, {w.name: w for w in self.workloads})
            _BY_NAME[key] = held
            if len(_BY_NAME) > _BY_NAME_KEPT:
                _BY_NAME.pop(next(iter(_BY_NAME)), None)
        return held[1][name]
