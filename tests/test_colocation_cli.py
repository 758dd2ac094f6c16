"""``energyopt validate`` and ``energyopt solve`` on co-location files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.cli import EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_NO_PLAN, EXIT_OK, main
from energyopt.families.colocation.spec import ColocationPlan
from energyopt.spec.io import load

from .colocation_helpers import ROOT, SMALL, small_data
from .mutations import delete_at, set_at


def run(capfd: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "coloc.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "path",
    [
        SMALL,
        ROOT / "instances/colocation/colocation-64.yaml",
        ROOT / "instances/colocation/colocation-512.yaml",
    ],
)
def test_shipped_files_validate(capfd: pytest.CaptureFixture[str], path: Path) -> None:
    code, out, err = run(capfd, "validate", str(path))
    assert code == EXIT_OK, err
    assert out.startswith(f"{path}: ok (co-location:")


BAD: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "unknown model",
        set_at("jobs", 0, "model", value="Llama-7"),
        "jobs[0](train-llama7b).model: unknown model 'Llama-7'",
    ),
    (
        "unknown GPU",
        set_at("cluster", "pools", 0, "type", value="H100"),
        "cluster.pools[0].type: unknown GPU type 'H100'",
    ),
    (
        "min over max",
        set_at("jobs", 2, "min_gpus", value=8),
        "jobs[2](batch-llama8b): Value error, min_gpus exceeds max_gpus",
    ),
    (
        "bad kind",
        set_at("jobs", 1, "kind", value="serving"),
        "jobs[1](train-mistral): Input tag 'serving' found using 'kind' does not match",
    ),
    ("missing work", delete_at("jobs", 3, "items"), "jobs[3](batch-llama7b).items: Field required"),
    ("negative slot", set_at("options", "slot_s", value=-5), "options.slot_s: Input should be"),
    (
        "share 100",
        set_at("options", "share_levels_pct", value=[50, 100]),
        "options: Value error, share level 100 is outside 1..99",
    ),
    (
        "duplicate names",
        set_at("jobs", 1, "name", value="train-llama7b"),
        "duplicate job names: ['train-llama7b']",
    ),
    (
        "no GPU count",
        set_at("options", "gpu_counts", value=[16]),
        "jobs[0](train-llama7b): no GPU count of options.gpu_counts [16]",
    ),
    (
        "unknown field",
        set_at("jobs", 0, "iteratons", value=3),
        "jobs[0](train-llama7b).iteratons: Extra inputs are not permitted",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "expected"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_file_and_field(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    name: str,
    mutate: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    data = small_data()
    mutate(data)
    path = write(tmp_path, data)
    for command in ("validate", "solve"):
        code, out, err = run(capfd, command, str(path))
        assert code == EXIT_BAD_INPUT, (name, command, out, err)
        lines = err.strip().splitlines()
        assert any(line.startswith(f"{path}: ") and expected in line for line in lines), (
            name,
            lines,
        )


def test_solve_prints_plan_bound_gap_and_writes_the_plan(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out_file = tmp_path / "plan.json"
    code, out, err = run(
        capfd, "solve", str(SMALL), "--solver", "shadow-price", "-o", str(out_file)
    )
    assert code == EXIT_OK, err
    assert "train-mistral" in out and "MHz" in out
    assert "mean JCT" in out and "GPU utilization" in out and "jobs/h" in out
    assert "lower bound" in out and "gap" in out
    assert "shadow-price: iteration" in err and "bound" in err and "gap" in err
    plan = load(ColocationPlan, out_file)
    assert {uj.job for u in plan.units for uj in u.jobs} == {
        "train-llama7b",
        "train-mistral",
        "batch-llama8b",
        "batch-llama7b",
    }


@pytest.mark.parametrize("solver", ["auto", "exact", "isolated"])
def test_solvers_by_name(capfd: pytest.CaptureFixture[str], solver: str) -> None:
    code, out, err = run(capfd, "solve", str(SMALL), "--solver", solver, "-q")
    assert code == EXIT_OK, err
    assert err == ""
    expected = "none (heuristic)" if solver == "isolated" else "gap 0.000%"
    assert expected in out


def test_unknown_solver_lists_the_valid_ones(capfd: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capfd, "solve", str(SMALL), "--solver", "highs-pattern")
    assert code == EXIT_BAD_INPUT
    assert "no solver 'highs-pattern' for colocation problems" in err
    assert "shadow-price" in err and "isolated" in err
    # A serving preset name is not silently taken for another family's solver.
    code, _, err = run(capfd, "solve", str(SMALL), "--solver", "highs-exact")
    assert code == EXIT_BAD_INPUT and "no solver 'highs-exact'" in err


def test_a_horizon_too_short_is_no_plan_on_the_grid_not_infeasible(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """One hour of slots, and train-llama7b needs more: the slotted solvers find no
    plan and say which job the horizon is too short for, but the instance is not
    infeasible: the checker accepts units past the horizon, and the isolated
    baseline's plan, which runs there, verifies."""
    data = small_data()
    data["options"]["slots"] = 2
    path = str(write(tmp_path, data))
    for solver in ("exact", "shadow-price"):
        code, _, err = run(capfd, "solve", path, "-q", "--solver", solver)
        assert code == EXIT_NO_PLAN  # not the exit status of a proven infeasibility
        assert "no plan (no_solution)" in err and "not proven infeasible" in err
        assert "longer than the horizon" in err
        assert "a plan exists past the horizon" in err
    plan = tmp_path / "isolated.json"
    code, _, err = run(capfd, "solve", path, "-q", "--solver", "isolated", "-o", str(plan))
    assert code == EXIT_OK, err
    code, out, err = run(capfd, "verify", path, str(plan))
    assert code == EXIT_OK, out + err


def test_a_job_that_fits_no_gpu_is_infeasible_with_a_reason(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A power budget that leaves less than any configuration draws: no horizon helps."""
    data = small_data()
    data["cluster"]["power_budget_w"] = 350  # four H100s idle at 300 W
    code, _, err = run(capfd, "solve", str(write(tmp_path, data)), "-q")
    assert code == EXIT_INFEASIBLE
    assert "no plan (infeasible)" in err and "draws more than the power budget" in err
