"""Independent checker of collective plans.

It expands every choice into its sends, executes them symbolically (which rank
holds which contributions of which piece after every step) and checks that every
rank ends with what the collective promises; then it recomputes the time and
energy with its own arithmetic: routes from the topology's rule, link loads per
step, the alpha-beta-gamma terms and the dataflow of steps of collective.md
(section 2). It shares no code
with the solvers' cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
from numpy.typing import NDArray

from energyopt.families.collective.formulations.constants import (
    PROTOCOL_EFFICIENCY,
    PROTOCOL_STEP_US,
)
from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.formulations.program import Program, Scatter
from energyopt.families.collective.formulations.schedules import NotApplicable, program_of
from energyopt.families.collective.spec import Choice, Collective, CollectivePlan, Protocol
from energyopt.perf.power import HBM_PJ_PER_BIT, clock_power_factor, gpu_on_power_w
from energyopt.verify.violation import Violation

SHARE_TOL = 1e-9
_SHAPE = (
    "algorithm",
    "chunks",
    "channels",
    "order",
    "leaves",
    "rail_weights",
    "pieces",
    "piece_owner",
    "piece_dest",
    "transfers",
)
"""The fields of a choice that fix its program (not its protocol, clock or figures)."""


@dataclass
class CollectiveEvaluation:
    """What a plan does: violations, per-collective time and energy, totals."""

    violations: list[Violation] = field(default_factory=list)
    time_us: dict[str, float] = field(default_factory=dict)
    energy_j: dict[str, float] = field(default_factory=dict)
    total_time_us: float = 0.0
    total_energy_j: float = 0.0


def execute(prog: Program, c: Collective) -> list[str]:
    """Run ``prog`` symbolically; every way the end state misses the collective's
    semantics, or a send is impossible, as a sentence (empty: correct)."""
    n = prog.n
    full = (1 << n) - 1
    pieces = range(prog.n_pieces)
    problems: list[str] = []
    owner = [int(x) for x in prog.owner]
    dest = [int(x) for x in prog.dest]
    frac = [float(x) for x in prog.frac]
    # initial holdings: hold[r][piece] = bitmask of ranks whose data it holds
    hold: list[dict[int, int]] = [{} for _ in range(n)]
    if c.op in ("all_reduce", "reduce_scatter"):
        for r in range(n):
            for q in pieces:
                hold[r][q] = 1 << r
    elif c.op == "broadcast":
        for q in pieces:
            hold[c.root][q] = 1 << c.root
    else:
        for q in pieces:
            if not 0 <= owner[q] < n:
                return [f"piece {q} has no owner rank"]
            hold[owner[q]][q] = 1 << owner[q]
    copy_only = c.op in ("all_gather", "broadcast", "all_to_all")
    for s, step in enumerate(prog.steps):
        start = [dict(h) for h in hold]
        for row in step.tolist():
            a, b, q, red = (int(x) for x in row)
            if not (0 <= a < n and 0 <= b < n and 0 <= q < prog.n_pieces) or a == b:
                problems.append(f"step {s}: send {a}->{b} of piece {q} is not between two ranks")
                continue
            have = start[a].get(q)
            if have is None:
                problems.append(f"step {s}: rank {a} sends piece {q}, which it does not hold")
                continue
            if red:
                if copy_only:
                    problems.append(f"step {s}: {c.op} has nothing to reduce (piece {q})")
                    continue
                mine = hold[b].get(q)
                if mine is None:
                    problems.append(f"step {s}: rank {b} reduces piece {q} it does not hold")
                    continue
                if mine & have:
                    problems.append(
                        f"step {s}: rank {b} adds contributions to piece {q} twice "
                        f"(ranks {_ranks(mine & have)})"
                    )
                    continue
                hold[b][q] = mine | have
            else:
                hold[b][q] = have
        if len(problems) > 5:
            break
    if problems:
        return problems[:5]
    need: list[tuple[int, int, int]] = []  # (rank, piece, mask)
    if c.op == "all_reduce":
        need = [(r, q, full) for r in range(n) for q in pieces]
    elif c.op == "reduce_scatter":
        need = [(dest[q], q, full) for q in pieces]
    elif c.op == "broadcast":
        need = [(r, q, 1 << c.root) for r in range(n) for q in pieces]
    elif c.op == "all_gather":
        need = [(r, q, 1 << owner[q]) for r in range(n) for q in pieces]
    else:
        need = [(dest[q], q, 1 << owner[q]) for q in pieces]
    for r, q, mask in need:
        if not 0 <= r < n:
            problems.append(f"piece {q} has no destination rank")
        elif hold[r].get(q) != mask:
            got = hold[r].get(q)
            problems.append(
                f"rank {r} ends with piece {q} "
                + ("missing" if got is None else f"holding ranks {_ranks(got)}, not {_ranks(mask)}")
            )
        if len(problems) > 5:
            break
    problems.extend(_coverage(c, n, frac, owner, dest))
    return problems[:6]


def _coverage(
    c: Collective, n: int, frac: list[float], owner: list[int], dest: list[int]
) -> list[str]:
    """The pieces tile the message: each rank's block has its share of the bytes."""
    out: list[str] = []
    if any(not f > 0 for f in frac):
        return ["a piece has no positive share of the message"]
    if c.op == "all_to_all":
        blocks: dict[tuple[int, int], float] = {}
        for q, f in enumerate(frac):
            blocks[(owner[q], dest[q])] = blocks.get((owner[q], dest[q]), 0.0) + f
        for s in range(n):
            for d in range(n):
                if abs(blocks.get((s, d), 0.0) - 1.0 / n) > SHARE_TOL:
                    out.append(f"the pieces from rank {s} to rank {d} are not 1/{n} of its input")
                    return out
        return out
    if abs(sum(frac) - 1.0) > SHARE_TOL:
        out.append(f"the pieces cover {sum(frac):.6f} of the message, not all of it")
    keyed = owner if c.op == "all_gather" else dest if c.op == "reduce_scatter" else None
    if keyed is not None:
        for r in range(n):
            got = sum(f for q, f in enumerate(frac) if keyed[q] == r)
            if abs(got - 1.0 / n) > SHARE_TOL:
                out.append(f"rank {r}'s block is {got:.6f} of the message, not 1/{n}")
                break
    return out


