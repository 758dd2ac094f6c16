"""A task-graph problem bound to the catalog: options per (task, GPU type, clock), topology.

Times are integers on the file's grid (``time_resolution_ms``, 1 us by default),
rounded up from the model, so every solver and the checker see the same
durations. Energies are in J, powers in W.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, replace

import networkx as nx
import numpy as np

from energyopt.catalog.loader import Catalog, builtin_catalog
from energyopt.families.taskgraph.spec import (
    MAX_TIME_MS,
    ObjectiveKind,
    TaskGraphFile,
    TopologyLink,
)
from energyopt.perf.kernels import default_clocks_mhz, kernel_costs
from energyopt.perf.params import PCIE_GBPS
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType

HOST_NODE = "host"
"""Topology node every GPU hangs off when a file gives no links (PCIe root)."""
DEFAULT_LINK_LATENCY_MS = 0.01


@dataclass(frozen=True)
class TaskOptions:
    """The ways one task can run on one GPU type: parallel tuples, one entry per clock."""

    clock_mhz: tuple[int, ...]
    dur: tuple[int, ...]  # time units of the grid
    active_w: tuple[float, ...]  # board power while it runs, W
    dyn_j: tuple[float, ...]  # (active_w - idle_w of the type) x duration, J


@dataclass(frozen=True)
class TaskGraph:
    """Everything a scheduler needs, with tasks, GPUs and types as integer indices."""

    name: str
    source: str
    spec: TaskGraphFile
    task_names: tuple[str, ...]
    gpu_names: tuple[str, ...]
    gpu_type: tuple[int, ...]  # per GPU: index into ``types``
    types: tuple[GpuType, ...]
    idle_w: tuple[float, ...]  # per type, W
    options: tuple[tuple[TaskOptions, ...], ...]  # [type][task]; empty tuples: cannot run
    preds: tuple[tuple[tuple[int, float], ...], ...]  # per task: (predecessor, bytes)
    succs: tuple[tuple[tuple[int, float], ...], ...]  # per task: (successor, bytes)
    topo_order: tuple[int, ...]
    unit_ms: float  # length of one time unit, ms
    transition: int  # DVFS transition latency, time units
    transition_j: float  # DVFS transition energy, J
    route_latency_ms: tuple[tuple[float, ...], ...]  # [gpu][gpu]
    route_gbps: tuple[tuple[float, ...], ...]  # [gpu][gpu] bottleneck bandwidth, GB/s
    objective: ObjectiveKind
    deadline: int | None = None  # energy_within: makespan bound, time units
    reference_makespan: int | None = None  # energy_within: the reference, time units
    graph: nx.DiGraph = field(default_factory=nx.DiGraph, compare=False, repr=False)

    @property
    def n_tasks(self) -> int:
        """Number of tasks."""
        return len(self.task_names)

    @property
    def n_gpus(self) -> int:
        """Number of GPUs."""
        return len(self.gpu_names)

    def opts(self, task: int, gpu: int) -> TaskOptions:
        """Options of ``task`` on ``gpu`` (by the GPU's type)."""
        return self.options[self.gpu_type[gpu]][task]

    def can_run(self, task: int, gpu: int) -> bool:
        """True if ``task`` has at least one option on ``gpu``."""
        return bool(self.options[self.gpu_type[gpu]][task].dur)

    def transfer(self, nbytes: float, src_gpu: int, dst_gpu: int) -> int:
        """Time units to move ``nbytes`` from ``src_gpu`` to ``dst_gpu`` (0 on one GPU)."""
        if src_gpu == dst_gpu or nbytes <= 0:
            return 0
        ms = (
            self.route_latency_ms[src_gpu][dst_gpu]
            + nbytes / (self.route_gbps[src_gpu][dst_gpu] * 1e9) * 1e3
        )
        return to_units(ms, self.unit_ms)

    @property
    def idle_total_w(self) -> float:
        """Power of all GPUs while they wait, W (every GPU is on until the makespan)."""
        return float(sum(self.idle_w[t] for t in self.gpu_type))

    def ms(self, units: float) -> float:
        """Time units to ms."""
        return units * self.unit_ms

    def max_clock_option(self, task: int, gpu: int) -> int:
        """Index of the fastest option of ``task`` on ``gpu`` (highest clock on ties)."""
        o = self.opts(task, gpu)
        return min(range(len(o.dur)), key=lambda k: (o.dur[k], -o.clock_mhz[k]))

    def objective_value(self, makespan: int, energy_j: float) -> float:
        """Objective of a schedule in its unit (J, ms, J*s, J*s^2)."""
        return objective_value(self.objective, self.ms(makespan), energy_j)


def objective_value(kind: ObjectiveKind, makespan_ms: float, energy_j: float) -> float:
    """energy (J), makespan (ms), edp (J*s), ed2p (J*s^2), energy_within (J)."""
    seconds = makespan_ms / 1e3
    if kind == "makespan":
        return makespan_ms
    if kind == "edp":
        return energy_j * seconds
    if kind == "ed2p":
        return energy_j * seconds * seconds
    return energy_j


def to_units(ms: float, unit_ms: float) -> int:
    """ms rounded up to the time grid (a tiny tolerance absorbs float noise)."""
    return max(0, math.ceil(ms / unit_ms - 1e-9))


def bind_taskgraph(
    spec: TaskGraphFile, source: str = "<taskgraph>", catalog: Catalog | None = None
) -> TaskGraph:
    """Bind a parsed file to the catalog; SpecError lists every problem found. An
    ``energy_within`` objective without a reference makespan is left without its
    deadline: ``loading.build_taskgraph`` derives it from HEFT's schedule."""
    cat = catalog or builtin_catalog()
    problems = spec.cross_problems(source)
    type_names: list[str] = []
    for i, g in enumerate(spec.gpus):
        if g.type not in cat.gpus:
            try:
                cat.gpu(g.type)
            except KeyError as exc:
                problems.append(f"{source}: gpus[{i}]({g.name}).type: {exc.args[0]}")
            continue
        if g.type not in type_names:
            type_names.append(g.type)
    for key in ("clocks_mhz", "idle_w"):
        for name in getattr(spec, key):
            if name not in type_names:
                problems.append(f"{source}: {key}.{name}: no GPU of this type in gpus")
    if problems:
        raise SpecError(problems)
    types = tuple(cat.gpu(n) for n in type_names)
    idle = tuple(float(spec.idle_w.get(t.name, t.idle_w)) for t in types)
    graph = _dag(spec, source)
    route_lat, route_bw = _routes(spec, source)
    unit = spec.time_resolution_ms
    options = tuple(
        _type_options(spec, source, gpu, idle_w, unit, problems)
        for gpu, idle_w in zip(types, idle, strict=True)
    )
    if problems:  # a task the model cannot time, or an idle power above a task's
        raise SpecError(problems)
    for i, t in enumerate(spec.tasks):
        if not any(options[k][i].dur for k in range(len(types))):
            measured_on = sorted({m.gpu_type for m in t.measured})
            problems.append(
                f"{source}: tasks[{i}]({t.name}): no GPU of the platform can run it "
                f"(no flops/bytes; measured only on {', '.join(measured_on)})"
            )
    if problems:
        raise SpecError(problems)
    index = {t.name: i for i, t in enumerate(spec.tasks)}
    preds: list[list[tuple[int, float]]] = [[] for _ in spec.tasks]
    succs: list[list[tuple[int, float]]] = [[] for _ in spec.tasks]
    for e in spec.edges:
        preds[index[e.dst]].append((index[e.src], e.bytes))
        succs[index[e.src]].append((index[e.dst], e.bytes))
    order = tuple(index[n] for n in nx.lexicographical_topological_sort(graph, key=index.get))
    tg = TaskGraph(
        name=spec.name,
        source=source,
        spec=spec,
        task_names=tuple(t.name for t in spec.tasks),
        gpu_names=tuple(g.name for g in spec.gpus),
        gpu_type=tuple(type_names.index(g.type) for g in spec.gpus),
        types=types,
        idle_w=idle,
        options=options,
        preds=tuple(tuple(x) for x in preds),
        succs=tuple(tuple(x) for x in succs),
        topo_order=order,
        unit_ms=unit,
        transition=to_units(spec.dvfs.transition_ms, unit),
        transition_j=spec.dvfs.transition_j,
        route_latency_ms=route_lat,
        route_gbps=route_bw,
        objective=spec.objective.kind,
        graph=graph,
    )
    if spec.objective.kind != "energy_within":
        return tg
    ref_ms = spec.objective.reference_makespan_ms
    return tg if ref_ms is None else with_deadline(tg, to_units(ref_ms, unit))


def with_deadline(tg: TaskGraph, reference: int) -> TaskGraph:
    """``tg`` with the ``energy_within`` deadline: the reference makespan (time
    units) times 1 + epsilon, rounded down."""
    objective = tg.spec.objective
    assert objective.kind == "energy_within"
    deadline = math.floor(reference * (1.0 + objective.epsilon) + 1e-9)
    return replace(tg, reference_makespan=reference, deadline=deadline)


def _dag(spec: TaskGraphFile, source: str) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(t.name for t in spec.tasks)
    graph.add_edges_from((e.src, e.dst, {"bytes": e.bytes}) for e in spec.edges)
    if not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        shown = " -> ".join([*(u for u, _ in cycle), cycle[0][0]])
        raise SpecError([f"{source}: edges: the graph has a cycle: {shown}"])
    return graph


def _routes(
    spec: TaskGraphFile, source: str
) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]:
    """(latency ms, bottleneck GB/s) of the route between every pair of GPUs.

    The route is the path of least sum of 1/bandwidth (networkx Dijkstra);
    its latency is the sum over its links, its bandwidth the narrowest link's.
    Links are not shared: concurrent transfers do not slow each other.
    """
    topo = nx.Graph()
    names = [g.name for g in spec.gpus]
    topo.add_nodes_from(names)
    links = spec.links or tuple(
        _host_link(name) for name in names
    )  # every GPU on one PCIe root (perf.params.PCIE_GBPS)
    for link in links:
        if link.a == link.b:
            raise SpecError([f"{source}: links: a link from {link.a!r} to itself"])
        topo.add_edge(
            link.a,
            link.b,
            weight=1.0 / link.bandwidth_gbps,
            gbps=link.bandwidth_gbps,
            latency_ms=link.latency_ms,
        )
    lat = [[0.0] * len(names) for _ in names]
    bw = [[math.inf] * len(names) for _ in names]
    problems: list[str] = []
    for i, a in enumerate(names):
        paths = nx.single_source_dijkstra_path(topo, a, weight="weight")
        for j, b in enumerate(names):
            if i == j:
                continue
            path = paths.get(b)
            if path is None:
                if i < j:
                    problems.append(f"{source}: links: GPUs {a!r} and {b!r} are not connected")
                continue
            hops = list(itertools.pairwise(path))
            lat[i][j] = sum(topo.edges[u, v]["latency_ms"] for u, v in hops)
            bw[i][j] = min(topo.edges[u, v]["gbps"] for u, v in hops)
    if problems:
        raise SpecError(problems)
    return tuple(tuple(r) for r in lat), tuple(tuple(r) for r in bw)


