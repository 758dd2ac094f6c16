"""Bad input to the older kinds and the executor's files: profile CSVs, solver
presets, plans handed to ``apply``, ``--map`` files, checkpoints and the simulated
NVML's state. Each is refused with the file and the field named (exit 2; exit 5
where the file is sound but names a GPU or a backend this host does not have),
never an internal error, never a hang, never accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.catalog import builtin_catalog
from energyopt.cli import main
from energyopt.nvml.planner import read_map_file
from energyopt.nvml.sim import SimulatedNvml
from energyopt.solvers.presets import load_preset
from energyopt.spec import GpuPlan, Placement, Plan, SpecError, dump
from energyopt.spec.io import MAX_NESTING, read_data

from .cli_helpers import run

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "instances" / "quickstart.yaml"
H100 = "H100-SXM5-80GB"


# ------------------------------------------------------------ files that never end

HANG_CHILD = textwrap.dedent(
    """
    import json, sys
    from energyopt.nvml.planner import read_map_file
    from energyopt.sim.trace import read_trace
    from energyopt.spec import SpecError
    from energyopt.spec.io import read_data
    out = {}
    for name in sys.argv[1:]:
        reader = {"map": read_map_file, "trace": read_trace}.get(name.split("-")[0], read_data)
        try:
            reader(name)
            out[name] = None
        except SpecError as exc:
            out[name] = str(exc)
    from energyopt.cli import main
    out["validate"] = main(["validate", "fifo.yaml", "zero.yaml"])
    print(json.dumps(out))
    """
)


def _doubling_aliases(levels: int) -> str:
    """Each anchor a list of two aliases of the one before: 2**levels values, 2 * levels
    aliases (under the alias-count limit)."""
    lines = ["a0: &a0 [x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, levels)]
    lines.append(f"node0/0: *a{levels - 1}")
    return "\n".join(lines) + "\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_devices_and_alias_doubling_are_refused_without_hanging(tmp_path: Path) -> None:
    """A FIFO with no writer (as a spec file or a trace), a symlink to /dev/zero and a
    --map file whose aliases double 110 times were read forever (or until memory ran
    out); each is refused naming the file, in a child process so that a regression
    fails instead of hanging."""
    os.mkfifo(tmp_path / "fifo.yaml")
    os.mkfifo(tmp_path / "trace-fifo.csv")
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    (tmp_path / "map-bomb.yaml").write_text(_doubling_aliases(110), encoding="utf-8")
    (tmp_path / "map-ok.yaml").write_text("node0/0: 1\n", encoding="utf-8")
    names = ["fifo.yaml", "trace-fifo.csv", "zero.yaml", "map-bomb.yaml", "map-ok.yaml"]
    child = subprocess.run(
        [sys.executable, "-c", HANG_CHILD, *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    out = json.loads(child.stdout)
    assert out["fifo.yaml"] == "fifo.yaml: cannot read: a FIFO (named pipe), not a regular file"
    assert out["zero.yaml"] == "zero.yaml: cannot read: a device, not a regular file"
    assert out["trace-fifo.csv"] == (
        "trace-fifo.csv: cannot read: a FIFO (named pipe), not a regular file"
    )
    assert out["map-bomb.yaml"].startswith("map-bomb.yaml: malformed YAML: aliases expand it")
    assert out["map-ok.yaml"] is None
    assert out["validate"] == 2  # the command line: bad input, each file named
    assert child.stderr.splitlines() == [
        "fifo.yaml: cannot read: a FIFO (named pipe), not a regular file",
        "zero.yaml: cannot read: a device, not a regular file",
    ]


def test_recursive_and_too_deep_values_are_refused(tmp_path: Path) -> None:
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("name: &a [*a]\n", encoding="utf-8")
    with pytest.raises(SpecError, match=r"recursive\.yaml: malformed YAML: an alias refers"):
        read_data(recursive)
    deep = tmp_path / "deep.json"
    deep.write_text('{"a": ' + "[" * MAX_NESTING + "]" * MAX_NESTING + "}", encoding="utf-8")
    with pytest.raises(SpecError, match=rf"deep\.json: .*more than {MAX_NESTING} levels"):
        read_data(deep)
    fits = tmp_path / "fits.json"
    depth = MAX_NESTING - 1  # the top-level mapping is the first level
    fits.write_text('{"a": ' + "[" * depth + "]" * depth + "}", encoding="utf-8")
    node, levels = read_data(fits)["a"], 1
    while node:
        node, levels = node[0], levels + 1
    assert levels == depth


def test_aliases_that_reuse_a_block_many_times_are_fine(tmp_path: Path) -> None:
    """The expansion bound leaves ordinary anchors alone: 200 GPUs sharing one list of
    400 clocks add 80,000 values (under MAX_ALIAS_EXPANSION, as 200 is under the alias
    limit)."""
    clocks = ", ".join(str(210 + 5 * i) for i in range(400))
    lines = [f"base: &s [{clocks}]", "gpus:"]
    lines += [f"  - {{name: g{i}, clocks: *s}}" for i in range(200)]
    path = tmp_path / "many.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = read_data(path)
    assert len(data["gpus"]) == 200 and data["gpus"][-1]["clocks"][-1] == 2205


# ------------------------------------------------------------------ profile CSVs


def _with_profile(tmp_path: Path, payload: bytes) -> Path:
    data: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    data["profiles"] = [{"gpu": H100, "model": "Llama-3.1-8B", "file": "p.csv"}]
    (tmp_path / "p.csv").write_bytes(payload)
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


HEADER = b"phase,tokens,context,tp,latency_ms\n"
PROFILES_BAD = [
    ("binary", bytes(range(256)) * 8, "p.csv: cannot read as UTF-8 text"),
    ("huge-field", HEADER + b"prefill," + b"1" * 200_000 + b",0,1,3\n", "p.csv: row 1: not a CSV"),
    ("extra-fields", HEADER + b"prefill,512,0,1,38,4,5\n", "p.csv: row 2: more fields than"),
    ("tp-huge", HEADER + b"prefill,512,0,1e300,38\n", "p.csv: row 2: tp: 1e+300 must be"),
]


@pytest.mark.parametrize(
    ("payload", "expected"), [pytest.param(p, e, id=i) for i, p, e in PROFILES_BAD]
)
def test_garbage_profile_csv_is_refused_naming_the_file(
    tmp_path: Path, payload: bytes, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_profile(tmp_path, payload)
    code, _, err = run(capsys, "validate", str(path))
    assert code == 2
    assert f"{path}: profiles[0]: " in err and expected in err


def test_profile_csv_with_a_byte_order_mark_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A spreadsheet's UTF-8 CSV starts with a byte-order mark: the header still names
    the phase column (it was refused as a missing column)."""
    path = _with_profile(tmp_path, b"\xef\xbb\xbf" + HEADER + b"prefill,512,0,1,38.2\n")
    code, out, _ = run(capsys, "validate", str(path))
    assert code == 0 and "ok" in out


