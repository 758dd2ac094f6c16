"""Spec files: round trips in every format, and bad input rejected with file and field named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from energyopt.catalog import builtin_catalog, load_problem
from energyopt.perf.reachability import unreachable_slos
from energyopt.spec import (
    GpuEntry,
    GpuPlan,
    Instance,
    Placement,
    Plan,
    Slo,
    SpecError,
    dump,
    load,
    read_data,
)

from .mutations import delete_at, set_at

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "tests" / "data" / "sample-instance.yaml"
SUFFIXES = [".yaml", ".yml", ".json", ".toml"]


def quick_data() -> dict[str, Any]:
    """The quickstart instance as plain data, fresh for every caller to mutate."""
    data: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text(encoding="utf-8"))
    return data


def write_yaml(path: Path, data: Any) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def small_plan() -> Plan:
    return Plan(
        instance="quick",
        gpus=(
            GpuPlan(
                gpu="n0/0",
                type="H100-SXM5-80GB",
                on=True,
                clock_mhz=1500,
                power_limit_w=650.5,
                predicted_power_w=412.25,
                placements=(
                    Placement(workload="chat", rate_rps=12.0, share_pct=50),
                    Placement(
                        workload="code",
                        phase="prefill",
                        rate_rps=1e-6,
                        share_pct=50,
                        tp_group="g1",
                        tp_size=2,
                    ),
                ),
            ),
            GpuPlan(gpu="n0/1", type="H100-SXM5-80GB", on=False),
        ),
        objective=1234.5,
        bound=1200.0,
        gap=0.0123,
        solver="highs-exact",
        status="optimal",
    )


def parse_as(path: Path) -> Any:
    """Parse ``path`` with the format's own reference parser, not energyopt's."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    if path.suffix == ".toml":
        return tomllib.loads(text)
    return yaml.safe_load(text)


# ---------------------------------------------------------------- round trips


def test_quickstart_loads() -> None:
    inst = load(Instance, QUICKSTART)
    assert inst.name == "quick"
    assert [w.name for w in inst.workloads] == ["chat", "code", "big"]
    assert inst.workload("chat").rate_rps == 12.0
    assert inst.cluster.nodes[0].gpus[0].count == 8


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_instance_round_trip(tmp_path: Path, suffix: str) -> None:
    original = load(Instance, QUICKSTART)
    first = tmp_path / f"inst{suffix}"
    dump(original, first)
    # the file really is in the format its suffix names
    assert parse_as(first)["name"] == "quick"
    again = load(Instance, first)
    assert again == original
    second = tmp_path / f"again{suffix}"
    dump(again, second)
    assert load(Instance, second) == original
    assert second.read_text(encoding="utf-8") == first.read_text(encoding="utf-8")


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_plan_round_trip(tmp_path: Path, suffix: str) -> None:
    original = small_plan()
    first = tmp_path / f"plan{suffix}"
    dump(original, first)
    assert parse_as(first)["instance"] == "quick"
    again = load(Plan, first)
    assert again == original
    assert again.gpu("n0/0").placements[1].tp_size == 2
    second = tmp_path / f"again{suffix}"
    dump(again, second)
    assert load(Plan, second) == original


def test_round_trip_across_formats(tmp_path: Path) -> None:
    """YAML -> JSON -> TOML -> YAML keeps the instance equal."""
    obj = load(Instance, QUICKSTART)
    for i, suffix in enumerate([".json", ".toml", ".yaml", ".json"]):
        path = tmp_path / f"step{i}{suffix}"
        dump(obj, path)
        obj = load(Instance, path)
    assert obj == load(Instance, QUICKSTART)


def test_dump_refuses_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"unknown file type '\.txt'"):
        dump(small_plan(), tmp_path / "plan.txt")
    assert not (tmp_path / "plan.txt").exists()


