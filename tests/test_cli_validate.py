"""``energyopt validate`` and ``energyopt schema``: exit codes, messages, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, main

from .mutations import set_at

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "tests" / "data" / "sample-instance.yaml"


def quick_data() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    return data


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_validate_good_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", str(QUICKSTART))
    assert code == EXIT_OK == 0
    assert out == f"{QUICKSTART}: ok (8 GPUs, 3 workloads)\n"
    assert err == ""


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yml"])
def test_validate_good_file_in_other_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    from energyopt.spec import Instance, dump, load

    path = tmp_path / f"quick{suffix}"
    dump(load(Instance, QUICKSTART), path)
    code, out, err = run(capsys, "validate", str(path))
    assert code == 0, err
    assert out.startswith(f"{path}: ok")


def test_console_script() -> None:
    """The installed ``energyopt`` entry point runs the same command."""
    exe = Path(sys.executable).parent / "energyopt"
    assert exe.exists(), exe
    proc = subprocess.run(
        [str(exe), "validate", "tests/data/sample-instance.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "tests/data/sample-instance.yaml: ok (8 GPUs, 3 workloads)"
    assert "Traceback" not in proc.stderr


def _delete_rate(data: dict[str, Any]) -> None:
    del data["workloads"][1]["rate_rps"]


def _duplicate_workload(data: dict[str, Any]) -> None:
    data["workloads"][2]["name"] = "code"


def _bad_link(data: dict[str, Any]) -> None:
    data["cluster"]["links"] = [{"a": "n0", "b": "n7", "bandwidth_gbps": 25}]


BAD_DATA = [
    (
        "wrong-type",
        set_at("workloads", 0, "rate_rps", value="fast"),
        "workloads[0](chat).rate_rps: Input should be a valid number",
    ),
    (
        "unknown-gpu",
        set_at("cluster", "nodes", 0, "gpus", 0, "type", value="H100"),
        "cluster.nodes[0](n0).gpus[0].type: unknown GPU type 'H100'; did you mean 'H100-SXM5-80GB'",
    ),
    (
        "unknown-model",
        set_at("workloads", 2, "model", value="Llama-3.1-70b"),
        "workloads[2](big).model: unknown model 'Llama-3.1-70b'",
    ),
    (
        "negative-rate",
        set_at("workloads", 0, "rate_rps", value=-12),
        "workloads[0](chat).rate_rps: Input should be greater than or equal to 0.000001",
    ),
    ("missing-rate", _delete_rate, "workloads[1](code).rate_rps: Field required"),
    (
        "unreachable-slo",
        set_at("workloads", 0, "slo", "ttft_ms", value=0.001),
        "workloads[0](chat).slo: no catalog GPU meets it",
    ),
    (
        "unknown-key",
        set_at("workloads", 0, "slo", "ttft", value=400),
        "workloads[0](chat).slo.ttft: Extra inputs are not permitted",
    ),
    ("duplicate-workload", _duplicate_workload, "workloads: Value error, duplicate workload"),
    ("link-unknown-node", _bad_link, "cluster.links: Value error, link 0: end 'n7'"),
    (
        "state-count",
        set_at("cluster", "nodes", 0, "gpus", 0, "state", value={"on": False}),
        "cluster.nodes[0](n0).gpus[0]: Value error, a state can only be given",
    ),
    (
        "ids-count",
        set_at("cluster", "nodes", 0, "gpus", 0, "ids", value=["g0"]),
        "cluster.nodes[0](n0).gpus[0]: Value error, ids has 1 entries but count is 8",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [pytest.param(m, e, id=i) for i, m, e in BAD_DATA])
def test_validate_bad_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mutate: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    data = quick_data()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    code, out, err = run(capsys, "validate", str(path))
    assert code == EXIT_BAD_INPUT == 2
    assert out == ""
    assert f"{path}: {expected}" in err
    assert all(line.startswith(f"{path}: ") for line in err.splitlines()), err
    assert "internal error" not in err


def _bomb() -> str:
    lines = ["l0: &l0 [" + ", ".join(['"lol"'] * 10) + "]"]
    lines += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 30)]
    return "\n".join([*lines, "description: *l29"]) + "\n"


BAD_FILES = [
    ("bad.yaml", "name: q\ncluster: [1, 2\n", "malformed YAML"),
    ("bad.json", '{"name": "q", }', "malformed JSON"),
    ("bad.toml", "name = 'q\n", "malformed TOML"),
    ("empty.yaml", "", "file is empty"),
    ("list.yaml", "- 1\n- 2\n", "top level must be a mapping, got list"),
    ("notes.txt", "name: q\n", "unknown file type '.txt'"),
    ("bomb.yaml", _bomb(), "refusing a possible YAML bomb"),
    ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize(("name", "text", "words"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_validate_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, words: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code, out, err = run(capsys, "validate", str(path))
    assert code == 2
    assert out == ""
    assert err.startswith(f"{path}: ")
    assert words in err
    assert len(err.splitlines()) == 1


def test_validate_nonexistent_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent.yaml"
    code, out, err = run(capsys, "validate", str(path))
    assert code == 2
    assert out == ""
    assert err.startswith(f"{path}: cannot read")


def test_validate_reports_every_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = quick_data()
    data["workloads"][0]["rate_rps"] = -1
    bad_rate = tmp_path / "bad_rate.yaml"
    bad_rate.write_text(yaml.safe_dump(data), encoding="utf-8")
    empty = tmp_path / "empty.json"
    empty.write_text("", encoding="utf-8")
    missing = tmp_path / "missing.toml"

    code, out, err = run(
        capsys, "validate", str(bad_rate), str(QUICKSTART), str(empty), str(missing)
    )

    assert code == 2
    assert out.splitlines() == [f"{QUICKSTART}: ok (8 GPUs, 3 workloads)"]
    err_lines = err.splitlines()
    assert [line.split(": ")[0] for line in err_lines] == [str(bad_rate), str(empty), str(missing)]
    assert "workloads[0](chat).rate_rps" in err_lines[0]


def test_validate_all_good_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from energyopt.spec import Instance, dump, load

    copy = tmp_path / "copy.json"
    dump(load(Instance, QUICKSTART), copy)
    code, out, err = run(capsys, "validate", str(QUICKSTART), str(copy))
    assert code == 0
    assert err == ""
    assert [line.split(": ")[0] for line in out.splitlines()] == [str(QUICKSTART), str(copy)]


def test_validate_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["validate"])
    assert info.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_schema_instance(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "schema")
    assert err == ""
    assert code == 0
    schema = json.loads(out)
    assert "workloads" in schema["properties"]
    assert "workloads" in schema["required"]
    assert "cluster" in schema["required"]
    assert schema["additionalProperties"] is False  # typos are errors


@pytest.mark.parametrize(
    ("kind", "field"),
    [("instance", "workloads"), ("plan", "gpus"), ("gpu", "sm_count"), ("model", "kv_heads")],
)
def test_schema_kinds(capsys: pytest.CaptureFixture[str], kind: str, field: str) -> None:
    code, out, _ = run(capsys, "schema", kind)
    assert code == 0
    assert field in json.loads(out)["properties"]


def test_schema_unknown_kind(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["schema", "fleet"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err
    assert "Traceback" not in err


def test_output_piped_into_a_closed_reader_is_not_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (say, `head`) has gone away
    closed = os.fdopen(write_end, "w", buffering=1)
    monkeypatch.setattr(sys, "stdout", closed)
    assert main(["schema"]) == 0
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err


def test_unknown_problem_family_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = quick_data()
    data["kind"] = "quantum"
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    for command in ("validate", "solve"):
        code, _out, err = run(capsys, command, str(path))
        assert code == EXIT_BAD_INPUT
        assert err.startswith(f"{path}: kind: unknown problem family 'quantum'; known: serving")


def test_explicit_serving_kind_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = quick_data()
    data["kind"] = "serving"
    path = tmp_path / "serving.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, out, _ = run(capsys, "validate", str(path))
    assert code == EXIT_OK
    assert out == f"{path}: ok (8 GPUs, 3 workloads)\n"


def test_evaluation_spec_validates_and_solve_points_to_evaluate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = ROOT / "instances" / "evaluate" / "quickstart-bursty.yaml"
    code, out, _ = run(capsys, "validate", str(spec))
    assert code == EXIT_OK
    assert out.startswith(f"{spec}: ok (evaluation spec: base quickstart.yaml (4 GPUs)")
    code, _out, err = run(capsys, "solve", str(spec))
    assert code == EXIT_BAD_INPUT
    assert f"energyopt evaluate {spec}" in err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["evaluate", "instances/quickstart.yaml"], "solve it with `energyopt solve"),
        (["evaluate", "instances/keepalive/azure-llm-2nodes.yaml"], "keepalive problem file"),
        (["evaluate", "instances/compile-quickstart.yaml"], "energyopt compile"),
        (["compile", "instances/quickstart.yaml", "-o", "t.eot"], "serving problem file"),
        (["compile", "instances/evaluate/quickstart-bursty.yaml", "-o", "t.eot"], "evaluate"),
    ],
)
def test_evaluate_and_compile_name_the_kind_of_a_file_they_do_not_take(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    named: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    path = str(ROOT / argv[1])
    code, _out, err = run(capsys, argv[0], path, *argv[2:])
    assert code == EXIT_BAD_INPUT
    assert err.startswith(f"{path}: kind: `energyopt {argv[0]}` takes kind: ")
    assert named in err
    assert len(err.splitlines()) == 1  # one line naming the kind, not a field-by-field refusal
    assert not (tmp_path / "t.eot").exists()
