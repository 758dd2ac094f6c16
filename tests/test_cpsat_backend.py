"""The CP-SAT backend's two discretizations against HiGHS on random small MILPs:
the plan (restriction) is feasible for the exact model and costs no less than its
optimum; the bound (relaxation) is never above the optimum; a relaxation proven
infeasible means the exact model is infeasible."""

from __future__ import annotations

import math

import pyomo.environ as pyo
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.backends.cpsat import solve_cpsat
from energyopt.backends.pyomo_highs import solve_milp

coef = st.floats(min_value=-9.0, max_value=9.0, allow_nan=False).map(lambda c: round(c, 3))


@st.composite
def milps(draw: st.DrawFn) -> pyo.ConcreteModel:
    """A bounded MILP: integer and continuous variables, <=, >= and == rows with
    fractional coefficients, objective coefficients of either sign."""
    n_int = draw(st.integers(1, 3))
    n_cont = draw(st.integers(1, 4))
    m = pyo.ConcreteModel()
    m.z = pyo.Var(range(n_int), domain=pyo.NonNegativeIntegers, bounds=(0, 4))
    ubs = draw(st.lists(st.floats(0.5, 20.0), min_size=n_cont, max_size=n_cont))
    m.x = pyo.Var(range(n_cont), domain=pyo.NonNegativeReals, bounds=lambda _, j: (0, ubs[j]))
    m.rows = pyo.ConstraintList()
    for _ in range(draw(st.integers(1, 4))):
        a = draw(st.lists(coef, min_size=n_int, max_size=n_int))
        b = draw(st.lists(coef, min_size=n_cont, max_size=n_cont))
        rhs = round(draw(st.floats(-10.0, 30.0)), 3)
        body = sum(a[i] * m.z[i] for i in range(n_int)) + sum(b[j] * m.x[j] for j in range(n_cont))
        sense = draw(st.sampled_from(["<=", ">=", "=="]))
        if sense == "<=":
            m.rows.add(body <= rhs)
        elif sense == ">=":
            m.rows.add(body >= rhs)
        else:
            m.rows.add(body == rhs)
    c_int = draw(st.lists(coef, min_size=n_int, max_size=n_int))
    c_cont = draw(st.lists(coef, min_size=n_cont, max_size=n_cont))
    m.obj = pyo.Objective(
        expr=sum(c_int[i] * m.z[i] for i in range(n_int))
        + sum(c_cont[j] * m.x[j] for j in range(n_cont))
        + 3.0
    )
    return m


def violation(model: pyo.ConcreteModel) -> float:
    """Largest violation of a row or a bound at the loaded values."""
    worst = 0.0
    for con in model.component_data_objects(pyo.Constraint, active=True):
        value = float(pyo.value(con.body))
        if con.has_ub():
            worst = max(worst, value - float(pyo.value(con.upper)))
        if con.has_lb():
            worst = max(worst, float(pyo.value(con.lower)) - value)
    for var in model.component_data_objects(pyo.Var):
        worst = max(worst, float(var.lb) - float(var.value), float(var.value) - float(var.ub))
        if var.is_integer():
            worst = max(worst, abs(float(var.value) - round(float(var.value))))
    return worst


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(milps())
def test_plan_is_feasible_and_bound_is_below_the_optimum(model: pyo.ConcreteModel) -> None:
    exact = solve_milp(model.clone(), rel_gap=1e-9)
    out = solve_cpsat(model, time_limit_s=10, rel_gap=1e-9, threads=1)
    if exact.status == "infeasible":
        assert out.objective is None
        return
    assert exact.status == "optimal" and exact.objective is not None
    opt = exact.objective
    tol = 1e-6 * max(1.0, abs(opt))
    if out.status == "infeasible":
        pytest.fail(f"CP-SAT called a feasible model (optimum {opt}) infeasible")
    if out.objective is not None:
        assert violation(model) <= 1e-6
        assert out.objective == pytest.approx(float(pyo.value(model.obj)), abs=1e-9)
        assert out.objective >= opt - tol
    if out.bound is not None:
        assert out.bound <= opt + tol, (out.bound, opt, out.log)


def _fractional() -> pyo.ConcreteModel:
    """A MILP whose optimum (x summing to pi) lies off the restriction's grid."""
    m = pyo.ConcreteModel()
    m.x = pyo.Var(range(3), domain=pyo.NonNegativeReals, bounds=(0, 10))
    m.z = pyo.Var(range(3), domain=pyo.Binary)
    m.rows = pyo.ConstraintList()
    for j in range(3):
        m.rows.add(m.x[j] <= (2.0 + j / 3) * m.z[j])
    m.rows.add(sum(m.x[j] for j in range(3)) == math.pi)
    m.obj = pyo.Objective(expr=sum((1 + j) * m.x[j] + 0.5 * m.z[j] for j in range(3)))
    return m


