"""Task-graph solvers: every schedule passes the independent checker, objectives are
recomputed independently, CP-SAT is exact on tiny graphs, the heuristic is close."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.families.taskgraph.formulations.bounds import lower_bounds
from energyopt.families.taskgraph.formulations.generators import (
    layered,
    platform,
    stencil,
    taskgraph_file,
)
from energyopt.families.taskgraph.formulations.heft import heft_max_clock
from energyopt.families.taskgraph.formulations.loading import build_taskgraph, load_taskgraph
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import Schedule, earliest_starts, totals
from energyopt.families.taskgraph.solvers.cpsat import solve_cpsat
from energyopt.families.taskgraph.solvers.heuristic import solve_heuristic
from energyopt.families.taskgraph.spec import OBJECTIVE_KINDS, ObjectiveKind, TopologyLink
from energyopt.families.taskgraph.verify import check_schedule
from energyopt.solvers.result import OPTIMAL, relative_gap

ROOT = Path(__file__).resolve().parents[1]


def _with(tg_file: object, kind: ObjectiveKind, **dvfs: float) -> TaskGraph:
    spec = tg_file  # a TaskGraphFile
    update = {"objective": spec.objective.model_copy(update={"kind": kind})}  # type: ignore[attr-defined]
    if dvfs:
        update["dvfs"] = spec.dvfs.model_copy(update=dvfs)  # type: ignore[attr-defined]
    return build_taskgraph(spec.model_copy(update=update))  # type: ignore[attr-defined]


def _agree(tg: TaskGraph, s: Schedule) -> None:
    check = check_schedule(tg, s)
    assert check.ok, check.violations
    tot = totals(tg, s)
    assert check.energy_j == pytest.approx(tot.energy_j, rel=1e-9)
    assert check.makespan_ms == pytest.approx(tot.makespan_ms, rel=1e-12)
    assert check.transitions == tot.transitions
    assert check.objective == pytest.approx(tot.objective, rel=1e-9)


def test_checker_catches_each_kind_of_violation() -> None:
    tg = _with(stencil(2, 3, 2**24, platform("L4", 2)), "energy_within")
    s = solve_heuristic(tg, search_evals=0).plan
    assert s is not None
    _agree(tg, s)
    # an input arriving late
    j = next(i for i in range(tg.n_tasks) if tg.preds[i])
    early = list(s.start)
    early[j] = 0
    assert any(
        "before its input" in v
        for v in check_schedule(tg, replace(s, start=tuple(early))).violations
    )
    # two tasks on one GPU at once
    gpus = [0] * tg.n_tasks
    starts = [0] * tg.n_tasks
    bad = Schedule(
        tuple(gpus), tuple(tg.max_clock_option(i, 0) for i in range(tg.n_tasks)), tuple(starts)
    )
    assert any("overlaps" in v for v in check_schedule(tg, bad).violations)
    # a clock change without its transition time
    seq = [i for i in tg.topo_order]
    opts = [0 if k % 2 else len(tg.opts(i, 0).dur) - 1 for k, i in enumerate(seq)]
    option = [0] * tg.n_tasks
    for i, k in zip(seq, opts, strict=True):
        option[i] = k
    t = 0
    start = [0] * tg.n_tasks
    for i in seq:
        start[i] = t
        t += tg.opts(i, 0).dur[option[i]]
    tight = Schedule(tuple(gpus), tuple(option), tuple(start))
    assert any("clock change" in v for v in check_schedule(tg, tight).violations)
    # the deadline
    late = tuple(x + tg.deadline for x in s.start)  # type: ignore[operator]
    assert any(
        "exceeds the deadline" in v for v in check_schedule(tg, replace(s, start=late)).violations
    )


def _brute_force_single_gpu(tg: TaskGraph) -> float:
    """Least objective over every clock choice of a chain on one GPU (order fixed)."""
    order = list(tg.topo_order)
    best = float("inf")
    for choice in itertools.product(*(range(len(tg.opts(i, 0).dur)) for i in order)):
        option = [0] * tg.n_tasks
        for i, k in zip(order, choice, strict=True):
            option[i] = k
        start = earliest_starts(tg, [0] * tg.n_tasks, option, [order])
        s = Schedule(tuple([0] * tg.n_tasks), tuple(option), tuple(start))
        if check_schedule(tg, s).ok:
            best = min(best, totals(tg, s).objective)
    return best


@pytest.mark.parametrize("kind", OBJECTIVE_KINDS)
def test_cpsat_matches_brute_force_on_a_chain(kind: ObjectiveKind) -> None:
    tasks = [
        {"name": "a", "flops": 4e10, "bytes": 1e8},
        {"name": "b", "flops": 1e8, "bytes": 2e9},
        {"name": "c", "flops": 8e10, "bytes": 1e8},
    ]
    edges = [{"src": "a", "dst": "b", "bytes": 1e6}, {"src": "b", "dst": "c", "bytes": 1e6}]
    spec = taskgraph_file(
        "chain",
        tasks,
        edges,
        platform("L4", 1),
        clocks_mhz={"L4": [810, 1410, 2040]},
        dvfs={"transition_ms": 0.3, "transition_j": 0.05},
        objective={"kind": kind, "epsilon": 0.1},
    )
    tg = build_taskgraph(spec)
    exact = _brute_force_single_gpu(tg)
    r = solve_cpsat(tg, time_limit_s=20, workers=1, search_evals=0)
    assert r.plan is not None and r.objective is not None and r.bound is not None
    _agree(tg, r.plan)
    assert r.status == OPTIMAL
    assert r.objective == pytest.approx(exact, rel=1e-4)
    assert r.bound <= exact * (1 + 1e-9)


@pytest.mark.parametrize("kind", ["energy_within", "energy", "edp"])
def test_heuristic_close_to_cpsat_on_small_graphs(kind: ObjectiveKind) -> None:
    tg = _with(layered(2, 3, platform("L4", 2), seed=3), kind)
    exact = solve_cpsat(tg, time_limit_s=20, workers=1, search_evals=40)
    heur = solve_heuristic(tg, search_evals=40)
    for r in (exact, heur):
        assert r.plan is not None and r.objective is not None and r.bound is not None
        _agree(tg, r.plan)
        assert r.bound <= r.objective * (1 + 1e-9)
    assert exact.objective is not None and heur.objective is not None
    assert exact.bound is not None
    assert heur.objective >= exact.bound * (1 - 1e-9)  # the CP bound holds for any schedule
    assert exact.objective <= heur.objective * (1 + 1e-9)  # warm-started: never worse
    assert heur.objective <= exact.objective * 1.03


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=st.integers(1, 3),
    width=st.integers(1, 4),
    gpus=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(OBJECTIVE_KINDS),
    gpu_type=st.sampled_from(["L4", "L40S"]),
    transition_ms=st.sampled_from([0.0, 0.05, 0.5]),
)
def test_heuristic_schedules_pass_the_checker_and_never_lose_to_heft(
    layers: int,
    width: int,
    gpus: int,
    seed: int,
    kind: ObjectiveKind,
    gpu_type: str,
    transition_ms: float,
) -> None:
    tg = _with(
        layered(layers, width, platform(gpu_type, gpus), seed=seed),
        kind,
        transition_ms=transition_ms,
    )
    r = solve_heuristic(tg, search_evals=4)
    assert r.plan is not None and r.objective is not None and r.bound is not None
    _agree(tg, r.plan)
    baseline = heft_max_clock(tg)
    _agree(replace(tg, deadline=None), baseline)
    assert r.objective <= totals(tg, baseline).objective * (1 + 1e-12)
    assert lower_bounds(tg).objective(tg, r.objective) == r.bound <= r.objective * (1 + 1e-12)
    if tg.deadline is not None:
        assert r.plan.makespan(tg) <= tg.deadline


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=st.integers(2, 4),
    width=st.integers(2, 5),
    gpus=st.integers(1, 3),
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(OBJECTIVE_KINDS),
    mixed=st.booleans(),
    epsilon=st.sampled_from([0.0, 0.05, 0.5]),
)
def test_the_priced_energy_bound_holds_for_every_schedule(
    layers: int, width: int, gpus: int, seed: int, kind: ObjectiveKind, mixed: bool, epsilon: float
) -> None:
    """The Lagrangian bound on busy time per GPU type holds for every schedule: on
    random graphs (one or two GPU types, deadlines from tight to loose) it is at most
    the energy of the heuristic's schedule and of CP-SAT's (and of its proven optimum
    on the smallest), and never below the plain idle-plus-least-energy bound."""
    more = platform("L40S", 1, prefix="big") if mixed else []
    spec = layered(layers, width, platform("L4", gpus) + more, seed=seed)
    objective = spec.objective.model_copy(update={"kind": kind, "epsilon": epsilon})
    tg = build_taskgraph(spec.model_copy(update={"objective": objective}))
    lb = lower_bounds(tg)
    plain = tg.idle_total_w * tg.ms(lb.makespan) / 1e3 + lb.dyn_j
    assert lb.energy_j(tg) >= plain
    small = tg.n_tasks <= 8
    runs = [solve_heuristic(tg, search_evals=4)]
    runs.append(solve_cpsat(tg, time_limit_s=20 if small else 2, workers=1, search_evals=4))
    for r in runs:
        assert r.plan is not None
        assert lb.energy_j(tg) <= totals(tg, r.plan).energy_j * (1 + 1e-9)
    exact = runs[-1]
    if small and exact.status == OPTIMAL and exact.objective is not None:
        assert lb.objective(tg) <= exact.objective * (1 + 1e-6)


def test_under_a_deadline_the_priced_bound_pays_for_the_faster_clocks() -> None:
    """energy_within on the bundled Cholesky graph: pricing busy time lifts the bound
    well above idle power x the makespan bound plus each task's least energy (which
    ignores the deadline), so the heuristic's certified gap shrinks (25 % -> 13 %)."""
    tg = load_taskgraph(ROOT / "instances" / "taskgraph" / "cholesky-4x4-l40s.yaml")
    lb = lower_bounds(tg)
    plain = tg.idle_total_w * tg.ms(lb.makespan) / 1e3 + lb.dyn_j
    r = solve_heuristic(tg)
    assert r.objective is not None and r.bound is not None and r.gap is not None
    assert lb.priced_j > plain * 1.1
    assert r.bound == pytest.approx(lb.priced_j, rel=1e-12)
    assert r.gap < 0.2 < relative_gap(r.objective, plain)


