"""Task-graph file (``kind: taskgraph``): tasks, data edges, GPUs, topology, DVFS costs.

A task-based multi-GPU application is a DAG of tasks. Each task gives its work
(FLOPs and bytes moved, turned into time and power by the roofline and power
model of ``perf/``) or measured time and power per GPU type and clock. Data
edges carry bytes between tasks; when producer and consumer run on different
GPUs the bytes cross the topology's links. Units are in the field names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.hardware import MAX_CLOCK_MHZ, MAX_POWER_W, GpuType
from energyopt.spec.limits import over_limit

MAX_TIME_MS = 86_400_000.0
"""Longest time any task-graph field takes, ms (one day)."""

ObjectiveKind = Literal["energy", "makespan", "edp", "ed2p", "energy_within"]
OBJECTIVE_KINDS: tuple[ObjectiveKind, ...] = ("energy", "makespan", "edp", "ed2p", "energy_within")
OBJECTIVE_UNITS: dict[ObjectiveKind, str] = {
    "energy": "J",
    "makespan": "ms",
    "edp": "J*s",
    "ed2p": "J*s^2",
    "energy_within": "J",
}


class MeasuredPoint(Spec):
    """Measured run of one task on one GPU type at one clock."""

    gpu_type: str = Field(min_length=1, description="catalog GPU type")
    clock_mhz: int = Field(gt=0, le=MAX_CLOCK_MHZ)
    time_ms: float = Field(gt=0, le=MAX_TIME_MS, description="wall time of the task, ms")
    power_w: float = Field(gt=0, le=MAX_POWER_W, description="board power while the task runs, W")


class Task(Spec):
    """One task: FLOPs and bytes for the model, or measured points (or both)."""

    name: str = Field(min_length=1)
    kernel: str = Field(default="", description="kernel kind, for display (potrf, gemm, ...)")
    flops: float = Field(default=0.0, ge=0, le=1e18, description="floating-point operations")
    bytes: float = Field(
        default=0.0, ge=0, le=1e16, description="device-memory bytes read and written"
    )
    compute_efficiency: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="fraction of the GPU type's achieved dense tensor rate this kernel reaches",
    )
    launch_ms: float = Field(
        default=0.01,
        ge=0,
        le=MAX_TIME_MS,
        description="fixed launch and synchronisation cost at max clock, ms",
    )
    measured: tuple[MeasuredPoint, ...] = Field(
        default=(), description="measured points; they replace the model on their GPU types"
    )

    @model_validator(mode="after")
    def _check(self) -> Task:
        if self.flops <= 0 and self.bytes <= 0 and not self.measured:
            raise ValueError("give flops and/or bytes, or measured points")
        seen: set[tuple[str, int]] = set()
        for point in self.measured:
            key = (point.gpu_type, point.clock_mhz)
            if key in seen:
                raise ValueError(f"measured point {key[0]} at {key[1]} MHz is given twice")
            seen.add(key)
        return self

    @property
    def modeled(self) -> bool:
        """True if the task has work for the performance model (FLOPs or bytes)."""
        return self.flops > 0 or self.bytes > 0


class Edge(Spec):
    """Data dependency: ``dst`` reads ``bytes`` that ``src`` wrote."""

    src: str = Field(min_length=1)
    dst: str = Field(min_length=1)
    bytes: float = Field(
        default=0.0, ge=0, le=1e16, description="bytes moved when on different GPUs"
    )


class GpuSlot(Spec):
    """One GPU of the platform."""

    name: str = Field(min_length=1)
    type: str = Field(min_length=1, description="catalog GPU type")


class TopologyLink(Spec):
    """Bidirectional link between two topology nodes (GPUs or switches/hosts)."""

    a: str = Field(min_length=1)
    b: str = Field(min_length=1)
    bandwidth_gbps: float = Field(
        ge=0.001, le=1_000_000, description="achieved bandwidth, GB/s (at least 1 MB/s)"
    )
    latency_ms: float = Field(
        default=0.01, ge=0, le=MAX_TIME_MS, description="per-transfer latency, ms"
    )


class Dvfs(Spec):
    """Cost of changing a GPU's SM clock between two tasks."""

    transition_ms: float = Field(
        default=0.1, ge=0, le=MAX_TIME_MS, description="GPU stalls this long, ms"
    )
    transition_j: float = Field(
        default=0.01, ge=0, le=1e9, description="extra energy per change, J"
    )


class TaskGraphObjective(Spec):
    """What to minimise."""

    kind: ObjectiveKind = "energy_within"
    epsilon: float = Field(
        default=0.015,
        ge=0,
        le=10,
        description="energy_within: makespan at most (1 + epsilon) x the reference makespan",
    )
    reference_makespan_ms: float | None = Field(
        default=None,
        gt=0,
        le=MAX_TIME_MS,
        description="energy_within: reference makespan; default HEFT at the maximum clock",
    )