# --------------------------------------------------------------- solver presets


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"\x9b\xff\x00garbage" * 100, "cannot read as UTF-8 text"),
        (b"a = " + b"[" * 50_000 + b"]" * 50_000, "malformed TOML: nested too deeply"),
        (b"a = " + b"[" * 100 + b"]" * 100, "malformed TOML: nested too deeply"),
    ],
    ids=["binary", "deep-50000", "deep-100"],
)
def test_bad_preset_file_is_refused_naming_it(
    tmp_path: Path, text: bytes, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_bytes(text)
    with pytest.raises(SpecError, match=f"mine.toml: {expected}"):
        load_preset(str(preset))
    code, _, err = run(capsys, "solve", str(QUICKSTART), "-q", "--solver", str(preset))
    assert code == 2 and f"{preset}: {expected}" in err


# ------------------------------------------------------------- the executor's files


@pytest.fixture
def simhost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Simulated NVML with two H100s; cwd is tmp_path; the state in its default place
    (conftest points XDG_STATE_HOME into tmp_path). Returns that place."""
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_GPUS", f"{H100}x2")
    monkeypatch.chdir(tmp_path)
    return Path(os.environ["XDG_STATE_HOME"]) / "energyopt" / "nvml-sim.json"


def _plan(clock: int = 1200, limit_w: float = 400) -> Plan:
    return Plan(
        instance="t",
        gpus=tuple(
            GpuPlan(
                gpu=f"node0/{i}",
                type=H100,
                on=True,
                clock_mhz=clock,
                power_limit_w=limit_w,
                placements=(
                    Placement(workload="a", share_pct=60, rate_rps=1),
                    Placement(workload="b", share_pct=40, rate_rps=1),
                ),
            )
            for i in range(2)
        ),
    )


def test_sim_state_is_kept_in_a_default_place_and_named(
    simhost: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ENERGYOPT_NVML_SIM_STATE, `status` after `apply --apply` showed a new
    host's defaults: the apply's changes were lost with its process."""
    dump(_plan(), "plan.json")
    code, _, err = run(capsys, "apply", "plan.json", "--apply", "--checkpoint", "cp.json")
    assert code == 0
    assert f"state in {simhost} (a new host" in err
    code, out, err = run(capsys, "status")
    assert code == 0 and f"state in {simhost};" in err
    assert out.count("locked: 1200 MHz") == 2 and out.count("limit 400 W") == 2
    code, out, _ = run(capsys, "restore", "cp.json")
    assert code == 0 and "at their original values" in out
    code, out, _ = run(capsys, "status")
    assert "locked: 1200 MHz" not in out and "limit 400 W" not in out


def test_restore_refuses_a_host_that_never_saw_the_apply(
    simhost: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dump(_plan(), "plan.json")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_STATE", str(tmp_path / "first.json"))
    assert run(capsys, "apply", "plan.json", "--apply", "--checkpoint", "cp.json")[0] == 0
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_STATE", str(tmp_path / "other.json"))
    code, out, err = run(capsys, "restore", "cp.json")
    assert code == 5
    assert "original values" not in out
    assert f"cp.json: the simulated host has no saved state at {tmp_path / 'other.json'}" in err
    assert not (tmp_path / "other.json").exists()  # a refusal leaves no new host behind
    assert run(capsys, "restore", "cp.json")[0] == 5  # so it is refused again, not "restored"
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_STATE", str(tmp_path / "first.json"))
    assert run(capsys, "restore", "cp.json")[0] == 0


def test_sim_gpus_that_disagree_with_the_saved_host_are_named(
    simhost: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run(capsys, "status")[0] == 0
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_GPUS", "L4")
    code, _, err = run(capsys, "status")
    assert code == 5
    assert f"ENERGYOPT_NVML_SIM_GPUS asks for L4, but the simulated host saved in {simhost}" in err


def _state(edit: str) -> str:
    good = SimulatedNvml([builtin_catalog().gpu(H100)]).to_json()
    if edit == "garbage":
        return "\x00garbage{"
    if edit == "list":
        return "[]"
    if edit == "unknown-type":
        good["types"] = ["B300"]
        good["devices"][0]["type_name"] = "B300"
    elif edit == "type-mismatch":
        good["devices"][0]["type_name"] = "L4"
    elif edit == "locked-int":
        good["devices"][0]["locked"] = 5
    elif edit == "limit-out-of-range":
        good["devices"][0]["power_limit_mw"] = 10**9
    elif edit == "devices-missing":
        del good["devices"]
    elif edit == "deep":
        return '{"types": ' + "[" * 100_000 + "]" * 100_000 + "}"
    return json.dumps(good)


STATES_BAD = {
    "garbage": "malformed JSON",
    "list": "top level must be a mapping, got list",
    "unknown-type": "types[0]: unknown GPU type 'B300'",
    "type-mismatch": "devices[0].type_name: 'L4', but types[0] is 'H100-SXM5-80GB'",
    "locked-int": "devices[0].locked: Input should be a valid tuple",
    "limit-out-of-range": "devices[0].power_limit_mw: 1000000000 is outside",
    "devices-missing": "devices: Field required",
    "deep": "malformed JSON: nested too deeply",
}


@pytest.mark.parametrize("edit", sorted(STATES_BAD))
def test_bad_sim_state_is_refused_naming_the_file(
    edit: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state.json"
    state.write_text(_state(edit), encoding="utf-8")
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_STATE", str(state))
    code, _, err = run(capsys, "status")
    assert code == 2
    assert f"{state}: {STATES_BAD[edit]}" in err
    assert f"{state}: not a simulated host's state" in err


def test_apply_names_the_plans_it_takes(
    simhost: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schedule = {
        "name": "lu",
        "objective": "energy",
        "tasks": [{"task": "a", "gpu": "gpu0", "clock_mhz": 2040, "start_ms": 0, "end_ms": 1}],
    }
    Path("schedule.json").write_text(json.dumps(schedule), encoding="utf-8")
    code, _, err = run(capsys, "apply", "schedule.json")
    assert code == 2
    assert err.strip().splitlines() == [
        "schedule.json: this is a taskgraph plan; `energyopt apply` takes serving plans "
        "(per-GPU clocks, power limits and MPS/MIG placements, from `energyopt solve` on a "
        "serving instance): it has no GPU settings to apply"
    ]
    Path("other.json").write_text('{"name": "x", "steps": []}', encoding="utf-8")
    code, _, err = run(capsys, "apply", "other.json")
    assert code == 2 and err.startswith("other.json: gpus: missing; `energyopt apply` takes")


MAPS_BAD = [
    ("int-key.yaml", b"0: 0\n", "int-key.yaml: 0: a key is a plan GPU id"),
    ("binary.yaml", b"node0/0: !!binary aGVsbG8=\n", "binary.yaml: node0/0: expected a device"),
    ("date.yaml", b"node0/0: 2001-12-14\n", "date.yaml: node0/0: expected a device index"),
    ("nested.yaml", b"node0/0: [[[[1]]]]\n", "nested.yaml: node0/0: expected a device index"),
    ("negative.json", b'{"node0/0": -1}', "negative.json: node0/0: device index -1 is negative"),
    ("unknown.yaml", b"node9/9: 0\n", "unknown.yaml: node9/9: not a GPU of the plan"),
    ("beyond.YAML", b"node0/0: 7\n", "beyond.YAML: node0/0: no GPU with index 7"),
    ("uuid.yaml", b"node0/0: GPU-nope\n", "uuid.yaml: node0/0: no GPU with UUID GPU-nope"),
]


@pytest.mark.parametrize(("name", "text", "expected"), MAPS_BAD, ids=[m[0] for m in MAPS_BAD])
def test_map_file_errors_name_the_file_and_the_key(
    simhost: Path, name: str, text: bytes, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dump(_plan(), "plan.json")
    Path(name).write_bytes(text)
    code, _, err = run(capsys, "apply", "plan.json", "--map-file", name)
    assert code in (2, 5)  # 5: the file is well formed but names a GPU this host lacks
    assert expected in err


def test_map_file_with_bom_and_crlf_reads(tmp_path: Path) -> None:
    path = tmp_path / "map.yaml"
    path.write_bytes(b"\xef\xbb\xbfnode0/0: 1\r\nnode0/1: GPU-x\r\n")
    assert read_map_file(path, ["node0/0", "node0/1"]) == {"node0/0": "1", "node0/1": "GPU-x"}


# ------------------------------------------------------------------- checkpoints


@pytest.fixture
def checkpoint(simhost: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    dump(_plan(), "plan.json")
    assert main(["apply", "plan.json", "--apply", "--checkpoint", "good.json"]) == 0
    capsys.readouterr()
    data: dict[str, Any] = json.loads(Path("good.json").read_text(encoding="utf-8"))
    return data


CHECKPOINTS_BAD = {
    "chained-string": ("chained_from", "cp0.json", "chained_from: expected a list", 2),
    "chained-dict": ("chained_from", {"a": {"b": 1}}, "chained_from: expected a list", 2),
    "chained-nested": ("chained_from", [{"a": [1]}], "chained_from[0]: expected a checkpoint", 2),
    "backend-int": ("backend", 3, "backend: expected one of nvml, sim, got an integer", 2),
    # a sound checkpoint of another host's GPUs: a device error, as an unknown UUID is
    "backend-other": ("backend", "nvml", "backend: written by the nvml backend", 5),
}


@pytest.mark.parametrize("how", sorted(CHECKPOINTS_BAD))
def test_bad_checkpoint_header_is_refused_not_restored(
    how: str, checkpoint: dict[str, Any], simhost: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key, value, expected, status = CHECKPOINTS_BAD[how]
    Path("bad.json").write_text(json.dumps({**checkpoint, key: value}), encoding="utf-8")
    state = simhost.read_text(encoding="utf-8")
    code, out, err = run(capsys, "restore", "bad.json")
    assert code == status
    assert "original values" not in out
    assert f"energyopt restore: bad.json: {expected}" in err
    assert simhost.read_text(encoding="utf-8") == state  # nothing was put back


def test_deep_checkpoint_is_refused(simhost: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    code, _, err = run(capsys, "restore", "deep.json")
    assert code == 2
    assert err.strip() == "energyopt restore: deep.json: malformed JSON: nested too deeply"


# ------------------------------------------- solve: internal errors become input checks


def _edited(tmp_path: Path, source: Path, edit: Any, name: str = "edited.yaml") -> Path:
    data: dict[str, Any] = yaml.safe_load(source.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _inline_type(
    catalog_file: str, name: str, edit: Callable[[dict[str, Any]], None]
) -> Callable[[dict[str, Any]], None]:
    """An edit that puts every GPU of a serving instance on an inline copy of a catalog
    type, itself edited by ``edit``."""

    def mutate(data: dict[str, Any]) -> None:
        gpu: dict[str, Any] = yaml.safe_load(
            (ROOT / "models" / "gpus" / catalog_file).read_text(encoding="utf-8")
        )
        gpu["name"] = name
        edit(gpu)
        data["gpu_types"] = [gpu]
        for node in data["cluster"]["nodes"]:
            for entry in node["gpus"]:
                entry["type"] = name

    return mutate


def _tiny_rate(data: dict[str, Any]) -> None:
    data["workloads"][0]["rate_rps"] = 1e-300


def _unmeasured_latency_error(data: dict[str, Any]) -> None:
    _inline_type("h100-sxm5-80gb.yaml", "Site-H100", lambda g: g["efficiency"].update(
        latency_error=0
    ))(data)
    data["options"]["latency_margin"] = "calibrated"


MIG_A100 = ROOT / "instances" / "mig-a100.yaml"
SERVING_BAD = [
    ("rate-tiny", QUICKSTART, _tiny_rate, "workloads[0](chat-llama).rate_rps: Input should be"),
    (
        "mig-start-negative",
        MIG_A100,
        _inline_type(
            "a100-sxm4-80gb.yaml",
            "Site-A100",
            lambda g: g["mig_profiles"][0].update(placements=[-1, 0]),
        ),
        "gpu_types[0](Site-A100): Value error, mig_profiles: 1g.10gb: placement -1 is not",
    ),
    (
        "mig-start-past-the-end",
        MIG_A100,
        _inline_type(  # 7g.80gb occupies all 8 memory slices: it can only start at 0
            "a100-sxm4-80gb.yaml",
            "Site-A100",
            lambda g: g["mig_profiles"][-1].update(placements=[1]),
        ),
        "gpu_types[0](Site-A100): Value error, mig_profiles: 7g.80gb: placement 1 is not a "
        "start memory slice from 0 to 0",
    ),
    (
        "mig-start-twice",
        MIG_A100,
        _inline_type(
            "a100-sxm4-80gb.yaml",
            "Site-A100",
            lambda g: g["mig_profiles"][0].update(placements=[0, 0, 0]),
        ),
        "gpu_types[0](Site-A100): Value error, mig_profiles: 1g.10gb: placements [0, 0, 0] "
        "give a start twice",
    ),
    (
        "latency-error-zero",
        QUICKSTART,
        _unmeasured_latency_error,
        "options.latency_margin: calibrated, but GPU type Site-H100 has no measured latency",
    ),
]


def _refused_by_validate_and_solve(
    capsys: pytest.CaptureFixture[str], path: Path, expected: str, *solve_args: str
) -> None:
    """validate and ``solve -q SOLVE_ARGS`` both exit 2 with ``PATH: EXPECTED``."""
    for argv in (["validate"], ["solve", "-q", *solve_args]):
        code, _, err = run(capsys, argv[0], str(path), *argv[1:])
        assert code == 2
        assert f"{path}: {expected}" in err


@pytest.mark.parametrize(
    ("source", "edit", "expected"), [pytest.param(s, e, x, id=i) for i, s, e, x in SERVING_BAD]
)
def test_bad_serving_input_is_refused_before_solving(
    tmp_path: Path, source: Path, edit: Any, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused_by_validate_and_solve(capsys, _edited(tmp_path, source, edit), expected)


def test_the_lowest_rate_gives_a_valid_covering_bound() -> None:
    """The rate floor is a rate the covering bound's grid handles: at 1e-6 req/s the
    bound is finite and at most the cheapest single use (at 1e-300 the grid step
    underflowed, an internal error on fleet-10240)."""
    import numpy as np

    from energyopt.families.serving.formulations.unit_bound import UnitCover
    from energyopt.families.serving.solvers.unit_bound import grid_cover_bound
    from energyopt.spec.workload import MIN_RATE_RPS

    rng = np.random.default_rng(0)
    cap = rng.uniform(0.01, 5_000, 200)
    fixed = rng.uniform(50, 700, 200)
    per_rps = rng.uniform(0, 5, 200)
    bound = grid_cover_bound(UnitCover(MIN_RATE_RPS, fixed, per_rps, cap))
    assert np.isfinite(bound)
    assert bound <= float(np.min(fixed + per_rps * MIN_RATE_RPS)) + 1e-9
    assert bound >= float(np.min(fixed)) - 1e-9  # one use is needed, whichever it is


def test_calibrated_margin_of_an_evaluate_planner_needs_a_measured_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A planner's latency_margin: calibrated overrides the base instance's margin, so
    it is held to the same rule: each GPU type has a measured latency error."""
    base = _edited(tmp_path, QUICKSTART, _inline_type(
        "h100-sxm5-80gb.yaml", "Site-H100", lambda g: g["efficiency"].update(latency_error=0)
    ), "base.yaml")
    spec = {
        "kind": "evaluate",
        "name": "margin",
        "base": base.name,
        "load": {"kind": "bursty", "burst_factor": 2.0, "burst_s": 20, "gap_s": 40},
        "duration_s": 60,
        "reference": "plain",
        "planners": [
            {"name": "plain", "kind": "energyopt", "solver": "highs-exact"},
            {"name": "margin", "kind": "energyopt", "solver": "highs-exact",
             "latency_margin": "calibrated"},
        ],
    }
    path = tmp_path / "ev.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    for verb in ("validate", "evaluate"):
        code, _, err = run(capsys, verb, str(path), *(["-q"] if verb == "evaluate" else []))
        assert code == 2
        assert f"{path}: planners[1](margin).latency_margin: calibrated, but GPU type " in err


TASKGRAPH_BAD = [
    (
        "efficiency-tiny",
        ROOT / "instances" / "taskgraph" / "hetero-measured.yaml",
        lambda d: d["tasks"][1].update(compute_efficiency=1e-300),
        "tasks[1](gemm_a): the model gives 4.15e+300 ms on L40S, more than a day",
    ),
    (
        "idle-above-tdp",
        ROOT / "instances" / "taskgraph" / "lu-3x3-l4.yaml",
        lambda d: d.update(idle_w={"L4": 500.0}),
        "idle_w.L4: 500 W is above the 34.2 W the model gives task getrf_0 at 810 MHz",
    ),
]


@pytest.mark.parametrize(
    ("source", "edit", "expected"), [pytest.param(s, e, x, id=i) for i, s, e, x in TASKGRAPH_BAD]
)
def test_bad_taskgraph_is_refused_before_solving(
    tmp_path: Path, source: Path, edit: Any, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _edited(tmp_path, source, edit)
    _refused_by_validate_and_solve(capsys, path, expected, "--time-limit", "5")


def test_colocation_slot_below_a_second_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = ROOT / "tests" / "data" / "colocation-small.yaml"
    path = _edited(tmp_path, source, lambda d: d["options"].update(slot_s=1e-300))
    code, _, err = run(capsys, "solve", str(path), "-q", "--time-limit", "5")
    assert code == 2
    assert f"{path}: options.slot_s: Input should be greater than or equal to 1" in err


def test_slot_counts_never_wrap_around() -> None:
    """A job far longer than its slots is held for a huge, positive number of slots
    (the count overflowed int64 to a negative number before)."""
    import numpy as np

    from energyopt.families.colocation.formulations.configs import MAX_SLOTS_HELD, slots_needed

    held = slots_needed(np.asarray([1e-3, 3_600.0, 1e12, 1e300]), 1.0)
    assert held.tolist() == [1, 3_600, 10**12, MAX_SLOTS_HELD]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("index", -1, "action.index: -1 is outside 0..2147483647"),
        ("default_pct", 0, "action.default_pct: 0 is outside 1..100"),
        ("clients", [["a", 10**30]], "action.clients[0]: 1000000000000000000000000000000 %"),
    ],
    ids=["index-negative", "pct-zero", "client-pct-huge"],
)
def test_checkpoint_numbers_out_of_range_are_refused(
    field: str,
    value: Any,
    expected: str,
    checkpoint: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    entries = checkpoint["entries"]
    k = next(i for i, e in enumerate(entries) if e["action"]["kind"] == "mps")
    entries[k]["action"][field] = value
    Path("bad.json").write_text(json.dumps(checkpoint), encoding="utf-8")
    code, out, err = run(capsys, "restore", "bad.json")
    assert code == 2 and "original values" not in out
    assert f"bad.json: entries[{k}].{expected}" in err
