"""Collective schedules: selection among the candidate schedules on the cost model,
NCCL's own choice, a fixed ring, and the bound every result carries.

Selection evaluates every candidate (algorithm x channels x chunks x rank order,
then protocol x clock on the same flows) of every collective and keeps the best
by the objective. Collectives of one op (and root, for a broadcast) share their
candidates' flows, so every size of such a group is scored in one pass. Under a
time limit every collective first gets a cheap schedule (direct, one channel),
then the groups with the most to gain (count x (time - bound)) are searched in
full until the limit; the log says which were not.
The bound is the sum of each collective's lower bound
(``costmodel.time_bound_us`` / ``energy_bound_j``), valid for every schedule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from energyopt.families.collective.formulations.costmodel import (
    Flows,
    energies_j,
    energy_bound_j,
    energy_j,
    flows_of,
    time_bound_us,
    time_us,
    times_us_at,
)
from energyopt.families.collective.formulations.model import CollectiveProblem, FloatArray
from energyopt.families.collective.formulations.nccl import nccl_channels, nccl_choice
from energyopt.families.collective.formulations.schedules import (
    NotApplicable,
    applicable,
    program_of,
)
from energyopt.families.collective.spec import (
    CANDIDATE_ALGORITHMS,
    PROTOCOLS,
    Algorithm,
    Choice,
    Collective,
    CollectivePlan,
    Op,
    Protocol,
)
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import FEASIBLE, Result, Termination, status_at
from energyopt.spec.base import MAX_MAGNITUDE
from energyopt.spec.errors import SpecError

CHANNELS = (1, 2, 4, 8, 16, 32)
CHUNKS = (1, 2, 3, 4, 6, 8, 12, 16)
PIPELINED: tuple[Algorithm, ...] = ("tree", "hierarchical_direct")
"""Algorithms whose chunks pipeline (a broadcast pipelines in every algorithm)."""
FORMULATION = "collective cost model (alpha-beta-gamma, link contention)"


@dataclass(frozen=True)
class Structure:
    """A candidate's structure (what its flows depend on)."""

    algorithm: Algorithm
    channels: int
    chunks: int
    order: tuple[int, ...] | None
    leaves: int
    weights: tuple[float, ...] | None = None
    """Hierarchical: each rail's share of the message (None: equal)."""


@dataclass(frozen=True)
class Scored:
    """A candidate with its protocol, clock and figures."""

    choice: Choice
    time_us: float
    energy_j: float


def structures(p: CollectiveProblem, c: Collective) -> Iterator[Structure]:
    """Every candidate structure of ``c``."""
    sizes = [list(p.node_of).count(k) for k in range(p.n_nodes)]
    slow = [r for r in range(p.n) if p.slowdown[r] > 1.0]
    orders: list[tuple[tuple[int, ...] | None, int]] = [(None, 0)]
    if slow and len(slow) < p.n:  # a tree keeps at most n - 1 ranks leaves
        rest = [r for r in range(p.n) if r not in slow]
        orders.append((tuple(rest + slow), len(slow)))
    weighted = rail_weights(p)
    for alg in CANDIDATE_ALGORITHMS:
        if not applicable(alg, c.op, p.n, sizes):
            continue
        chunk_set = CHUNKS if (alg in PIPELINED or c.op == "broadcast") else (1,)
        for ch in CHANNELS:
            for k in chunk_set:
                for order, leaves in orders if alg == "tree" else [(None, 0)]:
                    yield Structure(alg, ch, k, order, leaves)
                if weighted and (
                    (alg == "hierarchical" and c.op in ("all_reduce", "broadcast"))
                    or alg == "hierarchical_direct"
                ):
                    yield Structure(alg, ch, k, None, 0, weighted)


def rail_weights(p: CollectiveProblem) -> tuple[float, ...] | None:
    """Shares of the message for the rails of a hierarchical schedule, in proportion
    to each rail's slowest member (NIC factor over straggler slowdown); None when
    all rails are equal or the ranks are not in equal nodes."""
    if p.n_nodes < 2 or not p.uniform_nodes():
        return None
    g = p.n // p.n_nodes
    nic = {lh.gpu: lh.factor for lh in p.spec.health.links if lh.link == "nic"}
    strength = [1.0] * g
    for r, name in enumerate(p.ranks):
        s = nic.get(name, 1.0) / float(p.slowdown[r])
        strength[p.local_of[r]] = min(strength[p.local_of[r]], s)
    if max(strength) - min(strength) < 1e-12:
        return None
    total = sum(strength)
    return tuple(x / total for x in strength)


