"""GPU classes for the configuration formulation: GPUs that are interchangeable.

Two GPUs are interchangeable when they have the same type and power cap, no
current state, and sit in the same node whenever node identity matters (a node
power budget, or tensor-parallel groups, which must stay inside one node).
A GPU with a current state is a class of its own (migration costs differ).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from energyopt.catalog.problem import Problem
from energyopt.formulations.serving.assemble import power_cap_w
from energyopt.perf.oppoints import OpTable
from energyopt.spec.cluster import Gpu


@dataclass(frozen=True)
class GpuClass:
    """Interchangeable GPUs."""

    index: int
    type_name: str
    node: str | None  # None: members may come from several nodes
    power_cap_w: float
    gpus: tuple[Gpu, ...]

    @property
    def size(self) -> int:
        """Number of GPUs in the class."""
        return len(self.gpus)

    @property
    def state_units(self) -> tuple[tuple[str, str], ...]:
        """(workload, phase) placed on the class's single stateful GPU now."""
        state = self.gpus[0].state
        if self.size != 1 or state is None:
            return ()
        return tuple((p.workload, p.phase) for p in state.placements)


def gpu_classes(problem: Problem, table: OpTable) -> list[GpuClass]:
    """Partition the fleet into classes of interchangeable GPUs."""
    tp_types = {table.type_names[int(t)] for t, k in zip(table.gpu_type, table.tp, strict=True) if k > 1}
    budgeted = {n.name for n in problem.instance.cluster.nodes if n.power_budget_w is not None}
    groups: dict[tuple[str | None, str, float, str | None], list[Gpu]] = defaultdict(list)
    for gpu in problem.gpus:
        cap = power_cap_w(problem, gpu)
        by_node = gpu.node in budgeted or gpu.type in tp_types or gpu.state is not None
        node = gpu.node if by_node else None
        solo = gpu.id if gpu.state is not None else None
        groups[(node, gpu.type, cap, solo)].append(gpu)
    return [
        GpuClass(i, type_name, node, cap, tuple(members))
        for i, ((node, type_name, cap, _), members) in enumerate(groups.items())
    ]
