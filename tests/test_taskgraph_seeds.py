"""Per-GPU clocks suggested by the busy-time prices (``priced_clock_levels``) and the
descent that starts from them."""

from __future__ import annotations

from energyopt.families.taskgraph.formulations.generators import (
    layered,
    platform,
    taskgraph_file,
)
from energyopt.families.taskgraph.formulations.heft import heft_gpu_clocks
from energyopt.families.taskgraph.formulations.loading import build_taskgraph
from energyopt.families.taskgraph.formulations.model import TaskGraph
from energyopt.families.taskgraph.formulations.schedule import totals
from energyopt.families.taskgraph.solvers.heuristic import (
    ENERGY_WEIGHTS,
    _clock_lists,
    gpu_clock_descent,
    priced_clock_levels,
)


def _graph(gpus: list[dict[str, str]], kind: str = "energy") -> TaskGraph:
    spec = layered(6, 12, gpus, seed=3)
    objective = spec.objective.model_copy(update={"kind": kind})
    return build_taskgraph(spec.model_copy(update={"objective": objective}))


def _split(memory_bound: int, compute_bound: int, gpus: int) -> TaskGraph:
    """Independent tasks: ``memory_bound`` streaming 4 GB with few FLOPs (their time
    hardly follows the clock), ``compute_bound`` of 1 TFLOP with little traffic."""
    tasks = [
        {"name": f"m{i}", "kernel": "copy", "flops": 1e6, "bytes": 4e9} for i in range(memory_bound)
    ] + [
        {"name": f"c{i}", "kernel": "gemm", "flops": 1e12, "bytes": 1e6, "compute_efficiency": 0.9}
        for i in range(compute_bound)
    ]
    spec = taskgraph_file("split", tasks, [], platform("L40S", gpus), objective={"kind": "energy"})
    return build_taskgraph(spec)


def test_suggestions_share_each_types_gpus_among_its_clocks() -> None:
    """Every suggestion gives each GPU a clock level of its type, non-decreasing over the
    GPUs of a type, and at the highest price rounding down runs no more GPUs below the
    maximum clock than at the lowest."""
    tg = _graph(platform("L4", 4) + platform("L40S", 2, prefix="big"))
    clocks = _clock_lists(tg)
    top = [len(clocks[tg.gpu_type[g]]) - 1 for g in range(tg.n_gpus)]
    for rounding in ("down", "nearest"):
        suggested = priced_clock_levels(tg, clocks, rounding)
        assert suggested
        for levels in suggested:
            assert len(levels) == tg.n_gpus
            for t in range(len(tg.types)):
                mine = [levels[g] for g in range(tg.n_gpus) if tg.gpu_type[g] == t]
                assert mine == sorted(mine)
                assert all(0 <= v < len(clocks[t]) for v in mine)
    down = priced_clock_levels(tg, clocks, "down")
    slow = [sum(v < m for v, m in zip(levels, top, strict=True)) for levels in down]
    assert slow[-1] <= slow[0]


def test_memory_bound_work_gets_the_lowest_clock_in_proportion() -> None:
    """Equal memory-bound and compute-bound work on 4 GPUs: at the idle price the
    memory-bound tasks choose the lowest clock (same time, less power) and the
    compute-bound ones a fast clock, so the lowest clock gets a share of the GPUs near
    the memory-bound tasks' share of the time; all memory-bound: every GPU slow."""
    tg = _split(0, 8, 4)
    clocks = _clock_lists(tg)
    fast_only = priced_clock_levels(tg, clocks, "down")
    assert all(v > 0 for v in fast_only[-1])
    tg = _split(8, 0, 4)
    assert priced_clock_levels(tg, _clock_lists(tg), "down")[0] == [0, 0, 0, 0]
    tg = _split(8, 8, 4)
    first = priced_clock_levels(tg, _clock_lists(tg), "nearest")[0]
    assert 1 <= sum(v == 0 for v in first) <= 3


def test_the_descent_is_no_worse_than_its_start_at_the_maximum_clock() -> None:
    """With the suggestions tried first, the per-GPU clock descent still returns a
    schedule that meets the deadline and is at least as good as every GPU at its
    maximum clock with the first energy weight (where the descent used to start)."""
    tg = _graph(platform("L40S", 4), "energy_within")
    assert tg.deadline is not None
    found = gpu_clock_descent(tg, stop_at=float("inf"))
    assert found is not None
    schedule, objective = found
    assert schedule.makespan(tg) <= tg.deadline
    assert objective == totals(tg, schedule).objective
    fast_dur = fast_dyn = 0.0
    for i in range(tg.n_tasks):
        k = tg.max_clock_option(i, 0)
        fast_dur += tg.opts(i, 0).dur[k]
        fast_dyn += tg.opts(i, 0).dyn_j[k]
    clocks = _clock_lists(tg)
    start = heft_gpu_clocks(
        tg, [c[-1] for c in clocks] * tg.n_gpus, ENERGY_WEIGHTS[0] * fast_dur / fast_dyn
    )
    if start.makespan(tg) <= tg.deadline:
        assert objective <= totals(tg, start).objective * (1 + 1e-12)
