"""The alpha-beta-gamma cost of a program on the topology, with link contention
(collective.md, section 2), and lower bounds on every schedule's time and energy.

Flows of one step share links. A flow from a to b occupies both ranks for the
protocol's step overhead (times the slower end's straggler factor) plus its bytes
over its rate: the least over the route's links of the link's capacity shared
equally by the step's flows on it, and one channel's copy rate at the clock,
times the protocol's efficiency; a reducing flow adds the bytes it reduces over
the reduction rate (one channel's at the clock, and the GPU's memory bandwidth / 3
shared by its reductions of the step: gamma). Its data lands the route's latency
after (alpha). Steps run as a dataflow (``dataflow_makespan``): a rank starts a
step when it has finished the last one and received its inputs, so latency
overlaps work as NCCL's pipelined steps do. A collective takes the launch cost
plus the time the last byte lands. Energy: every rank draws, for the whole time, its on-power at
the clock plus the dynamic power of the SMs its channels use, and the memory
system moves every byte sent, received and reduced.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from energyopt.families.collective.formulations.constants import (
    PROTOCOL_EFFICIENCY,
    PROTOCOL_STEP_US,
)
from energyopt.families.collective.formulations.model import (
    SWITCH,
    CollectiveProblem,
    FloatArray,
    IntArray,
)
from energyopt.families.collective.formulations.program import Program, Scatter, pipelined
from energyopt.families.collective.spec import Collective, Protocol
from energyopt.perf.power import (
    HBM_PJ_PER_BIT,
    clock_power_factor,
    dynamic_range_w,
    gpu_on_power_w,
)

HBM_TOUCHES_PER_REDUCED_BYTE = 3.0
"""A reduction reads the received and the local byte and writes the sum: the GPU's
reductions in one step share its memory bandwidth over 3."""
SMS_PER_CHANNEL = 1
"""One channel is one thread block on one SM (NCCL's channel model)."""


@dataclass(frozen=True)
class ClockChannels:
    """A schedule's SM clock and channel count, for the bound terms that hold only
    for schedules run at them (``energy_bound_j``)."""

    clock_mhz: int
    channels: int


@dataclass(frozen=True)
class Flows:
    """A pipelined program as flat arrays, ready for many protocol and clock pairs."""

    step: IntArray
    src: IntArray
    dst: IntArray
    reduce: IntArray
    chan: IntArray
    share: FloatArray
    """Share of the message bytes each flow carries."""
    reduce_share: FloatArray
    """The part of ``share`` the receiver reduces (the rest it copies)."""
    n_steps: int
    link_share: FloatArray
    """(F,): least over the flow's route of link capacity / flows on the link, GB/s."""
    route_us: FloatArray
    """(F,): latency of the flow's route, us."""
    n: int
    """Ranks."""
    edges: IntArray
    """(F, L): the edges of each flow's route (-1 padding)."""
    on_edge: FloatArray
    """(F, L): flows of the same step on each of those edges."""

    def with_capacities(self, edge_gbs: FloatArray) -> Flows:
        """The same flows on the same topology under other link capacities (another
        health state): only ``link_share`` changes; the step plan is kept."""
        share = _link_share(self.edges, self.on_edge, edge_gbs)
        out = replace(self, link_share=share)
        if "plan" in self.__dict__:
            out.__dict__["plan"] = self.__dict__["plan"]
        return out

    @cached_property
    def plan(self) -> list[tuple[int, int, Scatter, Scatter]]:
        """Per non-empty step: its flows' range and how to scatter their ends into the
        per (rank, channel) state of the dataflow (both ends; the receiver), for
        ``dataflow_makespans`` (planned once, used for every size, protocol, clock)."""
        bounds = np.searchsorted(self.step, np.arange(self.n_steps + 1))
        out = []
        n = self.n
        for g in range(self.n_steps):
            lo, hi = int(bounds[g]), int(bounds[g + 1])
            if lo == hi:
                continue
            ch = self.chan[lo:hi] * n
            a, b = self.src[lo:hi] + ch, self.dst[lo:hi] + ch
            out.append((lo, hi, Scatter.of(np.concatenate((a, b))), Scatter.of(b)))
        return out


def route_table(p: CollectiveProblem) -> tuple[IntArray, IntArray]:
    """Padded (n, n, L) edge indices of every route (-1 padding) and their lengths."""
    return p.route_table


def flows_of(p: CollectiveProblem, prog: Program, chunks: int) -> Flows:
    """The flows of ``prog`` cut into ``chunks`` pipelined chunks."""
    table, _ = route_table(p)
    per_step = pipelined(prog, chunks)
    steps, src, dst, red, chan, share, reduced = [], [], [], [], [], [], []
    for g, (flows, sh, rsh) in enumerate(per_step):
        reduced.append(rsh)
        steps.append(np.full(len(sh), g, dtype=np.int64))
        src.append(flows[:, 0])
        dst.append(flows[:, 1])
        red.append(flows[:, 2])
        chan.append(flows[:, 3])
        share.append(sh)
    step = np.concatenate(steps) if steps else np.zeros(0, dtype=np.int64)
    s = np.concatenate(src) if src else np.zeros(0, dtype=np.int64)
    d = np.concatenate(dst) if dst else np.zeros(0, dtype=np.int64)
    edges = table[s, d]  # (F, L)
    n_e = len(p.edge_gbs)
    valid = edges >= 0
    key = step[:, None] * n_e + np.where(valid, edges, 0)
    load = np.zeros(len(per_step) * n_e)
    np.add.at(load, key[valid], 1.0)
    on_edge = np.maximum(load[key], 1.0)
    us = np.where(valid, p.edge_us[np.where(valid, edges, 0)], 0.0).sum(axis=1)
    return Flows(
        step=step,
        src=s,
        dst=d,
        reduce=np.concatenate(red) if red else np.zeros(0, dtype=np.int64),
        chan=np.concatenate(chan) if chan else np.zeros(0, dtype=np.int64),
        share=np.concatenate(share) if share else np.zeros(0),
        reduce_share=np.concatenate(reduced) if reduced else np.zeros(0),
        n_steps=len(per_step),
        link_share=_link_share(edges, on_edge, p.edge_gbs),
        route_us=us,
        n=p.n,
        edges=edges,
        on_edge=on_edge,
    )


def _link_share(edges: IntArray, on_edge: FloatArray, edge_gbs: FloatArray) -> FloatArray:
    """(F,): least over each flow's route of link capacity / flows on the link, GB/s."""
    if len(edges) == 0:
        return np.zeros(0)
    valid = edges >= 0
    cap = np.where(valid, edge_gbs[np.where(valid, edges, 0)] / on_edge, np.inf)
    out: FloatArray = cap.min(axis=1)
    return out


def time_us(
    p: CollectiveProblem, fl: Flows, message_bytes: int, protocol: Protocol, clock_mhz: int
) -> float:
    """Time of one run of the collective, us."""
    return float(times_us(p, fl, np.asarray([float(message_bytes)]), protocol, clock_mhz)[0])


MAX_BATCH_CELLS = 1 << 22
"""Most (flow, message size) pairs ``times_us`` holds at once (32 MiB per array)."""


def times_us(
    p: CollectiveProblem, fl: Flows, message_bytes: FloatArray, protocol: Protocol, clock_mhz: int
) -> FloatArray:
    """Time of one run of the collective for each message size of ``message_bytes``
    (bytes, shape (K,)), us (``times_us_at`` of one protocol and clock)."""
    out: FloatArray = times_us_at(p, fl, message_bytes, [(protocol, clock_mhz)])[0]
    return out


def times_us_at(
    p: CollectiveProblem,
    fl: Flows,
    message_bytes: FloatArray,
    settings: list[tuple[Protocol, int]],
) -> FloatArray:
    """(len(settings), K): time of one run for each (protocol, clock MHz) of
    ``settings`` and each message size of ``message_bytes`` (bytes), us. The flows
    are the same for all of them, so they run through one dataflow side by side
    (in batches of ``MAX_BATCH_CELLS``), each with the arithmetic of a single one."""
    m = np.asarray(message_bytes, dtype=np.float64)
    slow = np.maximum(p.slowdown[fl.src], p.slowdown[fl.dst])
    red = fl.reduce > 0
    reducing = np.zeros(fl.n_steps * p.n)
    np.add.at(reducing, (fl.step * p.n + fl.dst)[red], 1.0)
    k_dst = np.maximum(reducing[fl.step * p.n + fl.dst], 1.0)
    hbm = p.gpu.memory_bandwidth_gbps / HBM_TOUCHES_PER_REDUCED_BYTE / k_dst
    per: list[tuple[FloatArray, FloatArray, FloatArray]] = []
    for protocol, clock_mhz in settings:
        ratio = clock_mhz / p.gpu.max_sm_clock_mhz
        rate = np.minimum(fl.link_share, p.rates.channel_gbs * ratio / slow)
        rate = rate * PROTOCOL_EFFICIENCY[protocol]
        per.append(
            (PROTOCOL_STEP_US[protocol] * slow, rate, np.minimum(p.rates.reduce_gbs * ratio, hbm))
        )
    cols = [(i, j) for i in range(len(settings)) for j in range(len(m))]
    out = np.empty((len(settings), len(m)))
    step = max(1, MAX_BATCH_CELLS // max(1, len(fl.step)))
    for lo in range(0, len(cols), step):
        part = cols[lo : lo + step]
        si = np.asarray([c[0] for c in part])
        mm = m[np.asarray([c[1] for c in part])]
        base = np.stack([x[0] for x in per], axis=1)[:, si]
        rate = np.stack([x[1] for x in per], axis=1)[:, si]
        red_rate = np.stack([x[2] for x in per], axis=1)[:, si]
        nbytes = fl.share[:, None] * mm[None, :]
        occ = base + nbytes / rate / 1e3
        reduced = fl.reduce_share[:, None] * mm[None, :]
        gamma = reduced * p.slowdown[fl.dst][:, None] / red_rate / 1e3
        occ = occ + np.where(red[:, None], gamma, 0.0)
        out[si, [c[1] for c in part]] = p.rates.launch_us + dataflow_makespans(p.n, fl, occ)
    return out


def dataflow_makespan(n: int, fl: Flows, occ: FloatArray) -> float:
    """When the last byte lands, us (``dataflow_makespans`` of one message size)."""
    return float(dataflow_makespans(n, fl, occ[:, None])[0])


def dataflow_makespans(n: int, fl: Flows, occ: FloatArray) -> FloatArray:
    """When the last byte lands, us, for each column of ``occ`` (flows x columns: a
    message size, protocol and clock each). Every channel is its own dataflow: a
    flow of step s starts once both its ranks have finished their step s - 1 flows
    of the channel (``free``) and its sender has received what earlier steps of the
    channel sent it (``arrived``); it occupies both ends for ``occ`` and lands its
    route latency later (latency overlaps the next step's work). Channels share
    links only through the contention of flows of the same step."""
    assert n == fl.n
    k = occ.shape[1]
    width = int(fl.chan.max()) + 1 if len(fl.chan) else 1
    free = np.zeros((n * width, k))
    arrived = np.zeros((n * width, k))
    last = np.zeros(k)
    for lo, hi, both, dst in fl.plan:
        ch = fl.chan[lo:hi] * n
        a, b = fl.src[lo:hi] + ch, fl.dst[lo:hi] + ch
        start = np.maximum(np.maximum(free[a], free[b]), arrived[a])
        end = start + occ[lo:hi]
        land = end + fl.route_us[lo:hi, None]
        both.apply(free, np.concatenate((end, end)))
        dst.apply(arrived, land)
        last = np.maximum(last, land.max(axis=0))
    return last


def rank_power_w(p: CollectiveProblem, channels: int, clock_mhz: int) -> float:
    """Power of one rank while the collective runs, W: on-power at the clock plus the
    dynamic power of its channels' SMs (memory-bound activity)."""
    g = p.gpu
    ratio = np.asarray([clock_mhz / g.max_sm_clock_mhz])
    dyn = float(
        dynamic_range_w(
            np.asarray(g.tdp_w), np.asarray(g.idle_w), np.asarray(g.power.locked_clock_w)
        )
    )
    share = min(1.0, channels * SMS_PER_CHANNEL / g.sm_count)
    factor = float(
        clock_power_factor(
            ratio, np.asarray([g.power.voltage_floor]), np.asarray([g.power.knee_fraction])
        )[0]
    )
    active = dyn * g.power.sm_fraction * share * g.power.memory_bound_sm_activity * factor
    return gpu_on_power_w(g, clock_mhz) + active


def memory_energy_j(fl: Flows, message_bytes: int) -> float:
    """Energy of HBM traffic: each byte read at the sender and written at the
    receiver, a reduced byte also read there, J."""
    return float(memory_energies_j(fl, np.asarray([float(message_bytes)]))[0])


def memory_energies_j(fl: Flows, message_bytes: FloatArray) -> FloatArray:
    """``memory_energy_j`` for each message size of ``message_bytes`` (bytes), J."""
    touched = float((2.0 * fl.share + fl.reduce_share).sum())
    return touched * np.asarray(message_bytes, dtype=np.float64) * 8.0 * HBM_PJ_PER_BIT * 1e-12


def energy_j(
    p: CollectiveProblem, fl: Flows, message_bytes: int, channels: int, clock_mhz: int, t_us: float
) -> float:
    """Energy of one run, J, all ranks together."""
    return p.n * rank_power_w(p, channels, clock_mhz) * t_us * 1e-6 + memory_energy_j(
        fl, message_bytes
    )


def energies_j(
    p: CollectiveProblem,
    fl: Flows,
    message_bytes: FloatArray,
    channels: int,
    clock_mhz: int,
    t_us: FloatArray,
) -> FloatArray:
    """``energy_j`` for each message size of ``message_bytes`` and its time ``t_us``, J."""
    return p.n * rank_power_w(p, channels, clock_mhz) * np.asarray(t_us) * 1e-6 + memory_energies_j(
        fl, message_bytes
    )


def _needs(c: Collective, n: int) -> tuple[FloatArray, FloatArray]:
    """Bytes every rank must receive and send at least, by the collective's semantics."""
    m = float(c.bytes)
    into = np.zeros(n)
    out = np.zeros(n)
    if c.op == "all_gather":
        into[:] = m * (n - 1) / n
    elif c.op == "reduce_scatter":
        out[:] = m * (n - 1) / n
    elif c.op == "all_reduce":
        # each element's sum needs r's contribution, and r holds its sum at the
        # end: something of every element comes in, and something goes out (r's
        # contribution, or a sum r formed that another rank still needs)
        into[:] = m
        out[:] = m
    elif c.op == "broadcast":
        into[:] = m
        into[c.root] = 0.0
        out[c.root] = m
    else:
        into[:] = m * (n - 1) / n
        out[:] = m * (n - 1) / n
    return into, out


def _total_needs(c: Collective, n: int) -> float:
    """Bytes all ranks together must send at least (and so receive), by the
    collective's semantics. An all-reduce needs 2(n - 1) one-way messages per
    element: the least number of one-way calls that tell n parties everything
    (directed gossip), which a sum, that cannot be taken apart, needs too."""
    m = float(c.bytes)
    if c.op == "all_reduce":
        return 2.0 * (n - 1) * m
    into, out = _needs(c, n)
    return float(max(into.sum(), out.sum()))


def _cut_needs(c: Collective, n: int, k: int, root_inside: bool) -> tuple[float, float]:
    """(bytes in, bytes out) that must cross into and out of a set of ``k`` of the
    ``n`` ranks (0 < k < n), by the collective's semantics (blocks of m/n)."""
    m = float(c.bytes)
    if c.op == "all_gather":
        return m * (n - k) / n, m * k / n
    if c.op == "reduce_scatter":
        return m * k / n, m * (n - k) / n
    if c.op == "all_reduce":
        return m, m
    if c.op == "broadcast":
        return (0.0, m) if root_inside else (m, 0.0)
    return m * k * (n - k) / n, m * k * (n - k) / n


def _port_capacities(p: CollectiveProblem) -> tuple[FloatArray, ...]:
    """(into, out of, into over the network, out over the network) each rank, GB/s
    (``CollectiveProblem.port_capacities``, computed once per problem)."""
    return p.port_capacities


def time_bound_us(p: CollectiveProblem, c: Collective, at: ClockChannels | None = None) -> float:
    """A lower bound on the time of every schedule of ``c`` (any algorithm, protocol,
    chunking, channels and clock; with ``at``, every schedule run at that clock over
    at most that many channels), us: launch plus the least over the protocols of
    ``protocol_bound_us`` (every flow of a schedule runs the schedule's one protocol,
    so the bound of that protocol holds for it).

    ``protocol_bound_us``'s bandwidth terms rest on the channels of a schedule
    meeting the same links in the same steps (flows of different steps do not
    contend in the cost model, so channels out of step could each take a link's
    full capacity). Every schedule but one keeps them in step: synthesized,
    tree, halving-doubling, direct, hierarchical_direct and hierarchical
    broadcasts run the same program on every channel, and rings and hierarchical
    rings, rotated per channel, still give every rank one flow in and one out per
    step and channel (so the per-rank and per-node pools hold). A ring broadcast
    over several nodes is the one: each channel's rotated ring reaches a rank in
    another step, so for a broadcast there the bound is the lesser of that and
    ``ring_broadcast_bound_us``."""
    bound = p.rates.launch_us + min(protocol_bound_us(p, c, pr, at) for pr in PROTOCOL_STEP_US)
    if c.op == "broadcast" and p.n_nodes > 1 and p.n > p.n_nodes:
        bound = min(bound, ring_broadcast_bound_us(p, c))
    return bound


def ring_broadcast_bound_us(p: CollectiveProblem, c: Collective) -> float:
    """A lower bound on every ring broadcast's time, us: launch plus, at the best
    protocol, the largest of

    - the chain: the ring's n - 1 hops run one after another (a rank forwards only
      what has landed), each at least the protocol's step overhead times the slower
      end's factor (the slowest rank ends at least one hop) plus its route's latency;
      the ring enters every node, so at least N - 1 hops cross between nodes;
    - the root: it sends in the first step of every channel (its place is the same
      in all), so its out-ports carry the message at the protocol's efficiency;
    - every other node: each channel enters it once with the whole channel's share.
      The ring's hop number there differs between channels only by where the root
      sits in its rotated run of ranks, which takes at most g (the root's node's
      rank count) values; channels of one hop number entering through one NIC share
      it in the same steps, so the node takes in at most g times its NICs' capacity.
      The busiest such channel (share m/H, N channels on its NIC and hop number v)
      runs its K crossing steps one after another, each at least alpha plus its
      chunk over the NIC shared by the N; before the first, its first chunk takes
      v - 1 hops to the crossing rank, and after the last, its last chunk lands a
      cross-node route later and takes n - 1 - v more hops, each hop at least alpha
      and a route; the slowest rank receives in one of these hops or crossings (or
      is the root and sends in the first), which adds alpha (s_max - 1)."""
    n, nodes = p.n, p.n_nodes
    m = float(c.bytes)
    node_of = np.asarray(p.node_of)
    cross = min(p.least_route_us(node_of == k) for k in range(nodes))
    _, cap_out, nic_in, _ = _port_capacities(p)
    g_root = int((node_of == node_of[c.root]).sum())
    routes = (nodes - 1) * cross + (n - nodes) * p.least_route_us()
    best = np.inf
    for protocol, alpha in PROTOCOL_STEP_US.items():
        eff = PROTOCOL_EFFICIENCY[protocol]
        chain = alpha * (n - 1 + float(np.max(p.slowdown)) - 1.0) + routes
        root = (
            alpha * float(p.slowdown[c.root])
            + m / (float(cap_out[c.root]) * eff) / 1e3
            + p.least_route_us()
        )
        term = max(chain, root)
        for k in range(nodes):
            inside = node_of == k
            if not inside[c.root]:
                take = m / (g_root * float(nic_in[inside].sum()) * eff) / 1e3
                # the busiest channel's crossings into the node, after the hops
                # that bring its first chunk to the crossing and before the hops
                # that take its last chunk on
                hops = alpha * (n - 2 + float(np.max(p.slowdown))) + (n - 2) * p.least_route_us()
                term = max(term, hops + take + p.least_route_us(inside))
        best = min(best, term)
    general = p.rates.launch_us + float(best)
    if n <= RING_ORDERS_MAX_RANKS:
        return max(general, ring_orders_bound_us(p, c))
    return general


RING_ORDERS_MAX_RANKS = 5
"""Most ranks for which ``ring_orders_bound_us`` goes through every rank order (n!
orders x every channel count)."""


def ring_orders_bound_us(p: CollectiveProblem, c: Collective) -> float:
    """A lower bound on every ring broadcast's time, us, by going through every rank
    order, channel count H (1..MAX_CHANNELS), chunk count K (1..MAX_CHUNKS) and
    protocol: for each, the busiest channel's pipeline.

    In a ring broadcast over order o, channel c runs the ring of o with every node's
    run of ranks rotated by c (``rotate_in_nodes``): its hop i (i = 0..n - 2, from the
    root on) carries each of the K chunks, m / (H K) bytes, in global steps i..i + K - 1,
    for every channel alike. So in those steps an edge e on hop i's route carries at
    least the flows of the cnt_i(e) channels whose hop i uses it, and a flow of hop
    i of channel c occupies its ends at least w_ci = alpha s_ci + b r_ci, with
    s_ci the slower end's factor, b = m / (H K) and r_ci = max(max_e cnt_i(e) / (eta C_e),
    s_ci / (eta c_ch)) (the fair share and the channel's copy rate at the max clock;
    a lower clock only lowers it). A hop's K flows share both its ranks on the
    channel, so they run one after another; chunk 0 reaches hop i's sender after
    the hops before it, each at least its w plus its route's latency, and chunk K - 1
    leaves hop i's receiver through the hops after it in the same way. So
    T >= launch + sum_j (w_cj + lambda_cj) + (K - 1) max_i w_ci for every channel c.
    The least over (o, H, K, protocol) of the largest over c bounds every ring."""
    from energyopt.families.collective.formulations.schedules import rotate_in_nodes
    from energyopt.families.collective.spec import MAX_CHANNELS, MAX_CHUNKS

    n = p.n
    m = float(c.bytes)
    slow = np.maximum(1.0, np.asarray(p.slowdown, dtype=np.float64))
    table, _ = route_table(p)
    chunks = np.arange(1, MAX_CHUNKS + 1, dtype=np.float64)
    channels = np.arange(1, MAX_CHANNELS + 1, dtype=np.float64)
    n_edges = len(p.edge_gbs)
    best = np.inf
    for order in itertools.permutations(range(n)):
        # every channel is one of `period` rotations
        runs: list[int] = []
        for i, r in enumerate(order):
            if i and p.node_of[r] == p.node_of[order[i - 1]]:
                runs[-1] += 1
            else:
                runs.append(1)
        period = int(np.lcm.reduce(np.asarray(runs, dtype=np.int64)))
        hops = []  # per rotation: (n - 1, 2) sender and receiver of every hop
        for k in range(period):
            o = rotate_in_nodes(list(order), p.node_of, k)
            at = o.index(c.root)
            o = o[at:] + o[:at]
            hops.append(np.asarray([(o[i], o[i + 1]) for i in range(n - 1)], dtype=np.int64))
        ring = np.stack(hops)  # (period, n - 1, 2)
        edges = table[ring[..., 0], ring[..., 1]]  # (period, n - 1, L)
        valid = edges >= 0
        at_edge = np.where(valid, edges, 0)
        lam = p.route_us[ring[..., 0], ring[..., 1]]  # (period, n - 1)
        s_hop = np.maximum(slow[ring[..., 0]], slow[ring[..., 1]])
        # uses[k, i, e]: hop i of rotation k runs over edge e
        uses = np.zeros((period, n - 1, n_edges))
        k_i = np.nonzero(valid)
        uses[k_i[0], k_i[1], edges[valid]] = 1.0
        # count[H - 1, k]: channels of rotation k among H; cnt: channels whose hop i
        # uses e, (H, n - 1, E)
        count = np.asarray(
            [
                [len(range(k, h, period)) for k in range(period)]
                for h in range(1, len(channels) + 1)
            ],
            dtype=np.float64,
        )
        cnt = np.einsum("hk,kie->hie", count, uses)
        hop_index = np.arange(n - 1)[None, :, None]
        share = cnt[:, hop_index, at_edge] / p.edge_gbs[at_edge]  # (H, period, n - 1, L)
        per_edge = np.where(valid[None], share, 0.0).max(axis=3)  # (H, period, n - 1)
        live = count > 0  # (H, period)
        b = m / (channels[:, None] * chunks[None, :])  # (H, K)
        for protocol, alpha in PROTOCOL_STEP_US.items():
            eff = PROTOCOL_EFFICIENCY[protocol]
            per_byte = np.maximum(per_edge, s_hop[None] / p.rates.channel_gbs) / eff / 1e3
            # w[H, k, i, K]: least occupancy of a flow of hop i of rotation k, us
            w = alpha * s_hop[None, :, :, None] + per_byte[..., None] * b[:, None, None, :]
            total = (w + lam[None, :, :, None]).sum(axis=2) + (chunks - 1.0) * w.max(axis=2)
            worst = np.where(live[..., None], total, -np.inf).max(axis=1)  # (H, K)
            best = min(best, float(worst.min()))
    return p.rates.launch_us + float(best)


def protocol_bound_us(
    p: CollectiveProblem, c: Collective, protocol: Protocol, at: ClockChannels | None = None
) -> float:
    """A lower bound on the time after launch of every schedule of ``c`` that runs
    ``protocol`` (with ``at``: at that clock over at most that many channels), us.
    Every flow's occupancy is at least the protocol's step overhead times the
    slower end's straggler factor plus its bytes over its rate, and its
    rate is at most its links' capacity shared by the step's flows on them times the
    protocol's efficiency (a lower clock only lowers it). The terms, each valid alone:

    - busiest rank: for rank r its overhead (times its factor) plus the bytes it must
      receive or send through its ports at full capacity times the efficiency; pooled
      over ranks (all bytes through all ports) as well; and the route latency after.
      One step can be all a rank takes part in, even in an all-reduce: every rank
      may send its input to every other rank in one step, each reducing all it
      receives (the one-step exchange), so the overhead counts once.
    - per node (several nodes): the bytes that must cross into or out of the node
      through its NICs; the last lands a cross-node route's latency later. Where
      every one of the node's g ranks needs each byte that crosses in, a byte whose
      first crossing lands later than an overhead and a route inside the node
      before the end must cross to every rank apart (g times); pooling both over
      the NICs adds (g - 1)/g of that overhead and route, or the g - 1 more
      crossings of every byte, whichever is less. The same holds, reversed,
      where each byte that crosses out must hold all g ranks' contributions.
    - all nodes (all-reduce, several nodes): the nodes are N parties that must all
      learn every element's sum, and a byte crossing between nodes is a one-way
      call. N parties need at least 2(N - 1) one-way calls to all learn everything
      (directed gossip), so at least 2(N - 1)m bytes cross, pooled over every NIC.
      And a crossing whose sender holds another node's contribution to an element
      lands at least two overheads and two cross-node latencies after the start (its
      sender's input crossed before); a schedule faster than that has none, so each
      node receives every element from each of the N - 1 others apart: N(N - 1)m
      bytes cross. The lesser of the two holds.
    - all-reduce one-step ranks (``one_step_ranks_us``): a rank that takes part in
      one step only must get every other such rank's contribution directly in it;
      the others pay two overheads.
    - all-reduce chain: rank r's sum holds another rank's contribution, so a flow
      lands at r (its overhead at least r's factor, a route into r); on several
      nodes another node's contribution crossed first: either that crossing lands
      at r, or it lands in r's node and a later flow brings it to r.
    - reductions (all-reduce, reduce-scatter): n - 1 of every element's bytes must
      be reduced; a reducing flow into r carries its bytes over a link and adds them
      at the GPU's memory bandwidth / 3 shared by r's reducing flows of the step, slowed
      by r's factor; ``reduce_rates_gbs`` is the most a rank reduces per us in this
      way, and pooled over the ranks that bounds the busiest reducer."""
    n = p.n
    alpha = PROTOCOL_STEP_US[protocol]
    eff = PROTOCOL_EFFICIENCY[protocol]
    into, out = _needs(c, n)
    cap_in, cap_out, nic_in, nic_out = _port_capacities(p)
    least_route = p.least_route_us()
    slow = np.maximum(1.0, p.slowdown)
    per_rank = np.maximum(into / cap_in, out / cap_out) / eff / 1e3
    total = _total_needs(c, n)
    pooled = max(total / float(cap_in.sum()), total / float(cap_out.sum())) / eff / 1e3
    busiest = max(float(np.max(alpha * slow + per_rank)), alpha + pooled) + least_route
    node_of = np.asarray(p.node_of)
    for node in set(p.node_of) if p.n_nodes > 1 else ():
        # The bytes that must leave or enter this node cross the network: the last
        # of them lands a cross-node route's latency after its rank sent it.
        inside = node_of == node
        g = int(inside.sum())
        need_in, need_out = _cut_needs(c, n, g, bool(inside[c.root]))
        least_cross = p.least_route_us(inside)
        # every rank of the node needs what crosses in (all-gather, all-reduce,
        # broadcast), or what crosses out holds every rank's part (reduce-scatter,
        # all-reduce): the spread after, or the gather before, the crossing
        spread = 0.0
        if g > 1:
            pair = inside[:, None] & inside[None, :] & ~np.eye(n, dtype=bool)
            spread = (g - 1) / g * (alpha + float(p.route_us[pair].min()))
        tail_in = spread if c.op in ("all_gather", "all_reduce", "broadcast") else 0.0
        tail_out = spread if c.op in ("reduce_scatter", "all_reduce") else 0.0
        for need, nics, tail in (
            (need_in, float(nic_in[inside].sum()), tail_in),
            (need_out, float(nic_out[inside].sum()), tail_out),
        ):
            if need > 0:
                # a late byte crosses g times: the tail is at most g - 1 more crossings
                more = (g - 1) * need / nics / eff / 1e3
                busiest = max(
                    busiest, alpha + need / nics / eff / 1e3 + min(tail, more) + least_cross
                )
                if c.op == "all_reduce" and g > 1 and n - g > 1:
                    # an element that crosses this cut once must cross gathered
                    # (after a flow landed at its sender) and be passed on after it
                    # lands (collective.md, section 4, "Once or twice")
                    window = 2.0 * alpha + least_route + float(p.route_us[pair].min())
                    once = need / nics / eff / 1e3
                    busiest = max(busiest, alpha + once + min(window / 2.0, once) + least_cross)
    if c.op == "all_reduce":
        busiest = max(busiest, one_step_ranks_us(p, c, protocol, at) + least_route)
        routes = p.route_us + np.diag(np.full(n, np.inf))
        # a flow brings another rank's contribution to r
        into_r = routes.min(axis=0)
        busiest = max(busiest, float(np.max(alpha * slow + into_r)))
        busiest = max(busiest, relayed_or_direct_us(p, c, protocol))
        if p.n_nodes > 1:
            crossing = node_of[:, None] != node_of[None, :]
            cross = min(p.least_route_us(node_of == k) for k in range(p.n_nodes))
            into_cross = np.where(crossing, routes, np.inf).min(axis=0)
            into_inside = np.where(~crossing, routes, np.inf).min(axis=0)
            # another node's contribution reaches r: its crossing lands at r, or in
            # r's node and a later flow brings it to r
            relayed = alpha + cross + alpha * slow + into_inside
            reach = np.minimum(alpha * slow + into_cross, relayed)
            busiest = max(busiest, float(np.max(reach)))
            # directed gossip among the nodes: 2(N - 1) m bytes cross, over every NIC
            crossing_bytes = 2.0 * (p.n_nodes - 1) * float(c.bytes)
            nics = min(float(nic_in.sum()), float(nic_out.sum()))
            busiest = max(busiest, alpha + crossing_bytes / (nics * eff) / 1e3 + cross)
            # a crossing whose sender holds another node's contribution lands no
            # sooner than two overheads and two crossings; without one, every node
            # hears from each of the N - 1 others: N(N - 1) m bytes cross
            all_pairs = p.n_nodes * (p.n_nodes - 1) * float(c.bytes)
            one_crossing = alpha + all_pairs / (nics * eff) / 1e3 + cross
            busiest = max(busiest, min(2.0 * (alpha + cross), one_crossing))
    if c.op == "broadcast" and n > 1:
        busiest = max(busiest, relay_broadcast_us(p, c, protocol))
    if c.op in ("all_reduce", "reduce_scatter"):
        reduced = (n - 1) * float(c.bytes)
        rates = reduce_rates_gbs(p, eff)
        busiest = max(busiest, alpha + reduced / float(rates.sum()) / 1e3 + least_route)
    return busiest


def relayed_or_direct_us(p: CollectiveProblem, c: Collective, protocol: Protocol) -> float:
    """A lower bound on an all-reduce's time after launch at ``protocol``, us, by how
    each rank gets the sum of each element: relayed or direct.

    A flow that starts before tau = alpha + the least route carries its sender's own
    input only (nothing has landed yet: every flow takes at least alpha and its
    route). For rank r and an element, either r receives the element in a set that
    holds a rank other than its sender (relayed: that flow starts after tau), or
    every set r receives of it is its sender's own input (direct): r takes all
    n - 1 other inputs and reduces each (a copy would drop r's own input, which
    only a relayed set could bring back). With a share x of the elements direct to
    r, r receives (n - 1) x m bytes it reduces, (1 + (n - 2) x) m bytes in all, and,
    when x < 1, (1 - x) m bytes in steps that start after tau. So r is busy until
    at least the largest of alpha s_r + (n - 1) x m / rho_r,
    alpha s_r + (1 + (n - 2) x) m / (eta C_r) and tau + alpha s_r + (1 - x) m / (eta C_r),
    and its last flow lands a route later. The least over x in [0, 1] (the first two
    rise with x, the third falls: a convex function, least at an end or where the
    third crosses one of the others; at x = 1 the third does not apply), for the
    worst rank."""
    n = p.n
    alpha = PROTOCOL_STEP_US[protocol]
    eff = PROTOCOL_EFFICIENCY[protocol]
    m = float(c.bytes)
    cap_in = _port_capacities(p)[0]
    least = p.least_route_us()
    routes = p.route_us + np.diag(np.full(n, np.inf))
    into = routes.min(axis=0)
    slow = np.maximum(1.0, np.asarray(p.slowdown, dtype=np.float64))
    rho = reduce_rates_gbs(p, eff) * 1e3  # bytes per us
    rate = eff * cap_in * 1e3
    # each term a + b x
    a1, b1 = alpha * slow, (n - 1) * m / rho
    a2, b2 = alpha * slow + m / rate, (n - 2) * m / rate
    a3, b3 = alpha + least + alpha * slow + m / rate, -m / rate
    worst = 0.0
    for r in range(n):
        # busy until at least the least over x of the largest of the three terms,
        # with ``more`` overheads added to the first two (``more`` = 1: r takes
        # part in two steps or more)
        def least_top(more: float, r: int = r) -> float:
            lines = ((a1[r] + more, b1[r]), (a2[r] + more, b2[r]), (a3[r], b3[r]))
            points = [0.0]
            for a, b in lines[:2]:
                if b - b3[r] > 0:
                    points.append(min(1.0, max(0.0, (a3[r] - a) / (b - b3[r]))))
            return float(min(max(a + b * x for a, b in lines) for x in points))

        if p.n_nodes == 1:
            # one step: with x > 0 every other rank sends r its inputs of the direct
            # elements in that step, so a relayed flow (starting after tau) also
            # carries them; on r's one port among n - 1 senders it takes at least
            # (1 + (n - 2) x) m at r's rate, which is least at x = 0. Two steps or
            # more: a second overhead on the first two terms
            busy = min(float(a3[r]), least_top(float(alpha * slow[r])))
        else:
            busy = least_top(0.0)
        # relayed: also the two flows one after another, the second landing at r
        relayed = max(busy + least, alpha + least + a1[r] + into[r])
        direct = max(a1[r] + b1[r], a2[r] + b2[r]) + least
        worst = max(worst, min(relayed, direct))
    return float(worst)


def relay_broadcast_us(p: CollectiveProblem, c: Collective, protocol: Protocol) -> float:
    """A lower bound on a broadcast's time after launch at ``protocol``, us, by how
    much each rank takes from the root directly.

    A rank other than the root holds nothing at the start, so a flow it sends starts
    once a flow into it has landed: no sooner than tau = alpha + the least route.
    Say rank r takes D_r bytes from the root and the rest, at least m - D_r, from
    other ranks. The root's steps carry sum D_r through its out-ports, so
    T >= alpha s_root + sum D_r / (eta C_out,root) + the least route; and where
    D_r < m, r's steps that take the rest start after tau and carry it through its
    in-ports, so T >= tau + alpha s_r + (m - D_r) / (eta C_in,r) + the least route
    into r (channels in step: ``time_bound_us``). The least T for which some D
    meets both is found by bisection: the D_r each rank needs falls with T, what the
    root can send rises."""
    n = p.n
    alpha = PROTOCOL_STEP_US[protocol]
    eff = PROTOCOL_EFFICIENCY[protocol]
    cap_in, cap_out, _, _ = _port_capacities(p)
    m = float(c.bytes)
    root = c.root
    least = p.least_route_us()
    routes = p.route_us + np.diag(np.full(n, np.inf))
    into = routes.min(axis=0)
    slow = np.maximum(1.0, np.asarray(p.slowdown, dtype=np.float64))
    others = np.arange(n) != root
    start = (alpha + least + alpha * slow + into)[others]  # us
    rate_in = eff * cap_in[others] * 1e3  # bytes per us
    rate_root = eff * float(cap_out[root]) * 1e3
    root_start = alpha * float(slow[root]) + least

    def feasible(t: float) -> bool:
        need = np.clip(m - rate_in * (t - start), 0.0, m)
        return float(need.sum()) <= rate_root * max(0.0, t - root_start)

    lo = root_start
    hi = root_start + (n - 1) * m / rate_root
    if feasible(lo):
        return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return lo


def one_step_ranks_us(
    p: CollectiveProblem, c: Collective, protocol: Protocol, at: ClockChannels | None = None
) -> float:
    """A lower bound on when an all-reduce's busiest rank ends its last flow, us (the
    route latency after it and launch not included), by how many ranks take part
    in one step only (with ``at``: for schedules at that clock over at most that
    many channels, ``_copy_and_reduce``).

    Let S be the ranks that take part in one step only (of a channel; every
    schedule runs its channels in step, ``time_bound_us``). A rank sends its
    contribution only in its steps, and receives only in its steps what its senders
    held at the start of the step, so the contribution of q in S reaches r in S only
    if q's step is not after r's; both ways, all of S share one step, and each of
    them receives the contribution of each other one directly in it: (|S| - 1) m
    bytes into each. Every other rank takes part in two steps or more. A rank's
    steps run one after another, each at least the overhead plus its bytes in over
    its ports' capacity at the efficiency, so rank r is busy for at least
    alpha steps_r + I_r / (eta C_r); the busiest at least the average of that
    weighted by C_r / sum C: alpha (2 - the k largest weights) + sum I / (eta sum C)
    with k = |S|, and sum I at least the gossip's 2(n - 1) m and k max(k - 1, 1) m +
    (n - k) m. A rank of S alone takes alpha + (k - 1) m / (eta C_r).

    A rank r of S also reduces all it receives, at least min(k, n - 1) m bytes in
    its one step: no sender holds r's contribution at the start of that step, so a
    copy into r would leave r without it for good. Those are the inputs of the
    k - 1 others of S (each only its own, all of it) and, where n > k, the sums of
    the others' contributions, which only they can send (at least m). Every flow of
    the step into r reduces, so ``reduce_rates_gbs`` rho_r bounds the step:
    r's last flow ends no sooner than alpha s_r + min(k, n - 1) m / rho_r and lands
    the least route into r later; some rank of S is at least the k-th least of that
    over the ranks. The least of the largest of these over k = 0..n holds whatever
    S is."""
    n = p.n
    alpha = PROTOCOL_STEP_US[protocol]
    eff = PROTOCOL_EFFICIENCY[protocol]
    cap_in, _, nic_in, _ = _port_capacities(p)
    total = float(cap_in.sum())
    heaviest = np.concatenate(([0.0], np.cumsum(np.sort(cap_in)[::-1] / total)))
    m = float(c.bytes)
    mix = _copy_and_reduce(p, eff, cap_in - nic_in, nic_in, at)
    slow = np.maximum(1.0, np.asarray(p.slowdown, dtype=np.float64))
    rho = reduce_rates_gbs(p, eff) * 1e3  # bytes per us
    # the least route into each rank beyond the least of all (the caller adds that)
    later = (p.route_us + np.diag(np.full(n, np.inf))).min(axis=0) - p.least_route_us()
    best = np.inf
    for k in range(n + 1):
        into = max(2.0 * (n - 1), k * max(k - 1, 1) + (n - k)) * m
        term = alpha * (2.0 - float(heaviest[k])) + into / (eff * total) / 1e3
        if k >= 2:
            term = max(term, alpha + (k - 1) * m / (eff * float(cap_in.max())) / 1e3)
        if k >= 1:
            # a rank of S receives and reduces min(k, n - 1) m bytes in its one step
            ends = alpha * slow + min(k, n - 1) * m / rho + later
            term = max(term, float(np.sort(ends)[k - 1]))
        term = max(term, mix(alpha, k, into, (n - 1) * m))
        best = min(best, term)
    return float(best)


COPY_REDUCE_GRID = np.linspace(0.0, 1.0, 41)
"""The multipliers lambda at which ``_copy_and_reduce`` weighs its two per-step
inequalities (each one gives a valid bound; the largest is taken)."""


def _copy_and_reduce(
    p: CollectiveProblem,
    eff: float,
    nvlink_in: FloatArray,
    nic_in: FloatArray,
    at: ClockChannels | None = None,
) -> Callable[[float, int, float, float], float]:
    """The copy-and-reduce term of ``one_step_ranks_us``: a function of (the
    protocol's overhead alpha, us; k, the ranks that take part in one step only;
    Z, the bytes all ranks must receive; X, the bytes they must reduce) giving a
    lower bound on when the busiest rank ends its last flow, us (collective.md, §4).

    Per step s of rank r and its NVLink in-port e (capacity c_e at the efficiency;
    k_e flows of the step on it, k_re of them reducing into r, k_r reducing into r
    in all, u = k_re / k_e; Z_s bytes in, X_s of them reduced; the channels run
    in step, so every channel has the same number of each): every flow occupies
    r at least alpha s_r + b k_e / c_e + s_r beta k_r / H (H: memory bandwidth / 3),
    so the average over all of them gives t_s >= alpha s_r + Z_s / c_e + s_r u X_s / H
    and over the reducing ones t_s >= alpha s_r + X_s / (u c_e) + s_r X_s / H. For
    lambda in [0, 1] their mix, minimised over u in (0, 1], is linear in (X_s, Z_s):
    t_s >= alpha s_r + (1 - lambda) Z_s / c_e + a_r(lambda) X_s, so it sums over the
    rank's steps. A step without an NVLink in-flow still costs alpha s_r. Weighted
    by c_e / sum c over the ranks (the k one-step ranks weigh at most the k largest
    weights), with X_nv and Z_nv the bytes over NVLink in-ports:
    T' >= alpha (2 - W_k) + ((1 - lambda) Z_nv + A X_nv) / sum c, A = min_r c_r a_r.
    The rest crosses NIC in-ports, which land at most T' times their capacity:
    Z_nv >= Z - T' C_nic and X_nv >= X - T' C_nic, solved for T'.

    With ``at`` (clock f, at most H channels): a reducing flow also adds its bytes
    no faster than one channel's reduction rate at the clock, g = c_red f / f_max,
    so its reduction takes at least s_r beta max(k_r / H_mem, 1 / g); and at most
    K_r = (ranks of r's node - 1) H flows of a step share r's NVLink in-port (one
    per sender and channel). The first average then takes
    s_r X_s max(u / H_mem, 1 / (K_r g)), the second s_r X_s max(1 / H_mem,
    1 / (u K_r g)): with H' = min(H_mem, K_r g) both are the terms above with H'
    for H_mem where u >= u_r = H' / (K_r g), and fall with u below it, so the least
    over u is taken over [u_r, 1] only: few reducing flows reduce slowly at a low
    clock."""
    h_mem = p.gpu.memory_bandwidth_gbps / HBM_TOUCHES_PER_REDUCED_BYTE
    lam = COPY_REDUCE_GRID[:, None]
    c = eff * np.asarray(nvlink_in, dtype=np.float64)[None, :]
    s = np.maximum(1.0, np.asarray(p.slowdown, dtype=np.float64))[None, :]
    h = np.full((1, p.n), h_mem)
    u_least = np.zeros((1, p.n))
    if at is not None:
        node_of = np.asarray(p.node_of)
        pairs = (node_of[:, None] == node_of[None, :]).sum(axis=1) - 1.0
        flows_gbs = pairs * at.channels * p.rates.reduce_gbs * at.clock_mhz / p.gpu.max_sm_clock_mhz
        used = pairs > 0
        h[0, used] = np.minimum(h_mem, flows_gbs[used])
        u_least[0, used] = h[0, used] / flows_gbs[used]
    # min over u in [u_least, 1] of a u + b / u (convex; least at sqrt(b / a) clipped)
    a_u = (1.0 - lam) * s / h
    b_u = lam / c
    with np.errstate(divide="ignore", invalid="ignore"):
        u = np.where(a_u > 0, np.sqrt(b_u / np.where(a_u > 0, a_u, 1.0)), 1.0)
    u = np.clip(u, np.maximum(u_least, 1e-300), 1.0)
    phi = a_u * u + b_u / u
    big_a = (c * (lam * s / h + phi)).min(axis=1)  # (L,), dimensionless
    c_nv = float(c.sum())
    c_nic = eff * float(np.asarray(nic_in).sum())
    weights = np.concatenate(([0.0], np.cumsum(np.sort(c[0])[::-1] / c_nv)))
    one_minus = 1.0 - COPY_REDUCE_GRID
    denominator = c_nv + (one_minus + big_a) * c_nic

    def term(alpha: float, k: int, z: float, x: float) -> float:
        steps = alpha * (2.0 - float(weights[k])) * c_nv * 1e3
        values = (steps + one_minus * z + big_a * x) / denominator / 1e3
        return float(values.max())

    return term


def reduce_rates_gbs(p: CollectiveProblem, eff: float) -> FloatArray:
    """(n,): the most bytes per ns each rank can receive and reduce together, GB/s.

    A reducing flow f into rank r of a step carries b bytes over an in-port e of
    capacity C_e shared by k_e >= k_re flows of the step (k_re of them reducing into r
    through e) at efficiency ``eff``, and reduces them at most at H / k_r (H: the
    GPU's memory bandwidth / 3, shared by r's k_r reducing flows of the step) slowed
    by r's factor s: its occupancy is at least b (k_re / (eff C_e) + s k_r / H). The
    step lasts at least as long as each of them, so its reduced bytes are at most its
    time times sum_e x_e eff C_e H / (x_e H + s eff C_e) with x_e = k_re / k_r. Each term
    grows with x_e, so x_e = 1 for every port bounds it, and each term is at most
    x_e H / s, so the sum is at most H / s too; the lesser of the two is returned."""
    h = p.gpu.memory_bandwidth_gbps / HBM_TOUCHES_PER_REDUCED_BYTE
    g = p.graph
    out = np.zeros(p.n)
    for r, name in enumerate(p.ranks):
        s = max(1.0, float(p.slowdown[r]))
        ports = []
        for u, _, d in g.in_edges(name, data=True):
            hop = min(d["gbs"], g[SWITCH][u]["gbs"]) if u.endswith(":nic") else d["gbs"]
            ports.append(eff * hop)
        combined = sum(cap * h / (h + s * cap) for cap in ports)
        out[r] = min(combined, h / s)
    return out


def channel_capped(p: CollectiveProblem, clock_mhz: int, channels: int) -> CollectiveProblem:
    """``p`` with every link's capacity lowered to what the flows of one step of a
    schedule over at most ``channels`` channels at ``clock_mhz`` can take through it:
    the rank pairs whose route uses the link, times ``channels``, times one
    channel's copy rate at the clock, GB/s.

    A step holds at most one flow per (sender, receiver, channel), so at most
    pairs_e x H flows share link e, and each runs at most at the channel rate
    c f / f_max (times the efficiency; a straggler only lowers it). A flow's rate
    is then at most both C_e / k_e and c f / f_max <= pairs_e H c f / f_max / k_e,
    so at most min(C_e, pairs_e H c f / f_max) / k_e: every bound term, which
    rests on a flow's rate being at most its links' capacity over their flows,
    holds for such schedules with the lowered capacities (collective.md, section 4)."""
    table, _ = route_table(p)
    used = table[table >= 0]
    pairs = np.bincount(used, minlength=len(p.edge_gbs)).astype(np.float64)
    per_pair = p.rates.channel_gbs * clock_mhz / p.gpu.max_sm_clock_mhz * channels
    gbs = np.where(pairs > 0, np.minimum(p.edge_gbs, pairs * per_pair), p.edge_gbs)
    graph = p.graph.copy()
    for _, _, d in graph.edges(data=True):
        d["gbs"] = float(gbs[d["index"]])
    return replace(p, graph=graph, edge_gbs=gbs)


def energy_bound_j(p: CollectiveProblem, c: Collective) -> float:
    """A lower bound on every schedule's energy, J: all ranks at their power for the
    schedule's clock f and channels H for the least time of a schedule that runs
    them, least over (f, H), plus the memory traffic of the least bytes sent (read
    at the sender, written at the receiver) and reduced (a sum of n inputs takes
    n - 1 reductions of a received byte).

    The time is the larger of ``time_bound_us`` (any clock and channels) and that
    bound on ``channel_capped`` links (H channels at f), for an all-reduce with the
    clock's reduction rate and the H channels' flows in its copy-and-reduce term
    (``ClockChannels``). Power rises with H, and above the H at which no link is
    capped (H*(f)) the capped bound is the plain one, so for other collectives
    H = 1..H*(f) covers every schedule at f; an all-reduce goes on to the most
    channels a plan may state. An H whose power times the plain bound is already
    above the best found so far cannot be the least (nor can any larger H)."""
    from energyopt.families.collective.spec import MAX_CHANNELS

    base = time_bound_us(p, c)
    table, _ = route_table(p)
    pairs = np.bincount(table[table >= 0], minlength=len(p.edge_gbs))
    used = pairs > 0
    per_clock = c.op == "all_reduce"
    best = np.inf
    for f in p.clocks_mhz:
        per_pair = p.rates.channel_gbs * f / p.gpu.max_sm_clock_mhz
        # the fewest channels at which no link is capped
        enough = (
            int(np.ceil(np.max(p.edge_gbs[used] / (pairs[used] * per_pair)))) if used.any() else 1
        )
        last = MAX_CHANNELS if per_clock else max(1, enough)
        for h in range(1, last + 1):
            watts = p.n * rank_power_w(p, h, f) * 1e-6
            if watts * base >= best:
                break
            if per_clock:
                links = p if h >= enough else channel_capped(p, f, h)
                t = max(base, time_bound_us(links, c, ClockChannels(f, h)))
            else:
                t = base if h >= enough else max(base, time_bound_us(channel_capped(p, f, h), c))
            best = min(best, watts * t)
    reduced = (p.n - 1) * float(c.bytes) if c.op in ("all_reduce", "reduce_scatter") else 0.0
    touches = 2.0 * _total_needs(c, p.n) + reduced
    memory = touches * 8.0 * HBM_PJ_PER_BIT * 1e-12
    return float(best) + memory