def _ranks(mask: int) -> str:
    ranks = [str(i) for i in range(mask.bit_length()) if mask >> i & 1]
    return ",".join(ranks) if len(ranks) <= 8 else f"{len(ranks)} ranks"


def _route(p: CollectiveProblem, a: int, b: int) -> list[tuple[str, str]]:
    """Directed links from rank a to rank b by the topology's rule."""
    ga, gb = p.ranks[a], p.ranks[b]
    na, nb = ga.split("/")[0], gb.split("/")[0]
    if na == nb:
        return [(ga, f"{na}/nvs"), (f"{nb}/nvs", gb)]
    return [(ga, f"{ga}:nic"), (f"{ga}:nic", "net"), ("net", f"{gb}:nic"), (f"{gb}:nic", gb)]


def _link(p: CollectiveProblem, u: str, v: str) -> tuple[float, float]:
    """(capacity GB/s, latency us) of directed link u -> v under the file's health."""
    r = p.rates
    h = p.spec.health
    if u.endswith("/nvs") or v.endswith("/nvs"):
        gpu = v if u.endswith("/nvs") else u
        f = next((x.factor for x in h.links if x.gpu == gpu and x.link == "nvlink"), 1.0)
        return r.nvlink_gbs * f, r.nvlink_us
    if u == "net" or v == "net":
        gpu = (v if u == "net" else u).removesuffix(":nic")
        f = next((x.factor for x in h.links if x.gpu == gpu and x.link == "nic"), 1.0)
        return r.network_gbs * f, r.network_us
    return r.network_gbs, 0.0


@dataclass(frozen=True)
class _Step:
    """The flows of one global step: ends and channel, bytes and reduced bytes as
    shares of the message, whether each reduces, its route's fair share of capacity
    (GB/s) and latency (us), and how many flows the receiver reduces in the step."""

    a: NDArray[np.int64]
    b: NDArray[np.int64]
    k: NDArray[np.int64]
    share: NDArray[np.float64]
    reduced: NDArray[np.float64]
    red: NDArray[np.bool_]
    link_gbs: NDArray[np.float64]
    lat_us: NDArray[np.float64]
    reducing_at_b: NDArray[np.float64]
    both: Scatter
    """How to take, per (rank, channel), the latest end over the step's flows at both ends."""
    into: Scatter
    """The same at the receivers."""


