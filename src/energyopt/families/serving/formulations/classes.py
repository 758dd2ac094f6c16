"""GPU classes for the configuration formulation: GPUs that are interchangeable.

Two GPUs are interchangeable when they have the same type and power cap and no
current state. Node identity matters only through a node power budget and
tensor-parallel groups, which must stay inside one node. Nodes without a budget
are merged when they hold the same number of GPUs of the type and every TP size
of the type divides that number: TP sizes (1, 2, 4, 8) divide each other, so
any mix of groups whose total fits the class packs into its nodes largest
first. A GPU with a current state is a class of its own.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from energyopt.catalog.problem import Problem
from energyopt.families.serving.formulations.assemble import power_cap_w
from energyopt.perf.oppoints import OpTable
from energyopt.spec.cluster import Gpu


@dataclass(frozen=True)
class GpuClass:
    """Interchangeable GPUs, listed node by node."""

    index: int
    type_name: str
    node: str | None  # the node of a budgeted or stateful class; None when merged
    power_cap_w: float
    gpus: tuple[Gpu, ...]

    @property
    def size(self) -> int:
        """Number of GPUs in the class."""
        return len(self.gpus)

    @property
    def state_units(self) -> tuple[tuple[str, str], ...]:
        """Distinct (workload, phase) placed on the class's single stateful GPU now."""
        state = self.gpus[0].state
        if self.size != 1 or state is None:
            return ()
        return tuple(dict.fromkeys((p.workload, p.phase) for p in state.placements))


def tp_sizes_by_type(table: OpTable) -> dict[str, set[int]]:
    """TP sizes above 1 that some op of each GPU type uses."""
    out: dict[str, set[int]] = defaultdict(set)
    for t, k in zip(table.gpu_type, table.tp, strict=True):
        if k > 1:
            out[table.type_names[int(t)]].add(int(k))
    return out


def gpu_classes(problem: Problem, table: OpTable) -> list[GpuClass]:
    """Partition the fleet into classes of interchangeable GPUs."""
    tp = tp_sizes_by_type(table)
    budgeted = {n.name for n in problem.instance.cluster.nodes if n.power_budget_w is not None}
    per_node: dict[tuple[str, str, float], list[Gpu]] = defaultdict(list)
    solo: list[Gpu] = []
    for gpu in problem.gpus:
        if gpu.state is not None:
            solo.append(gpu)
        else:
            per_node[(gpu.node, gpu.type, power_cap_w(problem, gpu))].append(gpu)
    groups: dict[tuple[str | None, str, float, int], list[Gpu]] = defaultdict(list)
    for (node, type_name, cap), members in per_node.items():
        mergeable = node not in budgeted and all(len(members) % k == 0 for k in tp[type_name])
        key_node = None if mergeable else node
        groups[(key_node, type_name, cap, len(members) if mergeable else 0)].extend(members)
    classes = [
        GpuClass(i, type_name, node, cap, tuple(members))
        for i, ((node, type_name, cap, _), members) in enumerate(groups.items())
    ]
    for gpu in solo:
        classes.append(
            GpuClass(len(classes), gpu.type, gpu.node, power_cap_w(problem, gpu), (gpu,))
        )
    return classes


def split_tp_groups(cls: GpuClass, sizes: list[int]) -> tuple[list[list[Gpu]], list[Gpu]]:
    """Place TP groups of the given sizes inside the class's nodes, largest first.

    Returns the member GPUs of each group (in the order of ``sizes``) and the
    GPUs left for single-GPU configurations.
    """
    free: dict[str, list[Gpu]] = defaultdict(list)
    for gpu in cls.gpus:
        free[gpu.node].append(gpu)
    order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
    groups: list[list[Gpu]] = [[] for _ in sizes]
    for i in order:
        k = sizes[i]
        node = next((n for n, g in free.items() if len(g) >= k), None)
        if node is None:
            raise ValueError(f"cannot place a TP group of {k} GPUs in class {cls.index}")
        groups[i] = free[node][:k]
        free[node] = free[node][k:]
    rest = [g for gs in free.values() for g in gs]
    return groups, rest
