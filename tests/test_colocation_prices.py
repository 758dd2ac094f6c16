"""Shadow prices: the subgradient converges to a known dual solution."""

from __future__ import annotations

import highspy
import numpy as np
import pytest
from scipy.sparse import csc_matrix, csr_matrix, vstack

from energyopt.backends.highs import quiet_highs
from energyopt.families.colocation.formulations.model import build_model
from energyopt.families.colocation.formulations.relaxation import Relaxation, build_relaxation
from energyopt.families.colocation.solvers.lagrangian import Subgradient

from .colocation_helpers import problem_of, small_data


def relaxation_lp(r: Relaxation) -> tuple[float, np.ndarray]:
    """LP optimum of the relaxation (job columns fractional) and its row duals."""
    n = len(r.cost)
    cover = csr_matrix((np.ones(n), (r.job, np.arange(n))), shape=(r.n_jobs, n))
    a = csc_matrix(vstack([cover, r.usage]))
    h = quiet_highs()
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = a.shape[0]
    lp.col_cost_ = r.cost
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = np.ones(n)
    lp.row_lower_ = np.r_[
        np.zeros(r.n_jobs) if r.optional else np.ones(r.n_jobs), np.where(r.equality, 0.0, -np.inf)
    ]
    lp.row_upper_ = np.r_[np.ones(r.n_jobs), np.where(r.equality, 0.0, 1.0)]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = a.indptr
    lp.a_matrix_.index_ = a.indices
    lp.a_matrix_.value_ = a.data
    h.passModel(lp)
    h.run()
    duals = np.asarray(h.getSolution().row_dual)[r.n_jobs :]
    return float(h.getInfo().objective_function_value), -duals


def two_job_case() -> Relaxation:
    """Two jobs share one resource of capacity 1.5 (scaled: usage 1/1.5 per 'big' column).

    Job j runs 'big' (uses 1 unit, cost 0) or 'small' (no resource, cost 3 for job 0,
    5 for job 1). L(y) = min(y/1.5, 3) + min(y/1.5, 5) - y peaks only at y/1.5 = 3,
    i.e. the scaled price y* = 4.5, with L* = 1.5 (the LP optimum: job 1 big, job 0
    half big).
    """
    usage = csr_matrix(np.array([[1 / 1.5, 0.0, 1 / 1.5, 0.0]]))
    return Relaxation(
        job=np.array([0, 0, 1, 1]),
        cost=np.array([0.0, 3.0, 0.0, 5.0]),
        usage=usage,
        equality=np.array([False]),
        row_kind=["share"],
        row_label=["resource"],
        row_scale=np.array([1.5]),
        n_jobs=2,
        optional=False,
        paired=np.zeros(4, dtype=bool),
        type_index=np.zeros(4, dtype=np.int64),
        start=np.zeros(4, dtype=np.int64),
    )


def test_prices_converge_to_the_known_dual() -> None:
    sg = Subgradient(two_job_case())
    for _ in range(200):
        sg.step(upper=3.0)  # a feasible integer plan: job 1 big, job 0 small
    assert sg.best_value <= 1.5 + 1e-9  # a lower bound, always
    assert abs(sg.best_value - 1.5) < 1e-3
    assert abs(sg.best_prices[0] - 4.5) < 1e-2
    # in natural units: price per unit of the resource = 3 (job 0's saving per unit)
    assert abs(sg.best_prices[0] / 1.5 - 3.0) < 1e-2


def test_known_dual_agrees_with_the_lp() -> None:
    value, duals = relaxation_lp(two_job_case())
    assert abs(value - 1.5) < 1e-9
    assert abs(duals[0] - 4.5) < 1e-6


def test_dual_value_approaches_the_lp_on_a_colocation_instance() -> None:
    model = build_model(problem_of(small_data()))
    relax = build_relaxation(model)
    lp_value, lp_duals = relaxation_lp(relax)
    sg = Subgradient(relax)
    for _ in range(400):
        sg.step(upper=4000.0)
    assert sg.best_value <= lp_value + 1e-6 * abs(lp_value)
    assert sg.best_value >= 0.97 * lp_value
    # the LP duals are an optimal price vector: the dual function reaches the LP value there
    prices = np.where(relax.equality, lp_duals, np.maximum(lp_duals, 0.0))
    assert sg.evaluate(prices).value == pytest.approx(lp_value, rel=1e-6)
