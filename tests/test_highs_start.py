"""A starting solution handed to HiGHS never makes the reported objective differ from
the cost of the values returned (an A100 whose on-power depends on its clock, started
at the wrong clock)."""

from __future__ import annotations

import numpy as np
import pytest

from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers.colgen import generate_columns
from energyopt.families.serving.solvers.highs_direct import solve_master_mip, values_objective
from energyopt.perf.oppoints import build_op_table
from tests.serving_helpers import A100, tiny_instance


@pytest.mark.parametrize("rate", [0.5, 3.0])
def test_start_at_the_wrong_clock_returns_values_of_the_reported_objective(rate: float) -> None:
    problem = tiny_instance(
        [A100, A100],
        [("Llama-3.1-8B", rate, 1200.0, 100.0), ("Mistral-7B", rate / 2, 1200.0, 100.0)],
        clocks={A100: [630, 1410]},
    )
    table = build_op_table(problem)
    assert table.on_power[(A100, 630)] < table.on_power[(A100, 1410)]
    prog = pat.prepare(problem, table)
    generate_columns(prog)
    mp = pat.integer_model(prog, pyomo=False).master
    free, _ = solve_master_mip(mp, time_limit_s=30, rel_gap=1e-9)
    assert free.objective is not None
    # A feasible start with every GPU at 1410 MHz: the same master with the
    # configurations at 630 MHz forbidden.
    low = [mp.z_var[j] for j, col in enumerate(prog.columns) if col.clock_mhz == 630]
    assert low
    saved = [mp.hi[i] for i in low]
    for i in low:
        mp.hi[i] = 0.0
    forced, start = solve_master_mip(mp, time_limit_s=30, rel_gap=1e-9)
    for i, hi in zip(low, saved, strict=True):
        mp.hi[i] = hi
    assert forced.objective is not None and start is not None
    assert forced.objective > free.objective + 1e-6
    out, values = solve_master_mip(mp, time_limit_s=30, rel_gap=1e-9, start=start)
    assert out.objective is not None and values is not None
    assert out.objective == pytest.approx(values_objective(mp, values), rel=1e-9, abs=1e-9)
    assert out.objective == pytest.approx(free.objective, rel=1e-6)
    assert np.any(values[low] > 0.5)


def test_a_backend_that_returns_the_start_with_its_own_objective_is_solved_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reported highspy behaviour, emulated: with a start, the first run reports
    the objective of its own solution but hands back the start's values."""
    import energyopt.families.serving.solvers.highs_direct as hd

    problem = tiny_instance(
        [A100, A100],
        [("Llama-3.1-8B", 3.0, 1200.0, 100.0), ("Mistral-7B", 1.5, 1200.0, 100.0)],
        clocks={A100: [630, 1410]},
    )
    prog = pat.prepare(problem, build_op_table(problem))
    generate_columns(prog)
    mp = pat.integer_model(prog, pyomo=False).master
    free, _ = solve_master_mip(mp, time_limit_s=30, rel_gap=1e-9)
    low = [mp.z_var[j] for j, col in enumerate(prog.columns) if col.clock_mhz == 630]
    saved = [mp.hi[i] for i in low]
    for i in low:
        mp.hi[i] = 0.0
    forced, start = solve_master_mip(mp, time_limit_s=30, rel_gap=1e-9)
    for i, hi in zip(low, saved, strict=True):
        mp.hi[i] = hi
    assert start is not None and forced.objective is not None and free.objective is not None
    assert forced.objective > free.objective + 1e-6

    real = hd._read_mip
    calls = []

    def buggy(h, master, wall):  # type: ignore[no-untyped-def]
        outcome, values = real(h, master, wall)
        calls.append(1)
        if len(calls) == 1:  # first run: HiGHS' objective, the start's values
            return outcome, np.array(start, dtype=float)
        return outcome, values

    monkeypatch.setattr(hd, "_read_mip", buggy)
    out, values = solve_master_mip(mp, time_limit_s=30, rel_gap=1e-9, start=start)
    assert len(calls) == 2  # the mismatch was noticed and the model solved again
    assert out.objective is not None and values is not None
    assert out.objective == pytest.approx(values_objective(mp, values), rel=1e-9, abs=1e-9)
    assert out.objective == pytest.approx(free.objective, rel=1e-6)
