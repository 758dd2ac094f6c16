"""The evaluation's figures and table compare the planners: every planner drawn
distinctly (and coinciding lines named), attainment on a zoomed axis with values
labelled, energy saved per planner, and a table whose columns are explained, with
the simulated energy set against the model's, part by part."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from energyopt.families.serving.loop import EvaluationResult, evaluate
from energyopt.families.serving.loop_report import COLUMNS, HEADER, format_table, write_csvs
from energyopt.families.serving.plots import (
    coinciding,
    draw_attainment,
    draw_power,
    draw_saving,
    styles,
    zoomed_range,
)
from energyopt.spec.evaluation import load_evaluation
from tests.test_sim_evaluate import write_spec

PLANNERS = [
    {"name": "performance-first", "kind": "performance-first"},
    {"name": "consolidation-only", "kind": "consolidation-only"},
    {"name": "frequency-only", "kind": "frequency-only"},
]


def test_every_planner_gets_its_own_colour_line_style_and_marker() -> None:
    names = [f"p{k}" for k in range(8)]
    look = styles(names)
    for attr in ("colour", "line", "marker"):
        assert len({str(getattr(look[n], attr)) for n in names}) == len(names)


def test_coinciding_series_are_named_after_the_first_of_them() -> None:
    series = {"a": [1.0, 2.0], "b": [1.0, 2.5], "c": [1.0, 2.0004], "d": [1.0, 2.5], "e": [1.0]}
    assert coinciding(series, 1e-3) == {"c": "a", "d": "b"}


def test_attainment_axis_is_zoomed_to_the_differences() -> None:
    lo, hi = zoomed_range([99.97, 100.0, 100.0])
    assert 99.8 < lo < 99.97 and hi == 100.0  # a 0-100 axis would show one bar height
    lo, hi = zoomed_range([91.0, 97.5])
    assert 87.0 < lo < 91.0 and 97.5 < hi <= 100.0


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> EvaluationResult:
    """One short evaluation of three planners on two GPUs, shared by the tests below."""
    tmp = tmp_path_factory.mktemp("eval")
    spec = write_spec(tmp, planners=PLANNERS, duration_s=30)
    return evaluate(load_evaluation(spec), spec)


def test_the_table_explains_every_column_and_the_model_gap(
    evaluated: EvaluationResult, tmp_path: Path
) -> None:
    lines = format_table(evaluated)
    assert set(COLUMNS) == set(HEADER[1:])
    legend = lines[lines.index("columns:") + 1 :]
    for name in HEADER[1:]:
        assert any(line.startswith(f"  {name}  ") for line in legend), name
    write_csvs(evaluated, tmp_path)
    with (tmp_path / "summary.csv").open() as fh:
        rows = {r["planner"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {p["name"] for p in PLANNERS}
    table = {line.split()[0]: line.split() for line in lines[2 : 2 + len(rows)]}
    for name, row in rows.items():
        energy, model = float(row["energy_j"]), float(row["predicted_j"])
        assert table[name][HEADER.index("sim/model")] == f"x{energy / model:.2f}"
        # the static parts (GPUs on at their clocks) agree; the gap is load-dependent
        static, model_static = float(row["static_j"]), float(row["predicted_static_j"])
        assert 0 < model_static < model and 0 < static < energy
        assert static == pytest.approx(model_static, rel=0.05)
        split = next(line for line in legend if line.split()[:2] == [name, "simulated"])
        assert f"simulated {static / 3.6e6:.3f} + {(energy - static) / 3.6e6:.3f}" in split
    assert any("at arrivals" in line for line in legend)


def test_the_panels_draw_every_planner_apart(evaluated: EvaluationResult) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    res = evaluated
    look = styles([run.name for run in res.runs])
    fig, (ax_p, ax_s, ax_a) = plt.subplots(1, 3)
    same = draw_power(ax_p, res, look)
    lines: list[Any] = ax_p.get_lines()
    assert [line.get_label().split(" (=")[0] for line in lines] == [r.name for r in res.runs]
    looks = {(ln.get_color(), str(ln.get_linestyle()), ln.get_marker()) for ln in lines}
    assert len(looks) == len(res.runs)
    for line in lines:
        name = line.get_label().split(" (=")[0]
        assert (name in same) == ("(= " in line.get_label())
    draw_saving(ax_s, res, look)
    assert len(ax_s.patches) == len(res.runs)
    draw_attainment(ax_a, res, look, per_workload=False)
    values = [100 * r.result.attainment[2] for r in res.runs]
    lo, hi = ax_a.get_xlim()
    assert lo < min(values) and max(values) <= hi <= 100.0
    labels = {t.get_text() for t in ax_a.texts}
    assert {f"{v:.2f} %" for v in values} <= labels
    plt.close(fig)
