"""Keep-alive files at the edges of their size limits, and the --catalog option:
each a finding of a fuzz run, kept as a regression test.

- 1,000 nodes (4 functions, 12 windows): the move energies were held for every
  pair of states (9 M per function) and ``auto`` built the whole MILP only to
  count its columns, a MemoryError; moves between nodes are now priced through
  one entering cost per state, and the MILP's are counted without building it.
- 10,080 windows: the repair ran its dynamic programme to the end whatever the
  time limit, and ``rolling`` started one more MILP after the limit for each of
  its 2,016 steps; both now stop at the deadline.
- ``--catalog`` was ignored for keep-alive files (a missing or broken catalog
  file passed ``validate`` and ``show``); the CLI now reads every ``--catalog``
  whatever the kind.
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, main
from energyopt.families import certify, family
from energyopt.families.keepalive.formulations.milp import MAX_COLUMNS, build_milp, milp_columns
from energyopt.families.keepalive.formulations.model import build_problem
from energyopt.families.keepalive.solvers.lagrangian import solve_lagrangian
from energyopt.families.keepalive.solvers.milp import solve_milp, solve_rolling
from energyopt.families.keepalive.solvers.programmes import (
    OutOfTime,
    Prices,
    one_function,
    priced_costs,
)
from energyopt.families.keepalive.spec import KeepAliveFile
from energyopt.families.keepalive.verify import evaluate_keepalive
from energyopt.solvers.result import NO_SOLUTION, OPTIMAL, Termination
from energyopt.spec.errors import SpecError
from energyopt.spec.io import parse
from energyopt.spec.limits import Limits, using
from tests.keepalive_exhaustive import random_doc

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "instances" / "keepalive" / "azure-llm-2nodes.yaml"
FAMILY = family("keepalive")


def _bundled() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(BUNDLED.read_text())
    return data


def _many_nodes(count: int) -> dict[str, Any]:
    doc = _bundled()
    doc["nodes"] = [dict(doc["nodes"][0], name=f"n{i}") for i in range(count)]
    return doc


def _long(windows: int) -> dict[str, Any]:
    doc = _bundled()
    doc["window_s"] = 60.0
    rng = random.Random(1)
    for fn in doc["functions"]:
        fn["arrivals"] = [rng.randint(0, 12) for _ in range(windows)]
    return doc


def test_a_thousand_nodes_solve_with_the_default_solver() -> None:
    p = build_problem(KeepAliveFile.model_validate(_many_nodes(1000)))
    assert milp_columns(p) < MAX_COLUMNS  # the MILP's moves between nodes pass a hub
    res = FAMILY.solve(p, "auto", time_limit_s=60, rel_gap=1e-6, progress=lambda _: None)
    certify(FAMILY, p, res, 1e-6, lambda _: None)
    assert res.plan is not None and res.bound is not None and res.objective is not None
    ev = evaluate_keepalive(p.spec, res.plan)
    assert ev.violations == [] and res.objective == pytest.approx(ev.energy_j, rel=1e-9)
    # a node each is room enough: the prices stay at zero and every function's own
    # cheapest path is the optimum, which the bound proves
    assert res.bound == pytest.approx(res.objective, rel=1e-9)
    two = build_problem(KeepAliveFile.model_validate(_bundled()))
    exact = FAMILY.solve(two, "milp", time_limit_s=60, rel_gap=1e-9, progress=lambda _: None)
    assert exact.objective is not None and res.objective <= exact.objective * (1 + 1e-9)


def test_the_hub_formulation_and_the_column_count_agree_with_the_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Columns counted without building equal those built; the random instances
    have functions whose moves between nodes pass the hub and functions whose do
    not (resuming dearer than loading: the hub would let them evict and reload
    on their own node); and on the bundled instance the MILP through the hub has
    the optimum of the MILP with a column for every pair of states."""
    rng = random.Random(4)
    hubbed = dense = 0
    for _ in range(60):
        p = build_problem(KeepAliveFile.model_validate(random_doc(rng)))
        assert milp_columns(p) == len(build_milp(p))
        if p.n_nodes > 1:
            hubbed += int(p.cross_node_exact().sum())
            dense += int((~p.cross_node_exact()).sum())
    assert hubbed > 0 and dense > 0
    doc = _bundled()
    doc["functions"][0]["tepid"]["resume_j"] = 5000.0  # dearer than a cold start
    p = build_problem(KeepAliveFile.model_validate(doc))
    assert not p.cross_node_exact()[0] and p.cross_node_exact()[1:].all()
    p = build_problem(KeepAliveFile.model_validate(_bundled()))
    through_hub, hub_columns = solve_milp(p, rel_gap=1e-9), milp_columns(p)
    monkeypatch.setattr(
        type(p), "cross_node_exact", lambda self: np.zeros(self.n_functions, dtype=bool)
    )
    every_pair = solve_milp(p, rel_gap=1e-9)
    assert len(build_milp(p)) == milp_columns(p) > hub_columns
    assert through_hub.status == every_pair.status == OPTIMAL
    assert through_hub.objective == pytest.approx(every_pair.objective, rel=1e-9)