def _host_link(gpu: str) -> TopologyLink:
    return TopologyLink(
        a=gpu, b=HOST_NODE, bandwidth_gbps=PCIE_GBPS, latency_ms=DEFAULT_LINK_LATENCY_MS
    )


def _type_options(
    spec: TaskGraphFile,
    source: str,
    gpu: GpuType,
    idle_w: float,
    unit_ms: float,
    problems: list[str],
) -> tuple[TaskOptions, ...]:
    """Options of every task on one GPU type (measured points replace the model)."""
    clocks = spec.clocks_mhz.get(gpu.name) or default_clocks_mhz(gpu, spec.clock_levels)
    clocks = tuple(sorted(set(clocks)))
    for c in clocks:
        if not gpu.min_sm_clock_mhz <= c <= gpu.max_sm_clock_mhz:
            problems.append(
                f"{source}: clocks_mhz.{gpu.name}: {c} MHz is outside "
                f"{gpu.min_sm_clock_mhz}-{gpu.max_sm_clock_mhz} MHz"
            )
    n, k = len(spec.tasks), len(clocks)
    modeled = [i for i, t in enumerate(spec.tasks) if t.modeled]
    rows: dict[int, TaskOptions] = {}
    if modeled:
        m = len(modeled)
        flops = np.repeat([spec.tasks[i].flops for i in modeled], k)
        nbytes = np.repeat([spec.tasks[i].bytes for i in modeled], k)
        eff = np.repeat([spec.tasks[i].compute_efficiency for i in modeled], k)
        launch = np.repeat([spec.tasks[i].launch_ms for i in modeled], k)
        clk = np.tile(np.asarray(clocks, dtype=np.float64), m)
        ms, watts = kernel_costs(gpu, clk, flops, nbytes, eff, launch)
        ms, watts = ms.reshape(m, k), watts.reshape(m, k)
        slow = [r for r in range(m) if not np.all(ms[r] <= MAX_TIME_MS)]
        for r in slow:
            t = spec.tasks[modeled[r]]
            longest = float(ms[r].max())
            problems.append(
                f"{source}: tasks[{modeled[r]}]({t.name}): the model gives {longest:.3g} ms on "
                f"{gpu.name}, more than a day ({MAX_TIME_MS:.0f} ms): check flops, bytes and "
                f"compute_efficiency ({t.compute_efficiency:g})"
            )
        cool = np.argwhere(watts < idle_w)
        if len(cool):
            r, c = (int(x) for x in cool[0])
            least = float(watts[r, c])
            problems.append(
                f"{source}: idle_w.{gpu.name}: {idle_w:g} W is above the {least:.1f} W "
                f"the model gives task {spec.tasks[modeled[r]].name} at {clocks[c]} MHz "
                f"({len(cool)} task-clock pair(s) in all); a waiting GPU draws less than a "
                "working one"
            )
        if slow or len(cool):
            return tuple(TaskOptions((), (), (), ()) for _ in spec.tasks)
        dur = np.maximum(np.ceil(ms / unit_ms - 1e-9), 1).astype(np.int64)
        active = watts
        dyn = (active - idle_w) * dur * unit_ms / 1e3
        for row, i in enumerate(modeled):
            rows[i] = TaskOptions(
                clocks,
                tuple(int(x) for x in dur[row]),
                tuple(float(x) for x in active[row]),
                tuple(float(x) for x in dyn[row]),
            )
    out: list[TaskOptions] = []
    for i, t in enumerate(spec.tasks):
        points = sorted(
            (p for p in t.measured if p.gpu_type == gpu.name), key=lambda p: p.clock_mhz
        )
        if points:
            for p in points:
                if p.power_w < idle_w:
                    problems.append(
                        f"{source}: tasks[{i}]({t.name}).measured: {p.power_w} W at "
                        f"{p.clock_mhz} MHz is below the {gpu.name} idle power {idle_w} W"
                    )
            durs = tuple(max(1, to_units(p.time_ms, unit_ms)) for p in points)
            out.append(
                TaskOptions(
                    tuple(p.clock_mhz for p in points),
                    durs,
                    tuple(p.power_w for p in points),
                    tuple(
                        (p.power_w - idle_w) * d * unit_ms / 1e3
                        for p, d in zip(points, durs, strict=True)
                    ),
                )
            )
        else:
            out.append(rows.get(i, TaskOptions((), (), (), ())))
    assert len(out) == n
    return tuple(out)