names = st.text(min_size=1, max_size=12).filter(lambda s: s.strip() != "")
finite_or_inf = st.floats(allow_nan=False, width=64)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    gpus = []
    for k in range(draw(st.integers(0, 3))):
        mig = draw(st.booleans())  # a GPU is in MIG mode or shares by MPS
        placements = tuple(
            Placement(
                workload=draw(names),
                phase=draw(st.sampled_from(["both", "prefill", "decode"])),
                share_pct=100 if mig else draw(st.integers(1, 100)),
                rate_rps=draw(st.floats(min_value=0, max_value=1e6)),
                mig_profile=draw(names) if mig else None,
                tp_group=draw(st.none() | names),
                tp_size=draw(st.integers(1, 8)),
            )
            for _ in range(draw(st.integers(0, 2)))
        )
        gpus.append(
            GpuPlan(
                gpu=f"n{k}/{draw(names)}",
                type=draw(names),
                on=draw(st.booleans()),
                clock_mhz=draw(st.none() | st.integers(1, 10_000)),
                power_limit_w=draw(st.none() | st.floats(1, 1e4)),
                placements=placements,
                predicted_power_w=draw(st.floats(0, 1e6)),
            )
        )
    return Plan(
        instance=draw(names),
        gpus=tuple(gpus),
        objective=draw(st.none() | finite_or_inf),
        bound=draw(st.none() | finite_or_inf),
        gap=draw(st.none() | st.floats(0, 1)),
        solver=draw(st.text(max_size=20)),
        status=draw(st.text(max_size=20)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=plans())
def test_plan_round_trip_property(tmp_path_factory: pytest.TempPathFactory, plan: Plan) -> None:
    """Any plan (any text, inf objectives, tiny floats) survives every format."""
    folder = tmp_path_factory.mktemp("prop", numbered=True)
    for suffix in SUFFIXES:
        path = folder / f"plan{suffix}"
        dump(plan, path)
        assert load(Plan, path) == plan, path.read_text(encoding="utf-8")


def test_toml_dump_of_non_bmp_text(tmp_path: Path) -> None:
    """Characters outside the BMP must not be written as JSON surrogate escapes."""
    plan = Plan(instance="q", gpus=(), solver="rocket \U0001f680", status="del\x7f")
    path = tmp_path / "plan.toml"
    dump(plan, path)
    assert tomllib.loads(path.read_text(encoding="utf-8"))["solver"] == "rocket \U0001f680"
    assert load(Plan, path) == plan


# ---------------------------------------------------------------- bad field values


def _rename_workload(data: dict[str, Any]) -> None:
    data["workloads"][1]["name"] = "chat"


def _bad_link(data: dict[str, Any]) -> None:
    data["cluster"]["links"] = [{"a": "n0", "b": "n9", "bandwidth_gbps": 50}]


def load_mutated(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None]
) -> tuple[Path, pytest.ExceptionInfo[SpecError]]:
    """Write the mutated sample instance and load it; the SpecError it must raise."""
    data = quick_data()
    mutate(data)
    path = write_yaml(tmp_path / "bad.yaml", data)
    with pytest.raises(SpecError) as info:
        load(Instance, path)
    return path, info