def _infeasible_off_the_grid() -> pyo.ConcreteModel:
    """Infeasible (x >= 1.75 but x <= 1.7 z), which only the relaxation proves."""
    m = pyo.ConcreteModel()
    m.x = pyo.Var(domain=pyo.NonNegativeReals, bounds=(0, 3.3))
    m.z = pyo.Var(domain=pyo.Binary)
    m.cap = pyo.Constraint(expr=m.x <= 1.7 * m.z)
    m.need = pyo.Constraint(expr=m.x >= 1.75)
    m.obj = pyo.Objective(expr=m.x + m.z)
    return m


def test_relaxation_proves_infeasibility() -> None:
    m = _infeasible_off_the_grid()
    out = solve_cpsat(m, time_limit_s=5, threads=1)
    assert out.status == "infeasible" and out.objective is None


def test_bound_closes_the_gap_on_a_fractional_optimum() -> None:
    """An optimum off the restriction's grid: the plan is within a step of it and
    the relaxation's bound proves it to far better than the step."""
    m = _fractional()
    exact = solve_milp(m.clone(), rel_gap=1e-9)
    assert exact.objective is not None
    out = solve_cpsat(m, time_limit_s=5, rel_gap=1e-9, threads=1)
    assert out.objective is not None and out.bound is not None
    assert out.bound <= exact.objective + 1e-9 <= out.objective + 2e-9
    assert out.objective - out.bound <= 1e-4 * exact.objective


def test_negative_variables_get_no_bound() -> None:
    m = pyo.ConcreteModel()
    m.x = pyo.Var(domain=pyo.Reals, bounds=(-2.0, 2.0))
    m.z = pyo.Var(domain=pyo.Binary)
    m.row = pyo.Constraint(expr=m.x + m.z >= 0.25)
    m.obj = pyo.Objective(expr=m.x + m.z)
    out = solve_cpsat(m, time_limit_s=5, threads=1)
    assert out.objective is not None and out.bound is None
    assert any("relaxation not built" in line for line in out.log)


def test_without_a_bound_the_plan_is_the_same_and_nothing_is_claimed() -> None:
    """``bound=False`` (a caller that does not read the bound): the same plan, no
    relaxation solved, no bound, and a model infeasible on the grid is 'no
    solution', never 'infeasible' (only the relaxation can prove that)."""
    m = _fractional()
    with_bound = solve_cpsat(m.clone(), time_limit_s=5, rel_gap=1e-9, threads=1)
    out = solve_cpsat(m, time_limit_s=5, rel_gap=1e-9, threads=1, bound=False)
    assert out.status == "feasible" and out.bound is None
    assert out.objective == pytest.approx(with_bound.objective, rel=1e-9)
    assert not any("relaxation" in line for line in out.log)

    none = solve_cpsat(_infeasible_off_the_grid(), time_limit_s=5, threads=1, bound=False)
    assert none.status == "no_solution" and none.objective is None and none.bound is None


def test_a_feasible_model_highs_presolve_calls_infeasible_is_solved() -> None:
    """HiGHS 1.16's presolve declared this MILP infeasible although x = z = 0 meets
    every row (found by the property test above); the Pyomo backend takes an
    infeasibility claim only once HiGHS repeats it without presolve."""
    ubs = [1.0, 2.0, 3.0, 1.0]
    m = pyo.ConcreteModel()
    m.z = pyo.Var([0], domain=pyo.NonNegativeIntegers, bounds=(0, 4))
    m.x = pyo.Var(range(4), domain=pyo.NonNegativeReals, bounds=lambda _, j: (0, ubs[j]))
    x, z = m.x, m.z[0]
    m.r1 = pyo.Constraint(expr=3.0 * x[0] - 2.0 * x[1] + x[3] - z == 0)
    m.r2 = pyo.Constraint(expr=-x[0] + x[2] - x[3] >= 0)
    m.r3 = pyo.Constraint(expr=x[0] - x[1] + x[2] + z == 0)
    m.obj = pyo.Objective(expr=0.0 * x[0] + 3.0)
    out = solve_milp(m, rel_gap=1e-9)
    assert out.status == "optimal" and out.objective == pytest.approx(3.0)
    assert violation(m) <= 1e-9