class TaskGraphFile(Spec):
    """A task-graph problem: ``kind: taskgraph``."""

    kind: Literal["taskgraph"]
    name: str = Field(min_length=1)
    description: str = ""
    gpus: tuple[GpuSlot, ...] = Field(min_length=1)
    links: tuple[TopologyLink, ...] = Field(
        default=(), description="topology; default every GPU on one PCIe host"
    )
    clocks_mhz: dict[str, tuple[Annotated[int, Field(gt=0, le=MAX_CLOCK_MHZ)], ...]] = Field(
        default_factory=dict, description="GPU type -> clocks the scheduler may use, MHz"
    )
    idle_w: dict[str, Annotated[float, Field(gt=0, le=MAX_POWER_W)]] = Field(
        default_factory=dict,
        description="GPU type -> power of a GPU while it waits, W; default the catalog's idle_w",
    )
    clock_levels: int = Field(
        default=6, ge=1, le=64, description="clocks per GPU type when clocks_mhz omits it"
    )
    dvfs: Dvfs = Dvfs()
    time_resolution_ms: float = Field(
        default=0.001,
        ge=1e-4,
        le=1,
        description="times are rounded up to this grid, ms (0.1 us at the finest)",
    )
    objective: TaskGraphObjective = TaskGraphObjective()
    tasks: tuple[Task, ...] = Field(min_length=1)
    edges: tuple[Edge, ...] = ()

    @field_validator("gpus")
    @classmethod
    def _gpu_limit(cls, gpus: tuple[GpuSlot, ...]) -> tuple[GpuSlot, ...]:
        message = over_limit("the number of GPUs", len(gpus), "gpus")
        if message:
            raise ValueError(message)
        return gpus

    @field_validator("tasks")
    @classmethod
    def _task_limit(cls, tasks: tuple[Task, ...]) -> tuple[Task, ...]:
        message = over_limit("the number of tasks", len(tasks), "tasks")
        if message:
            raise ValueError(message)
        return tasks

    def cross_problems(self, source: str) -> list[str]:
        """'source: field: message' lines for names that repeat or point nowhere."""
        problems: list[str] = []
        seen_gpus: set[str] = set()
        for i, g in enumerate(self.gpus):
            if g.name in seen_gpus:
                problems.append(f"{source}: gpus[{i}]({g.name}).name: repeats an earlier GPU")
            seen_gpus.add(g.name)
        names: set[str] = set()
        for i, t in enumerate(self.tasks):
            if t.name in names:
                problems.append(f"{source}: tasks[{i}]({t.name}).name: repeats an earlier task")
            names.add(t.name)
        pairs: set[tuple[str, str]] = set()
        for i, e in enumerate(self.edges):
            for end in ("src", "dst"):
                value = getattr(e, end)
                if value not in names:
                    problems.append(f"{source}: edges[{i}].{end}: unknown task {value!r}")
            if e.src == e.dst:
                problems.append(f"{source}: edges[{i}]: task {e.src!r} cannot depend on itself")
            if (e.src, e.dst) in pairs:
                problems.append(f"{source}: edges[{i}]: edge {e.src} -> {e.dst} is given twice")
            pairs.add((e.src, e.dst))
        for gpu_type, clocks in self.clocks_mhz.items():
            if not clocks or any(c <= 0 for c in clocks):
                problems.append(f"{source}: clocks_mhz.{gpu_type}: give positive clocks (MHz)")
        for gpu_type, watts in self.idle_w.items():
            if watts <= 0:
                problems.append(f"{source}: idle_w.{gpu_type}: must be positive (W)")
        types = {g.type for g in self.gpus}
        for i, t in enumerate(self.tasks):
            for j, point in enumerate(t.measured):
                if point.gpu_type not in types:
                    problems.append(
                        f"{source}: tasks[{i}]({t.name}).measured[{j}].gpu_type: no GPU of type "
                        f"{point.gpu_type!r} in gpus (types: {', '.join(sorted(types))})"
                    )
        return problems

    def catalog_problems(self, source: str, gpu_types: Mapping[str, GpuType]) -> list[str]:
        """'source: field: message' lines for measured clocks outside their GPU type's
        range (``gpu_types``: the catalog entries of the file's GPU types)."""
        problems: list[str] = []
        for i, t in enumerate(self.tasks):
            for j, point in enumerate(t.measured):
                gtype = gpu_types.get(point.gpu_type)
                if gtype is None:
                    continue
                if not gtype.min_sm_clock_mhz <= point.clock_mhz <= gtype.max_sm_clock_mhz:
                    problems.append(
                        f"{source}: tasks[{i}]({t.name}).measured[{j}].clock_mhz: "
                        f"{point.clock_mhz} MHz is outside {gtype.name}'s range "
                        f"{gtype.min_sm_clock_mhz}..{gtype.max_sm_clock_mhz} MHz"
                    )
        return problems
