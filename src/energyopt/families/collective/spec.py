"""Collective file (``kind: collective``): communication schedules for collectives.

A cluster of nodes, each with GPUs on one NVSwitch (every GPU one NVLink port to
the switch) and one NIC per GPU to a network switch shared by all nodes; every
link has a latency, a bandwidth per direction and a health factor (the share of
its bandwidth it delivers now). A trace of collectives (all-reduce, all-gather,
reduce-scatter, broadcast, all-to-all), each of a message size and a count, runs
over the ranks. A plan picks for every collective a schedule (algorithm,
protocol, chunks, channels, rank order) and the SM clock the GPUs hold while it
runs. Units are in the field names; docs/formulations/collective.md states the
model.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from energyopt.spec.base import Spec

Op = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"]
OPS: tuple[Op, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
Algorithm = Literal[
    "ring",
    "tree",
    "halving_doubling",
    "hierarchical",
    "hierarchical_direct",
    "direct",
    "synthesized",
]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
CANDIDATE_ALGORITHMS: tuple[Algorithm, ...] = tuple(a for a in ALGORITHMS if a != "synthesized")
"""The algorithms selection builds schedules of (a synthesized one comes from the MILP)."""
Protocol = Literal["ll", "ll128", "simple"]
PROTOCOLS: tuple[Protocol, ...] = ("ll", "ll128", "simple")

MAX_GPUS_PER_NODE = 16
MAX_NODES = 64
MAX_GPUS = 64
"""Most GPUs in one topology: a ring of n ranks over 32 channels has 64 n (n - 1)
flows, and selection times every candidate."""
MAX_BYTES = 1 << 36
"""Largest message, bytes (64 GiB)."""
MAX_CHUNKS = 64
MAX_CHANNELS = 64
MAX_BANDWIDTH_GBS = 10_000.0
MIN_BANDWIDTH_GBS = 1e-3
"""Least bandwidth of a link or channel, GB/s (1 MB/s): with the least health factor
and the greatest straggler slowdown, the largest message still takes under 1e16 us
per run, so every time and energy a plan states stays within the numbers a file may
hold (a link at 1e-300 GB/s gave 5e302 us, which the plan file refuses)."""
MIN_HEALTH_FACTOR = 1e-3
"""Least delivered share of a link's bandwidth (a link below it is as good as down)."""
MAX_LATENCY_US = 10_000.0


class Link(Spec):
    """One kind of link: latency and bandwidth per direction."""

    latency_us: float = Field(ge=0, le=MAX_LATENCY_US, description="one-way latency, us")
    bandwidth_gbs: float = Field(
        ge=MIN_BANDWIDTH_GBS,
        le=MAX_BANDWIDTH_GBS,
        description="bandwidth per direction, GB/s (1e9 B/s)",
    )


class Node(Spec):
    """One node: its name and how many GPUs it holds."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    gpus: int = Field(ge=1, le=MAX_GPUS_PER_NODE)


class Topology(Spec):
    """Nodes of GPUs on an NVSwitch, one NIC per GPU to a shared network switch.

    GPU ``i`` of node ``a`` is ``a/i``. Omitted link and rate fields take the
    calibrated values of the GPU type (docs/formulations/collective.md, section 2).
    """

    gpu: str = Field(default="H100-SXM5-80GB", description="catalog GPU type of every GPU")
    nodes: tuple[Node, ...] = Field(min_length=1, max_length=MAX_NODES)
    nvlink: Link | None = Field(default=None, description="GPU <-> NVSwitch port")
    network: Link | None = Field(default=None, description="GPU's NIC <-> network switch")
    channel_gbs: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_GBS,
        le=MAX_BANDWIDTH_GBS,
        description="what one channel (one SM) moves at the max SM clock, GB/s",
    )
    reduce_gbs: float | None = Field(
        default=None,
        ge=MIN_BANDWIDTH_GBS,
        le=MAX_BANDWIDTH_GBS,
        description="what one channel reduces at the max SM clock, GB/s",
    )
    launch_us: float | None = Field(
        default=None, ge=0, le=MAX_LATENCY_US, description="fixed start-up cost per collective, us"
    )

    @model_validator(mode="after")
    def _check(self) -> Topology:
        total = sum(n.gpus for n in self.nodes)
        if total > MAX_GPUS:
            raise ValueError(f"nodes: {total} GPUs, at most {MAX_GPUS}")
        seen: set[str] = set()
        for n in self.nodes:
            if n.name in seen:
                raise ValueError(f"nodes: {n.name!r} is named twice")
            seen.add(n.name)
        return self


class LinkHealth(Spec):
    """The state of one GPU's NVLink port or NIC: the share of bandwidth it delivers."""

    gpu: str = Field(min_length=1, description="GPU name, node/index")
    link: Literal["nvlink", "nic"]
    factor: float = Field(
        ge=MIN_HEALTH_FACTOR, le=1, description="delivered share of the nominal bandwidth"
    )


