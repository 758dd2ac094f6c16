"""The co-location checker finds every kind of broken plan."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from energyopt.families.colocation.formulations.model import build_model
from energyopt.families.colocation.solvers.exact import solve_exact
from energyopt.families.colocation.spec import ColocationPlan, PlanUnit, UnitJob
from energyopt.families.colocation.verify import evaluate_colocation

from .colocation_helpers import problem_of, small_data

PROBLEM = problem_of(small_data())
H100 = "H100-SXM5-80GB"


def gpus(*idx: int) -> tuple[str, ...]:
    return tuple(f"{H100}/{i}" for i in idx)


def unit(
    jobs: list[tuple[str, int]], ids: tuple[str, ...], start: float = 0.0, clock: int = 1980
) -> PlanUnit:
    return PlanUnit(
        gpu_type=H100,
        gpus=ids,
        clock_mhz=clock,
        start_s=start,
        jobs=tuple(UnitJob(job=j, share_pct=s) for j, s in jobs),
    )


def good_plan() -> ColocationPlan:
    plan = solve_exact(build_model(PROBLEM)).plan
    assert plan is not None
    return plan


def with_units(*units: PlanUnit, unscheduled: tuple[str, ...] = ()) -> ColocationPlan:
    return ColocationPlan(instance="colocation-small", units=units, unscheduled=unscheduled)


SERIAL = [  # every job alone on two GPUs, one after another: a valid plan
    unit([("train-llama7b", 100)], gpus(0, 1), 0.0),
    unit([("train-mistral", 100)], gpus(2, 3), 0.0),
    unit([("batch-llama8b", 100)], gpus(0, 1), 5000.0),
    unit([("batch-llama7b", 100)], gpus(2, 3), 5000.0, 885),
]


def test_a_solved_plan_and_a_serial_plan_verify() -> None:
    assert evaluate_colocation(PROBLEM, good_plan()).violations == []
    ev = evaluate_colocation(PROBLEM, with_units(*SERIAL))
    assert ev.violations == [], ev.violations
    assert set(ev.runs) == {j.name for j in PROBLEM.jobs}


CASES: list[tuple[str, Callable[[], ColocationPlan], str]] = [
    ("missing job", lambda: with_units(*SERIAL[:3]), "in no unit"),
    ("job twice", lambda: with_units(*SERIAL, SERIAL[0]), "appears 2 times"),
    ("unknown job", lambda: with_units(*SERIAL, unit([("nope", 100)], gpus(0))), "not a job"),
    (
        "unscheduled under jct",
        lambda: with_units(*SERIAL[:3], unscheduled=("batch-llama7b",)),
        "unscheduled is for throughput",
    ),
    (
        "shares over 100",
        lambda: with_units(
            unit([("train-llama7b", 75), ("batch-llama8b", 50)], gpus(0, 1, 2, 3)),
            *SERIAL[1:2],
            *SERIAL[3:],
        ),
        "over 100%",
    ),
    (
        "two training jobs",
        lambda: with_units(
            unit([("train-llama7b", 50), ("train-mistral", 50)], gpus(0, 1, 2, 3)), *SERIAL[2:]
        ),
        "one training and one inference",
    ),
    (
        "too few GPUs",
        lambda: with_units(unit([("train-llama7b", 100)], gpus(0)), *SERIAL[1:]),
        "outside 2..4",
    ),
    (
        "unknown GPU",
        lambda: with_units(unit([("train-llama7b", 100)], gpus(0, 9)), *SERIAL[1:]),
        "no GPU",
    ),
    (
        "GPU listed twice",
        lambda: with_units(unit([("train-llama7b", 100)], gpus(0, 0)), *SERIAL[1:]),
        "listed twice",
    ),
    (
        "bad clock",
        lambda: with_units(unit([("train-llama7b", 100)], gpus(0, 1), clock=1234), *SERIAL[1:]),
        "not a clock",
    ),
    (
        "memory",
        lambda: with_units(
            unit([("train-llama7b", 75), ("batch-llama8b", 25)], gpus(0, 1)),
            *SERIAL[1:2],
            *SERIAL[3:],
        ),
        "GB usable",
    ),
    (
        "power budget",
        lambda: with_units(unit([("train-llama7b", 100)], gpus(0, 1, 2, 3)), *SERIAL[1:]),
        "can never start",
    ),
]


@pytest.mark.parametrize(("name", "make", "expected"), CASES, ids=[c[0] for c in CASES])
def test_broken_plans_are_caught(
    name: str, make: Callable[[], ColocationPlan], expected: str
) -> None:
    violations = evaluate_colocation(PROBLEM, make()).violations
    assert any(expected in str(v) for v in violations), (name, [str(v) for v in violations])


def test_units_wait_for_their_gpus_and_for_power() -> None:
    """Two units planned on the same GPUs at once run one after the other."""
    plan = with_units(
        unit([("train-llama7b", 100)], gpus(0, 1), 0.0),
        unit([("train-mistral", 100)], gpus(0, 1), 0.0),
        unit([("batch-llama8b", 100)], gpus(2, 3), 0.0),
        unit([("batch-llama7b", 100)], gpus(2, 3), 0.0),
    )
    ev = evaluate_colocation(PROBLEM, plan)
    assert ev.violations == []
    first, second = ev.runs["train-llama7b"], ev.runs["train-mistral"]
    assert second.start_s == pytest.approx(first.end_s)
    assert ev.peak_power_w <= PROBLEM.instance.cluster.power_budget_w + 1e-6
