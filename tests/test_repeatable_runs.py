"""Effort limits, not time limits, decide what column generation, shadow prices and
POP return: the same command gives the same plan and bound on a quiet machine and
on one three times slower, and a run that a time limit did cut says so.

A loaded machine is simulated by a clock that runs ``SLOWER`` times faster than the
real one (``time.perf_counter`` patched), so every time share the solvers hand
out ends sooner in work done. HiGHS keeps its own clock; its time limit is the
safety net these runs must not reach.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from energyopt.catalog import Problem, load_problem
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.verify import verify_plan
from energyopt.solvers.presets import load_preset
from energyopt.solvers.result import Termination

ROOT = Path(__file__).resolve().parents[1]
SLOWER = 3.0
"""How much slower the simulated loaded machine is."""


def _fast_clock(monkeypatch: pytest.MonkeyPatch, factor: float) -> None:
    real = time.perf_counter
    origin = real()
    monkeypatch.setattr(time, "perf_counter", lambda: origin + factor * (real() - origin))


SAFETY = 3.0
"""The tests' time limits are this times the preset's, so that the safety net stays
out of reach on a slow CI machine that also runs the simulated load: the effort
limits, not the machine's speed, must decide these runs."""


def _run(problem: Problem, solver: str, **kw: Any) -> Any:
    preset = load_preset(solver)
    kw.setdefault("time_limit_s", SAFETY * preset.time_limit_s)
    res = solve(problem, preset, **kw)
    assert res.plan is not None
    assert not verify_plan(problem, res.plan)
    return res


@pytest.fixture(scope="module")
def fleet64() -> Problem:
    return load_problem(ROOT / "instances" / "fleet-64.yaml")


@pytest.fixture(scope="module")
def quiet_colgen(fleet64: Problem) -> Any:
    return _run(fleet64, "colgen")


# POP's parts of fleet-64 are small enough for colgen's exact reduced-cost filter,
# whose proofs take most of POP's 30 s on a machine three times slower: POP is
# checked on fleet-256, the size it is meant for.
@pytest.mark.parametrize(
    ("solver", "instance"),
    [("colgen", "fleet-64"), ("shadow-price", "fleet-64"), ("pop", "fleet-256")],
)
def test_a_loaded_machine_gives_the_same_plan(
    fleet64: Problem,
    quiet_colgen: Any,
    solver: str,
    instance: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    problem = (
        fleet64 if instance == "fleet-64" else load_problem(ROOT / "instances" / f"{instance}.yaml")
    )
    quiet = quiet_colgen if solver == "colgen" else _run(problem, solver)
    with monkeypatch.context() as m:
        _fast_clock(m, SLOWER)
        loaded = _run(problem, solver)
    for res in (quiet, loaded):
        assert res.termination != Termination.TIME_LIMIT, res.log[-3:]
    assert quiet.plan.model_dump() == loaded.plan.model_dump()
    assert quiet.objective == loaded.objective
    assert quiet.bound == loaded.bound


def test_a_run_the_time_limit_cut_says_so(
    fleet64: Problem, quiet_colgen: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a clock 200 times faster the safety net (3 x 30 s) binds: the plan still
    verifies, its bound still holds, and the run reports the time limit."""
    quiet = quiet_colgen
    lines: list[str] = []
    with monkeypatch.context() as m:
        _fast_clock(m, 200.0)
        cut = _run(fleet64, "colgen", progress=lines.append)
    assert cut.termination == Termination.TIME_LIMIT
    assert any("stopped by the time limit in" in line for line in lines)
    assert cut.bound is not None and quiet.objective is not None
    assert cut.bound <= quiet.objective + 1e-6
