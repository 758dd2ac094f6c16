"""Operating-point table: conservative quantization against the performance model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyopt.catalog.problem import Problem, load_problem
from energyopt.families.serving.tables import compile_table
from energyopt.online import OpLookups
from energyopt.perf.energy import LINE_LOW_ANCHOR, steady_power_w
from energyopt.perf.queueing import metrics_at
from energyopt.tables import SloTier, Table, TableError, write_table
from energyopt.tables.oppoints import build_oppoint_columns, op_grid
from energyopt.tables.variants import one_gpu_per_type, variant

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


TIERED = """
kind: oppoints
base: {base}
load_points: 17
slo_tiers:
  - {{name: strict, ttft_scale: 0.7, tbt_scale: 0.6}}
  - {{name: standard}}
gpu_types: [H100-SXM5-80GB, A100-SXM4-80GB]
"""


@pytest.fixture(scope="module")
def tiered(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder = tmp_path_factory.mktemp("tiered")
    spec = folder / "spec.yaml"
    spec.write_text(TIERED.format(base=ROOT / "instances" / "quickstart.yaml"))
    compile_table(spec, folder / "ops.eot")
    table = Table.open(folder / "ops.eot")
    base = one_gpu_per_type(
        load_problem(ROOT / "instances" / "quickstart.yaml"), table.axes["gpu_type"].values
    )
    tiers = {t["name"]: SloTier.model_validate(t) for t in table.meta["slo_tiers"]}
    return table, {name: op_grid(variant(base, tier=t)) for name, t in tiers.items()}


def _covers(grid, k: int, load: float) -> bool:  # type: ignore[no-untyped-def]
    p = grid.params.take(np.asarray([k]))
    return bool(grid.capacity_rps[k] >= load and metrics_at(p, np.asarray([load])).meets_slo(p)[0])


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_placing_on_a_busy_gpu_is_safe_at_the_actual_state(tiered, data) -> None:  # type: ignore[no-untyped-def]
    table, grids = tiered
    tier = data.draw(st.sampled_from(table.axes["slo_tier"].values))
    wl = data.draw(st.sampled_from(table.axes["workload"].values))
    gpu = data.draw(st.sampled_from(table.axes["gpu_type"].values))
    clock = data.draw(st.sampled_from(table.axes["clock_mhz"].values))
    used = data.draw(st.floats(0.0, 100.0))
    load = data.draw(st.floats(0.0, table.axes["load"].values[-1]))
    out = table.lookup(
        slo_tier=tier, workload=wl, gpu_type=gpu, clock_mhz=clock, share_used=used, load=load
    )
    assert out["in_grid"]
    g = grids[tier]
    w, t = g.axes[0].values.index(wl), g.axes[1].values.index(gpu)
    assert (out["place_share"] >= 0) == (out["raise_clock_mhz"] == clock)
    for at_clock, share in (
        (clock, out["place_share"]),
        (out["raise_clock_mhz"], out["raise_share"]),
    ):
        if share < 0:
            continue
        assert at_clock >= clock and share + used <= table.meta["share_capacity"][gpu]
        k = g.cell.index((w, t, g.axes[2].values.index(at_clock), g.axes[3].values.index(share)))
        assert _covers(g, k, load)
    if out["raise_clock_mhz"] < 0:
        # nothing fits at any clock >= this one, at the rounded-up share in use U and
        # load L: U < used + 25 (the grid's spacing) and L <= load + one step, and an op
        # that covered load + one step would cover L, so no op with share <= cap - used
        # - 25 covers load + one step
        top = table.axes["load"].values[-1]
        for k, (w2, t2, c2, s2) in enumerate(g.cell):
            free = g.axes[3].values[s2] + used <= table.meta["share_capacity"][gpu] - 25
            if (w2, t2) == (w, t) and g.axes[2].values[c2] >= clock and free:
                assert not _covers(g, k, min(load + table.meta["load_step_rps"], top))


def test_a_stricter_tier_never_has_more_capacity(tiered) -> None:  # type: ignore[no-untyped-def]
    table, _ = tiered
    tiers = table.axes["slo_tier"].values
    cap = table.array("capacity_rps")
    strict, standard = cap[tiers.index("strict")], cap[tiers.index("standard")]
    assert np.all(strict <= standard * (1 + 1e-9)) and np.any(strict < standard)
    assert table.axes["gpu_type"].values == ("H100-SXM5-80GB", "A100-SXM4-80GB")


def test_slice_power_is_the_models_steady_draw(compiled, grid) -> None:  # type: ignore[no-untyped-def]
    """A slice's attributed power is its share of the on-power plus its power line:
    the line meets the model's steady draw at the op's capacity and half of it and
    never lies below it under half the capacity (a lightly loaded decode loop is
    charged its fixed part, not a share of its load)."""
    table, _ = compiled
    fixed = np.asarray([table.array("fixed_w")[c] for c in grid.cell])
    marginal = np.asarray([table.array("marginal_w_per_rps")[c] for c in grid.cell])
    cap = grid.capacity_rps
    assert np.all(fixed > 0) and np.all(marginal > 0)
    for frac in (1.0, LINE_LOW_ANCHOR):
        line = fixed + marginal * frac * cap
        np.testing.assert_allclose(line, steady_power_w(grid.params, frac * cap), rtol=1e-9)
    for frac in (0.02, 0.1, 0.3):
        line = fixed + marginal * frac * cap
        assert np.all(line >= steady_power_w(grid.params, frac * cap) * (1 - 1e-9))
    loads = np.asarray(table.axes["load"].values)
    power = table.array("power_w")
    for k, cell in enumerate(grid.cell):
        covered = ~np.isnan(power[cell])
        want = grid.share_frac[k] * grid.on_power_w[k] + fixed[k] + marginal[k] * loads
        np.testing.assert_allclose(power[cell][covered], want[covered], rtol=1e-12)


def test_an_older_table_is_refused_by_name(tmp_path: Path) -> None:
    """An oppoints table of the earlier version (energy per request only, no fixed
    part) is refused by the online lookups with the file's name, not misread."""
    problem = load_problem(ROOT / "instances" / "quickstart.yaml")
    axes, columns, meta = build_oppoint_columns(problem, load_points=5)
    old = tmp_path / "old.eot"
    write_table(
        old,
        "oppoints",
        axes,
        {k: v for k, v in columns.items() if k != "fixed_w"},
        {k: v for k, v in meta.items() if k != "oppoints_version"},
    )
    with pytest.raises(TableError, match="compile it again") as err:
        OpLookups(Table.open(old), problem)
    assert str(old) in str(err.value)
    new = tmp_path / "new.eot"
    write_table(new, "oppoints", axes, columns, meta)
    OpLookups(Table.open(new), problem)
