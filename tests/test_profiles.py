"""A measured profile overrides the analytic latency for its (GPU, model) pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from energyopt.catalog import load_problem
from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.oppoints import build_op_table, op_spec
from energyopt.perf.params import build_params
from energyopt.spec import SpecError

from .conftest import INSTANCES

GPU = "H100-SXM5-80GB"
MODEL = "Llama-3.1-8B"


def write_instance(tmp_path: Path, rows: list[str], clock: int | None = None) -> Path:
    (tmp_path / "prof.csv").write_text("\n".join(["phase,tokens,context,tp,latency_ms", *rows]))
    data = yaml.safe_load((INSTANCES / "quickstart.yaml").read_text())
    ref = {"gpu": GPU, "model": MODEL, "file": "prof.csv"}
    if clock:
        ref["clock_mhz"] = clock
    data["profiles"] = [ref]
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def params(problem, clock: float, share: float = 1.0):
    gpu = problem.gpu_type(GPU)
    wl = problem.instance.workload("chat-llama")
    return build_params(
        [op_spec(problem, wl, "both", gpu, clock, (100, None, share, share, 72.0), 1)]
    )


ROWS = [
    "prefill,256,0,1,30.0",
    "prefill,1024,0,1,90.0",
    "prefill,4096,0,1,400.0",
    "decode,1,1024,1,12.0",
    "decode,64,1024,1,20.0",
    "decode,1,4096,1,13.0",
    "decode,64,4096,1,30.0",
]


def test_measured_points_are_reproduced_at_the_reference(tmp_path: Path) -> None:
    problem = load_problem(write_instance(tmp_path, ROWS))
    p = params(problem, problem.gpu_type(GPU).default_sm_clock_mhz)
    assert prefill_pass(p, np.asarray([1024.0])).ms[0] == pytest.approx(90.0, rel=1e-9)
    assert decode_pass(p, np.asarray([64.0]), np.asarray([1024.0])).ms[0] == pytest.approx(
        20.0, rel=1e-9
    )
    between = prefill_pass(p, np.asarray([512.0])).ms[0]
    assert 30.0 < between < 90.0


def test_clock_and_share_dependence_comes_from_the_analytic_model(tmp_path: Path) -> None:
    measured = load_problem(write_instance(tmp_path, ROWS))
    analytic = load_problem(INSTANCES / "quickstart.yaml")
    tokens = np.asarray([1024.0])
    ratios = []
    for problem in (measured, analytic):
        hi = prefill_pass(params(problem, 1980), tokens).ms[0]
        lo = prefill_pass(params(problem, 990, share=0.5), tokens).ms[0]
        ratios.append(lo / hi)
    assert ratios[0] == pytest.approx(ratios[1], rel=1e-9)
    assert ratios[0] > 2.0


def test_slower_measurements_lower_capacity_and_other_tp_sizes_stay_analytic(
    tmp_path: Path,
) -> None:
    base = build_op_table(load_problem(INSTANCES / "quickstart.yaml"))
    slow = build_op_table(load_problem(write_instance(tmp_path, ROWS)))
    unit = 0  # chat-llama, the profiled model

    def caps(table, tp):
        return sorted(float(table.capacity_rps[o]) for o in table.ops_of(unit) if table.tp[o] == tp)

    assert max(caps(slow, 1)) < 0.8 * max(caps(base, 1))
    assert caps(slow, 2) == pytest.approx(caps(base, 2))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["prefill,256,0,1,-3"], "row 2: tokens, tp and latency_ms must be positive"),
        (["prefil,256,0,1,3"], "row 2: phase must be prefill or decode"),
        (["prefill,many,0,1,3"], "row 2:"),
        ([], "profile has no measurements"),
    ],
)
def test_bad_profiles_are_rejected_naming_file_and_row(tmp_path: Path, rows, message) -> None:
    with pytest.raises(SpecError) as err:
        load_problem(write_instance(tmp_path, rows))
    text = str(err.value)
    assert "prof.csv" in text and message in text and "profiles[0]" in text


def test_missing_column_is_named(tmp_path: Path) -> None:
    path = write_instance(tmp_path, ROWS)
    (tmp_path / "prof.csv").write_text("phase,tokens,tp,latency_ms\nprefill,1,1,2\n")
    with pytest.raises(SpecError, match="missing column"):
        load_problem(path)
