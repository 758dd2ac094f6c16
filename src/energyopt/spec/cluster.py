"""Cluster: nodes of GPUs, their current state, power budgets and interconnect."""

from __future__ import annotations

import networkx as nx
from pydantic import Field, ValidationInfo, field_validator, model_validator

from energyopt.spec.base import Spec
from energyopt.spec.workload import Phase


class CurrentPlacement(Spec):
    """A unit that currently runs on a GPU (for migration costs)."""

    workload: str
    phase: Phase = "both"
    share_pct: int = Field(default=100, gt=0, le=100)


class GpuState(Spec):
    """What a GPU is doing now."""

    on: bool = True
    clock_mhz: int | None = Field(default=None, gt=0)
    placements: tuple[CurrentPlacement, ...] = ()


class GpuEntry(Spec):
    """One GPU, or ``count`` identical GPUs, of a catalog type in a node."""

    type: str = Field(min_length=1, description="name of a catalog GPU type")
    count: int = Field(default=1, gt=0)
    ids: tuple[str, ...] | None = Field(default=None, description="explicit GPU ids")
    power_cap_w: float | None = Field(default=None, gt=0, description="per-GPU cap, W")
    state: GpuState | None = None

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
    power_budget_w: float | None = Field(default=None, gt=0, description="GPU power budget")


class Link(Spec):
    """An interconnect link between two nodes."""

    a: str
    b: str
    bandwidth_gbps: float = Field(gt=0)


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
    power_budget_w: float | None = Field(default=None, gt=0)
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
        names = [n.name for n in self.nodes]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"duplicate node names: {sorted(dup)}")
        ids = [g.id for g in self.gpus()]
        dup_ids = {i for i in ids if ids.count(i) > 1}
        if dup_ids:
            raise ValueError(f"duplicate GPU ids: {sorted(dup_ids)}")
        return self

    def gpus(self) -> list[Gpu]:
        """Every GPU, in file order, with its id (``node/index`` unless ids are given)."""
        out: list[Gpu] = []
        for node in self.nodes:
            index = 0
            for entry in node.gpus:
                for k in range(entry.count):
                    gid = entry.ids[k] if entry.ids else f"{node.name}/{index}"
                    out.append(
                        Gpu(
                            id=gid,
                            node=node.name,
                            type=entry.type,
                            index=index,
                            power_cap_w=entry.power_cap_w,
                            state=entry.state,
                        )
                    )
                    index += 1
        return out

    def topology(self) -> nx.Graph:
        """Interconnect as a graph: GPU nodes joined to their server, servers by links.

        Inter-node edges carry ``bandwidth_gbps`` (GB/s); GPU-server edges ``intra_node``.
        """
        graph = nx.Graph()
        for node in self.nodes:
            graph.add_node(node.name, kind="node", power_budget_w=node.power_budget_w)
        for gpu in self.gpus():
            graph.add_node(gpu.id, kind="gpu", type=gpu.type)
            graph.add_edge(gpu.id, gpu.node, intra_node=True)
        for link in self.links:
            graph.add_edge(link.a, link.b, bandwidth_gbps=link.bandwidth_gbps)
        return graph
