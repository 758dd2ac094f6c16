"""A collective file bound to its catalog: the topology graph, routes between ranks,
link capacities under the current health, and the collectives of the trace.

Bandwidths are GB/s (1e9 B/s, so bytes / GB/s / 1e3 is us), latencies us.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import pairwise
from pathlib import Path

import networkx as nx
import numpy as np
from numpy.typing import NDArray

from energyopt.catalog import builtin_catalog
from energyopt.catalog.loader import Catalog
from energyopt.families.collective.formulations.constants import LinkDefaults, defaults_for
from energyopt.families.collective.spec import Collective, CollectiveFile, Health
from energyopt.perf.clocks import spread_clocks_mhz
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.io import parse, read_data

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

SWITCH = "net"
"""The network switch every NIC connects to."""
CLOCK_COUNT = 6
"""SM clocks the energy objective chooses among when the file lists none."""
CLOCK_FLOOR = 0.5
"""Lowest spread clock as a share of the max clock."""


@dataclass(frozen=True)
class Rates:
    """Link and rate constants of the problem (file values or calibrated defaults)."""

    nvlink_gbs: float
    nvlink_us: float
    network_gbs: float
    network_us: float
    channel_gbs: float
    reduce_gbs: float
    launch_us: float


@dataclass(frozen=True)
class CollectiveProblem:
    """A bound collective instance over n ranks."""

    spec: CollectiveFile
    source: str
    gpu: GpuType
    rates: Rates
    gpus: tuple[str, ...]
    """Every GPU of the topology, node/index."""
    ranks: tuple[str, ...]
    """The GPUs that take part, in rank order."""
    node_of: tuple[int, ...]
    """Node index of each rank."""
    local_of: tuple[int, ...]
    """Index of each rank among its node's ranks."""
    graph: nx.DiGraph
    """GPUs, one NVSwitch per node (node/nvs), one NIC per GPU (node/i:nic) and the
    network switch; each directed edge has ``gbs`` (nominal x health), ``us``
    and ``index``."""
    edge_gbs: FloatArray
    """(E,): capacity of each directed edge under the current health, GB/s."""
    edge_us: FloatArray
    """(E,): latency of each directed edge, us."""
    routes: tuple[tuple[tuple[int, ...], ...], ...]
    """routes[a][b]: edge indices from rank a to rank b."""
    slowdown: FloatArray
    """(n,): straggler factor of each rank (1: healthy)."""
    clocks_mhz: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def n_nodes(self) -> int:
        return len(set(self.node_of))

    @property
    def collectives(self) -> tuple[Collective, ...]:
        return self.spec.collectives

    def name_of(self, i: int) -> str:
        c = self.spec.collectives[i]
        return c.name or f"{c.op}:{c.bytes}"

    def uniform_nodes(self) -> bool:
        """Every node that takes part has the same number of ranks, in node-major order."""
        counts: dict[int, int] = {}
        for k in self.node_of:
            counts[k] = counts.get(k, 0) + 1
        return len(set(counts.values())) == 1

    @cached_property
    def route_table(self) -> tuple[IntArray, IntArray]:
        """Padded (n, n, L) edge indices of every route (-1 padding) and their lengths,
        computed once per problem."""
        n = self.n
        width = max((len(r) for row in self.routes for r in row), default=1)
        table = np.full((n, n, max(width, 1)), -1, dtype=np.int64)
        lengths = np.zeros((n, n), dtype=np.int64)
        for a in range(n):
            for b in range(n):
                r = self.routes[a][b]
                table[a, b, : len(r)] = r
                lengths[a, b] = len(r)
        return table, lengths

    @cached_property
    def route_us(self) -> FloatArray:
        """(n, n): latency of the route from rank a to rank b, us (0 from a rank to itself)."""
        table, _ = self.route_table
        out: FloatArray = np.where(table >= 0, self.edge_us[np.maximum(table, 0)], 0.0).sum(axis=2)
        return out

    @cached_property
    def port_capacities(self) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """(into, out of, into over the network, out over the network) each rank, GB/s:
        its links' capacities, a NIC's as the lesser of its two hops (every byte to
        or from the network crosses both)."""
        n = self.n
        g = self.graph
        caps = [np.zeros(n) for _ in range(4)]
        for r, name in enumerate(self.ranks):
            for u, _, d in g.in_edges(name, data=True):
                hop = min(d["gbs"], g[SWITCH][u]["gbs"]) if u.endswith(":nic") else d["gbs"]
                caps[0][r] += hop
                caps[2][r] += hop if u.endswith(":nic") else 0.0
            for _, v, d in g.out_edges(name, data=True):
                hop = min(d["gbs"], g[v][SWITCH]["gbs"]) if v.endswith(":nic") else d["gbs"]
                caps[1][r] += hop
                caps[3][r] += hop if v.endswith(":nic") else 0.0
        return caps[0], caps[1], caps[2], caps[3]

    def least_route_us(self, inside: NDArray[np.bool_] | None = None) -> float:
        """Least latency of a route between two ranks, us; with ``inside`` (a mask of
        ranks), of a route from a rank inside to one outside or back."""
        pair = ~np.eye(self.n, dtype=bool) if inside is None else inside[:, None] != inside
        return float(self.route_us[pair].min())

    def with_health(self, health: Health) -> CollectiveProblem:
        """The same problem under another health state."""
        return build_problem(self.spec.model_copy(update={"health": health}), self.source)


