"""Clock classes (``solvers/clock_classes.py``): the LP's picks, the class-restricted
HEFT schedules and the search pass the checker, keep every task in its class and meet
the deadline."""

from __future__ import annotations

import pytest

from energyopt.families.taskgraph.formulations.generators import layered, platform
from energyopt.families.taskgraph.formulations.heft import heft, heft_max_clock
from energyopt.families.taskgraph.formulations.loading import build_taskgraph
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import totals
from energyopt.families.taskgraph.solvers.clock_classes import (
    FREE_CAPACITY,
    class_lp,
    class_option,
    class_options,
    class_schedule,
    class_search,
    class_settings,
    free_prediction,
    justify,
    latest_ends,
)
from energyopt.families.taskgraph.solvers.heuristic import (
    _clock_lists,
    priced_clock_levels,
    solve_heuristic,
)
from energyopt.families.taskgraph.spec import ObjectiveKind
from energyopt.families.taskgraph.verify import check_schedule


def _graph(kind: ObjectiveKind, gpus: list[dict[str, str]]) -> TaskGraph:
    """240 tasks (6 layers of 40); deadline 5 % above max-clock HEFT (at the default
    1.5 % the classes pack too loosely on so few tasks per GPU)."""
    spec = layered(6, 40, gpus, seed=3)
    objective = spec.objective.model_copy(update={"kind": kind, "epsilon": 0.05})
    return build_taskgraph(spec.model_copy(update={"objective": objective}))


MIXED = [*platform("L40S", 2), {"name": "l4-0", "type": "L4"}, {"name": "l4-1", "type": "L4"}]


@pytest.mark.parametrize("gpus", [platform("L40S", 4), MIXED])
def test_without_a_binding_capacity_every_task_takes_its_cheapest_class(
    gpus: list[dict[str, str]],
) -> None:
    tg = _graph("energy_within", gpus)
    clocks = [1005 if g % 2 == 0 else 10**6 for g in range(tg.n_gpus)]  # slow / top
    ref = heft_max_clock(tg)
    got = class_lp(tg, clocks, ref, 10**9, 3)
    assert got is not None
    pick, dyn_j = got
    members: list[int] = []
    for g in range(tg.n_gpus):
        if all((tg.gpu_type[h], clocks[h]) != (tg.gpu_type[g], clocks[g]) for h in members):
            members.append(g)
    least = 0.0
    for i in range(tg.n_tasks):
        costs = [tg.opts(i, g).dyn_j[class_option(tg, i, g, clocks[g])] for g in members]
        least += min(costs)
        assert costs[pick[i]] == pytest.approx(min(costs), rel=1e-6)
    assert dyn_j == pytest.approx(least, rel=1e-6)