SCHEMA_CASES = [
    # id, mutation, field named in the message, words of the message
    (
        "wrong-type",
        set_at("workloads", 0, "rate_rps", value="fast"),
        "workloads[0](chat).rate_rps",
        "valid number",
    ),
    (
        "negative-rate",
        set_at("workloads", 0, "rate_rps", value=-3),
        "workloads[0](chat).rate_rps",
        "greater than or equal to 0.000001",
    ),
    (
        "zero-rate",
        set_at("workloads", 2, "rate_rps", value=0),
        "workloads[2](big).rate_rps",
        "greater than or equal to 0.000001",
    ),
    (
        "infinite-rate",
        set_at("workloads", 1, "rate_rps", value=float("inf")),
        "workloads[1](code).rate_rps",
        "finite",
    ),
    (
        "missing-rate",
        delete_at("workloads", 0, "rate_rps"),
        "workloads[0](chat).rate_rps",
        "Field required",
    ),
    (
        "typo-key",
        set_at("workloads", 0, "rate_rsp", value=5),
        "workloads[0](chat).rate_rsp",
        "Extra inputs are not permitted",
    ),
    (
        "typo-top-key",
        set_at("worklods", value=[]),
        "worklods",
        "Extra inputs are not permitted",
    ),
    (
        "negative-ttft",
        set_at("workloads", 1, "slo", "ttft_ms", value=-1),
        "workloads[1](code).slo.ttft_ms",
        "greater than 0",
    ),
    (
        "percentile-out-of-range",
        set_at("workloads", 0, "slo", "percentile", value=100),
        "workloads[0](chat).slo.percentile",
        "less than 100",
    ),
    (
        "bad-count",
        set_at("cluster", "nodes", 0, "gpus", 0, "count", value="eight"),
        "cluster.nodes[0](n0).gpus[0].count",
        "valid integer",
    ),
    (
        "duplicate-workloads",
        _rename_workload,
        "workloads",
        "duplicate workload names: ['chat']",
    ),
    (
        "link-to-unknown-node",
        _bad_link,
        "cluster.links",
        "'n9' is not a node",
    ),
    (
        "state-on-many",
        set_at("cluster", "nodes", 0, "gpus", 0, "state", value={"on": True}),
        "cluster.nodes[0](n0).gpus[0]",
        "a state can only be given for a single GPU",
    ),
    (
        "ids-count-mismatch",
        set_at("cluster", "nodes", 0, "gpus", 0, "ids", value=["a", "b"]),
        "cluster.nodes[0](n0).gpus[0]",
        "ids has 2 entries but count is 8",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [pytest.param(m, f, w, id=i) for i, m, f, w in SCHEMA_CASES],
)
def test_bad_field_names_file_and_field(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None], field: str, words: str
) -> None:
    path, info = load_mutated(tmp_path, mutate)
    lines = info.value.problems
    assert str(info.value) == "\n".join(lines)
    matching = [line for line in lines if line.startswith(f"{path}: {field}: ")]
    assert matching, lines
    assert any(words in line for line in matching), lines


@pytest.mark.parametrize(
    "mutate",
    [
        set_at("cluster", "nodes", 0, "gpus", 0, "state", value={"on": True}),
        set_at("cluster", "nodes", 0, "gpus", 0, "ids", value=["a"]),
        set_at("cluster", "nodes", 0, "gpus", 0, "count", value=-1),
    ],
    ids=["state", "ids", "count"],
)
def test_one_bad_entry_gives_one_true_line(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], None]
) -> None:
    """The only GPU entry of the only node is bad: report that, not 'nodes is empty'."""
    _, info = load_mutated(tmp_path, mutate)
    assert len(info.value.problems) == 1, info.value.problems
    assert "at least 1 item" not in str(info.value)


def test_empty_list_still_reported_as_too_short(tmp_path: Path) -> None:
    data = quick_data()
    data["workloads"] = []
    path = write_yaml(tmp_path / "bad.yaml", data)
    with pytest.raises(SpecError, match=r"bad\.yaml: workloads: .*at least 1 item"):
        load(Instance, path)


def test_every_problem_is_reported(tmp_path: Path) -> None:
    data = quick_data()
    data["workloads"][0]["rate_rps"] = "fast"
    data["workloads"][2]["slo"]["tbt_ms"] = -1
    path = write_yaml(tmp_path / "two.yaml", data)
    with pytest.raises(SpecError) as info:
        load(Instance, path)
    fields = [line.split(": ")[1] for line in info.value.problems]
    assert fields == ["workloads[0](chat).rate_rps", "workloads[2](big).slo.tbt_ms"]


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_bad_field_in_json_and_toml(tmp_path: Path, suffix: str) -> None:
    """The field path is named whatever the format."""
    good = tmp_path / f"good{suffix}"
    dump(load(Instance, QUICKSTART), good)
    text = good.read_text(encoding="utf-8")
    needle = '"rate_rps": 12.0' if suffix == ".json" else "rate_rps = 12.0"
    assert needle in text
    bad = tmp_path / f"bad{suffix}"
    bad.write_text(text.replace(needle, needle.replace("12.0", '"fast"'), 1), encoding="utf-8")
    with pytest.raises(SpecError, match=r"workloads\[0\]\(chat\)\.rate_rps: Input should be"):
        load(Instance, bad)
    with pytest.raises(SpecError, match=str(bad).replace("\\", "\\\\")):
        load(Instance, bad)


