"""Variants of a base problem that grid cells stand for: workload rates scaled, the SLOs
of a tier, every GPU of the fleet of one type."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from energyopt.catalog.problem import Problem
from energyopt.spec.cluster import Cluster, GpuEntry, Node
from energyopt.tables.spec import SloTier


def _retyped(entry: GpuEntry, type_name: str) -> GpuEntry:
    # a current clock is a clock of the old type: keep the placements, drop the clock
    state = entry.state
    if state is not None and state.clock_mhz is not None:
        state = state.model_copy(update={"clock_mhz": None})
    return entry.model_copy(update={"type": type_name, "state": state})


def variant(
    problem: Problem,
    scales: Mapping[str, float] | None = None,
    tier: SloTier | None = None,
    gpu_type: str | None = None,
) -> Problem:
    """``problem`` with each workload's rate (requests/s) times ``scales[name]``, every
    TTFT/TBT SLO (ms) times the tier's multipliers, and every GPU of type ``gpu_type``
    (a current clock in a GPU's state is dropped: it was a clock of the old type)."""
    inst = problem.instance
    workloads = []
    for w in inst.workloads:
        update: dict[str, object] = {}
        if scales is not None:
            update["rate_rps"] = w.rate_rps * scales.get(w.name, 1.0)
        if tier is not None:
            update["slo"] = w.slo.model_copy(
                update={
                    "ttft_ms": w.slo.ttft_ms * tier.ttft_scale,
                    "tbt_ms": w.slo.tbt_ms * tier.tbt_scale,
                }
            )
        workloads.append(w.model_copy(update=update))
    cluster = inst.cluster
    if gpu_type is not None:
        nodes = tuple(
            node.model_copy(update={"gpus": tuple(_retyped(e, gpu_type) for e in node.gpus)})
            for node in cluster.nodes
        )
        cluster = cluster.model_copy(update={"nodes": nodes})
    changed = inst.model_copy(update={"workloads": tuple(workloads), "cluster": cluster})
    return problem.with_instance(changed)


def one_gpu_per_type(problem: Problem, types: Sequence[str]) -> Problem:
    """``problem`` with its cluster replaced by one node holding one GPU of each type
    (the operating-point table tabulates single-GPU ops of these types)."""
    node = Node(name="types", gpus=tuple(GpuEntry(type=t) for t in types))
    changed = problem.instance.model_copy(update={"cluster": Cluster(nodes=(node,))})
    return problem.with_instance(changed)