def test_a_week_of_minutes_plans_through_the_lagrangian_repair() -> None:
    """10,080 windows: the first repair's plan verifies, its stated energy is its
    own and the bound is below it."""
    p = build_problem(KeepAliveFile.model_validate(_long(10_080)))
    res = solve_lagrangian(p, time_limit_s=600, max_iterations=1)
    assert res.plan is not None and res.objective is not None and res.bound is not None
    ev = evaluate_keepalive(p.spec, res.plan)
    assert ev.violations == [] and res.objective == pytest.approx(ev.energy_j, rel=1e-9)
    assert res.bound <= res.objective


def test_the_solvers_stop_at_the_time_limit_on_a_long_horizon() -> None:
    """With the limit already spent, the repair's programme gives up (it used to run
    to its end), the Lagrangian says why it has no plan and keeps its bound, and
    rolling names how far it got instead of starting one MILP per step."""
    p = build_problem(KeepAliveFile.model_validate(_long(10_080)))
    cost, factor = priced_costs(p, Prices.zero(p))
    room = np.full((p.n_nodes, p.n_windows), np.inf)
    with pytest.raises(OutOfTime):
        one_function(p, 0, cost[0], factor, room, room, room, 1e9, time.perf_counter())
    lag = solve_lagrangian(p, time_limit_s=1e-9)
    assert lag.plan is None and lag.status == NO_SOLUTION
    assert lag.termination == Termination.TIME_LIMIT and lag.bound is not None
    assert "time limit" in " ".join(lag.diagnosis)
    rolled = solve_rolling(p, time_limit_s=1e-9)
    assert rolled.plan is None and rolled.termination == Termination.TIME_LIMIT
    assert "windows planned" in " ".join(rolled.diagnosis)


def test_an_exact_solver_too_large_to_build_is_refused_by_name(tmp_path: Path) -> None:
    """Eight functions on 1,000 nodes: each of rolling's MILPs (here the whole
    horizon) would have 1.3 M columns; milp and rolling refuse, naming the way out,
    and auto goes to the Lagrangian; the throughput objective, which only milp
    solves, is refused too."""
    doc = _many_nodes(1000)
    doc["functions"] = [
        dict(copy.deepcopy(fn), name=f"{fn['name']}-{k}")
        for k in range(2)
        for fn in doc["functions"]
    ]
    p = build_problem(KeepAliveFile.model_validate(doc))
    assert milp_columns(p) > MAX_COLUMNS
    for solver in ("milp", "rolling"):
        with pytest.raises(SpecError, match=rf"--solver: {solver} would build .* lagrangian"):
            FAMILY.solve(p, solver, time_limit_s=10, rel_gap=None, progress=lambda _: None)
    doc["objective"] = {"kind": "throughput"}
    p = build_problem(KeepAliveFile.model_validate(doc))
    with pytest.raises(SpecError, match="solved by milp only"):
        FAMILY.solve(p, "auto", time_limit_s=10, rel_gap=None, progress=lambda _: None)


def test_the_size_limit_refuses_a_file_naming_the_field_and_the_flag(tmp_path: Path) -> None:
    doc = _many_nodes(1000)
    doc["functions"] = [
        dict(copy.deepcopy(doc["functions"][i % 4]), name=f"f{i}") for i in range(300)
    ]
    source = str(tmp_path / "big.yaml")
    with pytest.raises(SpecError) as info:
        parse(KeepAliveFile, doc, source)
    assert f"{source}: functions:" in str(info.value)
    assert "--limit keepalive_cells=" in str(info.value)
    with using(Limits(keepalive_cells=20_000_000)):
        parse(KeepAliveFile, doc, source)


@pytest.mark.parametrize("verb", ["validate", "show", "solve"])
def test_a_missing_or_broken_catalog_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], verb: str
) -> None:
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("gpus: 3\n")
    valid = tmp_path / "valid.yaml"
    valid.write_text("gpus: []\nmodels: []\n")
    extra = ["-q"] if verb == "solve" else []
    for catalog in (tmp_path / "missing.yaml", garbage):
        code = main([verb, str(BUNDLED), "--catalog", str(catalog), *extra])
        err = capfd.readouterr().err
        assert code == EXIT_BAD_INPUT and f"--catalog {catalog}: {catalog}" in err, err
    if verb != "solve":
        assert main([verb, str(BUNDLED), "--catalog", str(valid)]) == EXIT_OK