def root_key(op: Op, root: int) -> int:
    """The root as far as a schedule depends on it (only a broadcast's does)."""
    return root if op == "broadcast" else 0


@dataclass
class Winners:
    """The best schedule found so far for each message size of a group: its
    structure, protocol and clock, time (us) and energy (J) of one run."""

    time_us: FloatArray
    energy_j: FloatArray
    which: list[tuple[Structure, Protocol, int, Choice | None] | None]

    @staticmethod
    def empty(k: int) -> Winners:
        return Winners(np.full(k, np.inf), np.full(k, np.inf), [None] * k)

    def offer(
        self,
        energy_first: bool,
        s: Structure,
        protocol: Protocol,
        clock: int,
        t: FloatArray,
        e: FloatArray,
        choice: Choice | None = None,
    ) -> None:
        """Keep, size by size, whichever is strictly better by the objective's key
        ((time, energy), or (energy, time) for the energy objective)."""
        a, b = (e, t) if energy_first else (t, e)
        a0, b0 = (self.energy_j, self.time_us) if energy_first else (self.time_us, self.energy_j)
        better = (a < a0) | ((a == a0) & (b < b0))
        for i in np.flatnonzero(better):
            self.which[int(i)] = (s, protocol, clock, choice)
        self.time_us = np.where(better, t, self.time_us)
        self.energy_j = np.where(better, e, self.energy_j)

    def scored(self, i: int, name: str) -> Scored:
        """Size ``i``'s schedule as a choice for the collective ``name``."""
        w = self.which[i]
        assert w is not None
        s, protocol, clock, choice = w
        t, e = float(self.time_us[i]), float(self.energy_j[i])
        base = choice or Choice(collective=name, algorithm=s.algorithm, clock_mhz=clock)
        ch = base.model_copy(
            update={
                "collective": name,
                "protocol": protocol,
                "chunks": s.chunks,
                "channels": s.channels,
                "clock_mhz": clock,
                "order": s.order,
                "leaves": s.leaves,
                "rail_weights": s.weights,
                "time_us": t,
                "energy_j": e,
            }
        )
        return Scored(ch, t, e)


