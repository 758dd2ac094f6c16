"""A measured profile overrides the analytic latency for its (GPU, model) pair."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from energyopt.catalog import load_problem, profiles
from energyopt.perf.forward import decode_pass, prefill_pass
from energyopt.perf.oppoints import build_op_table, op_spec
from energyopt.perf.params import build_params
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec import SpecError

from .conftest import INSTANCES

GPU = "H100-SXM5-80GB"
MODEL = "Llama-3.1-8B"


def write_instance(
    tmp_path: Path,
    rows: list[str],
    clock: int | None = None,
    header: str = "phase,tokens,context,tp,latency_ms",
) -> Path:
    (tmp_path / "prof.csv").write_text("\n".join([header, *rows]))
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
        (["prefill,256,0,1,-3"], "row 2: latency_ms: -3 must be positive"),
        (["prefil,256,0,1,3"], "row 2: phase: 'prefil' must be prefill or decode"),
        (["prefill,many,0,1,3"], "row 2: tokens: 'many' is not a number"),
        (["prefill,256,0,1.5,3"], "row 2: tp: 1.5 must be a whole number from 1 to 64"),
        (["decode,8,-1,1,3"], "row 2: context: -1 must not be negative"),
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


CLOCKED = "phase,tokens,context,tp,latency_ms,clock_mhz,power_w"
CLOCK_ROWS = [
    "prefill,1024,0,1,90.0,1980,650",
    "prefill,1024,0,1,150.0,990,260",
    "prefill,4096,0,1,400.0,1980,690",
    "prefill,4096,0,1,700.0,990,280",
    "decode,1,1024,1,12.0,1980,300",
    "decode,64,1024,1,20.0,1980,420",
    "decode,1,4096,1,13.0,1980,310",
    "decode,64,4096,1,30.0,1980,450",
    "decode,1,1024,1,12.5,990,150",
    "decode,64,1024,1,24.0,990,200",
    "decode,1,4096,1,13.5,990,160",
    "decode,64,4096,1,36.0,990,215",
]


def test_a_clock_column_overrides_the_model_at_and_between_measured_clocks(
    tmp_path: Path,
) -> None:
    problem = load_problem(write_instance(tmp_path, CLOCK_ROWS, header=CLOCKED))
    tokens = np.asarray([1024.0])
    assert prefill_pass(params(problem, 1980), tokens).ms[0] == pytest.approx(90.0, rel=1e-9)
    assert prefill_pass(params(problem, 990), tokens).ms[0] == pytest.approx(150.0, rel=1e-9)
    step = decode_pass(params(problem, 990), np.asarray([64.0]), np.asarray([4096.0]))
    assert step.ms[0] == pytest.approx(36.0, rel=1e-9)
    # between the clocks: linear in log clock of the log times
    supported = problem.gpu_type(GPU).nearest_clocks_mhz(1400.0, 1)[0]
    w = np.log(supported / 990.0) / np.log(1980.0 / 990.0)
    expect = float(np.exp((1 - w) * np.log(150.0) + w * np.log(90.0)))
    got = prefill_pass(params(problem, supported), tokens).ms[0]
    assert got == pytest.approx(expect, rel=1e-9)


def test_outside_the_measured_clocks_the_model_carries_from_the_nearest(tmp_path: Path) -> None:
    measured = load_problem(write_instance(tmp_path, CLOCK_ROWS, header=CLOCKED))
    analytic = load_problem(INSTANCES / "quickstart.yaml")
    tokens = np.asarray([1024.0])
    ratios = []
    for problem in (measured, analytic):
        at = prefill_pass(params(problem, 990), tokens).ms[0]
        below = prefill_pass(params(problem, 600), tokens).ms[0]
        ratios.append(below / at)
    assert ratios[0] == pytest.approx(ratios[1], rel=1e-9)
    assert ratios[0] > 1.2


def test_measured_power_replaces_the_analytic_dynamic_power(tmp_path: Path) -> None:
    problem = load_problem(write_instance(tmp_path, CLOCK_ROWS, header=CLOCKED))
    gpu = problem.gpu_type(GPU)
    for clock, board in ((1980, 650.0), (990, 260.0)):
        out = prefill_pass(params(problem, clock), np.asarray([1024.0]))
        assert out.power_w[0] + gpu_on_power_w(gpu, clock) == pytest.approx(board, rel=1e-9)
    # a half share draws the analytic fraction of the measured dynamic power
    full = prefill_pass(params(problem, 990), np.asarray([1024.0])).power_w[0]
    half = prefill_pass(params(problem, 990, share=0.5), np.asarray([1024.0])).power_w[0]
    plain = load_problem(INSTANCES / "quickstart.yaml")
    ratio = (
        prefill_pass(params(plain, 990, share=0.5), np.asarray([1024.0])).power_w[0]
        / prefill_pass(params(plain, 990), np.asarray([1024.0])).power_w[0]
    )
    assert half / full == pytest.approx(ratio, rel=1e-9)


def test_interpolators_are_built_once_per_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = load_problem(write_instance(tmp_path, CLOCK_ROWS, header=CLOCKED))
    p = params(problem, 1500)
    before = decode_pass(p, np.asarray([16.0]), np.asarray([2048.0])).ms[0]

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("interpolator built on a lookup")

    monkeypatch.setattr(profiles, "LinearNDInterpolator", forbidden)
    monkeypatch.setattr(profiles, "NearestNDInterpolator", forbidden)
    after = decode_pass(p, np.asarray([16.0]), np.asarray([2048.0])).ms[0]
    assert after == before
    assert 12.0 < after < 36.0


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["prefill,256,0,1,3,-5,100"], "row 2: clock_mhz: -5 must be positive"),
        (["prefill,256,0,1,3,1980,"], "row 2: power_w: '' is not a number"),
        (["prefill,256,0,1,3,fast,100"], "row 2: clock_mhz: 'fast' is not a number"),
        (["prefill,256,0,1,3,1980,0"], "row 2: power_w: 0 must be positive"),
    ],
)
def test_bad_clock_and_power_entries_are_named(tmp_path: Path, rows, message) -> None:
    with pytest.raises(SpecError) as err:
        load_problem(write_instance(tmp_path, rows, header=CLOCKED))
    text = str(err.value)
    assert "prof.csv" in text and message in text and "profiles[0]" in text


def test_unknown_column_is_named(tmp_path: Path) -> None:
    path = write_instance(
        tmp_path, ["prefill,1,0,1,2,3"], header="phase,tokens,context,tp,latency_ms,watts"
    )
    with pytest.raises(SpecError, match="unknown column\\(s\\) watts"):
        load_problem(path)