def _brute_force(tg: TaskGraph) -> float:
    """Least objective over every placement, clock and GPU order (earliest starts:
    for a fixed placement, clocks and order they give the least makespan, and the
    energy depends on nothing else)."""
    n = tg.n_tasks
    best = float("inf")
    gpus_of = [[g for g in range(tg.n_gpus) if tg.can_run(i, g)] for i in range(n)]
    for gpu in itertools.product(*gpus_of):
        for option in itertools.product(*(range(len(tg.opts(i, gpu[i]).dur)) for i in range(n))):
            groups = [[i for i in range(n) if gpu[i] == g] for g in range(tg.n_gpus)]
            for seqs in itertools.product(*(itertools.permutations(t) for t in groups)):
                try:
                    start = earliest_starts(tg, list(gpu), list(option), [list(q) for q in seqs])
                except ValueError:  # an order against the graph
                    continue
                s = Schedule(tuple(gpu), tuple(option), tuple(start))
                if tg.deadline is None or s.makespan(tg) <= tg.deadline:
                    best = min(best, totals(tg, s).objective)
    return best


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layers=st.integers(1, 2),
    width=st.integers(1, 2),
    gpus=st.integers(1, 2),
    mixed=st.booleans(),
    seed=st.integers(0, 10_000),
    kind=st.sampled_from(OBJECTIVE_KINDS),
    epsilon=st.sampled_from([0.0, 0.05, 0.5]),
    transition_ms=st.sampled_from([0.0, 0.3]),
)
def test_every_bound_is_at_most_the_brute_force_optimum(
    layers: int,
    width: int,
    gpus: int,
    mixed: bool,
    seed: int,
    kind: ObjectiveKind,
    epsilon: float,
    transition_ms: float,
) -> None:
    """On graphs of up to 4 tasks, 1 to 3 GPUs (two alike, or one of another type
    beside), 2 clocks per type: the optimum by enumeration of every placement, clock
    and order is >= the cheap bound, >= the EDP/ED^2P interval bound given any
    incumbent at or above the optimum, and >= CP-SAT's reported bound; CP-SAT (with
    its GPU symmetry breaking) reaches the optimum where it proves optimality."""
    more = platform("L40S", 1, prefix="big") if mixed else []
    spec = layered(layers, width, platform("L4", gpus) + more, seed=seed)
    spec = spec.model_copy(
        update={
            "objective": spec.objective.model_copy(update={"kind": kind, "epsilon": epsilon}),
            "clocks_mhz": {"L4": (1065, 2040), "L40S": (1305, 2520)}
            if mixed
            else {"L4": (1065, 2040)},
            "dvfs": spec.dvfs.model_copy(update={"transition_ms": transition_ms}),
        }
    )
    tg = build_taskgraph(spec)
    exact = _brute_force(tg)
    lb = lower_bounds(tg)
    assert lb.objective(tg) <= exact * (1 + 1e-9)
    for incumbent in (exact, exact * 1.3):
        assert lb.objective(tg, incumbent) <= exact * (1 + 1e-9)
    r = solve_cpsat(tg, time_limit_s=20, workers=1, search_evals=4)
    assert r.plan is not None and r.objective is not None and r.bound is not None
    _agree(tg, r.plan)
    assert r.bound <= exact * (1 + 1e-9)
    assert r.objective >= exact * (1 - 1e-9)
    if r.status == OPTIMAL:
        assert r.objective <= exact * (1 + 2e-4)