class Evaluator:
    """Flows of candidate structures, cached per (op, root, structure)."""

    def __init__(
        self, p: CollectiveProblem, shared: dict[tuple[str, int, Structure], Flows] | None = None
    ) -> None:
        """``shared``: flows built for another health state of the same topology and
        ranks (evaluators of such states may share it; only capacities differ)."""
        self.p = p
        self._cache: dict[tuple[str, int, Structure], Flows] = {}
        self._shared = shared

    def flows(self, c: Collective, s: Structure, choice: Choice | None = None) -> Flows:
        return self.flows_of(c.op, c.root, s, choice)

    def flows_of(self, op: Op, root: int, s: Structure, choice: Choice | None = None) -> Flows:
        key = (op, root_key(op, root), s)
        if choice is None and key not in self._cache and self._shared and key in self._shared:
            self._cache[key] = self._shared[key].with_capacities(self.p.edge_gbs)
        if choice is not None or key not in self._cache:
            p = self.p
            prog = program_of(
                op,
                s.algorithm,
                p.n,
                p.node_of,
                p.local_of,
                root,
                s.channels,
                s.order,
                s.leaves,
                choice,
                s.weights,
            )
            fl = flows_of(p, prog, s.chunks)
            if choice is not None:
                return fl
            self._cache[key] = fl
            if self._shared is not None:
                self._shared[key] = fl
        return self._cache[key]

    def score(
        self,
        c: Collective,
        s: Structure,
        protocol: Protocol,
        clock: int,
        name: str,
        choice: Choice | None = None,
    ) -> Scored:
        fl = self.flows(c, s, choice)
        t = time_us(self.p, fl, c.bytes, protocol, clock)
        e = energy_j(self.p, fl, c.bytes, s.channels, clock, t)
        w = Winners(np.asarray([t]), np.asarray([e]), [(s, protocol, clock, choice)])
        return w.scored(0, name)

    def best(self, c: Collective, s: Structure, name: str, choice: Choice | None = None) -> Scored:
        """The best protocol and clock of one structure for the file's objective."""
        w = Winners.empty(1)
        self.offer_best(w, c.op, c.root, s, np.asarray([float(c.bytes)]), choice)
        return w.scored(0, name)

    def offer_best(
        self,
        w: Winners,
        op: Op,
        root: int,
        s: Structure,
        sizes: FloatArray,
        choice: Choice | None = None,
    ) -> None:
        """Offer ``w`` the best protocol and clock of one structure for every message
        size of ``sizes`` (bytes): at the max clock for the time objective; for the
        energy objective every clock of the file whose time is within the file's
        ratio of the same protocol's time at the max clock (the max clock always)."""
        p = self.p
        fl = self.flows_of(op, root, s, choice)
        fmax = p.gpu.max_sm_clock_mhz
        energy = p.spec.objective.kind == "energy"
        clocks = p.clocks_mhz if energy else (fmax,)
        settings = [(pr, f) for pr in PROTOCOLS for f in clocks]
        times = times_us_at(p, fl, sizes, settings)
        at = {x: i for i, x in enumerate(settings)}
        for pr in PROTOCOLS:
            top = times[at[(pr, fmax)]]
            if not energy:
                e = energies_j(p, fl, sizes, s.channels, fmax, top)
                w.offer(False, s, pr, fmax, top, e, choice)
                continue
            limit = p.spec.objective.max_time_ratio * top * (1 - 1e-9)
            for f in p.clocks_mhz:
                t = times[at[(pr, f)]]
                e = energies_j(p, fl, sizes, s.channels, f, t)
                ok = (t <= limit) | (f == fmax)
                w.offer(True, s, pr, f, np.where(ok, t, np.inf), np.where(ok, e, np.inf), choice)


def objective_key(p: CollectiveProblem, s: Scored) -> tuple[float, float]:
    """Sort key of a scored schedule: (energy J, time us) when the objective is
    energy, else (time us, energy J); smaller is better."""
    return (s.energy_j, s.time_us) if p.spec.objective.kind == "energy" else (s.time_us, s.energy_j)


def bound_of(p: CollectiveProblem) -> float:
    """Lower bound on the trace objective."""
    return sum(c.count * collective_bound(p, c) for c in p.collectives)


def collective_bound(p: CollectiveProblem, c: Collective) -> float:
    """Lower bound on one run of ``c`` in the objective's unit (us or J)."""
    return energy_bound_j(p, c) if p.spec.objective.kind == "energy" else time_bound_us(p, c)


def objective_of(p: CollectiveProblem, choices: list[Scored]) -> float:
    cs = p.collectives
    if p.spec.objective.kind == "energy":
        return sum(c.count * s.energy_j for c, s in zip(cs, choices, strict=True))
    return sum(c.count * s.time_us for c, s in zip(cs, choices, strict=True))


def check_figures(p: CollectiveProblem, scored: list[Scored]) -> None:
    """SpecError naming the file and the collective when a run's time or energy is
    beyond what a plan file may state (the verifier would refuse the plan)."""
    for i, s in enumerate(scored):
        for figure, unit in ((s.time_us, "us"), (s.energy_j, "J")):
            if not (math.isfinite(figure) and abs(figure) <= MAX_MAGNITUDE):
                raise SpecError(
                    [
                        f"{p.source}: collectives[{i}]: one run takes {figure:.3g} {unit} on "
                        f"this topology, beyond what a plan may state ({MAX_MAGNITUDE:g}); "
                        "raise the link bandwidths or health factors"
                    ]
                )


