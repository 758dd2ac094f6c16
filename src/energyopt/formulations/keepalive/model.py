"""A keep-alive file bound into the arrays every keep-alive solver works on.

States of one function are numbered ``kind * N + node`` for the N nodes, with kind
0 warm, 1 tepid, 2 cold; ``SOURCE`` (= 3N) is the state before the first window
(nothing kept anywhere). Energies are J, powers W, memory GB, times s.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse, read_data
from energyopt.spec.keepalive import (
    MAX_REQUESTS_PER_WINDOW,
    STATES,
    FunctionSchedule,
    KeepAliveFile,
    KeepAlivePlan,
)

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
    trans_j: FloatArray
    """(F, S + 1, S): energy of the move from state a (row S: the start) to state b,
    J; inf where the move takes longer than a window."""
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
    problems: list[str] = []
    for i, fn in enumerate(spec.functions):
        for name in fn.nodes or ():
            if name not in node_names:
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
    n_s = 3 * n_n
    dt = spec.window_s
    allowed = np.zeros((n_f, n_s), dtype=bool)
    arrivals = np.array([fn.window_arrivals(dt) for fn in spec.functions], dtype=np.float64)
    keep_w = np.zeros((n_f, n_s))
    start_j = np.zeros((n_f, n_s))
    start_s = np.zeros((n_f, n_s))
    gpu_gb = np.zeros((n_f, n_s))
    host_gb = np.zeros((n_f, n_s))
    trans_j = np.full((n_f, n_s + 1, n_s), np.inf)
    slow = np.zeros((n_f, n_s), dtype=bool)
    slo_budget = np.full(n_f, np.inf)
    serve_j = np.array([fn.service.time_s * fn.service.power_w for fn in spec.functions])
    for f, fn in enumerate(spec.functions):
        permitted = [node_names.index(n) for n in (fn.nodes or node_names)]
        tep = fn.tepid
        for n in permitted:
            allowed[f, WARM * n_n + n] = True
            allowed[f, COLD * n_n + n] = True
            if tep is not None:
                allowed[f, TEPID * n_n + n] = True
        for n in range(n_n):
            w, t, c = WARM * n_n + n, TEPID * n_n + n, COLD * n_n + n
            keep_w[f, w] = fn.warm.power_w
            gpu_gb[f, w] = fn.warm.gpu_memory_gb
            host_gb[f, w] = fn.warm.host_memory_gb
            start_j[f, c] = fn.cold_start.energy_j
            start_s[f, c] = fn.cold_start.time_s
            if tep is not None:
                keep_w[f, t] = tep.power_w
                gpu_gb[f, t] = tep.gpu_memory_gb
                host_gb[f, t] = tep.host_memory_gb
                start_j[f, t] = tep.resume_j + tep.enter_j
                start_s[f, t] = tep.resume_s
        slo = fn.slo or spec.slo
        if slo is not None:
            slow[f] = start_s[f] > slo.start_latency_s
            if spec.objective.kind == "energy":
                slo_budget[f] = (1.0 - slo.percentile / 100.0) * float(arrivals[f].sum())
        _transitions(spec, f, n_n, trans_j[f])
    for f in range(n_f):
        trans_j[f][:, ~allowed[f]] = np.inf
        trans_j[f][:n_s][~allowed[f], :] = np.inf
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
        trans_j=trans_j,
        slow=slow,
        slo_budget=slo_budget,
        cold_cap=cold_cap,
        gpu_cap=np.array([n.gpu_memory_gb for n in spec.nodes]),
        host_cap=np.array([n.host_memory_gb for n in spec.nodes]),
        power_cap=np.array([n.power_budget_w for n in spec.nodes]),
    )


def _transitions(spec: KeepAliveFile, f: int, n_n: int, out: FloatArray) -> None:
    """Fill ``out`` (S + 1, S) with function f's move energies, J (inf: impossible).

    On one node: warm -> tepid pauses (``tepid.enter``), tepid -> warm resumes,
    cold -> warm loads (``cold_start``), cold -> tepid loads then pauses, and any
    state -> cold evicts at no cost. Onto another node (or from the start) the
    function is evicted and enters its new state from cold there. A move that
    takes longer than one window is impossible.
    """
    fn = spec.functions[f]
    tep = fn.tepid
    dt = spec.window_s
    load = (fn.cold_start.energy_j, fn.cold_start.time_s)
    enter = (tep.enter_j, tep.enter_s) if tep is not None else (np.inf, np.inf)
    resume = (tep.resume_j, tep.resume_s) if tep is not None else (np.inf, np.inf)
    from_cold = {
        WARM: load,
        TEPID: (load[0] + enter[0], load[1] + enter[1]),
        COLD: (0.0, 0.0),
    }
    n_s = 3 * n_n
    for a in range(n_s + 1):
        for b in range(n_s):
            kb, nb = divmod(b, n_n)
            if a < n_s and a % n_n == nb:
                ka = a // n_n
                if ka == kb or kb == COLD:
                    move = (0.0, 0.0)
                elif ka == WARM:
                    move = enter
                elif ka == TEPID:
                    move = resume
                else:
                    move = from_cold[kb]
            else:
                move = from_cold[kb]
            out[a, b] = move[0] if move[1] <= dt else np.inf