def _flows(p: CollectiveProblem, prog: Program, chunks: int) -> list[_Step]:
    """Per global step of the pipelined program, its flows (what does not depend on
    the message size, the protocol or the clock)."""
    chan = [int(x) for x in prog.channel_of()]
    frac = [float(x) for x in prog.frac]
    n_steps = len(prog.steps)
    rows_of = [s.tolist() for s in prog.steps]
    out: list[_Step] = []
    path: dict[tuple[int, int], list[tuple[str, str]]] = {}
    links: dict[tuple[str, str], tuple[float, float]] = {}

    def link(u: str, v: str) -> tuple[float, float]:
        if (u, v) not in links:
            links[(u, v)] = _link(p, u, v)
        return links[(u, v)]

    for g in range(n_steps + chunks - 1):
        # per flow: share, whether any of it is reduced, and the reduced share
        # (a flow may carry a reducing step of one chunk and a copying one of another)
        flows: dict[tuple[int, int, int], list[float]] = {}
        for s in range(max(0, g - chunks + 1), min(n_steps, g + 1)):
            for a, b, q, red in rows_of[s]:
                key = (int(a), int(b), chan[q])
                cur = flows.setdefault(key, [0.0, 0.0, 0.0])
                part = frac[q] / chunks
                cur[0] += part
                cur[1] = max(cur[1], float(red))
                cur[2] += part if red else 0.0
        if not flows:
            continue
        load: dict[tuple[str, str], int] = {}
        routes = {}
        for a, b, k in flows:
            if (a, b) not in path:
                path[(a, b)] = _route(p, a, b)
            routes[(a, b, k)] = path[(a, b)]
            for e in routes[(a, b, k)]:
                load[e] = load.get(e, 0) + 1
        reducing: dict[int, int] = {}
        for (_a, b, _k), (_, red, _) in flows.items():
            if red:
                reducing[b] = reducing.get(b, 0) + 1
        keys = list(flows)
        vals = [flows[key] for key in keys]
        a_ = np.array([key[0] for key in keys], dtype=np.int64)
        b_ = np.array([key[1] for key in keys], dtype=np.int64)
        k_ = np.array([key[2] for key in keys], dtype=np.int64)
        ra, rb = a_ + p.n * k_, b_ + p.n * k_
        out.append(
            _Step(
                a=a_,
                b=b_,
                k=k_,
                share=np.array([v[0] for v in vals]),
                reduced=np.array([v[2] for v in vals]),
                red=np.array([v[1] > 0 for v in vals], dtype=bool),
                link_gbs=np.array(
                    [min(link(u, v)[0] / load[(u, v)] for u, v in routes[key]) for key in keys]
                ),
                lat_us=np.array([sum(link(u, v)[1] for u, v in routes[key]) for key in keys]),
                reducing_at_b=np.array([float(reducing.get(key[1], 0)) for key in keys]),
                both=Scatter.of(np.concatenate((ra, rb))),
                into=Scatter.of(rb),
            )
        )
    return out


def choice_program(p: CollectiveProblem, c: Collective, ch: Choice) -> Program:
    """The program ``ch`` runs for ``c`` (NotApplicable where its algorithm has none)."""
    return program_of(
        c.op,
        ch.algorithm,
        p.n,
        p.node_of,
        p.local_of,
        c.root,
        ch.channels,
        ch.order,
        ch.leaves,
        ch,
        ch.rail_weights,
    )


@dataclass(frozen=True)
class StepTiming:
    """One global step of a run, as the checker times it (us; flows are per
    (sender, receiver, channel))."""

    begin_us: float
    """When the step's last flow begins (after the launch)."""
    wait_us: float
    """The longest a flow waits, once both its ends are free, for what was sent to
    its sender to land."""
    busy_us: NDArray[np.float64]
    """Per flow: how long it occupies both ends, its reduction included."""
    reduce_us: NDArray[np.float64]
    """Per flow: the part of ``busy_us`` spent reducing at the receiver."""
    lat_us: NDArray[np.float64]
    """Per flow: the route's latency until its data lands."""


def step_timeline(
    p: CollectiveProblem, c: Collective, ch: Choice, chunks: int
) -> tuple[float, list[StepTiming]]:
    """(time us, per-step timings) of one run of ``c`` as ``ch`` runs it, pipelined in
    ``chunks`` chunks instead of ``ch.chunks``: the checker's own arithmetic."""
    trace: list[StepTiming] = []
    steps = _flows(p, choice_program(p, c, ch), chunks)
    t, _ = _run(p, steps, ch.protocol, ch.clock_mhz, np.array([float(c.bytes)]), trace)
    return float(t[0]), trace