def plan_result(
    p: CollectiveProblem,
    scored: list[Scored],
    solver: str,
    t0: float,
    algorithm: str,
    log: list[str],
    termination: Termination = Termination.HEURISTIC,
) -> Result[CollectivePlan]:
    """A Result of one choice per collective, with the problem's bound."""
    check_figures(p, scored)
    plan = CollectivePlan(
        name=p.spec.name,
        choices=tuple(s.choice for s in scored),
        objective_unit="J" if p.spec.objective.kind == "energy" else "us",
    )
    obj = objective_of(p, scored)
    bound = bound_of(p)
    return Result(
        status_at(obj, bound, 1e-6) if bound <= obj else FEASIBLE,
        obj,
        bound,
        time.perf_counter() - t0,
        plan,
        solver,
        log=log,
        termination=termination,
        formulation=FORMULATION,
        algorithm=algorithm,
    )


@dataclass
class Group:
    """Collectives of one op and root (for a broadcast): their distinct sizes (bytes),
    the index of each collective's size, and the best schedules found so far."""

    op: Op
    root: int
    sizes: FloatArray
    members: list[tuple[int, int]]
    """(collective index, size index) of every member."""
    winners: Winners
    searched: bool = False


def groups_of(p: CollectiveProblem) -> list[Group]:
    """The trace's collectives grouped by op and root (root only for a broadcast)."""
    by: dict[tuple[Op, int], list[int]] = {}
    for i, c in enumerate(p.collectives):
        by.setdefault((c.op, root_key(c.op, c.root)), []).append(i)
    out = []
    for (op, root), idx in by.items():
        sizes = sorted({p.collectives[i].bytes for i in idx})
        at = {b: j for j, b in enumerate(sizes)}
        out.append(
            Group(
                op,
                root,
                np.asarray(sizes, dtype=np.float64),
                [(i, at[p.collectives[i].bytes]) for i in idx],
                Winners.empty(len(sizes)),
            )
        )
    return out


QUICK = Structure("direct", 1, 1, None, 0)
"""The schedule every collective gets before the full search under a time limit:
direct (all-pairs) on one channel, every op's schedule of fewest steps (one or two),
so the cheapest to score."""


def search_group(
    ev: Evaluator,
    g: Group,
    deadline: float | None,
    candidates: Iterable[Structure] | None = None,
) -> bool:
    """Offer ``g`` every candidate structure (``candidates``, default ``structures``)
    until ``deadline`` (perf_counter seconds); True when every one was scored."""
    c = Collective(op=g.op, bytes=1, root=g.root)
    for s in structures(ev.p, c) if candidates is None else candidates:
        if deadline is not None and time.perf_counter() >= deadline:
            return False
        try:
            ev.offer_best(g.winners, g.op, g.root, s, g.sizes)
        except NotApplicable:
            continue
    g.searched = True
    return True


def select_one(ev: Evaluator, c: Collective, name: str) -> Scored:
    """The best candidate schedule of one collective."""
    g = Group(c.op, c.root, np.asarray([float(c.bytes)]), [(0, 0)], Winners.empty(1))
    search_group(ev, g, None)
    return g.winners.scored(0, name)


@dataclass
class Selection:
    """Selection's schedules of a trace and how far the search got."""

    scored: list[Scored]
    groups: list[Group]
    log: list[str]

    @property
    def complete(self) -> bool:
        return all(g.searched for g in self.groups)


def select_all(
    p: CollectiveProblem,
    ev: Evaluator,
    deadline: float | None,
    progress: Progress = quiet,
) -> Selection:
    """Every collective's best candidate, searched until ``deadline`` (perf_counter
    seconds; None: no limit): first the quick structure for all, then the full
    search, the groups with the most to gain (count x (quick - bound)) first."""
    groups = groups_of(p)
    energy = p.spec.objective.kind == "energy"
    log: list[str] = []
    if deadline is not None:
        for g in groups:
            ev.offer_best(g.winners, g.op, g.root, QUICK, g.sizes)

        def gain(g: Group) -> float:
            got = g.winners.energy_j if energy else g.winners.time_us
            return sum(
                p.collectives[i].count * (float(got[j]) - collective_bound(p, p.collectives[i]))
                for i, j in g.members
            )

        groups_order = sorted(groups, key=gain, reverse=True)
    else:
        groups_order = groups
    t0 = time.perf_counter()
    for k, g in enumerate(groups_order):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        done = search_group(ev, g, deadline)
        root = f" root {g.root}" if g.op == "broadcast" else ""
        progress(
            f"select: {g.op}{root}, {len(g.sizes)} size(s): "
            f"{'searched' if done else 'stopped by the time limit'} "
            f"({k + 1} of {len(groups)} groups, {time.perf_counter() - t0:.1f} s)"
        )
    cut = [g for g in groups if not g.searched]
    if cut:
        members = sum(len(g.members) for g in cut)
        log.append(
            f"time limit: {members} of {len(p.collectives)} collectives ({len(cut)} of "
            f"{len(groups)} op/root groups) not searched in full; they keep the best "
            "schedule found (at least the one-channel direct schedule)"
        )
    scored: list[Scored | None] = [None] * len(p.collectives)
    for g in groups:
        for i, j in g.members:
            scored[i] = g.winners.scored(j, p.name_of(i))
    out = [s for s in scored if s is not None]
    assert len(out) == len(p.collectives)
    return Selection(out, groups, log)