def test_interchangeable_gpus_follow_the_topology() -> None:
    """GPUs of one type on one host are interchangeable; a GPU behind a slower link is
    not, nor is a GPU of another type."""
    from energyopt.families.taskgraph.formulations.cpsat import interchangeable_gpus

    same = _with(layered(1, 2, platform("L4", 3), seed=0), "energy")
    assert interchangeable_gpus(same) == [[0, 1, 2]]
    mixed = _with(
        layered(1, 2, platform("L4", 2) + platform("L40S", 1, prefix="big"), seed=0), "energy"
    )
    assert interchangeable_gpus(mixed) == [[0, 1]]
    spec = layered(1, 2, platform("L4", 3), seed=0)
    links = [
        {"a": "gpu0", "b": "sw", "bandwidth_gbps": 25},
        {"a": "gpu1", "b": "sw", "bandwidth_gbps": 25},
        {"a": "gpu2", "b": "sw", "bandwidth_gbps": 5},
    ]
    tg = build_taskgraph(spec.model_copy(update={"links": tuple(TopologyLink(**x) for x in links)}))
    assert interchangeable_gpus(tg) == [[0, 1]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_schedule_meets_the_cp_model_work_rows(seed: int) -> None:
    """The CP-SAT model's redundant rows (G s_j >= ancestors' durations, G (M - e_j)
    >= descendants'; clock changes per GPU >= clocks used - 1) cut off no schedule:
    random placements, clocks and GPU orders of a three-layer graph on 2 GPUs, started
    at their earliest times and fixed in the model, stay feasible, at their own
    makespan as the horizon, and cost no more there than their own energy."""
    import random

    from ortools.sat.python import cp_model

    from energyopt.families.taskgraph.formulations.cpsat import build_cp_model, relabelled

    spec = layered(3, 2, platform("L4", 2), seed=seed)
    spec = spec.model_copy(
        update={
            "objective": spec.objective.model_copy(update={"kind": "energy"}),
            "clocks_mhz": {"L4": (1065, 1530, 2040)},
            "dvfs": spec.dvfs.model_copy(update={"transition_ms": 0.3}),
        }
    )
    tg = build_taskgraph(spec)
    rng = random.Random(seed)
    checked = changes = 0
    while checked < 8:
        gpu = [rng.randrange(tg.n_gpus) for _ in range(tg.n_tasks)]
        option = [rng.randrange(len(tg.opts(i, gpu[i]).dur)) for i in range(tg.n_tasks)]
        order = list(tg.topo_order)
        seqs = [[i for i in order if gpu[i] == g] for g in range(tg.n_gpus)]
        s = Schedule(tuple(gpu), tuple(option), tuple(earliest_starts(tg, gpu, option, seqs)))
        assert check_schedule(tg, s).ok
        s = relabelled(tg, s)
        cp = build_cp_model(tg, s.makespan(tg))
        for (i, g, k), x in cp.present.items():
            cp.model.add(x == int(s.gpu[i] == g and s.option[i] == k))
        for i, v in enumerate(cp.start):
            cp.model.add(v == s.start[i])
        solver = cp_model.CpSolver()
        solver.parameters.num_workers = 1
        solver.parameters.max_time_in_seconds = 10
        assert solver.solve(cp.model) == cp_model.OPTIMAL
        # ... and charge it no more than its own energy (the clock-count row forces no
        # clock change the sequence does not make)
        own = totals(tg, s).objective
        assert solver.objective_value * cp.objective_scale <= own * (1 + 1e-9)
        clock = [tg.opts(i, s.gpu[i]).clock_mhz[s.option[i]] for i in range(tg.n_tasks)]
        changes += sum(
            clock[i] != clock[j] for seq in s.sequences(tg) for i, j in itertools.pairwise(seq)
        )
        checked += 1
    assert changes > 0