class Straggler(Spec):
    """A slow GPU: its per-step overhead, copy and reduction take ``slowdown`` times longer."""

    gpu: str = Field(min_length=1)
    slowdown: float = Field(ge=1, le=1000)


class Health(Spec):
    """The cluster's state now: degraded links and slow GPUs."""

    links: tuple[LinkHealth, ...] = ()
    stragglers: tuple[Straggler, ...] = ()


class Collective(Spec):
    """One collective of the trace: op, message size and how often it runs."""

    name: str = Field(default="", description="label (default: op and size)")
    op: Op
    bytes: int = Field(
        ge=1,
        le=MAX_BYTES,
        description="message size, bytes: the buffer every rank reduces (all-reduce), "
        "the output (all-gather), the input (reduce-scatter, all-to-all), the root's "
        "buffer (broadcast), as nccl-tests counts it",
    )
    count: int = Field(default=1, ge=1, le=10_000_000, description="times it runs per trace")
    root: int = Field(default=0, ge=0, description="root rank (broadcast)")


class CollectiveObjective(Spec):
    """Least time, or least energy within ``max_time_ratio`` of each collective's fastest."""

    kind: Literal["time", "energy"] = "time"
    max_time_ratio: float = Field(
        default=1.1,
        ge=1,
        le=100,
        description="energy: a collective may take this times its fastest schedule's time",
    )


class CollectiveFile(Spec):
    """A collective problem: topology, health, ranks, trace and objective."""

    kind: Literal["collective"]
    name: str = Field(min_length=1)
    description: str = ""
    topology: Topology
    ranks: tuple[str, ...] | None = Field(
        default=None, description="GPUs that take part, in rank order; default every GPU"
    )
    health: Health = Health()
    collectives: tuple[Collective, ...] = Field(min_length=1, max_length=1_000)
    objective: CollectiveObjective = CollectiveObjective()
    clocks_mhz: tuple[int, ...] | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="SM clocks the energy objective may choose from, MHz; default a spread",
    )

    @model_validator(mode="after")
    def _check(self) -> CollectiveFile:
        if self.ranks is not None and len(set(self.ranks)) != len(self.ranks):
            raise ValueError("ranks: a GPU is named twice")
        return self


class Transfer(Spec):
    """One send of a synthesized schedule: piece ``piece`` from rank ``src`` to ``dst``
    in step ``step``; ``reduce``: the receiver adds it into its copy."""

    step: int = Field(ge=0)
    src: int = Field(ge=0)
    dst: int = Field(ge=0)
    piece: int = Field(ge=0)
    reduce: bool = False


class Choice(Spec):
    """The schedule of one collective of the trace and what it costs."""

    collective: str = Field(min_length=1, description="the collective's name")
    algorithm: Algorithm
    protocol: Protocol = "simple"
    chunks: int = Field(default=1, ge=1, le=MAX_CHUNKS, description="pipelined chunks")
    channels: int = Field(default=1, ge=1, le=MAX_CHANNELS, description="parallel channels")
    clock_mhz: int = Field(ge=1, le=10_000, description="SM clock while it runs, MHz")
    order: tuple[int, ...] | None = Field(
        default=None, description="rank order the algorithm runs on; default 0..n-1"
    )
    leaves: int = Field(
        default=0, ge=0, description="tree: the order's last ranks, kept leaves of both trees"
    )
    rail_weights: tuple[float, ...] | None = Field(
        default=None,
        description="hierarchical all-reduce or broadcast, hierarchical_direct: share of "
        "the message (all-reduce, broadcast) or of every rank's piece (all-gather, "
        "reduce-scatter) each rail (local GPU index) carries; default equal",
    )
    pieces: int | None = Field(
        default=None, ge=1, description="synthesized: equal pieces of the message"
    )
    piece_owner: tuple[int, ...] | None = Field(
        default=None, description="synthesized: rank whose input each piece is"
    )
    piece_dest: tuple[int, ...] | None = Field(
        default=None, description="synthesized: rank each piece must reach (all-to-all)"
    )
    transfers: tuple[Transfer, ...] | None = Field(
        default=None, description="synthesized: every send"
    )
    time_us: float | None = Field(default=None, description="time of one run, us")
    energy_j: float | None = Field(default=None, description="energy of one run, J")


class CollectivePlan(Spec):
    """A schedule per collective, with the figures of the solve that made it."""

    UNCHECKED_NUMBERS = frozenset({"objective", "bound", "gap"})

    name: str = ""
    choices: tuple[Choice, ...] = Field(min_length=1)
    objective: float | None = Field(default=None, description="trace total, us or J")
    objective_unit: str = "us"
    bound: float | None = Field(default=None, description="lower bound on the optimum")
    gap: float | None = None
    status: str = ""
    solver: str = ""