def solve_select(
    p: CollectiveProblem, *, time_limit_s: float | None = None, progress: Progress = quiet
) -> Result[CollectivePlan]:
    """Selection among the candidate schedules of every collective (within
    ``time_limit_s`` seconds when given)."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    deadline = None if time_limit_s is None else t0 + time_limit_s
    sel = select_all(p, ev, deadline, progress)
    return plan_result(
        p,
        sel.scored,
        "select",
        t0,
        "selection among candidate schedules",
        sel.log,
        Termination.HEURISTIC if sel.complete else Termination.TIME_LIMIT,
    )


def score_given(
    p: CollectiveProblem, ev: Evaluator, picks: list[tuple[Structure, Protocol, int]]
) -> list[Scored]:
    """Each collective's given schedule (structure, protocol, clock MHz), scored;
    collectives that share op, root, schedule, protocol and clock in one pass."""
    by: dict[tuple[Op, int, Structure, Protocol, int], list[int]] = {}
    for i, (s, pr, f) in enumerate(picks):
        c = p.collectives[i]
        by.setdefault((c.op, root_key(c.op, c.root), s, pr, f), []).append(i)
    out: dict[int, Scored] = {}
    for (op, root, s, pr, f), idx in by.items():
        sizes = np.asarray([float(p.collectives[i].bytes) for i in idx])
        fl = ev.flows_of(op, root, s)
        t = times_us_at(p, fl, sizes, [(pr, f)])[0]
        w = Winners(t, energies_j(p, fl, sizes, s.channels, f, t), [(s, pr, f, None)] * len(idx))
        for j, i in enumerate(idx):
            out[i] = w.scored(j, p.name_of(i))
    return [out[i] for i in range(len(picks))]


def solve_nccl(p: CollectiveProblem, *, progress: Progress = quiet) -> Result[CollectivePlan]:
    """NCCL's own algorithm, protocol and channel choice, run on the cost model at the
    max clock (NCCL does not change clocks)."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    fmax = p.gpu.max_sm_clock_mhz
    picks = [nccl_choice(p, c) for c in p.collectives]
    scored = score_given(
        p,
        ev,
        [
            (Structure(nc.algorithm, nc.channels, nc.chunks, None, 0), nc.protocol, fmax)
            for nc in picks
        ],
    )
    log = [
        f"{p.name_of(i)}: NCCL picks {nc.algorithm}/{nc.protocol} x{nc.channels} "
        f"(its model: {nc.predicted_us:,.1f} us; cost model {x.time_us:,.1f} us)"
        for i, (nc, x) in enumerate(zip(picks, scored, strict=True))
    ]
    return plan_result(p, scored, "nccl", t0, "NCCL 2.30.7 tuning model (Ring, Tree)", log)


def solve_ring(p: CollectiveProblem, *, progress: Progress = quiet) -> Result[CollectivePlan]:
    """A fixed ring (direct for all-to-all), Simple protocol, NCCL's channel count,
    max clock."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    nc = nccl_channels(p)
    fmax = p.gpu.max_sm_clock_mhz

    def ring_of(c: Collective) -> tuple[Structure, Protocol, int]:
        alg: Algorithm = "direct" if c.op == "all_to_all" else "ring"
        return Structure(alg, nc, 1, None, 0), "simple", fmax

    scored = score_given(p, ev, [ring_of(c) for c in p.collectives])
    return plan_result(p, scored, "ring", t0, "fixed ring, Simple protocol", [])
