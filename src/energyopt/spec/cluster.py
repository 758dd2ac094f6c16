"""Cluster: nodes of GPUs, their current state, power budgets and interconnect."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Annotated

from pydantic import Field, ValidationInfo, field_validator, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.hardware import MAX_CLOCK_MHZ, MAX_POWER_W
from energyopt.spec.limits import over_limit
from energyopt.spec.workload import Phase

MAX_BUDGET_W = 1e9
"""Largest power budget any field takes, W (a gigawatt)."""


class CurrentPlacement(Spec):
    """A unit that currently runs on a GPU (for migration costs)."""

    workload: str = Field(min_length=1)
    phase: Phase = "both"
    share_pct: int = Field(default=100, gt=0, le=100)


class GpuState(Spec):
    """What a GPU is doing now."""

    on: bool = True
    clock_mhz: int | None = Field(default=None, gt=0, le=MAX_CLOCK_MHZ)
    placements: tuple[CurrentPlacement, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> GpuState:
        total = sum(p.share_pct for p in self.placements)
        if total > 100:
            raise ValueError(f"placements: SM shares add up to {total} %, more than 100 %")
        units = [(p.workload, p.phase) for p in self.placements]
        for unit in units:
            if units.count(unit) > 1:
                raise ValueError(f"placements: {unit[0]} ({unit[1]}) is given twice")
        if not self.on and self.placements:
            raise ValueError("placements: a GPU that is off runs nothing")
        return self


class GpuEntry(Spec):
    """One GPU, or ``count`` identical GPUs, of a catalog type in a node."""

    type: str = Field(min_length=1, description="name of a catalog GPU type")
    count: int = Field(default=1, gt=0)
    ids: tuple[Annotated[str, Field(min_length=1)], ...] | None = Field(
        default=None, description="explicit GPU ids"
    )
    power_cap_w: float | None = Field(
        default=None, gt=0, le=MAX_POWER_W, description="per-GPU cap, W"
    )
    state: GpuState | None = None

    @field_validator("count")
    @classmethod
    def _count_limit(cls, count: int) -> int:
        message = over_limit("the GPU count", count, "gpus")
        if message:
            raise ValueError(message)
        return count

    @model_validator(mode="after")
    def _check(self) -> GpuEntry:
        if self.ids is not None and len(self.ids) != self.count:
            raise ValueError(f"ids has {len(self.ids)} entries but count is {self.count}")
        if self.state is not None and self.count != 1:
            raise ValueError("a state can only be given for a single GPU (count: 1)")
        return self


class Node(Spec):
    """A server: GPUs that can form tensor-parallel groups, with a power budget."""

    name: str = Field(min_length=1)
    gpus: tuple[GpuEntry, ...] = Field(min_length=1)
    power_budget_w: float | None = Field(
        default=None, gt=0, le=MAX_BUDGET_W, description="GPU power budget"
    )


class Link(Spec):
    """An interconnect link between two nodes."""

    a: str = Field(min_length=1)
    b: str = Field(min_length=1)
    bandwidth_gbps: float = Field(gt=0, le=1_000_000)


class Gpu(Spec):
    """One named GPU of the cluster (derived from the node entries)."""

    id: str
    node: str
    type: str
    index: int
    power_cap_w: float | None = None
    state: GpuState | None = None


class Cluster(Spec):
    """All nodes, the cluster-wide power budget and the inter-node links."""

    nodes: tuple[Node, ...] = Field(min_length=1)
    power_budget_w: float | None = Field(default=None, gt=0, le=MAX_BUDGET_W)
    links: tuple[Link, ...] = ()

    @field_validator("links")
    @classmethod
    def _link_ends(cls, links: tuple[Link, ...], info: ValidationInfo) -> tuple[Link, ...]:
        nodes: tuple[Node, ...] = info.data.get("nodes", ())
        names = {n.name for n in nodes}
        for i, link in enumerate(links):
            for end in (link.a, link.b):
                if nodes and end not in names:
                    raise ValueError(f"link {i}: end {end!r} is not a node")
        return links

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        message = over_limit(
            "the cluster's GPU count", sum(e.count for n in self.nodes for e in n.gpus), "gpus"
        )
        if message:
            raise ValueError(message)
        names = Counter(n.name for n in self.nodes)
        dup = {n for n, k in names.items() if k > 1}
        if dup:
            raise ValueError(f"duplicate node names: {sorted(dup)}")
        ids = Counter(gid for _, _, _, gid in self._slots())
        dup_ids = {i for i, k in ids.items() if k > 1}
        if dup_ids:
            raise ValueError(f"duplicate GPU ids: {sorted(dup_ids)}")
        return self

    def gpus(self) -> list[Gpu]:
        """Every GPU, in file order, with its id (``node/index`` unless ids are given).

        Built with ``model_construct``: every field comes from a node entry this
        cluster already validated, and validating a ``Gpu`` per GPU again took most
        of a second on fleets of thousands, on every call."""
        return [
            Gpu.model_construct(
                id=gid,
                node=node.name,
                type=entry.type,
                index=index,
                power_cap_w=entry.power_cap_w,
                state=entry.state,
            )
            for node, entry, index, gid in self._slots()
        ]

    def _slots(self) -> Iterator[tuple[Node, GpuEntry, int, str]]:
        """(node, entry, index in the node, id) of every GPU, in file order, without
        building its ``Gpu`` (validation checks the ids of fleets of thousands)."""
        for node in self.nodes:
            index = 0
            for entry in node.gpus:
                for k in range(entry.count):
                    yield node, entry, index, entry.ids[k] if entry.ids else f"{node.name}/{index}"
                    index += 1