def run_time_us(
    p: CollectiveProblem, prog: Program, ch: Choice, c: Collective, clock: int
) -> tuple[float, float]:
    """(time us, bytes touched in HBM) of one run of ``prog`` as ``ch`` runs it at ``clock``."""
    t, touched = _run(p, _flows(p, prog, ch.chunks), ch.protocol, clock, np.array([c.bytes]))
    return float(t[0]), float(touched[0])


def _run(
    p: CollectiveProblem,
    steps: list[_Step],
    protocol: Protocol,
    clock: int,
    sizes: NDArray[np.float64],
    trace: list[StepTiming] | None = None,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(time us, bytes touched in HBM) of one run for each message size of ``sizes``
    (bytes), on flows from ``_flows``; each step's timing at the first size is
    appended to ``trace`` where one is given."""
    slow = {s.gpu: s.slowdown for s in p.spec.health.stragglers}
    sd = np.array([slow.get(g, 1.0) for g in p.ranks])
    ratio = clock / p.gpu.max_sm_clock_mhz
    m = np.asarray(sizes, dtype=np.float64)[None, :]
    n = p.n
    width = 1 + max((int(st.k.max()) for st in steps), default=0)
    touched = np.zeros(m.shape[1])
    # per (rank, channel): when it finished its last step's flows, and when
    # everything sent to it so far has landed
    free = np.zeros((n * width, m.shape[1]))
    got = np.zeros((n * width, m.shape[1]))
    last = np.zeros(m.shape[1])
    eff = PROTOCOL_EFFICIENCY[protocol]
    for st in steps:
        nbytes, reduced = st.share[:, None] * m, st.reduced[:, None] * m
        s_ab = np.maximum(sd[st.a], sd[st.b])
        rate = np.minimum(st.link_gbs, p.rates.channel_gbs * ratio / s_ab) * eff
        busy = (PROTOCOL_STEP_US[protocol] * s_ab)[:, None] + nbytes / rate[:, None] / 1e3
        mem = p.gpu.memory_bandwidth_gbps / 3.0 / np.maximum(st.reducing_at_b, 1.0)
        red_rate = np.minimum(p.rates.reduce_gbs * ratio, mem)
        red_us = np.where(
            st.red[:, None], reduced * sd[st.b][:, None] / red_rate[:, None] / 1e3, 0.0
        )
        busy = busy + red_us
        touched += (2.0 * nbytes + reduced).sum(axis=0)
        ra, rb = st.a + n * st.k, st.b + n * st.k
        ready = np.maximum(free[ra], free[rb])
        begin = np.maximum(ready, got[ra])
        end = begin + busy
        if trace is not None:
            trace.append(
                StepTiming(
                    float(begin[:, 0].max()),
                    float((begin - ready)[:, 0].max()),
                    busy[:, 0].copy(),
                    red_us[:, 0].copy(),
                    st.lat_us.copy(),
                )
            )
        land = end + st.lat_us[:, None]
        # a rank starts its next step once this one's flows are done at both ends
        st.both.apply(free, np.concatenate((end, end)))
        st.into.apply(got, land)
        last = np.maximum(last, land.max(axis=0))
    return p.rates.launch_us + last, touched


def _power_w(p: CollectiveProblem, channels: int, clock: int) -> float:
    g = p.gpu
    ratio = clock / g.max_sm_clock_mhz
    fac = float(
        clock_power_factor(
            np.asarray([ratio]),
            np.asarray([g.power.voltage_floor]),
            np.asarray([g.power.knee_fraction]),
        )[0]
    )
    dyn = max(g.tdp_w - g.idle_w - g.power.locked_clock_w, 0.0) * g.power.sm_fraction
    sm_share = min(1.0, channels / g.sm_count)
    return gpu_on_power_w(g, clock) + dyn * sm_share * g.power.memory_bound_sm_activity * fac


def evaluate_collective(p: CollectiveProblem, plan: CollectivePlan) -> CollectiveEvaluation:
    """Check ``plan`` against ``p`` and recompute its figures."""
    ev = CollectiveEvaluation()
    v = ev.violations
    by_name = {p.name_of(i): c for i, c in enumerate(p.collectives)}
    seen: set[str] = set()
    g = p.gpu
    # per program (op, root of a broadcast, the choice's shape): why it is refused,
    # or its flows; the semantics and the flows do not depend on size or clock
    programs: dict[tuple[object, ...], tuple[str, str] | list[_Step]] = {}
    valid: list[tuple[str, Choice, Collective, tuple[object, ...]]] = []
    for j, ch in enumerate(plan.choices):
        where = f"choices[{j}]({ch.collective})"
        c = by_name.get(ch.collective)
        if c is None:
            v.append(Violation("unknown", where, "no collective of that name in the problem"))
            continue
        if ch.collective in seen:
            v.append(Violation("duplicate", where, "the collective has two choices"))
            continue
        seen.add(ch.collective)
        if not g.min_sm_clock_mhz <= ch.clock_mhz <= g.max_sm_clock_mhz:
            v.append(Violation("clock", where, f"{ch.clock_mhz} MHz outside {g.name}'s clocks"))
            continue
        if p.spec.objective.kind == "energy" and ch.clock_mhz not in p.clocks_mhz:
            v.append(
                Violation("clock", where, f"{ch.clock_mhz} MHz is not one of the file's clocks")
            )
            continue
        if ch.leaves >= p.n:
            v.append(Violation("order", where, f"leaves {ch.leaves} of {p.n} ranks"))
            continue
        if ch.order is not None and sorted(ch.order) != list(range(p.n)):
            v.append(Violation("order", where, f"order is not a permutation of ranks 0..{p.n - 1}"))
            continue
        key = (c.op, c.root if c.op == "broadcast" else 0, *(getattr(ch, f) for f in _SHAPE))
        if key not in programs:
            try:
                prog = choice_program(p, c, ch)
            except NotApplicable as exc:
                programs[key] = ("algorithm", str(exc))
            else:
                wrong = execute(prog, c)
                programs[key] = (
                    ("semantics", "; ".join(wrong)) if wrong else _flows(p, prog, ch.chunks)
                )
        known = programs[key]
        if isinstance(known, tuple):
            v.append(Violation(known[0], where, known[1]))
            continue
        valid.append((where, ch, c, key))
    # figures: every size of one program, protocol and clock in one pass
    runs: dict[tuple[object, ...], list[float]] = {}
    for _, ch, c, key in valid:
        runs.setdefault((*key, ch.protocol, ch.clock_mhz), []).append(float(c.bytes))
        if p.spec.objective.kind == "energy":
            runs.setdefault((*key, ch.protocol, g.max_sm_clock_mhz), []).append(float(c.bytes))
    figures: dict[tuple[object, ...], tuple[float, float]] = {}
    for rk, sizes in runs.items():
        steps = programs[rk[:-2]]
        assert not isinstance(steps, tuple)
        distinct = sorted(set(sizes))
        protocol = cast(Protocol, rk[-2])
        times, moved = _run(p, steps, protocol, cast(int, rk[-1]), np.asarray(distinct))
        for i, b in enumerate(distinct):
            figures[(*rk, b)] = (float(times[i]), float(moved[i]))
    for where, ch, c, key in valid:
        t, touched = figures[(*key, ch.protocol, ch.clock_mhz, float(c.bytes))]
        if p.spec.objective.kind == "energy":
            fastest, _ = figures[(*key, ch.protocol, g.max_sm_clock_mhz, float(c.bytes))]
            if t > p.spec.objective.max_time_ratio * fastest * (1 + 1e-9):
                v.append(
                    Violation(
                        "time",
                        where,
                        f"{t:,.2f} us at {ch.clock_mhz} MHz is more than "
                        f"{p.spec.objective.max_time_ratio:g} x its {fastest:,.2f} us "
                        "at the max clock",
                    )
                )
        e = (
            p.n * _power_w(p, ch.channels, ch.clock_mhz) * t * 1e-6
            + touched * 8 * HBM_PJ_PER_BIT * 1e-12
        )
        ev.time_us[ch.collective] = t
        ev.energy_j[ch.collective] = e
        ev.total_time_us += c.count * t
        ev.total_energy_j += c.count * e
    for name in by_name:
        if name not in seen:
            v.append(Violation("missing", name, "the plan has no schedule for this collective"))
    return ev


def plan_cost(p: CollectiveProblem, plan: CollectivePlan) -> float:
    """The plan's objective: trace time (us) or energy (J)."""
    ev = evaluate_collective(p, plan)
    return ev.total_energy_j if p.spec.objective.kind == "energy" else ev.total_time_us
