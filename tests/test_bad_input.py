"""The bad inputs of issue 22, one by one: each is refused with the file and the
field named (exit 2; exit 1 for a plan that ``verify`` finds wrong), never an
internal error, never accepted; outputs are never half-written."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from energyopt.cli import main
from energyopt.spec import Plan, SpecError, dump, load
from energyopt.spec.limits import Limits, parse_limit_options, using
from energyopt.tables.stdlib_reader import ALIGN, DIGEST_BYTES, PREFIX

from .cli_helpers import read_yaml, run
from .mutations import set_at

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "instances" / "quickstart.yaml"
TASKGRAPH = ROOT / "instances" / "taskgraph" / "hetero-measured.yaml"
H100 = ROOT / "models" / "gpus" / "h100-sxm5-80gb.yaml"


def _inline_gpu(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        gpu = read_yaml(H100)
        gpu.update({"name": "Site-H100", **changes})
        data["gpu_types"] = [gpu]
        data["cluster"]["nodes"][0]["gpus"][0]["type"] = "Site-H100"

    return mutate


def _state(**state: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(data: dict[str, Any]) -> None:
        data["cluster"]["nodes"][0]["gpus"] = [
            {"type": "H100-SXM5-80GB", "state": state},
            {"type": "H100-SXM5-80GB", "count": 3},
        ]

    return mutate


def _no_kind(data: dict[str, Any]) -> None:
    del data["kind"]


SERVING = [
    (
        "rate-1e308",
        set_at("workloads", 0, "rate_rps", value=1e308),
        "workloads[0](chat-llama).rate_rps",
    ),
    (
        "rate-huge-int",
        set_at("workloads", 0, "rate_rps", value=10**40),
        "workloads[0](chat-llama).rate_rps",
    ),
    (
        "clock-negative",
        set_at("options", "clocks_mhz", value={"H100-SXM5-80GB": [-885]}),
        "options.clocks_mhz",
    ),
    (
        "clock-empty",
        set_at("options", "clocks_mhz", value={"H100-SXM5-80GB": []}),
        "options.clocks_mhz",
    ),
    (
        "clock-huge",
        set_at("options", "clocks_mhz", value={"H100-SXM5-80GB": [99999]}),
        "options.clocks_mhz",
    ),
    (
        "tp-zero",
        set_at("workloads", 0, "tensor_parallel", value=[0]),
        "workloads[0](chat-llama).tensor_parallel[0]",
    ),
    (
        "tp-negative",
        set_at("workloads", 0, "tensor_parallel", value=[-2]),
        "workloads[0](chat-llama).tensor_parallel[0]",
    ),
    (
        "tp-not-dividing-heads",
        set_at("workloads", 0, "tensor_parallel", value=[3]),
        "workloads[0](chat-llama).tensor_parallel: size 3",
    ),
    (
        "tp-beyond-node",
        set_at("workloads", 0, "tensor_parallel", value=[8]),
        "workloads[0](chat-llama).tensor_parallel: every size",
    ),
    (
        "prompt-inf",
        set_at("workloads", 0, "prompt_tokens", "mean", value=math.inf),
        "workloads[0](chat-llama).prompt_tokens.mean",
    ),
    (
        "prompt-over-context",
        set_at("workloads", 0, "prompt_tokens", "mean", value=500_000),
        "workloads[0](chat-llama).prompt_tokens: prompt + output",
    ),
    ("share-level-zero", set_at("options", "sharing", "levels_pct", value=[0]), "options.sharing"),
    ("share-level-101", set_at("options", "sharing", "levels_pct", value=[101]), "options.sharing"),
    (
        "mig-unknown",
        set_at("options", "sharing", "mig_profiles", value=["9g.99gb"]),
        "options.sharing.mig_profiles[0]",
    ),
    (
        "count-2**62",
        set_at("cluster", "nodes", 0, "gpus", 0, "count", value=2**62),
        "cluster.nodes[0](node0).gpus[0].count",
    ),
    (
        "count-over-limit",
        set_at("cluster", "nodes", 0, "gpus", 0, "count", value=100_000),
        "above the limit of 65,536 (raise it with --limit gpus=N",
    ),
    (
        "ids-string",
        set_at("cluster", "nodes", 0, "gpus", 0, "ids", value="abcd"),
        "cluster.nodes[0](node0).gpus[0].ids",
    ),
    ("inline-tdp-inf", _inline_gpu(tdp_w=math.inf), "gpu_types[0](Site-H100).tdp_w"),
    ("inline-memory-1e308", _inline_gpu(memory_gb=1e308), "gpu_types[0](Site-H100).memory_gb"),
    ("inline-empty-name", _inline_gpu(name=""), "gpu_types[0].name"),
    (
        "inline-limit-above-tdp",
        _inline_gpu(power_limit_max_w=800),
        "power_limit_max_w 800 W exceeds tdp_w 700 W",
    ),
    (
        "inline-clock-outside-range",
        _inline_gpu(supported_sm_clocks_mhz=[100, 1980]),
        "supported_sm_clocks_mhz: 100 MHz",
    ),
    (
        "inline-too-many-mig-slices",
        _inline_gpu(
            mig_profiles=[
                {
                    "name": "1g.10gb",
                    "compute_slices": 1,
                    "memory_gb": 10,
                    "sm_count": 16,
                    "max_instances": 9,
                }
            ]
        ),
        "9 x 1g.10gb need 9 compute slices",
    ),
    (
        "state-clock-7",
        _state(clock_mhz=7),
        "gpus[0].state.clock_mhz: 7 MHz is outside H100-SXM5-80GB's range",
    ),
    (
        "state-shares-150",
        _state(
            placements=[
                {"workload": "chat-llama", "share_pct": 75},
                {"workload": "assistant-mistral", "share_pct": 75},
            ]
        ),
        "SM shares add up to 150 %",
    ),
]


@pytest.mark.parametrize(("mutate", "expected"), [pytest.param(m, e, id=i) for i, m, e in SERVING])
def test_bad_serving_instance_is_refused_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mutate: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    data = read_yaml(QUICKSTART)
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    for command in ("validate", "solve"):
        code, out, err = (
            run(capsys, command, str(path), "-q")
            if command == "solve"
            else run(capsys, command, str(path))
        )
        assert code == 2, (command, out, err)
        assert err.startswith(f"{path}: "), err
        assert expected in err, err


def test_a_raised_limit_lets_a_large_fleet_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = read_yaml(QUICKSTART)
    data["cluster"]["nodes"][0]["gpus"][0]["count"] = 20
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, _, err = run(capsys, "validate", str(path), "--limit", "gpus=16")
    assert code == 2
    assert "above the limit of 16 (raise it with --limit gpus=N" in err
    code, out, _ = run(capsys, "validate", str(path), "--limit", "gpus=16", "--limit", "gpus=20")
    assert code == 0
    assert out == f"{path}: ok (20 GPUs, 3 workloads)\n"
    code, _, err = run(capsys, "validate", str(path), "--limit", "gpu=20")
    assert code == 2
    assert err.startswith("--limit 'gpu=20': expected NAME=VALUE with NAME one of gpus, ")


def test_limits_parse_and_scope() -> None:
    raised = parse_limit_options(["load_scale=1e4", "tasks=10"], Limits())
    assert raised.load_scale == 1e4 and raised.tasks == 10
    with pytest.raises(SpecError, match="must be a positive finite number"):
        parse_limit_options(["gpus=-1"])
    with pytest.raises(SpecError, match="is not a number"):
        parse_limit_options(["gpus=many"])
    from energyopt.spec.limits import limits

    with using(raised):
        assert limits().tasks == 10
    assert limits() == Limits()


TASKGRAPH_BAD = [
    ("flops-inf", ("tasks", 1, "flops"), math.inf, "tasks[1](gemm_a).flops"),
    ("flops-1e308", ("tasks", 1, "flops"), 1e308, "tasks[1](gemm_a).flops"),
    ("bytes-1e308", ("tasks", 1, "bytes"), 1e308, "tasks[1](gemm_a).bytes"),
    ("launch-inf", ("tasks", 1, "launch_ms"), math.inf, "tasks[1](gemm_a).launch_ms"),
    ("transition-1e308", ("dvfs", "transition_ms"), 1e308, "dvfs.transition_ms"),
    ("latency-inf", ("links", 0, "latency_ms"), math.inf, "links[0].latency_ms"),
    ("bandwidth-1e-300", ("links", 0, "bandwidth_gbps"), 1e-300, "links[0].bandwidth_gbps"),
    ("resolution-tiny", ("time_resolution_ms",), 1e-12, "time_resolution_ms"),
    ("measured-time-inf", ("tasks", 0, "measured", 0, "time_ms"), math.inf, "measured[0].time_ms"),
    ("measured-power-1e308", ("tasks", 0, "measured", 0, "power_w"), 1e308, "measured[0].power_w"),
    (
        "measured-clock-7",
        ("tasks", 0, "measured", 0, "clock_mhz"),
        7,
        "measured[0].clock_mhz: 7 MHz",
    ),
    (
        "measured-unknown-type",
        ("tasks", 0, "measured", 0, "gpu_type"),
        "Nope",
        "measured[0].gpu_type",
    ),
]


@pytest.mark.parametrize(
    ("where", "value", "expected"), [pytest.param(w, v, e, id=i) for i, w, v, e in TASKGRAPH_BAD]
)
def test_bad_taskgraph_is_refused_naming_the_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    where: tuple[str | int, ...],
    value: Any,
    expected: str,
) -> None:
    data = read_yaml(TASKGRAPH)
    set_at(*where, value=value)(data)
    path = tmp_path / "tg.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = run(capsys, "validate", str(path))
    assert code == 2, err
    assert err.startswith(f"{path}: ")
    assert expected in err


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("dup.json", '{"name": "a", "name": "b"}', "malformed JSON: duplicate key 'name'"),
        ("dup.toml", 'name = "a"\nname = "b"\n', "malformed TOML"),
        ("listkey.yaml", "? [1, 2]\n: 3\n", "a mapping key must be a plain value"),
        ("comment.toml", "# nothing here\n", "file has no settings"),
        ("braces.json", "{}", "file has no settings"),
    ],
)
def test_bad_syntax_is_refused_as_instance_and_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, text: str, words: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    code, _, err = run(capsys, "validate", str(path))
    assert code == 2
    assert err.startswith(f"{path}: ") and words in err
    code, _, err = run(capsys, "validate", str(QUICKSTART), "--catalog", str(path))
    assert code == 2
    assert f"--catalog {path}: {path}: " in err and words in err


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["solve", str(QUICKSTART), "-q", "-o", str(path)]) == 0
    return path


def _edited_plan(plan_file: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = json.loads(plan_file.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (set_at("gpus", 0, "type", value=""), "gpus[0].type: String should have at least 1"),
        (set_at("gpus", 0, "power_limit_w", value=math.nan), "gpus[0].power_limit_w"),
        (set_at("gpus", 0, "power_limit_w", value=math.inf), "gpus[0].power_limit_w"),
        (set_at("gpus", 0, "clock_mhz", value=10**30), "gpus[0].clock_mhz"),
    ],
)
def test_bad_plan_is_refused_by_verify_and_apply(
    plan_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    path = _edited_plan(plan_file, tmp_path, edit)
    code, _, err = run(capsys, "verify", str(QUICKSTART), str(path))
    assert code == 2 and err.startswith(f"{path}: ") and expected in err, err
    with mock.patch.dict(os.environ, {"ENERGYOPT_NVML_BACKEND": "sim"}):
        code, _, err = run(capsys, "apply", str(path))
    assert code == 2 and err.startswith(f"{path}: ") and expected in err, err


def test_plan_with_unknown_gpu_type_is_a_violation_not_a_crash(
    plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _edited_plan(plan_file, tmp_path, set_at("gpus", 0, "type", value="H100"))
    code, _, err = run(capsys, "verify", str(QUICKSTART), str(path))
    assert code == 1
    assert "gpus[0](node0/0).type: unknown GPU type 'H100'" in err
    with mock.patch.dict(os.environ, {"ENERGYOPT_NVML_BACKEND": "sim"}):
        code, _, err = run(capsys, "apply", str(path))
    assert code == 2 and err.startswith(f"{path}: gpus[0](node0/0).type: unknown GPU type")


def test_mig_profile_in_an_mps_plan_is_refused(
    plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def to_mig(data: dict[str, Any]) -> None:
        # one placement, so that the plan file itself is well formed (no MIG next to MPS)
        first = data["gpus"][0]["placements"][0]
        first.update(mig_profile="3g.40gb", share_pct=100)
        data["gpus"][0]["placements"] = [first]

    path = _edited_plan(plan_file, tmp_path, to_mig)
    code, _, err = run(capsys, "verify", str(QUICKSTART), str(path))
    assert code == 1
    assert "3g.40gb is a MIG profile, but the instance shares GPUs by mps" in err

    def mixed(data: dict[str, Any]) -> None:
        data["gpus"][0]["placements"][0].update(mig_profile="3g.40gb", share_pct=75)

    path = _edited_plan(plan_file, tmp_path, mixed)
    with mock.patch.dict(os.environ, {"ENERGYOPT_NVML_BACKEND": "sim"}):
        code, _, err = run(capsys, "apply", str(path))
    assert code == 2 and "share_pct 75 is for MPS placements" in err


@pytest.fixture(scope="module")
def table_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("table") / "ops.eot"
    spec = ROOT / "instances" / "compile-quickstart-oppoints.yaml"
    assert main(["compile", str(spec), "-q", "-o", str(path)]) == 0
    return path


def _rewrite_header(table: Path, out: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """A copy of ``table`` with an edited header and a correct checksum."""
    raw = table.read_bytes()
    _, _, _, length = PREFIX.unpack_from(raw, 0)
    header = json.loads(raw[PREFIX.size : PREFIX.size + length])
    data = raw[(PREFIX.size + length + ALIGN - 1) // ALIGN * ALIGN : len(raw) - DIGEST_BYTES]
    edit(header)
    head = json.dumps(header).encode()
    prefix = PREFIX.pack(b"EOTABLE\x00", 1, 0, len(head)) + head
    body = prefix + b"\x00" * (-len(prefix) % ALIGN) + data
    out.write_bytes(body + hashlib.sha256(body).digest())


def _axis(name: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda header: next(a for a in header["axes"] if a["name"] == name)


TABLE_BAD = [
    (
        "unsorted-ceil",
        lambda h: _axis("load")(h)["values"].reverse(),
        "axis 'load': ceil values must be ascending",
    ),
    (
        "duplicate-axis",
        lambda h: h["axes"].append(copy.deepcopy(h["axes"][0])),
        "axis 'workload' is given twice",
    ),
    (
        "duplicate-column",
        lambda h: h["columns"].append(copy.deepcopy(h["columns"][0])),
        "the name is given twice",
    ),
    (
        "negative-offset",
        lambda h: h["columns"][1].update(offset=-64),
        "offset must be a whole number >= 0",
    ),
    (
        "string-axis-value",
        lambda h: _axis("load")(h)["values"].__setitem__(1, "x"),
        "ceil values must be finite numbers",
    ),
    (
        "null-axis-value",
        lambda h: _axis("clock_mhz")(h)["values"].__setitem__(0, None),
        "exact values must be finite numbers",
    ),
    (
        "null-category",
        lambda h: _axis("workload")(h)["values"].__setitem__(0, None),
        "category values must be strings",
    ),
    (
        "unknown-axis",
        lambda h: h["columns"][0]["axes"].__setitem__(0, "nope"),
        "unknown axis 'nope'",
    ),
    ("axes-not-list", lambda h: h.update(axes={}), "axes and columns must be lists"),
]


@pytest.mark.parametrize(("edit", "expected"), [pytest.param(e, x, id=i) for i, e, x in TABLE_BAD])
def test_bad_table_header_is_refused_by_inspect_and_lookup(
    table_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    edit: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    path = tmp_path / "bad.eot"
    _rewrite_header(table_file, path, edit)
    for argv in (["inspect", str(path)], ["lookup", str(path), "workload=chat-llama"]):
        code, _, err = run(capsys, *argv)
        assert code == 2
        assert err.startswith(f"{path}: ") and expected in err, err
    from energyopt.tables.stdlib_reader import StdlibTable, TableFormatError

    with pytest.raises(
        TableFormatError, match=r"ceil|given twice|offset|numbers|strings|axis|lists"
    ):
        StdlibTable(path)


def test_a_missing_table_is_named_as_every_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nothere.eot"
    for argv in (["inspect", str(path)], ["lookup", str(path), "workload=chat-llama"]):
        code, _, err = run(capsys, *argv)
        assert code == 2
        assert err == f"{path}: cannot read: No such file or directory\n", err


def test_outputs_are_never_half_written(tmp_path: Path, plan_file: Path) -> None:
    """A write that fails leaves the old file whole and no temporary file behind."""
    plan = load(Plan, plan_file)
    target = tmp_path / "out.json"
    target.write_text("old contents\n", encoding="utf-8")

    def broken_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    with (
        mock.patch("energyopt.spec.io.os.replace", broken_replace),
        pytest.raises(SpecError, match="No space left on device"),
    ):
        dump(plan, target)
    assert target.read_text(encoding="utf-8") == "old contents\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    dump(plan, target)
    assert load(Plan, target) == plan
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_table_write_failure_keeps_the_old_table(tmp_path: Path, table_file: Path) -> None:
    from energyopt.tables import Table, TableError, write_table

    target = tmp_path / "t.eot"
    target.write_bytes(table_file.read_bytes())
    table = Table.open(table_file)
    axes = list(table.axes.values())
    with (
        mock.patch("energyopt.spec.io.os.replace", side_effect=OSError(5, "I/O error")),
        pytest.raises(TableError, match="cannot write: I/O error"),
    ):
        write_table(target, "oppoints", axes, {})
    assert target.read_bytes() == table_file.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.eot"]


def test_duplicate_catalog_entries_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu = {**read_yaml(H100), "name": "Site-H100"}
    catalog = tmp_path / "cat.yaml"
    catalog.write_text(yaml.safe_dump({"gpus": [gpu, gpu]}), encoding="utf-8")
    code, _, err = run(capsys, "validate", str(QUICKSTART), "--catalog", str(catalog))
    assert code == 2
    assert f"{catalog}: gpus[1](Site-H100).name: 'Site-H100' is given twice" in err
    data = read_yaml(QUICKSTART)
    data["gpu_types"] = [gpu, gpu]
    path = tmp_path / "inline.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, _, err = run(capsys, "validate", str(path))
    assert code == 2
    assert err.startswith(f"{path}: gpu_types: Value error, 'Site-H100' is given twice")


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        (TASKGRAPH, "taskgraph"),
        (ROOT / "tests" / "data" / "colocation-small.yaml", "colocation"),
        (ROOT / "instances" / "compile-quickstart.yaml", "plans or kind: oppoints"),
    ],
)
def test_a_missing_kind_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: Path, kind: str
) -> None:
    data = read_yaml(source)
    del data["kind"]
    path = tmp_path / "nokind.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    for command in ("validate", "solve"):
        code, _, err = run(capsys, command, str(path))
        assert code == 2
        assert err == f"{path}: kind: missing; a file with " + err.split("a file with ")[1]
        assert err.rstrip().endswith(f"(add kind: {kind})")


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        (("workloads", 0, "prompt_tokens"), {"mean": 200_000}, "exceed Llama-3.1-8B's context"),
        (("workloads", 0, "tensor_parallel"), [3], "does not divide"),
        (
            ("cluster", "nodes", 0, "gpus"),
            [
                {"type": "H100-SXM5-80GB", "count": 1, "state": {"clock_mhz": 2500}},
                {"type": "H100-SXM5-80GB", "count": 3},
            ],
            "outside H100-SXM5-80GB's range",
        ),
    ],
)
def test_library_resolve_refuses_what_the_command_line_refuses(
    field: tuple[str | int, ...], value: Any, named: str
) -> None:
    """A library caller (``resolve`` / ``load_problem``, as in the README) gets the same
    catalog-dependent checks as ``energyopt solve``: a prompt beyond the model's context
    was solved as an 'infeasible' SLO before, with a diagnosis that blamed the GPUs."""
    from energyopt.catalog.problem import resolve
    from energyopt.spec.instance import Instance

    data = yaml.safe_load(QUICKSTART.read_text())
    set_at(*field, value=value)(data)
    with pytest.raises(SpecError) as err:
        resolve(Instance.model_validate(data), "inline.yaml")
    assert any(p.startswith("inline.yaml: ") and named in p for p in err.value.problems)
