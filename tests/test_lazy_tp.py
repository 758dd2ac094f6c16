"""TP columns priced each round instead of listed at the start
(``pattern.prepare(..., lazy_tp=True)``, ``colgen.tp_reduced_costs``): their reduced
costs are those of the columns ``tp_column`` builds, and column generation reaches
the LP optimum of the program that lists them all."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from energyopt.catalog import load_problem
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.formulations.columns import tp_column
from energyopt.families.serving.solvers.colgen import (
    best_per_unit,
    generate_columns,
    tp_reduced_costs,
)
from energyopt.perf.oppoints import build_op_table

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["tensor-parallel", "fleet-64", "quickstart"])
def test_priced_tp_columns_reach_the_lp_optimum_of_the_listed_ones(name: str) -> None:
    problem = load_problem(ROOT / "instances" / f"{name}.yaml")
    table = build_op_table(problem)
    listed = pat.prepare(problem, table)
    generate_columns(listed)
    lazy = pat.prepare(problem, table, lazy_tp=True)
    assert lazy.tp_ops and len(lazy.columns) < len(listed.columns)
    generate_columns(lazy)
    assert listed.lp is not None and lazy.lp is not None
    assert lazy.lp.objective == pytest.approx(listed.lp.objective, rel=1e-7)
    assert lazy.bound <= listed.lp.objective * (1 + 1e-9)
    # at the lazy LP's optimum no priced TP column prices out
    tol = -1e-6 * max(1.0, abs(lazy.lp.objective))
    for cls_index, ops in lazy.tp_ops.items():
        rc = tp_reduced_costs(lazy.classes[cls_index], table, lazy.costs, lazy.lp.duals, ops)
        for j in best_per_unit(table, ops, rc, tol):
            col = tp_column(lazy.classes[cls_index], table, lazy.costs, int(ops[j]))
            assert col.key in lazy.keys  # already a column (held at its bound)


def test_tp_reduced_costs_are_those_of_the_tp_columns() -> None:
    problem = load_problem(ROOT / "instances" / "fleet-64.yaml")
    table = build_op_table(problem)
    prog = pat.prepare(problem, table, lazy_tp=True)
    generate_columns(prog, max_rounds=2)
    assert prog.lp is not None
    duals = prog.lp.duals
    for cls_index, ops in prog.tp_ops.items():
        cls = prog.classes[cls_index]
        got = tp_reduced_costs(cls, table, prog.costs, duals, ops)
        for o, value in zip(ops.tolist(), got.tolist(), strict=True):
            col = tp_column(cls, table, prog.costs, o)
            (cap,) = col.capacity
            rate_rc = float(prog.costs.op_cost[o] - duals.demand[table.unit[o]])
            want = (
                col.on_cost
                - col.gpus_per_use * float(duals.count[cls_index])
                - float(duals.power[cls_index]) * col.worst_w
                + cap * min(0.0, rate_rc)
            )
            assert value == pytest.approx(want, rel=1e-9, abs=1e-6)


def test_best_per_unit_takes_each_units_least_reduced_cost_below_the_tolerance() -> None:
    problem = load_problem(ROOT / "instances" / "quickstart.yaml")
    table = build_op_table(problem)
    ops = np.flatnonzero(table.tp > 1)[:12].astype(np.int64)
    rc = np.linspace(-3.0, 2.0, len(ops))[::-1].copy()
    picked = best_per_unit(table, ops, rc, -0.5)
    units = table.unit[ops]
    want = []
    for u in np.unique(units):
        mine = np.flatnonzero((units == u) & (rc < -0.5))
        if mine.size:
            want.append(int(mine[np.argmin(rc[mine])]))
    assert picked == sorted(want)