# ---------------------------------------------------------------- names resolved in the catalog


def test_unknown_gpu_type_suggests_close_name(tmp_path: Path) -> None:
    data = quick_data()
    data["cluster"]["nodes"][0]["gpus"][0]["type"] = "H100"
    path = write_yaml(tmp_path / "gpu.yaml", data)
    load(Instance, path)  # the schema alone has no catalog: fine
    with pytest.raises(SpecError) as info:
        load_problem(path)
    (line,) = info.value.problems
    assert line.startswith(f"{path}: cluster.nodes[0](n0).gpus[0].type: ")
    assert "unknown GPU type 'H100'" in line
    assert "did you mean 'H100-SXM5-80GB'" in line


def test_unknown_model_suggests_close_name(tmp_path: Path) -> None:
    data = quick_data()
    data["workloads"][1]["model"] = "Qwen2.5-14b"
    path = write_yaml(tmp_path / "model.yaml", data)
    with pytest.raises(SpecError) as info:
        load_problem(path)
    (line,) = info.value.problems
    assert line.startswith(f"{path}: workloads[1](code).model: ")
    assert "unknown model 'Qwen2.5-14b'" in line
    assert "'Qwen2.5-14B'" in line.split("did you mean", 1)[1].split("(known", 1)[0]


def test_unknown_gpu_and_model_both_reported(tmp_path: Path) -> None:
    data = quick_data()
    data["cluster"]["nodes"][0]["gpus"][0]["type"] = "B200"
    data["workloads"][0]["model"] = "GPT-5"
    path = write_yaml(tmp_path / "both.yaml", data)
    with pytest.raises(SpecError) as info:
        load_problem(path)
    text = str(info.value)
    assert "gpus[0].type: unknown GPU type 'B200'" in text
    assert "workloads[0](chat).model: unknown model 'GPT-5'" in text


def test_quickstart_slos_are_reachable() -> None:
    assert unreachable_slos(load_problem(QUICKSTART)) == []


def test_unreachable_slo_is_named(tmp_path: Path) -> None:
    data = quick_data()
    data["workloads"][0]["slo"]["ttft_ms"] = 0.001
    path = write_yaml(tmp_path / "slo.yaml", data)
    problem = load_problem(path)  # a valid file: only the SLO is out of reach
    lines = unreachable_slos(problem)
    assert len(lines) == 1
    assert lines[0].startswith("workloads[0](chat).slo: no catalog GPU meets it")
    assert "0.001" in lines[0]


def test_each_unreachable_slo_names_its_own_workload(tmp_path: Path) -> None:
    """The check runs every workload's candidates in one model run: the verdicts and
    the best candidate's latencies must still be each workload's own."""
    data = quick_data()
    data["workloads"][1]["slo"]["tbt_ms"] = 0.002
    data["workloads"][2]["slo"]["ttft_ms"] = 0.003
    lines = unreachable_slos(load_problem(write_yaml(tmp_path / "slo.yaml", data)))
    names = [w["name"] for w in data["workloads"]]
    assert [line.split(".slo:")[0] for line in lines] == [
        f"workloads[1]({names[1]})",
        f"workloads[2]({names[2]})",
    ]
    assert "/ 0.002 ms" in lines[0] and "(SLO 0.003 /" in lines[1]
    alone = quick_data()
    alone["workloads"] = [alone["workloads"][2]]
    alone["workloads"][0]["slo"]["ttft_ms"] = 0.003
    single = unreachable_slos(load_problem(write_yaml(tmp_path / "one.yaml", alone)))
    assert [line.split(": ", 1)[1] for line in single] == [lines[1].split(": ", 1)[1]]


