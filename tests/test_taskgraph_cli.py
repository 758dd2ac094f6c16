"""``energyopt validate|solve`` on task-graph files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, main
from tests.conftest import INSTANCES

HETERO = str(INSTANCES / "taskgraph" / "hetero-measured.yaml")


def test_validate_taskgraph(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", HETERO]) == EXIT_OK
    assert "5 tasks, 5 edges, 2 GPUs (L40S, L4)" in capsys.readouterr().out


@pytest.mark.parametrize("solver", ["cpsat", "heuristic"])
def test_solve_prints_summary_and_writes_schedule(
    solver: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "s.json"
    assert main(["solve", HETERO, "--solver", solver, "-q", "-o", str(out)]) == EXIT_OK
    text = capsys.readouterr().out
    for needle in ("clock changes", "busy ms", "makespan", "energy", "bound", "gap"):
        assert needle in text
    data = json.loads(out.read_text())
    assert {t["task"] for t in data["tasks"]} == {"prep", "gemm_a", "gemm_b", "reduce", "post"}
    assert data["makespan_ms"] == pytest.approx(max(t["end_ms"] for t in data["tasks"]))


def test_unknown_solver_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["solve", HETERO, "--solver", "highs-pattern", "-q"]) == EXIT_BAD_INPUT
    assert "available: auto, cpsat, heuristic" in capsys.readouterr().err


def test_bad_file_names_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: taskgraph\nname: b\ngpus: [{name: a, type: L4}]\ntasks: [{name: x}]\n")
    assert main(["solve", str(bad), "-q"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert f"{bad}: tasks[0](x)" in err and "Traceback" not in err
