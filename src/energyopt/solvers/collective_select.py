"""Collective schedules: selection among the candidate schedules on the cost model,
NCCL's own choice, a fixed ring, and the bound every result carries.

Selection evaluates every candidate (algorithm x channels x chunks x rank order,
then protocol x clock on the same flows) of every collective and keeps the best
by the objective. The bound is the sum of each collective's lower bound
(``costmodel.time_bound_us`` / ``energy_bound_j``), valid for every schedule.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from energyopt.formulations.collective.costmodel import (
    Flows,
    energy_bound_j,
    energy_j,
    flows_of,
    time_bound_us,
    time_us,
)
from energyopt.formulations.collective.model import CollectiveProblem
from energyopt.formulations.collective.nccl import nccl_channels, nccl_choice
from energyopt.formulations.collective.schedules import NotApplicable, applicable, program_of
from energyopt.progress import Progress, quiet
from energyopt.solvers.result import FEASIBLE, Result, Termination, status_at
from energyopt.spec.collective import (
    CANDIDATE_ALGORITHMS,
    PROTOCOLS,
    Algorithm,
    Choice,
    Collective,
    CollectivePlan,
    Protocol,
)

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
    if slow:
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


class Evaluator:
    """Flows of candidate structures, cached per (op, root, structure)."""

    def __init__(self, p: CollectiveProblem) -> None:
        self.p = p
        self._cache: dict[tuple[str, int, Structure], Flows] = {}

    def flows(self, c: Collective, s: Structure, choice: Choice | None = None) -> Flows:
        key = (c.op, c.root, s)
        if choice is not None or key not in self._cache:
            p = self.p
            prog = program_of(
                c.op,
                s.algorithm,
                p.n,
                p.node_of,
                p.local_of,
                c.root,
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

    def best(self, c: Collective, s: Structure, name: str, choice: Choice | None = None) -> Scored:
        """The best protocol and clock of one structure for the file's objective."""
        p = self.p
        fmax = p.gpu.max_sm_clock_mhz
        best: Scored | None = None
        for pr in PROTOCOLS:
            fast = self.score(
                c,
                s,
                pr,
                fmax if p.spec.objective.kind == "time" else max(p.clocks_mhz),
                name,
                choice,
            )
            if p.spec.objective.kind == "time":
                cand = [fast]
            else:
                top = self.score(c, s, pr, fmax, name, choice)
                cand = [
                    x
                    for x in (self.score(c, s, pr, f, name, choice) for f in p.clocks_mhz)
                    if x.time_us <= p.spec.objective.max_time_ratio * top.time_us * (1 - 1e-9)
                ] or [fast]
            for x in cand:
                if best is None or _key(p, x) < _key(p, best):
                    best = x
        assert best is not None
        return best


def _key(p: CollectiveProblem, s: Scored) -> tuple[float, float]:
    return (s.energy_j, s.time_us) if p.spec.objective.kind == "energy" else (s.time_us, s.energy_j)


def bound_of(p: CollectiveProblem) -> float:
    """Lower bound on the trace objective."""
    if p.spec.objective.kind == "energy":
        return sum(c.count * energy_bound_j(p, c) for c in p.collectives)
    return sum(c.count * time_bound_us(p, c) for c in p.collectives)


def objective_of(p: CollectiveProblem, choices: list[Scored]) -> float:
    cs = p.collectives
    if p.spec.objective.kind == "energy":
        return sum(c.count * s.energy_j for c, s in zip(cs, choices, strict=True))
    return sum(c.count * s.time_us for c, s in zip(cs, choices, strict=True))


def plan_result(
    p: CollectiveProblem,
    scored: list[Scored],
    solver: str,
    t0: float,
    algorithm: str,
    log: list[str],
) -> Result[CollectivePlan]:
    """A Result of one choice per collective, with the problem's bound."""
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
        termination=Termination.HEURISTIC,
        formulation=FORMULATION,
        algorithm=algorithm,
    )


def select_one(ev: Evaluator, c: Collective, name: str) -> Scored:
    """The best candidate schedule of one collective."""
    best: Scored | None = None
    for s in structures(ev.p, c):
        try:
            x = ev.best(c, s, name)
        except NotApplicable:
            continue
        if best is None or _key(ev.p, x) < _key(ev.p, best):
            best = x
    assert best is not None
    return best


def solve_select(p: CollectiveProblem, *, progress: Progress = quiet) -> Result[CollectivePlan]:
    """Selection among the candidate schedules of every collective."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    scored = []
    for i, c in enumerate(p.collectives):
        best = select_one(ev, c, p.name_of(i))
        progress(
            f"select: {p.name_of(i)}: {best.choice.algorithm} {best.choice.protocol} "
            f"x{best.choice.channels}, {best.time_us:,.1f} us"
        )
        scored.append(best)
    return plan_result(p, scored, "select", t0, "selection among candidate schedules", [])


def solve_nccl(p: CollectiveProblem, *, progress: Progress = quiet) -> Result[CollectivePlan]:
    """NCCL's own algorithm, protocol and channel choice, run on the cost model at the
    max clock (NCCL does not change clocks)."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    scored = []
    log = []
    for i, c in enumerate(p.collectives):
        nc = nccl_choice(p, c)
        s = Structure(nc.algorithm, nc.channels, nc.chunks, None, 0)
        x = ev.score(c, s, nc.protocol, p.gpu.max_sm_clock_mhz, p.name_of(i))
        log.append(
            f"{p.name_of(i)}: NCCL picks {nc.algorithm}/{nc.protocol} x{nc.channels} "
            f"(its model: {nc.predicted_us:,.1f} us; cost model {x.time_us:,.1f} us)"
        )
        scored.append(x)
    return plan_result(p, scored, "nccl", t0, "NCCL 2.30.7 tuning model (Ring, Tree)", log)


def solve_ring(p: CollectiveProblem, *, progress: Progress = quiet) -> Result[CollectivePlan]:
    """A fixed ring (direct for all-to-all), Simple protocol, NCCL's channel count,
    max clock."""
    t0 = time.perf_counter()
    ev = Evaluator(p)
    nc = nccl_channels(p)
    scored = []
    for i, c in enumerate(p.collectives):
        alg: Algorithm = "direct" if c.op == "all_to_all" else "ring"
        scored.append(
            ev.score(
                c, Structure(alg, nc, 1, None, 0), "simple", p.gpu.max_sm_clock_mhz, p.name_of(i)
            )
        )
    return plan_result(p, scored, "ring", t0, "fixed ring, Simple protocol", [])