# ---------------------------------------------------------------- bad files


BAD_FILES = [
    ("bad.yaml", "name: quick\nworkloads: [unclosed\ncluster: {", "malformed YAML"),
    ("bad.yml", "name: quick\n  cluster: x\n", "malformed YAML"),
    ("bad.json", '{"name": "quick",\n "cluster": }', "malformed JSON"),
    ("bad.toml", 'name = "quick"\ncluster = {\n', "malformed TOML"),
    ("empty.yaml", "", "file is empty"),
    ("blank.json", "  \n\n", "file is empty"),
    ("empty.toml", "", "file is empty"),
    ("comment.yaml", "# nothing but a comment\n", "file is empty"),
    ("null.yaml", "null\n", "file is empty"),
    ("list.yaml", "- name: quick\n- name: other\n", "top level must be a mapping, got list"),
    ("list.json", '[{"name": "quick"}]', "top level must be a mapping, got list"),
    ("scalar.yaml", "just text\n", "top level must be a mapping, got str"),
    ("notes.txt", "name: quick\n", "unknown file type '.txt'"),
    ("latin1.yaml", b"name: caf\xe9\n", "cannot read as UTF-8"),
]


@pytest.mark.parametrize(("name", "text", "words"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_file_names_the_file(tmp_path: Path, name: str, text: str | bytes, words: str) -> None:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load(Instance, path)
    assert len(info.value.problems) == 1
    line = info.value.problems[0]
    assert line.startswith(f"{path}: "), line
    assert words in line


@pytest.mark.parametrize(
    ("name", "text", "line_no"),
    [
        ("bad.yaml", "name: quick\ncluster:\n  nodes: [a, b\n", "line 3"),
        ("bad.json", '{\n"name": "quick",\n"cluster": }\n', "line 3"),
        ("bad.toml", 'name = "quick"\n\nx = = 1\n', "line 3"),
    ],
    ids=["yaml", "json", "toml"],
)
def test_malformed_file_names_the_line(tmp_path: Path, name: str, text: str, line_no: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        read_data(path)
    assert str(path) in str(info.value)
    assert line_no in str(info.value)
    assert "\n" not in str(info.value)  # one line per problem


def test_nonexistent_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(SpecError, match=r"missing\.yaml: cannot read: No such file"):
        load(Instance, path)


def test_directory_instead_of_file(tmp_path: Path) -> None:
    path = tmp_path / "folder.yaml"
    path.mkdir()
    with pytest.raises(SpecError, match=r"folder\.yaml: cannot read"):
        load(Instance, path)


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".yaml", "[" * 50_000 + "]" * 50_000),
        (".json", '{"name": ' + "[" * 50_000 + "]" * 50_000 + "}"),
        (".toml", "name = " + "[" * 50_000 + "]" * 50_000),
    ],
)
def test_deep_nesting_is_a_spec_error(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"deep{suffix}"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match=r"deep\.\w+: malformed \w+: nested too deeply"):
        read_data(path)


def test_yaml_aliases_in_ordinary_use_are_fine(tmp_path: Path) -> None:
    """The bomb guard must not refuse a file that reuses a block a few times."""
    text = QUICKSTART.read_text(encoding="utf-8")
    text = text.replace(
        "    slo: {ttft_ms: 500, tbt_ms: 50, percentile: 90}",
        "    slo: &slo {ttft_ms: 500, tbt_ms: 50, percentile: 90}",
    ).replace("    slo: {ttft_ms: 1000, tbt_ms: 60, percentile: 90}", "    slo: *slo")
    assert "*slo" in text
    path = tmp_path / "alias.yaml"
    path.write_text(text, encoding="utf-8")
    inst = load(Instance, path)
    assert inst.workload("code").slo == inst.workload("chat").slo


