"""Independent checker of keep-alive plans: reads the file's numbers directly and
walks every function through its windows; it shares no arithmetic with the
formulation's arrays or the solvers.

A plan is feasible when every function has one state and node per window, only
offered states on permitted nodes, only moves that fit in a window, no node's GPU
memory, host memory or average power over budget in any window, every function's
start-latency SLO met over the horizon (for the energy objective; the throughput
objective counts the requests that start within the limit instead) and the
cold-start cap (if any) kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from energyopt.families.keepalive.spec import Function, KeepAliveFile, KeepAlivePlan
from energyopt.verify.violation import Violation

REL_TOL = 1e-9
"""Relative slack of every budget comparison (float rounding only)."""


@dataclass
class KeepAliveEvaluation:
    """A plan's violations and figures over the horizon (energies J, counts requests)."""

    violations: list[Violation] = field(default_factory=list)
    energy_j: float = 0.0
    keep_j: float = 0.0
    serve_j: float = 0.0
    start_j: float = 0.0
    move_j: float = 0.0
    requests: float = 0.0
    cold_starts: float = 0.0
    tepid_starts: float = 0.0
    late: dict[str, float] = field(default_factory=dict)
    within_slo: float = 0.0
    """Requests starting within their function's start-latency limit (all of a
    function without an SLO)."""
    throughput_rps: float = 0.0
    """``within_slo`` per second of the horizon."""
    peak_power_w: dict[str, float] = field(default_factory=dict)
    gpu_gb_s: float = 0.0
    """GPU memory held over time, GB x s."""
    host_gb_s: float = 0.0
    """Host memory held over time, GB x s."""


def _move(
    fn: Function, before: tuple[str, str] | None, after: tuple[str, str]
) -> tuple[float, float]:
    """(energy J, time s) of moving ``fn`` from (state, node) ``before`` (None: the
    start, nothing kept) to ``after``."""
    state, node = after
    load_j, load_s = fn.cold_start.energy_j, fn.cold_start.time_s
    tep = fn.tepid
    if before is not None and before[1] == node:
        old = before[0]
        if old == state or state == "cold":
            return 0.0, 0.0
        if old == "warm" and state == "tepid" and tep is not None:
            return tep.enter_j, tep.enter_s
        if old == "tepid" and state == "warm" and tep is not None:
            return tep.resume_j, tep.resume_s
    if state == "cold":
        return 0.0, 0.0
    if state == "warm":
        return load_j, load_s
    assert tep is not None
    return load_j + tep.enter_j, load_s + tep.enter_s


def _start(fn: Function, state: str) -> tuple[float, float]:
    """(energy J, latency s) a request pays to start in ``state``."""
    if state == "warm":
        return 0.0, 0.0
    if state == "tepid":
        assert fn.tepid is not None
        return fn.tepid.resume_j + fn.tepid.enter_j, fn.tepid.resume_s
    return fn.cold_start.energy_j, fn.cold_start.time_s