def load_collective(path: str | Path, catalogs: Sequence[str] = ()) -> CollectiveProblem:
    """Read, validate and bind a collective file; SpecError naming file and field."""
    p = Path(path)
    spec = parse(CollectiveFile, read_data(p), str(p))
    return build_problem(spec, str(p), _catalog(catalogs))


def _catalog(catalogs: Sequence[str]) -> Catalog:
    cat = builtin_catalog()
    if catalogs:
        from energyopt.catalog.loader import load_catalog_file

        gpus = []
        for c in catalogs:
            gpus.extend(load_catalog_file(c)[0])
        cat = cat.merged(gpus, [])
    return cat


def build_problem(
    spec: CollectiveFile, source: str = "<collective>", catalog: Catalog | None = None
) -> CollectiveProblem:
    """Bind a parsed file; SpecError for unknown GPUs, types and ranks."""
    cat = catalog or builtin_catalog()
    topo = spec.topology
    problems: list[str] = []
    try:
        gpu = cat.gpu(topo.gpu)
    except (KeyError, SpecError, ValueError) as exc:
        raise SpecError([f"{source}: topology.gpu: {exc}"]) from None
    cal = defaults_for(gpu.name)
    missing = [
        f
        for f, v in (
            ("nvlink", topo.nvlink),
            ("network", topo.network),
            ("channel_gbs", topo.channel_gbs),
            ("reduce_gbs", topo.reduce_gbs),
            ("launch_us", topo.launch_us),
        )
        if v is None
    ]
    if cal is None and missing:
        raise SpecError(
            [
                f"{source}: topology.{missing[0]}: required for {gpu.name}, which has no "
                "calibrated collective constants"
            ]
        )
    base = cal if cal is not None else LinkDefaults(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    rates = Rates(
        nvlink_gbs=topo.nvlink.bandwidth_gbs if topo.nvlink else base.nvlink_gbs,
        nvlink_us=topo.nvlink.latency_us if topo.nvlink else base.nvlink_us,
        network_gbs=topo.network.bandwidth_gbs if topo.network else base.network_gbs,
        network_us=topo.network.latency_us if topo.network else base.network_us,
        channel_gbs=topo.channel_gbs if topo.channel_gbs is not None else base.channel_gbs,
        reduce_gbs=topo.reduce_gbs if topo.reduce_gbs is not None else base.reduce_gbs,
        launch_us=topo.launch_us if topo.launch_us is not None else base.launch_us,
    )
    gpus = tuple(f"{node.name}/{i}" for node in topo.nodes for i in range(node.gpus))
    node_index = {
        f"{node.name}/{i}": k for k, node in enumerate(topo.nodes) for i in range(node.gpus)
    }
    ranks = spec.ranks if spec.ranks is not None else gpus
    for i, r in enumerate(ranks):
        if r not in node_index:
            problems.append(f"{source}: ranks[{i}]: unknown GPU {r!r}; GPUs are node/index")
    if len(ranks) < 2:
        problems.append(f"{source}: ranks: a collective needs at least 2 ranks")
    for i, lh in enumerate(spec.health.links):
        if lh.gpu not in node_index:
            problems.append(f"{source}: health.links[{i}].gpu: unknown GPU {lh.gpu!r}")
    for i, st in enumerate(spec.health.stragglers):
        if st.gpu not in node_index:
            problems.append(f"{source}: health.stragglers[{i}].gpu: unknown GPU {st.gpu!r}")
    for i, c in enumerate(spec.collectives):
        if c.root >= len(ranks):
            problems.append(f"{source}: collectives[{i}].root: rank {c.root} of {len(ranks)}")
    names = [c.name for c in spec.collectives if c.name]
    if len(set(names)) != len(names):
        problems.append(f"{source}: collectives: a name is used twice")
    if spec.clocks_mhz is not None:
        for i, f in enumerate(spec.clocks_mhz):
            if not gpu.min_sm_clock_mhz <= f <= gpu.max_sm_clock_mhz:
                problems.append(
                    f"{source}: clocks_mhz[{i}]: {f} MHz outside {gpu.name}'s "
                    f"{gpu.min_sm_clock_mhz}-{gpu.max_sm_clock_mhz} MHz"
                )
    if problems:
        raise SpecError(problems)
    factor_nv = {lh.gpu: lh.factor for lh in spec.health.links if lh.link == "nvlink"}
    factor_nic = {lh.gpu: lh.factor for lh in spec.health.links if lh.link == "nic"}
    graph: nx.DiGraph = nx.DiGraph()
    multi_node = len(topo.nodes) > 1

    def both(a: str, b: str, gbs: float, us: float) -> None:
        for u, v in ((a, b), (b, a)):
            graph.add_edge(u, v, gbs=gbs, us=us, index=graph.number_of_edges())

    for node in topo.nodes:
        for i in range(node.gpus):
            g = f"{node.name}/{i}"
            both(g, f"{node.name}/nvs", rates.nvlink_gbs * factor_nv.get(g, 1.0), rates.nvlink_us)
            if multi_node:
                both(g, f"{g}:nic", rates.network_gbs, 0.0)
                both(
                    f"{g}:nic",
                    SWITCH,
                    rates.network_gbs * factor_nic.get(g, 1.0),
                    rates.network_us,
                )
    n_e = graph.number_of_edges()
    edge_gbs = np.zeros(n_e)
    edge_us = np.zeros(n_e)
    for _, _, d in graph.edges(data=True):
        edge_gbs[d["index"]] = d["gbs"]
        edge_us[d["index"]] = d["us"]
    node_of = tuple(node_index[r] for r in ranks)
    nodes_used = sorted(set(node_of))
    local: list[int] = []
    seen: dict[int, int] = {}
    for k in node_of:
        local.append(seen.get(k, 0))
        seen[k] = seen.get(k, 0) + 1
    routes = tuple(
        tuple(
            () if a == b else tuple(graph[u][v]["index"] for u, v in _pairs(graph, a, b))
            for b in ranks
        )
        for a in ranks
    )
    slow = {st.gpu: st.slowdown for st in spec.health.stragglers}
    clocks = spec.clocks_mhz or spread_clocks_mhz(
        gpu, CLOCK_COUNT, CLOCK_FLOOR * gpu.max_sm_clock_mhz
    )
    return CollectiveProblem(
        spec=spec,
        source=source,
        gpu=gpu,
        rates=rates,
        gpus=gpus,
        ranks=tuple(ranks),
        node_of=tuple(nodes_used.index(k) for k in node_of),
        local_of=tuple(local),
        graph=graph,
        edge_gbs=edge_gbs,
        edge_us=edge_us,
        routes=routes,
        slowdown=np.array([slow.get(r, 1.0) for r in ranks]),
        clocks_mhz=tuple(sorted(set(clocks) | {gpu.max_sm_clock_mhz})),
    )


def _pairs(graph: nx.DiGraph, a: str, b: str) -> list[tuple[str, str]]:
    path: list[str] = nx.shortest_path(graph, a, b)
    return list(pairwise(path))


def healthy(p: CollectiveProblem) -> CollectiveProblem:
    """``p`` with every link whole and no straggler."""
    return replace(p.with_health(Health()), source=p.source)