BOMB_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from pathlib import Path
    from energyopt.spec import Instance, SpecError, load
    start = time.perf_counter()
    try:
        load(Instance, Path(sys.argv[1]))
        out = {"error": None}
    except SpecError as exc:
        out = {"error": str(exc)}
    out["seconds"] = time.perf_counter() - start
    # the peak RSS of this process's own address space (VmHWM); getrusage's maxrss
    # also carries the RSS of the parent it was forked from (the test process)
    hwm = [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM:")]
    out["maxrss_kb"] = (
        int(hwm[0].split()[1]) if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    )
    print(json.dumps(out))
    """
)


def _billion_laughs(levels: int, width: int, target: str) -> str:
    lines = ["lol0: &lol0 [" + ", ".join(['"lol"'] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * width) + "]")
    lines.append(f"{target}: *lol{levels - 1}")
    return "\n".join(lines) + "\n"


def _limit_memory() -> None:
    import resource

    limit = 3 * 1024**3
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.skipif(sys.platform != "linux", reason="uses RLIMIT_AS and ru_maxrss in KiB")
@pytest.mark.parametrize(
    ("levels", "width", "target", "words"),
    [
        # 9**9 = 387 million strings if expanded; 72 aliases, under the alias limit, so
        # the reader must measure the expansion without walking the shared structure
        (9, 9, "description", "malformed YAML: aliases expand it to 926,177,115 values"),
        (9, 9, "workloads", "malformed YAML: aliases expand it to 926,177,115 values"),
        # 10**30 if expanded; refused by the loader's alias limit
        (30, 10, "description", "malformed YAML: more than 256 aliases"),
    ],
    ids=["laughs-description", "laughs-workloads", "laughs-wide"],
)
def test_yaml_bomb_rejected_quickly_and_small(
    tmp_path: Path, levels: int, width: int, target: str, words: str
) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_billion_laughs(levels, width, target), encoding="utf-8")
    child = subprocess.run(
        [sys.executable, "-c", BOMB_CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    out = json.loads(child.stdout)
    assert out["error"] is not None
    assert str(path) in out["error"]
    assert words in out["error"]
    assert out["seconds"] < 2.0
    assert out["maxrss_kb"] < 400 * 1024


# ---------------------------------------------------------------- immutability


def test_specs_are_frozen() -> None:
    inst = load(Instance, QUICKSTART)
    with pytest.raises(ValidationError, match="frozen"):
        inst.name = "other"  # type: ignore[misc]
    wl = inst.workloads[0]
    with pytest.raises(ValidationError, match="frozen"):
        wl.rate_rps = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        wl.slo.ttft_ms = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        inst.cluster.nodes[0].gpus[0].count = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        inst.workloads.append(wl)  # type: ignore[attr-defined]
    assert inst == load(Instance, QUICKSTART)
    assert wl.rate_rps == 12.0


def test_plan_and_catalog_entries_are_frozen() -> None:
    plan = small_plan()
    with pytest.raises(ValidationError, match="frozen"):
        plan.status = "feasible"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        plan.gpus[0].placements[0].rate_rps = 0.0  # type: ignore[misc]
    gpu = builtin_catalog().gpus["H100-SXM5-80GB"]
    with pytest.raises(ValidationError, match="frozen"):
        gpu.tdp_w = 1.0  # type: ignore[misc]
    assert plan.status == "optimal"
    assert gpu.tdp_w == 700


def test_specs_are_hashable_where_all_fields_are() -> None:
    """Frozen specs without dict fields hash by value."""
    slo = Slo(ttft_ms=500, tbt_ms=50)
    entry = GpuEntry(type="L4", count=2)
    assert {slo: 1}[Slo(ttft_ms=500.0, tbt_ms=50.0)] == 1
    assert hash(entry) == hash(GpuEntry(type="L4", count=2))


def test_duplicate_yaml_keys_are_rejected_naming_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("name: a\nname: b\ncluster: {nodes: []}\n")
    with pytest.raises(SpecError) as err:
        load(Instance, path)
    text = str(err.value)
    assert str(path) in text and "duplicate key 'name'" in text and "line 2" in text