def evaluate_keepalive(spec: KeepAliveFile, plan: KeepAlivePlan) -> KeepAliveEvaluation:
    """Every constraint ``plan`` breaks and its energy, recomputed from ``spec``."""
    ev = KeepAliveEvaluation()
    bad = ev.violations
    nodes = {n.name: n for n in spec.nodes}
    n_t = spec.functions[0].n_windows
    dt = spec.window_s
    gpu = {(n, t): 0.0 for n in nodes for t in range(n_t)}
    host = dict(gpu)
    power = dict(gpu)
    scheduled = {s.function: s for s in plan.functions}
    names = {fn.name for fn in spec.functions}
    for s in plan.functions:
        if s.function not in names:
            bad.append(Violation("function", s.function, "not a function of the problem"))
    if len(scheduled) != len(plan.functions):
        bad.append(Violation("function", "plan", "a function is scheduled twice"))
    total_cold = 0.0
    total_requests = 0.0
    for fn in spec.functions:
        sched = scheduled.get(fn.name)
        if sched is None:
            bad.append(Violation("function", fn.name, "has no schedule"))
            continue
        if len(sched.states) != n_t or len(sched.nodes) != n_t:
            bad.append(
                Violation(
                    "windows",
                    fn.name,
                    f"{len(sched.states)} states and {len(sched.nodes)} nodes for {n_t} windows",
                )
            )
            continue
        forecast = fn.window_arrivals(dt)
        permitted = set(fn.nodes or nodes)
        slo = fn.slo or spec.slo
        late = 0.0
        before: tuple[str, str] | None = None
        ok = True
        for t, (state, node) in enumerate(zip(sched.states, sched.nodes, strict=True)):
            where = f"{fn.name} window {t}"
            if node not in nodes:
                bad.append(Violation("node", where, f"unknown node {node!r}"))
                ok = False
                break
            if node not in permitted:
                bad.append(Violation("node", where, f"{node} is not one of the function's nodes"))
            if state == "tepid" and fn.tepid is None:
                bad.append(Violation("state", where, "the function has no tepid state"))
                ok = False
                break
            move_j, move_s = _move(fn, before, (state, node))
            if move_s > dt * (1 + REL_TOL):
                was = "the start" if before is None else f"{before[0]} on {before[1]}"
                bad.append(
                    Violation(
                        "transition",
                        where,
                        f"{was} -> {state} on {node} takes {move_s:g} s, longer than the "
                        f"{dt:g} s window",
                    )
                )
            lam = forecast[t]
            start_j, start_s = _start(fn, state)
            keep_w, keep_gpu, keep_host = 0.0, 0.0, 0.0
            if state == "warm":
                keep_w = fn.warm.power_w
                keep_gpu, keep_host = fn.warm.gpu_memory_gb, fn.warm.host_memory_gb
            elif state == "tepid":
                assert fn.tepid is not None
                keep_w = fn.tepid.power_w
                keep_gpu, keep_host = fn.tepid.gpu_memory_gb, fn.tepid.host_memory_gb
            serve = lam * fn.service.time_s * fn.service.power_w
            window_j = keep_w * dt + serve + lam * start_j + move_j
            ev.keep_j += keep_w * dt
            ev.serve_j += serve
            ev.start_j += lam * start_j
            ev.move_j += move_j
            ev.energy_j += window_j
            gpu[node, t] += keep_gpu
            host[node, t] += keep_host
            power[node, t] += window_j / dt
            ev.gpu_gb_s += keep_gpu * dt
            ev.host_gb_s += keep_host * dt
            if state == "cold":
                total_cold += lam
            elif state == "tepid":
                ev.tepid_starts += lam
            if slo is not None and start_s > slo.start_latency_s:
                late += lam
            before = (state, node)
        requests = float(sum(forecast))
        total_requests += requests
        ev.late[fn.name] = late
        ev.within_slo += requests - late
        if ok and slo is not None and spec.objective.kind == "energy":
            allowed = (1 - slo.percentile / 100) * requests
            if late > allowed + REL_TOL * max(1.0, requests):
                bad.append(
                    Violation(
                        "slo",
                        fn.name,
                        f"{late:g} of {requests:g} requests start later than "
                        f"{slo.start_latency_s:g} s; the p{slo.percentile:g} SLO allows "
                        f"{allowed:g}",
                    )
                )
    for (node, t), used in gpu.items():
        spec_node = nodes[node]
        for what, value, cap, unit in (
            ("gpu_memory", used, spec_node.gpu_memory_gb, "GB"),
            ("host_memory", host[node, t], spec_node.host_memory_gb, "GB"),
            ("power", power[node, t], spec_node.power_budget_w, "W"),
        ):
            if value > cap + REL_TOL * max(1.0, cap):
                bad.append(
                    Violation(
                        what,
                        f"{node} window {t}",
                        f"{value:,.6g} {unit} held, over the node's {cap:,.6g} {unit}",
                    )
                )
        ev.peak_power_w[node] = max(ev.peak_power_w.get(node, 0.0), power[node, t])
    ev.requests = total_requests
    ev.cold_starts = total_cold
    ev.throughput_rps = ev.within_slo / (n_t * dt)
    rate = spec.objective.max_cold_start_rate
    if rate is not None and total_cold > rate * total_requests + REL_TOL * max(1.0, total_requests):
        bad.append(
            Violation(
                "cold_starts",
                "plan",
                f"{total_cold:g} cold starts in {total_requests:g} requests, over the cap "
                f"of {rate:g} per request",
            )
        )
    return ev
