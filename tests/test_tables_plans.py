"""Plan table: compile on a tiny instance equals direct solves; resume skips cells."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.catalog.problem import load_problem
from energyopt.cli import main
from energyopt.families.serving import tables as plans_mod
from energyopt.families.serving.planners import TablePlanner
from energyopt.families.serving.solvers.solve import solve
from energyopt.families.serving.tables import compile_table
from energyopt.perf.forward import decode_pass
from energyopt.perf.queueing import decode_context, metrics_at
from energyopt.solvers.presets import load_preset
from energyopt.spec.errors import SpecError
from energyopt.spec.evaluation import PlannerSpec
from energyopt.spec.plan import Plan
from energyopt.tables import Axis, ColumnData, Table, write_table
from energyopt.tables import local as local_mod
from energyopt.tables.spec import load_compile_spec
from energyopt.tables.variants import variant

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


def test_cells_and_tables_of_another_plans_version_are_refused(
    spec: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plans priced by an earlier power model are never mixed in: finished cells of
    another plans version fail the fingerprint, and the table planner refuses a
    table without this version, naming the file."""
    compile_spec, base = load_compile_spec(spec)
    now = plans_mod.fingerprint(compile_spec, base)
    out = tmp_path / "plans.eot"
    plans_mod._open_cells_dir(out, now)
    monkeypatch.setattr(plans_mod, "VERSION", plans_mod.VERSION + 1)
    later = plans_mod.fingerprint(compile_spec, base)
    assert later != now
    with pytest.raises(SpecError, match="plans version"):
        plans_mod._open_cells_dir(out, later)
    monkeypatch.undo()
    problem = load_problem(base)
    axes = [
        Axis("load_scale", "ceil", (1.0,)),
        Axis("gpu", "category", tuple(g.id for g in problem.gpus)),
        Axis("unit", "category", ("chat",)),
    ]
    status = {"status": ColumnData(np.zeros(1), ("load_scale",), "<i8", -1)}
    planner = PlannerSpec(name="lookup", kind="table", table="old.eot")
    old = tmp_path / "old.eot"
    write_table(old, "plans", axes, status, {})
    with pytest.raises(SpecError, match="compile it again") as err:
        TablePlanner(planner, problem, old)
    assert str(old) in str(err.value)
    current = tmp_path / "current.eot"
    write_table(current, "plans", axes, status, {"plans_version": plans_mod.VERSION})
    TablePlanner(planner, problem, current)


def test_dask_local_cluster_gives_the_same_table_as_local_processes(
    spec: Path, tmp_path: Path
) -> None:
    distributed = pytest.importorskip("distributed")
    local = tmp_path / "local.eot"
    compile_table(spec, local)
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


PHASED = """
name: phased
cluster:
  nodes:
    - name: n0
      gpus: [{type: H100-SXM5-80GB, count: 2}]
workloads:
  - name: chat
    model: Llama-3.1-8B
    rate_rps: 6
    prompt_tokens: {mean: 1500}
    output_tokens: {mean: 128}
    slo: {ttft_ms: 900, tbt_ms: 60}
  - name: summ
    model: Llama-3.1-8B
    rate_rps: 2
    prompt_tokens: {mean: 2048}
    output_tokens: {mean: 256}
    slo: {ttft_ms: 900, tbt_ms: 50}
    disaggregated: true
options:
  clock_count: 3
  sharing: {mode: mps, levels_pct: [25, 50, 100]}
"""
PHASED_SPEC = """
kind: plans
base: phased.yaml
load_scale: [1.0]
slo_tiers: [{name: tight, ttft_scale: 0.8, tbt_scale: 0.5}, {name: base}]
gpu_types: [H100-SXM5-80GB, A100-SXM4-80GB]
solver: highs-exact
time_limit_s: 20
"""


@pytest.fixture(scope="module")
def phased(tmp_path_factory: pytest.TempPathFactory) -> tuple[Table, Path]:
    folder = tmp_path_factory.mktemp("phased")
    (folder / "phased.yaml").write_text(PHASED)
    (folder / "spec.yaml").write_text(PHASED_SPEC)
    compile_table(folder / "spec.yaml", folder / "plans.eot", workers=2)
    return Table.open(folder / "plans.eot"), folder


def _cells(table: Table) -> list[tuple[str, str]]:
    return [(t, g) for t in table.axes["slo_tier"].values for g in table.axes["gpu_type"].values]


