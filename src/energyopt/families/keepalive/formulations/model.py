"""A keep-alive file bound into the arrays every keep-alive solver works on.

States of one function are numbered ``kind * N + node`` for the N nodes, with kind
0 warm, 1 tepid, 2 cold; ``SOURCE`` (= 3N) is the state before the first window
(nothing kept anywhere). Energies are J, powers W, memory GB, times s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from energyopt.families.keepalive.spec import (
    MAX_REQUESTS_PER_WINDOW,
    STATES,
    FunctionSchedule,
    KeepAliveFile,
    KeepAlivePlan,
)
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse, read_data

if TYPE_CHECKING:
    from energyopt.families.keepalive.formulations.cuts import Covers

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]

WARM, TEPID, COLD = 0, 1, 2


@dataclass(frozen=True)
class KeepAliveProblem:
    """A bound keep-alive instance (F functions, N nodes, T windows, S = 3N states)."""

    spec: KeepAliveFile
    source: str
    window_s: float
    allowed: BoolArray
    """(F, S): the function may take the state (tepid offered, node permitted)."""
    arrivals: FloatArray
    """(F, T): forecast requests per window (expected; fractional from a histogram)."""
    state_j: FloatArray
    """(F, T, S): energy of holding the state for the window and serving its requests, J."""
    gpu_gb: FloatArray
    """(F, S): GPU memory the state holds on its node, GB."""
    host_gb: FloatArray
    """(F, S): host memory the state holds on its node, GB."""
    same_j: FloatArray
    """(F, 3, 3): energy of the move from kind a to kind b on one node, J; inf where
    it takes longer than a window (``move_j`` gives any pair of states)."""
    enter_j: FloatArray
    """(F, 3): energy of entering kind b from nothing kept on the node (from the
    start, or from another node), J; inf where it takes longer than a window."""
    slow: BoolArray
    """(F, S): a request arriving in the state starts later than the function's SLO."""
    slo_budget: FloatArray
    """(F,): requests of the function that may start later than its SLO (inf: no SLO,
    or the throughput objective, which counts late requests instead of capping them)."""
    cold_cap: float
    """Cold starts allowed over the horizon (inf: no cap)."""
    gpu_cap: FloatArray
    """(N,): GPU memory per node, GB."""
    host_cap: FloatArray
    """(N,): host memory per node, GB."""
    power_cap: FloatArray
    """(N,): power budget per node, W."""

    @property
    def n_functions(self) -> int:
        return int(self.allowed.shape[0])

    @property
    def n_nodes(self) -> int:
        return int(self.gpu_cap.shape[0])

    @property
    def n_states(self) -> int:
        return 3 * self.n_nodes

    @property
    def n_windows(self) -> int:
        return int(self.arrivals.shape[1])

    @property
    def source_state(self) -> int:
        return self.n_states

    @property
    def maximises_throughput(self) -> bool:
        """The objective is throughput within the start SLO (else energy)."""
        return self.spec.objective.kind == "throughput"

    @property
    def horizon_s(self) -> float:
        return self.n_windows * self.window_s

    def late_requests(self, states: IntArray) -> float:
        """Requests starting later than their function's limit under the (F, T) states."""
        f = np.arange(self.n_functions)[:, None]
        return float((self.arrivals * self.slow[f, states]).sum())

    def throughput_of(self, late: float) -> float:
        """Requests per second within the start limit when ``late`` requests are late."""
        return (float(self.arrivals.sum()) - late) / self.horizon_s

    def move_j(self, f: IntArray | int, a: IntArray | int, b: IntArray | int) -> FloatArray:
        """Energy of function f's move from state a (``source_state``: the start) to
        state b, J, elementwise over broadcast arrays; inf where the move takes longer
        than a window or either state is not offered to the function."""
        fa, aa, ba = np.broadcast_arrays(
            np.asarray(f, dtype=np.int64),
            np.asarray(a, dtype=np.int64),
            np.asarray(b, dtype=np.int64),
        )
        n = self.n_nodes
        real = aa < self.n_states
        kind_a = np.where(real, aa // n, COLD)
        kind_b = ba // n
        same = real & (aa % n == ba % n)
        energy = np.where(same, self.same_j[fa, kind_a, kind_b], self.enter_j[fa, kind_b])
        ok = self.allowed[fa, ba] & (~real | self.allowed[fa, np.where(real, aa, 0)])
        return np.asarray(np.where(ok, energy, np.inf), dtype=np.float64)

    @cached_property
    def pair_moves_j(self) -> FloatArray:
        """(F, S, S): ``move_j`` between every pair of states, J, computed on first use
        (F S^2 numbers: for few nodes only)."""
        states = np.arange(self.n_states)
        f = np.arange(self.n_functions)[:, None, None]
        return self.move_j(f, states[None, :, None], states[None, None, :])

    @cached_property
    def covers(self) -> Covers:
        """The memory cover inequalities of every node (formulations/cuts.py), computed
        on first use."""
        from energyopt.families.keepalive.formulations.cuts import memory_covers

        return memory_covers(self)

    def energy_of(self, states: IntArray) -> float:
        """Energy of the (F, T) states over the horizon, J: every window's held states,
        requests and the moves into them (inf where a move is impossible)."""
        n_f, n_t = states.shape
        f = np.arange(n_f)[:, None]
        prev = np.concatenate([np.full((n_f, 1), self.source_state), states[:, :-1]], axis=1)
        held = self.state_j[f, np.arange(n_t)[None, :], states]
        return float((held + self.move_j(f, prev, states)).sum())

    def cross_node_exact(self) -> BoolArray:
        """(F,): whether every move of the function on one node is possible and no
        dearer than entering its target from nothing kept wherever entering it is
        possible (then evicting and entering anew never beats the direct move, and
        moves between nodes can pass through one hub state per window)."""
        direct = self.same_j
        entering = self.enter_j[:, None, :]
        ok = ~np.isfinite(entering) | (direct <= entering)
        offered = np.ones((self.n_functions, 3), dtype=np.bool_)
        offered[:, TEPID] = self.allowed[:, TEPID * self.n_nodes : COLD * self.n_nodes].any(axis=1)
        pairs = offered[:, :, None] & offered[:, None, :]
        return np.asarray(np.all(ok | ~pairs, axis=(1, 2)), dtype=np.bool_)

    def node_of(self) -> IntArray:
        """(S,): the node of each state."""
        return np.arange(self.n_states, dtype=np.int64) % self.n_nodes

    def is_cold(self) -> BoolArray:
        """(S,): whether each state is cold."""
        return np.asarray(np.arange(self.n_states) // self.n_nodes == COLD, dtype=np.bool_)

    def state_power_w(self) -> FloatArray:
        """(F, T, S): average power of the state over its window, W."""
        return self.state_j / self.window_s

    def plan_of(self, states: IntArray) -> KeepAlivePlan:
        """The plan file model of an (F, T) array of state indices."""
        n = self.n_nodes
        nodes = [nd.name for nd in self.spec.nodes]
        return KeepAlivePlan(
            name=self.spec.name,
            functions=tuple(
                FunctionSchedule(
                    function=fn.name,
                    states=tuple(STATES[int(s) // n] for s in states[f]),
                    nodes=tuple(nodes[int(s) % n] for s in states[f]),
                )
                for f, fn in enumerate(self.spec.functions)
            ),
        )

    def states_of(self, plan: KeepAlivePlan) -> IntArray:
        """The (F, T) state indices of a plan of this problem (``plan_of`` inverted);
        functions in the spec's order, whatever the plan's."""
        n = self.n_nodes
        nodes = {nd.name: i for i, nd in enumerate(self.spec.nodes)}
        by_name = {fs.function: fs for fs in plan.functions}
        states = np.zeros((self.n_functions, self.n_windows), dtype=np.int64)
        for f, fn in enumerate(self.spec.functions):
            fs = by_name[fn.name]
            states[f] = [
                STATES.index(st) * n + nodes[nd] for st, nd in zip(fs.states, fs.nodes, strict=True)
            ]
        return states


def load_keepalive(path: str | Path) -> KeepAliveProblem:
    """Read, validate and bind a keep-alive file; SpecError naming file and field."""
    p = Path(path)
    spec = parse(KeepAliveFile, read_data(p), str(p))
    return build_problem(spec, str(p))


def build_problem(spec: KeepAliveFile, source: str = "<keepalive>") -> KeepAliveProblem:
    """Bind a parsed file; SpecError for references to unknown nodes and missing SLOs."""
    node_names = [n.name for n in spec.nodes]
    known = set(node_names)
    problems: list[str] = []
    for i, fn in enumerate(spec.functions):
        for name in fn.nodes or ():
            if name not in known:
                problems.append(
                    f"{source}: functions[{i}]({fn.name}).nodes: unknown node {name!r}; "
                    f"nodes: {', '.join(node_names)}"
                )
        if fn.inter_arrivals is not None:
            rate = fn.inter_arrivals.per_window(spec.window_s)
            if rate > MAX_REQUESTS_PER_WINDOW:
                problems.append(
                    f"{source}: functions[{i}]({fn.name}).inter_arrivals: {rate:,.6g} requests "
                    f"expected per window, over {MAX_REQUESTS_PER_WINDOW:,}"
                )
    if problems:
        raise SpecError(problems)
    n_f, n_n = len(spec.functions), len(spec.nodes)
    dt = spec.window_s
    fns = spec.functions
    has_tepid = np.array([fn.tepid is not None for fn in fns], dtype=bool)

    def per_function(values: list[float]) -> FloatArray:
        return np.array(values, dtype=np.float64)

    def tepid_field(name: str) -> FloatArray:
        return per_function([0.0 if fn.tepid is None else getattr(fn.tepid, name) for fn in fns])

    def by_kind(warm: FloatArray, tepid: FloatArray, cold: FloatArray) -> FloatArray:
        """(F, S) from one value per function and kind, the same on every node."""
        kinds = np.stack([warm, tepid, cold], axis=1)  # (F, 3)
        return np.asarray(np.repeat(kinds, n_n, axis=1), dtype=np.float64)

    zero = np.zeros(n_f)
    permitted = np.zeros((n_f, n_n), dtype=bool)
    index = {name: i for i, name in enumerate(node_names)}
    for f, fn in enumerate(fns):
        permitted[f, [index[n] for n in (fn.nodes or node_names)]] = True
    allowed = np.concatenate([permitted, permitted & has_tepid[:, None], permitted], axis=1)
    arrivals = np.array([fn.window_arrivals(dt) for fn in fns], dtype=np.float64)
    load_j = per_function([fn.cold_start.energy_j for fn in fns])
    load_s = per_function([fn.cold_start.time_s for fn in fns])
    resume_j, resume_s = tepid_field("resume_j"), tepid_field("resume_s")
    pause_j, pause_s = tepid_field("enter_j"), tepid_field("enter_s")
    keep_w = by_kind(per_function([fn.warm.power_w for fn in fns]), tepid_field("power_w"), zero)
    gpu_gb = by_kind(
        per_function([fn.warm.gpu_memory_gb for fn in fns]), tepid_field("gpu_memory_gb"), zero
    )
    host_gb = by_kind(
        per_function([fn.warm.host_memory_gb for fn in fns]), tepid_field("host_memory_gb"), zero
    )
    start_j = by_kind(zero, resume_j + pause_j, load_j)
    start_s = by_kind(zero, resume_s, load_s)
    slow = np.zeros((n_f, 3 * n_n), dtype=bool)
    slo_budget = np.full(n_f, np.inf)
    serve_j = per_function([fn.service.time_s * fn.service.power_w for fn in fns])
    for f, fn in enumerate(fns):
        slo = fn.slo or spec.slo
        if slo is not None:
            slow[f] = start_s[f] > slo.start_latency_s
            if spec.objective.kind == "energy":
                slo_budget[f] = (1.0 - slo.percentile / 100.0) * float(arrivals[f].sum())
    same_j, enter_j = _transitions(
        dt,
        load_j,
        load_s,
        np.where(has_tepid, pause_j, np.inf),
        pause_s,
        np.where(has_tepid, resume_j, np.inf),
        resume_s,
    )
    state_j = keep_w[:, None, :] * dt + arrivals[:, :, None] * (
        serve_j[:, None, None] + start_j[:, None, :]
    )
    cap = spec.objective.max_cold_start_rate
    cold_cap = np.inf if cap is None else cap * float(arrivals.sum())
    return KeepAliveProblem(
        spec=spec,
        source=source,
        window_s=dt,
        allowed=allowed,
        arrivals=arrivals,
        state_j=state_j,
        gpu_gb=gpu_gb,
        host_gb=host_gb,
        same_j=same_j,
        enter_j=enter_j,
        slow=slow,
        slo_budget=slo_budget,
        cold_cap=cold_cap,
        gpu_cap=np.array([n.gpu_memory_gb for n in spec.nodes]),
        host_cap=np.array([n.host_memory_gb for n in spec.nodes]),
        power_cap=np.array([n.power_budget_w for n in spec.nodes]),
    )


def _transitions(
    dt: float,
    load_j: FloatArray,
    load_s: FloatArray,
    pause_j: FloatArray,
    pause_s: FloatArray,
    resume_j: FloatArray,
    resume_s: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Every function's move energies, J (inf: impossible): (F, 3, 3) from kind to
    kind on one node and (F, 3) into a kind from nothing kept. Arguments per
    function: cold start, pause (warm -> tepid) and resume (tepid -> warm) energy J
    and time s (pause and resume energy inf where the function has no tepid state).

    On one node: warm -> tepid pauses, tepid -> warm resumes, cold -> warm loads,
    cold -> tepid loads then pauses, and staying or evicting to cold is free. Onto
    another node (or from the start) the function enters its new state from cold
    there. A move that takes longer than one window is impossible.
    """
    n_f = len(load_j)
    zero = np.zeros(n_f)
    enter = np.stack([load_j, load_j + pause_j, zero], axis=1)
    enter_s = np.stack([load_s, load_s + pause_s, zero], axis=1)
    same = np.zeros((n_f, 3, 3))
    same_s = np.zeros((n_f, 3, 3))
    same[:, WARM, TEPID], same_s[:, WARM, TEPID] = pause_j, pause_s
    same[:, TEPID, WARM], same_s[:, TEPID, WARM] = resume_j, resume_s
    same[:, COLD, :], same_s[:, COLD, :] = enter, enter_s
    same = np.where(same_s <= dt, same, np.inf)
    return same, np.where(enter_s <= dt, enter, np.inf)
