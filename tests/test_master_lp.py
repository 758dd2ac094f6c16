"""The master LP held in one HiGHS instance: columns added in rounds (each round's
variables in one call, its rows in another) give HiGHS the same program as the
master built at once over the same columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from energyopt.catalog import load_problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.formulations.master import to_highs_lp
from energyopt.families.serving.solvers.colgen import generate_columns
from energyopt.families.serving.solvers.master_lp import LpSession
from energyopt.perf.oppoints import build_op_table

ROOT = Path(__file__).resolve().parents[1]


def _matrix(lp: object) -> sp.csc_matrix:
    a = lp.a_matrix_  # type: ignore[attr-defined]
    shape = (lp.num_row_, lp.num_col_)  # type: ignore[attr-defined]
    if a.format_ == a.format_.__class__.kRowwise:
        return sp.csr_matrix((a.value_, a.index_, a.start_), shape=shape).tocsc()
    return sp.csc_matrix((a.value_, a.index_, a.start_), shape=shape)


def test_columns_added_in_rounds_give_the_master_built_at_once() -> None:
    problem = load_problem(ROOT / "instances" / "fleet-16.yaml")
    table = build_op_table(problem)
    prog = pat.prepare(problem, table)
    first = len(prog.columns)
    session = LpSession(problem, table, prog.costs, prog.classes, prog.columns)
    generate_columns(prog, session=session, max_rounds=6)
    assert len(prog.columns) > first  # columns did join in rounds
    assert prog.lp is not None
    held = session.lp._h.getLp()
    whole = to_highs_lp(session.mp, integer=False)
    assert held.num_col_ == whole.num_col_ and held.num_row_ == whole.num_row_
    for name in ("col_cost_", "col_lower_", "col_upper_", "row_lower_", "row_upper_"):
        np.testing.assert_array_equal(np.asarray(getattr(held, name)), getattr(whole, name))
    diff = _matrix(held) - _matrix(whole)
    assert diff.count_nonzero() == 0
    again = LpSession(problem, table, prog.costs, prog.classes, prog.columns)
    assert np.isclose(again.solve().objective, prog.lp.objective, rtol=1e-9)
