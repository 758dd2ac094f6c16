"""Plan table: compile on a tiny instance equals direct solves; resume skips cells."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from energyopt.catalog.problem import load_problem
from energyopt.cli import main
from energyopt.solvers.presets import load_preset
from energyopt.solvers.serving import solve
from energyopt.spec.errors import SpecError
from energyopt.tables import Table, compile_table
from energyopt.tables import plans as plans_mod

INSTANCE = """
name: tiny
cluster:
  nodes:
    - name: n0
      gpus: [{type: H100-SXM5-80GB, count: 2}]
workloads:
  - name: chat
    model: Llama-3.1-8B
    rate_rps: 6
    prompt_tokens: {mean: 512}
    output_tokens: {mean: 128}
    slo: {ttft_ms: 600, tbt_ms: 60}
options:
  clock_count: 3
  sharing: {mode: mps, levels_pct: [50, 100]}
"""
SPEC = """
kind: plans
base: tiny.yaml
load_scale: [0.5, 1.0]
solver: highs-exact
time_limit_s: 20
"""


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(INSTANCE)
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def test_compile_equals_direct_solves(spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "plans.eot"
    assert main(["compile", str(spec), "-o", str(out), "-q"]) == 0
    table = Table.open(out)
    base = load_problem(tmp_path / "tiny.yaml")
    for scale in (0.5, 1.0):
        problem = plans_mod.scaled_problem(base, {"chat": scale})
        direct = solve(problem, load_preset("highs-exact"), time_limit_s=20)
        assert direct.plan is not None and direct.objective is not None
        got = table.lookup(load_scale=scale)
        assert got["status"] == 0
        assert got["objective"] == pytest.approx(direct.objective, rel=1e-6)
        served = 0.0
        for g in direct.plan.gpus:
            row = table.lookup(load_scale=scale, gpu=g.gpu, unit="chat")
            assert row["on"] == g.on
            assert row["clock_mhz"] == (g.clock_mhz if g.clock_mhz is not None else -1)
            served += row["rate_rps"]
        assert served == pytest.approx(6 * scale, rel=1e-6)
    # conservative: 0.7 rounds up to the 1.0 cell; above the grid: no decision
    assert table.lookup(load_scale=0.7)["objective"] == table.lookup(load_scale=1.0)["objective"]
    assert table.lookup(load_scale=1.5)["status"] == -1
    many = table.lookup_many({"load_scale": np.asarray([0.1, 0.5, 0.9, 2.0])})
    assert list(many["status"]) == [0, 0, 0, -1]


def test_resume_skips_finished_cells(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "plans.eot"
    compile_table(spec, out)
    first = Table.open(out).array("objective").copy()
    cells = plans_mod.cells_dir(out)
    (cells / "cell-1.json").unlink()
    out.unlink()
    calls: list[dict[str, float]] = []
    real = plans_mod.solve_cell

    def counting(base: str, change: dict[str, Any], *args: Any) -> dict[str, Any]:
        calls.append(change["scales"])
        return real(base, change, *args)

    monkeypatch.setattr(plans_mod, "solve_cell", counting)
    lines: list[str] = []
    compile_table(spec, out, say=lines.append)
    assert calls == [{"chat": 1.0}]
    assert any("resuming: 1 of 2" in line for line in lines)
    np.testing.assert_allclose(Table.open(out).array("objective"), first)


def test_changed_spec_refuses_stale_cells(spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "plans.eot"
    plans_mod.cells_dir(out).mkdir()
    (plans_mod.cells_dir(out) / "fingerprint").write_text("something else\n")
    with pytest.raises(SpecError, match="different spec"):
        compile_table(spec, out)


def test_dask_local_cluster_gives_the_same_table_as_local_processes(
    spec: Path, tmp_path: Path
) -> None:
    distributed = pytest.importorskip("distributed")
    local = tmp_path / "local.eot"
    compile_table(spec, local, workers=2)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        remote = tmp_path / "dask.eot"
        compile_table(spec, remote, scheduler=cluster.scheduler_address)
    a, b = Table.open(local), Table.open(remote)
    for scale in (0.5, 1.0):
        ra, rb = a.lookup(load_scale=scale), b.lookup(load_scale=scale)
        assert ra["status"] == rb["status"] == 0
        assert ra["objective"] == pytest.approx(rb["objective"], rel=1e-9)
        for gpu in ("n0/0", "n0/1"):
            ga = a.lookup(load_scale=scale, gpu=gpu, unit="chat")
            gb = b.lookup(load_scale=scale, gpu=gpu, unit="chat")
            assert ga["clock_mhz"] == gb["clock_mhz"] and ga["on"] == gb["on"]
            assert ga["rate_rps"] == pytest.approx(gb["rate_rps"], rel=1e-9)


def test_unreachable_scheduler_is_a_clear_error(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("distributed")
    monkeypatch.setattr(plans_mod, "DASK_CONNECT_TIMEOUT_S", 1.0)
    with pytest.raises(SpecError, match="cannot connect"):
        compile_table(spec, tmp_path / "x.eot", scheduler="tcp://127.0.0.1:9")
