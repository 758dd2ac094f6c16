"""Column generation's pricing on Dask workers gives the serial run's columns, plan
and bound (``families/serving/solvers/dask_pricing.py``)."""

from __future__ import annotations

import importlib.util
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from energyopt.catalog.problem import Problem, resolve
from energyopt.families.serving.formulations import pattern as pat
from energyopt.families.serving.solvers.colgen import (
    SerialPricer,
    generate_columns,
    greedy_columns,
    using_pricer,
)
from energyopt.families.serving.solvers.solve import solve
from energyopt.perf.oppoints import build_op_table
from energyopt.solvers.presets import load_preset
from energyopt.spec.errors import SpecError
from energyopt.spec.instance import Instance

ROOT = Path(__file__).resolve().parents[1]


def _make_fleet() -> Any:
    spec = importlib.util.spec_from_file_location("make_fleet", ROOT / "benchmarks/make_fleet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_fleet"] = module
    spec.loader.exec_module(module)
    return module.make_fleet


@pytest.fixture(scope="module")
def fleet() -> Problem:
    """96 GPUs of three types, 40 workloads: every (type, clock) priced by knapsack."""
    data = _make_fleet()(96, 40, 3, 4, None, 0.6, ["H100-SXM5-80GB", "A100-SXM4-80GB", "L40S"])
    return resolve(Instance.model_validate(data), "fleet-96")


@pytest.fixture(scope="module")
def pricer() -> Any:
    pytest.importorskip("distributed")
    from energyopt.families.serving.solvers.dask_pricing import DaskPricer

    with DaskPricer("local:2", min_items=0) as p:
        yield p


def _columns(problem: Problem, pricer: Any) -> pat.PatternProgram:
    prog = pat.prepare(problem, build_op_table(problem))
    generate_columns(prog, pricer=pricer)
    return prog


def test_dask_pricing_generates_the_serial_columns_and_bound(fleet: Problem, pricer: Any) -> None:
    serial = _columns(fleet, SerialPricer())
    assert serial.knapsacks and not serial.configs
    remote = _columns(fleet, pricer)
    assert [c.key for c in remote.columns] == [c.key for c in serial.columns]
    assert remote.rounds == serial.rounds > 1
    assert remote.bound == serial.bound
    assert remote.lp is not None and serial.lp is not None
    assert remote.lp.objective == serial.lp.objective
    assert np.array_equal(remote.lp.x, serial.lp.x)


def test_dask_solve_gives_the_serial_plan_and_bound(fleet: Problem, pricer: Any) -> None:
    preset = load_preset("colgen")
    # An effort-bound run (no time cut): the same work in either process.
    local = solve(fleet, preset, time_limit_s=600)
    with using_pricer(pricer):
        remote = solve(fleet, preset, time_limit_s=600)
    assert local.plan is not None and remote.plan is not None
    assert remote.objective == local.objective
    assert remote.bound == local.bound
    assert remote.plan.model_dump(exclude={"wall_s"}) == local.plan.model_dump(exclude={"wall_s"})


@pytest.mark.filterwarnings("error::UserWarning")
def test_solve_on_a_small_fleet_prices_in_process_with_the_serial_result(
    fleet: Problem,
) -> None:
    """Pricing on a LocalCluster gives the serial plan and bound, also while Dask's
    default dashboard port (8787) is taken: the cluster neither warns nor needs it."""
    pytest.importorskip("distributed")
    preset = load_preset("colgen")
    local = solve(fleet, preset, time_limit_s=600)
    with socket.socket() as held:
        try:
            held.bind(("", 8787))
            held.listen()
        except OSError:
            pass  # taken already, as the test wants
        remote = solve(fleet, preset, time_limit_s=600, scheduler="local:1")
    assert remote.plan is not None and local.plan is not None
    assert (remote.objective, remote.bound) == (local.objective, local.bound)


def test_local_scheduler_needs_a_worker_count() -> None:
    pytest.importorskip("distributed")
    from energyopt.families.serving.solvers.dask_pricing import local_workers

    assert local_workers("local:3") == 3
    assert local_workers("tcp://127.0.0.1:8786") is None
    for bad in ("local:", "local:0", "local:two"):
        with pytest.raises(SpecError, match="local:N"):
            local_workers(bad)


def test_unreachable_scheduler_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("distributed")
    from energyopt.families.serving.solvers import dask_pricing

    monkeypatch.setattr(dask_pricing, "DASK_CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(SpecError, match="cannot connect"):
        dask_pricing.DaskPricer("tcp://127.0.0.1:9")


def test_greedy_columns_grow_with_the_units(fleet: Problem) -> None:
    prog = pat.prepare(fleet, build_op_table(fleet))
    ks = next(iter(prog.knapsacks.values()))
    assert greedy_columns(ks) == 8  # 40 units: the fixed count
    assert greedy_columns(replace(ks, units=np.arange(1024))) == 8  # still the fixed count
    assert greedy_columns(replace(ks, units=np.arange(2560))) == 640  # one per 4 units
