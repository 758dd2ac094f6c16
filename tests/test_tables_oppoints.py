"""Operating-point table: conservative quantization against the performance model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.catalog.problem import Problem, load_problem
from energyopt.perf.queueing import metrics_at
from energyopt.tables import Table, compile_table
from energyopt.tables.oppoints import op_grid

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "instances" / "compile-quickstart-oppoints.yaml"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Table, Problem]:
    out = tmp_path_factory.mktemp("ops") / "ops.eot"
    assert compile_table(SPEC, out) == "oppoints"
    return Table.open(out), load_problem(ROOT / "instances" / "quickstart.yaml")


@pytest.fixture(scope="module")
def grid(compiled: tuple[Table, Problem]):  # type: ignore[no-untyped-def]
    return op_grid(compiled[1])


def _op(grid, workload: str, gpu: str, clock: int, share: int) -> int:  # type: ignore[no-untyped-def]
    w = grid.axes[0].values.index(workload)
    t = grid.axes[1].values.index(gpu)
    c = grid.axes[2].values.index(clock)
    s = grid.axes[3].values.index(share)
    return int(grid.cell.index((w, t, c, s)))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_best_op_meets_slo_at_actual_load(compiled, grid, data) -> None:  # type: ignore[no-untyped-def]
    table, _ = compiled
    workload = data.draw(st.sampled_from(table.axes["workload"].values))
    gpu = table.axes["gpu_type"].values[0]
    top = table.axes["load"].values[-1]
    load = data.draw(st.floats(0.0, top))
    out = table.lookup(workload=workload, gpu_type=gpu, load=load)
    assert out["in_grid"]
    if out["best_clock_mhz"] < 0:
        # no op covers the rounded-up load: then none covers anything above it either
        caps = table.array("capacity_rps")[table.axes["workload"].values.index(workload)]
        assert load > caps.max() - table.meta["load_step_rps"] - 1e-9
        return
    k = _op(grid, workload, gpu, out["best_clock_mhz"], out["best_share"])
    assert grid.capacity_rps[k] >= load
    p = grid.params.take(np.asarray([k]))
    assert bool(metrics_at(p, np.asarray([load])).meets_slo(p)[0])


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_safe_add_is_safe_at_actual_load(compiled, grid, data) -> None:  # type: ignore[no-untyped-def]
    table, _ = compiled
    k = data.draw(st.integers(0, len(grid.cell) - 1))
    w, t, c, s = grid.cell[k]
    key = {
        "workload": table.axes["workload"].values[w],
        "gpu_type": table.axes["gpu_type"].values[t],
        "clock_mhz": table.axes["clock_mhz"].values[c],
        "share": table.axes["share"].values[s],
    }
    load = data.draw(st.floats(0.0, table.axes["load"].values[-1]))
    out = table.lookup(load=load, **key)
    if out["safe_add"]:
        after = load + table.meta["load_step_rps"]
        assert grid.capacity_rps[k] >= after
        p = grid.params.take(np.asarray([k]))
        assert bool(metrics_at(p, np.asarray([after])).meets_slo(p)[0])


def test_outside_grid_is_no_decision(compiled) -> None:  # type: ignore[no-untyped-def]
    table, _ = compiled
    wl, gpu = table.axes["workload"].values[0], table.axes["gpu_type"].values[0]
    for load in (1e9, float("inf"), float("nan")):
        out = table.lookup(workload=wl, gpu_type=gpu, load=load)
        assert not out["in_grid"] and out["best_clock_mhz"] == -1 and out["best_share"] == -1
    out = table.lookup(workload="nope", gpu_type=gpu, load=1.0)
    assert out["best_clock_mhz"] == -1
    many = table.lookup_many({"workload": [wl, wl], "gpu_type": [gpu, gpu], "load": [1.0, 1e9]})
    assert list(many["in_grid"]) == [True, False] and many["best_clock_mhz"][1] == -1


def test_best_is_least_power(compiled) -> None:  # type: ignore[no-untyped-def]
    table, _ = compiled
    power = table.array("power_w")  # NaN where the op does not cover the load
    best = table.array("best_power_w")
    with np.errstate(all="ignore"):
        least = np.nanmin(np.where(np.isnan(power), np.inf, power), axis=(2, 3))
    np.testing.assert_allclose(np.where(np.isinf(least), np.nan, least), best)