def test_class_schedules_keep_tasks_in_their_class_and_pass_the_checker() -> None:
    tg = _graph("energy", platform("L40S", 4))
    ref = heft_max_clock(tg)
    clocks = [1005, 1005, 2520, 2520]
    s = class_schedule(tg, clocks, ref, 2 * ref.makespan(tg), 4)
    assert s is not None
    check = check_schedule(tg, s)
    assert check.ok, check.violations
    for i in range(tg.n_tasks):
        assert (
            s.clock(tg, i)
            == tg.opts(i, s.gpu[i]).clock_mhz[class_option(tg, i, s.gpu[i], clocks[s.gpu[i]])]
        )
    assert check.transitions == 0  # one clock per GPU
    # too little capacity for the fastest work: no LP solution
    assert class_schedule(tg, clocks, ref, ref.makespan(tg) // 10, 4) is None


@pytest.mark.parametrize("kind", ["energy_within", "edp"])
def test_the_search_meets_the_deadline_and_beats_max_clock_heft(kind: ObjectiveKind) -> None:
    tg = _graph(kind, platform("L40S", 4))
    ref = heft_max_clock(tg)
    clocks = _clock_lists(tg)
    seeds = [lv for r in ("down", "nearest") for lv in priced_clock_levels(tg, clocks, r)]
    settings = class_settings(tg, clocks, seeds)
    top = len(clocks[0]) - 1
    for lv in settings:  # the GPUs not at a seed's lowest level go to the top, but for
        # one or two at one level between, with at least one GPU left at the top
        middle = [v for v in lv if v not in (min(lv), top)]
        assert len(middle) <= 2 and len(set(middle)) <= 1
        assert top in lv
    got = class_search(tg, clocks, settings, ref, float("inf"))
    assert got is not None
    s, obj = got
    check = check_schedule(tg, s)
    assert check.ok, check.violations
    assert check.objective == pytest.approx(obj, rel=1e-9)
    assert obj == pytest.approx(totals(tg, s).objective, rel=1e-12)
    assert obj < totals(tg, ref).objective


def test_the_heuristic_uses_clock_classes_above_the_placement_search() -> None:
    tg = _graph("energy_within", platform("L40S", 4))
    result = solve_heuristic(tg, time_limit_s=30.0)
    assert result.plan is not None
    assert check_schedule(tg, result.plan).ok
    assert any(line.startswith("clock classes") for line in result.log)


def test_an_unbounded_backlog_makes_the_windows_one() -> None:
    """Work carried forward without limit (none after the last window) leaves only
    each class's total, the one-window LP; a backlog of 0 can only cost more."""
    tg = _graph("energy_within", platform("L40S", 4))
    ref = heft_max_clock(tg)
    clocks = [1005, 1005, 2520, 2520]
    assert tg.deadline is not None
    one = class_lp(tg, clocks, ref, tg.deadline, 1)
    free = class_lp(tg, clocks, ref, tg.deadline, 10, backlog=10**9)
    held = class_lp(tg, clocks, ref, tg.deadline, 10, backlog=0)
    some = class_lp(tg, clocks, ref, tg.deadline, 10, backlog=tg.deadline // 100)
    assert one is not None and free is not None and held is not None and some is not None
    assert free[1] == pytest.approx(one[1], rel=1e-7)
    assert held[1] >= some[1] - 1e-7 >= one[1] - 2e-7


def test_the_energy_prediction_is_at_most_the_energy_of_any_class_schedule() -> None:
    """Without a deadline and for energy (no price on the makespan but idle power),
    the one-window LP with a free length relaxes every schedule of the setting whose
    makespan is within ``FREE_CAPACITY`` of the reference's."""
    tg = _graph("energy", platform("L40S", 4))
    ref = heft_max_clock(tg)
    span = ref.makespan(tg)
    compared = 0
    for clocks in ([2520] * 4, [1005, 2520, 2520, 2520], [1005, 1005, 1620, 2520]):
        got = free_prediction(tg, clocks, ref)
        assert got is not None
        predicted, share = got
        assert 0.0 < share <= FREE_CAPACITY + 1e-9
        schedules = [ref] if clocks == [2520] * 4 else []  # ref: HEFT at max clock
        for capacity in (1.0, 1.02, 1.05, 1.08):
            s = class_schedule(tg, clocks, ref, int(capacity * span), 1)
            if s is not None:
                schedules.append(s)
        for s in schedules:
            if s.makespan(tg) <= FREE_CAPACITY * span:
                compared += 1
                assert predicted <= totals(tg, s).objective * (1 + 1e-9)
    assert compared > 1


@pytest.mark.parametrize(
    ("kind", "clocks", "capacity"),
    [
        ("edp", [1005, 1005, 1620, 2520], 1.1),
        ("edp", [1005, 1005, 1620, 2520], 1.2),
        ("energy_within", [1620, 2520, 2520, 2520], 1.0),
    ],
)
def test_justify_never_worsens_a_class_schedule_and_keeps_every_task_in_its_class(
    kind: ObjectiveKind, clocks: list[int], capacity: float
) -> None:
    """Forward-backward passes on a class schedule (one window, a free tail of 10 %):
    the result passes the checker, runs every task on a GPU and at the option HEFT
    allowed it, changes no clock, meets the deadline, and its objective is below the
    input's (these schedules pack loosely enough that the passes tighten them)."""
    tg = _graph(kind, platform("L40S", 4))
    ref = heft_max_clock(tg)
    options = class_options(tg, clocks, ref, int(capacity * ref.makespan(tg)), 1, 0, 0.1)
    assert options is not None
    s = heft(tg, options)
    before = totals(tg, s)
    repaired, obj = justify(tg, s, options, float("inf"))
    check = check_schedule(tg, repaired)
    assert check.ok, check.violations
    assert check.transitions == 0
    assert check.objective == pytest.approx(obj, rel=1e-9)
    assert obj < before.objective * (1 - 1e-4)
    for i in range(tg.n_tasks):
        assert options[i][repaired.gpu[i]] == repaired.option[i] >= 0
    if tg.deadline is not None:
        assert before.makespan <= tg.deadline
        assert repaired.makespan(tg) <= tg.deadline
    # no time left: the input comes back
    assert justify(tg, s, options, 0.0) == (s, before.objective)


def test_latest_ends_leave_every_edge_its_duration_and_transfer() -> None:
    """The backward pass's starts, counted back from the end, put every task at least
    its duration plus the transfer before each successor, and no two tasks of a GPU
    overlap."""
    tg = _graph("edp", platform("L40S", 4))
    ref = heft_max_clock(tg)
    options = class_options(tg, [1005, 1005, 2520, 2520], ref, 2 * ref.makespan(tg), 4)
    assert options is not None
    s = heft(tg, options)
    back = latest_ends(tg, s, options)
    for i in range(tg.n_tasks):
        for j, _ in tg.succs[i]:
            assert back[i] >= back[j] + s.dur(tg, i)
    assert max(back) >= s.makespan(tg) // 2  # it is a schedule, not all zeros


def test_justify_shortens_a_schedule_past_the_deadline_and_stops_after_its_passes() -> None:
    """A class schedule past the deadline: the passes may not make it later, and with
    ``passes=1`` the result is the input or the one pass (backward, then HEFT in the
    order of the latest starts)."""
    tg = _graph("energy_within", platform("L40S", 4))
    ref = heft_max_clock(tg)
    options = class_options(tg, [1005, 1005, 1620, 2520], ref, int(1.1 * ref.makespan(tg)), 1)
    assert options is not None and tg.deadline is not None
    s = heft(tg, options)
    assert s.makespan(tg) > tg.deadline
    repaired, obj = justify(tg, s, options, float("inf"))
    check = check_schedule(tg, repaired)
    assert all("exceeds the deadline" in v for v in check.violations)  # valid but late
    assert repaired.makespan(tg) < s.makespan(tg)
    assert obj == pytest.approx(totals(tg, repaired).objective, rel=1e-12)
    once = heft(tg, options, [float(b) for b in latest_ends(tg, s, options)])
    assert justify(tg, s, options, float("inf"), passes=1)[0] in (s, once)
    assert justify(tg, s, options, float("inf"), passes=1)[0].makespan(tg) == min(
        s.makespan(tg), once.makespan(tg)
    )