@pytest.fixture(scope="module")
def solved(phased: tuple[Table, Path]) -> dict[tuple[str, str], Any]:
    """Per solved cell: its problem, placements, op params (with the table's prefill
    budget) and planned rates."""
    table, folder = phased
    tiers = {t.name: t for t in load_compile_spec(folder / "spec.yaml")[0].slo_tiers}
    base = load_problem(folder / "phased.yaml")
    out = {}
    for n, (tier, gpu_type) in enumerate(_cells(table)):
        record = json.loads(
            (plans_mod.cells_dir(folder / "plans.eot") / f"cell-{n}.json").read_text()
        )
        if record["plan"] is None:
            continue
        problem = variant(base, tier=tiers[tier], gpu_type=gpu_type)
        placed, params, rates = local_mod.placed_ops(problem, Plan.model_validate(record["plan"]))
        key = {"slo_tier": tier, "gpu_type": gpu_type, "load_scale": 1.0}
        rows = [table.lookup(**key, gpu=op.gpu, unit=op.label) for op in placed]
        budget = np.asarray([float(r["prefill_tokens"]) for r in rows])
        params = params.replace(
            chunk_tokens=np.where(params.phase == 0, budget, params.chunk_tokens)
        )
        out[(tier, gpu_type)] = (problem, placed, params, rates, rows)
    return out


def test_tier_and_type_cells_equal_direct_solves(phased: tuple[Table, Path]) -> None:
    table, folder = phased
    tiers = {t.name: t for t in load_compile_spec(folder / "spec.yaml")[0].slo_tiers}
    base = load_problem(folder / "phased.yaml")
    for tier, gpu_type in (("tight", "H100-SXM5-80GB"), ("base", "A100-SXM4-80GB")):
        problem = variant(base, tier=tiers[tier], gpu_type=gpu_type)
        direct = solve(problem, load_preset("highs-exact"), time_limit_s=20)
        got = table.lookup(slo_tier=tier, gpu_type=gpu_type, load_scale=1.0)
        assert got["status"] == plans_mod.STATUS_CODES[direct.status]
        if direct.objective is not None:
            assert got["objective"] == pytest.approx(direct.objective, rel=1e-6)
    objective = table.array("objective")  # (tier, type, load)
    both = ~np.isnan(objective[0]) & ~np.isnan(objective[1])
    # the tight tier never costs less than the base one, and it changes some cell
    assert np.all(objective[0][both] >= objective[1][both] * (1 - 1e-4))
    assert not np.array_equal(objective[0], objective[1], equal_nan=True)


def test_local_decisions_keep_the_slo_and_are_the_largest_that_do(
    solved: dict[tuple[str, str], Any],
) -> None:
    checked = 0
    for problem, placed, params, rates, rows in solved.values():
        m = metrics_at(params, rates)
        assert bool(np.all(m.meets_slo(params)))  # the budgets keep both SLOs
        used: dict[str, float] = {}
        for op, mem in zip(placed, m.memory_bytes.tolist(), strict=True):
            used[op.gpu] = used.get(op.gpu, 0.0) + mem
        for i, (op, row) in enumerate(zip(placed, rows, strict=True)):
            assert row["share_pct"] == op.placement.share_pct
            assert row["ttft_ms"] == pytest.approx(float(m.ttft_ms[i]))
            p = params.take(np.asarray([i]))
            if op.placement.phase == "prefill":
                assert row["batch_limit"] == 0 and row["decode_share_pct"] == 0
                assert row["prefill_tokens"] == math.ceil(p.prompt_tokens[0])
                continue
            if op.placement.phase == "decode":
                assert row["prefill_tokens"] == 0 and row["prefill_share_pct"] == 0
            else:
                assert row["prefill_tokens"] >= min(512, p.prompt_tokens[0])
            ctx = decode_context(p)
            stall = (
                float(m.tbt_ms[i]) - decode_pass(p, np.maximum(m.batch[i : i + 1], 1.0), ctx).ms[0]
            )
            n = row["batch_limit"]

            def step(k: float, p: Any = p, ctx: Any = ctx) -> float:
                return float(decode_pass(p, np.asarray([k]), ctx).ms[0])

            assert n >= math.floor(float(m.batch[i]))  # never throttles the planned rate
            assert step(n) + stall <= p.tbt_slo_ms[0]  # safe
            others = used[op.gpu] - float(m.memory_bytes[i])
            kv = (n + 1) * (p.prompt_tokens[0] + p.output_tokens[0]) * p.kv_bytes_per_token[0]
            memory_full = (p.weight_bytes[0] + kv) / p.tp[0] > op.available_gb * 1e9 - others
            assert (
                step(n + 1) + stall > p.tbt_slo_ms[0]
                or n == problem.instance.options.max_batch
                or memory_full
            )  # largest
            checked += 1
    assert checked >= 3


@settings(max_examples=30, deadline=None)
@given(x=st.floats(0.01, 1.0))
def test_a_lookup_at_a_lower_load_meets_every_slo(
    phased: tuple[Table, Path], solved: dict[tuple[str, str], Any], x: float
) -> None:
    table, _ = phased
    for (tier, gpu_type), (_, placed, params, rates, _) in solved.items():
        # x rounds up to the 1.0 cell, whose plan then serves x times its rates
        key = {"slo_tier": tier, "gpu_type": gpu_type, "load_scale": x}
        assert table.lookup(**key)["status"] == 0
        for op in placed:
            assert table.lookup(**key, gpu=op.gpu, unit=op.label)["share_pct"] > 0
        assert bool(np.all(metrics_at(params, rates * x).meets_slo(params)))
