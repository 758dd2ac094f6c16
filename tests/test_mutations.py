"""Mutated inputs of every bundled file kind: a clean error or a valid result, never
an internal error (issue 22).

Each example takes a bundled file, makes one edit a user could make (delete a
key, give a leaf a value of the wrong type, put a non-finite or extreme number
anywhere, repeat a key), writes it as JSON, YAML or TOML, and runs the commands
that read that kind of file. The outcome must be one of:

* valid: every command exits 0 (a file ``validate`` accepts is one ``solve`` or
  ``compile`` can run, so they run too; ``solve`` may also exit 3 or 6, no plan, with
  the reason; for the newer kinds, serverless, moe-edge, keep-alive and collective, the
  plan ``solve`` writes must pass ``verify``, and their plans are mutated too);
* rejected: exit 2 (1 for a plan ``verify`` finds violations in), no traceback,
  no "internal error", and the first line of stderr starts with the file's path
  followed by the field (or the file-level problem) and a message.

Hypothesis is seeded (``derandomize``) and the example counts are fixed, so a run
is the same everywhere and takes a couple of minutes on two slow cores. The
session prints how the mutations were classified (run with ``-s`` to see it).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from energyopt.cli import main
from energyopt.solvers.presets import load_preset
from energyopt.spec.errors import SpecError
from energyopt.tables.stdlib_reader import ALIGN, DIGEST_BYTES, PREFIX

from .mutations import Edit, apply, edits, render

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = ROOT / "instances"
QUICKSTART = INSTANCES / "quickstart.yaml"

TALLY: Counter[tuple[str, str]] = Counter()
"""(file kind, outcome) -> examples, printed at the end of the session."""

Outcome = tuple[int, str, str]


def run_cli(*argv: str) -> Outcome:
    """``energyopt ARGV`` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def run_preset(path: Path) -> Outcome:
    """Load a solver preset file as ``--solver FILE`` does."""
    try:
        load_preset(str(path))
    except SpecError as exc:
        return 2, "", "\n".join(exc.problems) + "\n"
    return 0, "", ""


def read_yaml(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


@dataclass
class Workspace:
    """Files the mutated copies refer to, built once per session."""

    folder: Path
    plan: Path
    table: Path
    trace: Path
    catalog_instance: Path


@pytest.fixture(scope="session")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspace]:
    folder = tmp_path_factory.mktemp("mutations")
    plan = folder / "plan.json"
    code, _, err = run_cli("solve", str(QUICKSTART), "-q", "-o", str(plan))
    assert code == 0, err
    table = folder / "ops.eot"
    code, _, err = run_cli(
        "compile", str(INSTANCES / "compile-quickstart-oppoints.yaml"), "-q", "-o", str(table)
    )
    assert code == 0, err
    trace = folder / "trace.csv"
    with trace.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        for i in range(40):
            writer.writerow([f"2023-11-16 18:{i // 4:02d}:{i % 4 * 15:02d}", 200 + 37 * i, 40 + i])
    # an instance whose GPU type and model come only from a --catalog file
    data = read_yaml(QUICKSTART)
    data["cluster"]["nodes"][0]["gpus"][0]["type"] = "Test-GPU"
    for wl in data["workloads"]:
        wl["model"] = "Test-LLM"
    catalog_instance = folder / "catalog-instance.yaml"
    catalog_instance.write_text(yaml.safe_dump(data), encoding="utf-8")
    yield Workspace(folder, plan, table, trace, catalog_instance)
    if TALLY:
        kinds = sorted({k for k, _ in TALLY})
        print("\nmutations tried, by file kind and outcome:")
        for kind in kinds:
            row = {o: n for (k, o), n in TALLY.items() if k == kind}
            print(f"  {kind:<18} " + ", ".join(f"{o} {n}" for o, n in sorted(row.items())))
        totals: Counter[str] = Counter()
        for (_, outcome), n in TALLY.items():
            totals[outcome] += n
        print(f"  {'all':<18} " + ", ".join(f"{o} {n}" for o, n in sorted(totals.items())))


def classify(
    path: Path, edit_field: str | None, outcome: Outcome, others: tuple[Path, ...] = ()
) -> str:
    """'valid' or 'rejected...' for a clean outcome; AssertionError otherwise.

    The error must name ``path``, or one of ``others`` (files given on the same
    command line, which an edit can make wrong: a catalog file without the entry
    an instance names is reported at the instance)."""
    code, out, err = outcome
    assert "Traceback" not in out + err, err
    assert "internal error" not in err, err
    if code == 0:
        return "valid"
    if code in (3, 6):  # solve: a valid file with no plan (infeasible / none found), explained
        assert any(err.startswith(f"{p}: no ") for p in (path, *others)), err
        return "valid"
    assert code in (1, 2), (code, err)
    lines = err.strip().splitlines()
    assert lines, f"exit {code} with nothing on stderr"
    first = lines[0]
    named = [p for p in (path, *others) if str(p) in first]
    assert named, f"the first line does not name {path}: {first}"
    rest = first.split(str(named[0]), 1)[1]
    assert rest.startswith(": ") and rest[2:].strip(), f"nothing after the file name: {first}"
    if edit_field is not None and edit_field in err:
        return "rejected, field named"
    return "rejected"


def record(
    kind: str, path: Path, edit: Edit, outcomes: list[Outcome], others: tuple[Path, ...] = ()
) -> None:
    """Classify the outcome of every command (the first refusal decides)."""
    result = "valid"
    for outcome in outcomes:
        try:
            result = classify(path, edit.field(), outcome, others)
        except AssertionError:
            TALLY[(kind, "other")] += 1
            raise
        if result != "valid":
            break
    TALLY[(kind, result)] += 1


@dataclass(frozen=True)
class Kind:
    """A bundled file kind: its data, formats, and the commands that read it."""

    name: str
    load: Callable[[Workspace], dict[str, Any]]
    formats: tuple[str, ...]
    commands: Callable[[Workspace, Path], Iterator[Outcome]]
    examples: int
    others: Callable[[Workspace], tuple[Path, ...]] = lambda ws: ()
    ops: tuple[str, ...] | None = None
    """The edits drawn (``mutations.edits``); None for all of them."""


def _serving(source: Path) -> Callable[[Workspace], dict[str, Any]]:
    return lambda ws: read_yaml(source)


def _inline_catalog(ws: Workspace) -> dict[str, Any]:
    data = read_yaml(ws.catalog_instance)
    cat = read_yaml(ROOT / "models" / "gpus" / "h100-sxm5-80gb.yaml")
    llm = read_yaml(ROOT / "models" / "llms" / "llama-3.1-8b.yaml")
    for entry in (cat, llm):
        entry.pop("sources", None)
    data["gpu_types"] = [{**cat, "name": "Test-GPU"}]
    data["models"] = [{**llm, "name": "Test-LLM"}]
    return data


def _catalog_file(ws: Workspace) -> dict[str, Any]:
    data = _inline_catalog(ws)
    return {"gpus": data["gpu_types"], "models": data["models"]}


def _with_base(source: Path) -> Callable[[Workspace], dict[str, Any]]:
    def load(ws: Workspace) -> dict[str, Any]:
        data = read_yaml(source)
        data["base"] = str(QUICKSTART)
        return data

    return load


def _trace_spec(ws: Workspace) -> dict[str, Any]:
    data = _with_base(INSTANCES / "evaluate" / "quickstart-bursty.yaml")(ws)
    data["load"] = {"kind": "trace", "file": str(ws.trace), "load_scale": 1.5}
    return data


def _validate_then(*extra: str) -> Callable[[Workspace, Path], Iterator[Outcome]]:
    """``validate FILE``; if it passes, ``EXTRA... FILE ...`` must pass too."""

    def commands(ws: Workspace, path: Path) -> Iterator[Outcome]:
        first = run_cli("validate", str(path))
        yield first
        if first[0] == 0 and extra:
            yield run_cli(*[str(path) if a == "{}" else a for a in extra])

    return commands


def _compile(ws: Workspace, path: Path) -> Iterator[Outcome]:
    first = run_cli("validate", str(path))
    yield first
    if first[0] == 0:
        yield run_cli("compile", str(path), "-q", "-o", str(ws.folder / "out.eot"))


def _catalog_commands(ws: Workspace, path: Path) -> Iterator[Outcome]:
    first = run_cli("validate", str(ws.catalog_instance), "--catalog", str(path))
    yield first
    if first[0] == 0:
        yield run_cli(*SOLVE[:1], str(ws.catalog_instance), *SOLVE[2:], "--catalog", str(path))


def _plan_commands(ws: Workspace, path: Path) -> Iterator[Outcome]:
    yield run_cli("verify", str(QUICKSTART), str(path))
    with mock.patch.dict(os.environ, {"ENERGYOPT_NVML_BACKEND": "sim"}):
        yield run_cli("apply", str(path))


def _preset_commands(ws: Workspace, path: Path) -> Iterator[Outcome]:
    yield run_preset(path)


def _from_file(path: Path) -> Callable[[Workspace], dict[str, Any]]:
    def load(ws: Workspace) -> dict[str, Any]:
        if path.suffix == ".toml":
            import tomllib

            return tomllib.loads(path.read_text(encoding="utf-8"))
        return read_yaml(path)

    return load


def _plan(ws: Workspace) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ws.plan.read_text(encoding="utf-8"))
    return data


SOLVE = ("solve", "{}", "-q", "--time-limit", "20")
KINDS = [
    Kind("serving", _serving(QUICKSTART), ("yaml", "json"), _validate_then(*SOLVE), 40),
    Kind(
        "serving-mig", _serving(INSTANCES / "mig-a100.yaml"), ("yaml",), _validate_then(*SOLVE), 30
    ),
    Kind(
        "serving-state",
        _serving(INSTANCES / "hetero-migration.yaml"),
        ("json",),
        _validate_then(*SOLVE),
        20,
    ),
    Kind(
        "serving-tp",
        _serving(INSTANCES / "tensor-parallel.yaml"),
        ("yaml",),
        _validate_then(*SOLVE),
        20,
    ),
    Kind("inline-catalog", _inline_catalog, ("yaml", "json"), _validate_then(*SOLVE), 30),
    Kind(
        "catalog-file",
        _catalog_file,
        ("yaml", "json"),
        _catalog_commands,
        30,
        lambda ws: (ws.catalog_instance,),
    ),
    Kind(
        "taskgraph",
        _serving(INSTANCES / "taskgraph" / "hetero-measured.yaml"),
        ("yaml", "json"),
        _validate_then("solve", "{}", "--solver", "heuristic", "-q"),
        50,
    ),
    Kind(
        "colocation",
        _serving(ROOT / "tests" / "data" / "colocation-small.yaml"),
        ("yaml", "json"),
        _validate_then(*SOLVE),
        40,
    ),
    Kind(
        "evaluation",
        _with_base(INSTANCES / "evaluate" / "quickstart-bursty.yaml"),
        ("yaml", "json"),
        _validate_then(),
        40,
    ),
    Kind("evaluation-trace", _trace_spec, ("yaml",), _validate_then(), 20),
    Kind(
        "compile-plans",
        _with_base(INSTANCES / "compile-tiers.yaml"),
        ("yaml", "json"),
        _validate_then(),
        40,
    ),
    Kind(
        "compile-oppoints",
        _with_base(INSTANCES / "compile-quickstart-oppoints.yaml"),
        ("yaml", "json"),
        _compile,
        30,
    ),
    Kind(
        "solver-preset", _from_file(ROOT / "solvers" / "pop.toml"), ("toml",), _preset_commands, 40
    ),
    Kind("plan", _plan, ("json", "yaml"), _plan_commands, 50),
]

NEWER: dict[str, tuple[Path, str]] = {
    "serverless": (INSTANCES / "serverless" / "azure-conv-small.yaml", "fast"),
    "moe-edge": (INSTANCES / "moe-edge" / "mixtral-l4-cs.yaml", "auto"),
    "keepalive": (INSTANCES / "keepalive" / "azure-llm-2nodes.yaml", "rolling"),
    "collective": (INSTANCES / "collective" / "tiny-2x2.yaml", "select"),
}
"""Each newer kind's bundled file and the quickest of its solvers."""


def _solve_and_verify(kind: str) -> Callable[[Workspace, Path], Iterator[Outcome]]:
    """``validate FILE``; if it passes, ``solve`` (a short limit) must give a plan or
    say why there is none, and the plan it writes must pass ``verify``."""
    solver = NEWER[kind][1]

    def commands(ws: Workspace, path: Path) -> Iterator[Outcome]:
        first = run_cli("validate", str(path))
        yield first
        if first[0] != 0:
            return
        plan = path.with_name("plan.json")
        plan.unlink(missing_ok=True)
        yield run_cli(
            "solve", str(path), "--solver", solver, "-q", "--time-limit", "2", "-o", str(plan)
        )
        if plan.exists():
            code, _, err = run_cli("verify", str(path), str(plan))
            assert code == 0, f"{kind}: a plan solve wrote fails verify: {err}"

    return commands


def _newer_plan(kind: str) -> Callable[[Workspace], dict[str, Any]]:
    """The plan the quick solver writes for the kind's bundled file (solved once)."""

    def load(ws: Workspace) -> dict[str, Any]:
        source, solver = NEWER[kind]
        plan = ws.folder / f"{kind}-plan.json"
        if not plan.exists():
            code, _, err = run_cli("solve", str(source), "--solver", solver, "-q", "-o", str(plan))
            assert code == 0, err
        data: dict[str, Any] = json.loads(plan.read_text(encoding="utf-8"))
        return data

    return load


def _verify_against(kind: str) -> Callable[[Workspace, Path], Iterator[Outcome]]:
    def commands(ws: Workspace, path: Path) -> Iterator[Outcome]:
        yield run_cli("verify", str(NEWER[kind][0]), str(path))

    return commands


for _name in NEWER:
    KINDS += [
        Kind(_name, _serving(NEWER[_name][0]), ("yaml", "json"), _solve_and_verify(_name), 16),
        # numbers made extreme get through validation most often, so solve runs on them
        Kind(
            f"{_name}-numbers",
            _serving(NEWER[_name][0]),
            ("yaml",),
            _solve_and_verify(_name),
            10,
            ops=("number",),
        ),
        Kind(f"{_name}-plan", _newer_plan(_name), ("json", "yaml"), _verify_against(_name), 20),
    ]


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_mutated_file_is_refused_cleanly_or_valid(workspace: Workspace, kind: Kind) -> None:
    original = kind.load(workspace)
    folder = workspace.folder / kind.name
    folder.mkdir(exist_ok=True)

    @settings(
        max_examples=kind.examples,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(edit=edits(original, kind.ops), fmt=st.sampled_from(kind.formats))
    def check(edit: Edit, fmt: str) -> None:
        path = folder / f"mutated.{fmt}"
        path.write_text(render(apply(original, edit), edit, fmt), encoding="utf-8")
        outcomes = list(kind.commands(workspace, path))
        record(kind.name, path, edit, outcomes, kind.others(workspace))

    check()


def _table_parts(path: Path) -> tuple[dict[str, Any], bytes]:
    raw = path.read_bytes()
    _, _, _, header_len = PREFIX.unpack_from(raw, 0)
    header: dict[str, Any] = json.loads(raw[PREFIX.size : PREFIX.size + header_len])
    start = (PREFIX.size + header_len + ALIGN - 1) // ALIGN * ALIGN
    return header, raw[start : len(raw) - DIGEST_BYTES]


def _table_bytes(header_text: str, data: bytes) -> bytes:
    """A table file with this header and data section, and a correct checksum."""
    head = header_text.encode()
    prefix = PREFIX.pack(b"EOTABLE\x00", 1, 0, len(head)) + head
    body = prefix + b"\x00" * (-len(prefix) % ALIGN) + data
    return body + hashlib.sha256(body).digest()


def test_mutated_table_header_is_refused_cleanly_or_valid(workspace: Workspace) -> None:
    """A re-checksummed table whose header was edited: inspect and lookup refuse it
    naming the file, or read it."""
    header, data = _table_parts(workspace.table)
    path = workspace.folder / "mutated.eot"

    @settings(
        max_examples=120,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(edit=edits(header))
    def check(edit: Edit) -> None:
        text = render(apply(header, edit), edit, "json")
        path.write_bytes(_table_bytes(text, data))
        record(
            "table",
            path,
            edit,
            [
                run_cli("inspect", str(path)),
                run_cli("lookup", str(path), "workload=chat-llama", "load=3"),
            ],
        )

    check()


TRACE_EDITS: list[tuple[str, Callable[[list[list[str]]], list[list[str]]]]] = [
    ("no rows", lambda rows: rows[:1]),
    ("column dropped", lambda rows: [r[:2] for r in rows]),
    ("header renamed", lambda rows: [["time", *rows[0][1:]], *rows[1:]]),
    ("field missing", lambda rows: [*rows[:5], rows[5][:1], *rows[6:]]),
    ("blank field", lambda rows: [*rows[:5], [rows[5][0], "", rows[5][2]], *rows[6:]]),
    ("words", lambda rows: [*rows[:5], [rows[5][0], "many", rows[5][2]], *rows[6:]]),
    ("huge", lambda rows: [*rows[:5], [rows[5][0], "9" * 40, rows[5][2]], *rows[6:]]),
    ("negative", lambda rows: [*rows[:5], [rows[5][0], "-5", rows[5][2]], *rows[6:]]),
    ("bad time", lambda rows: [*rows[:5], ["yesterday", *rows[5][1:]], *rows[6:]]),
    ("float tokens", lambda rows: [*rows[:5], [rows[5][0], "3.5", rows[5][2]], *rows[6:]]),
    ("nan", lambda rows: [*rows[:5], [rows[5][0], "nan", rows[5][2]], *rows[6:]]),
    ("extra column", lambda rows: [[*r, "x"] for r in rows]),
]


@pytest.mark.parametrize(
    "name,change",
    [pytest.param(n, c, id=n) for n, c in [*TRACE_EDITS, ("binary", None), ("nul", None)]],
)
def test_mutated_trace_is_refused_cleanly_or_valid(
    workspace: Workspace,
    name: str,
    change: Callable[[list[list[str]]], list[list[str]]] | None,
) -> None:
    folder = workspace.folder / "trace"
    folder.mkdir(exist_ok=True)
    trace = folder / "trace.csv"
    if change is None:
        payload = bytes(range(256)) * 4 if name == "binary" else b"TIMESTAMP\x00,C\n"
        trace.write_bytes(payload)
    else:
        with workspace.trace.open(newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        with trace.open("w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows(change(rows))
    spec = _trace_spec(workspace)
    spec["load"]["file"] = str(trace)
    path = folder / "eval.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    code, _, err = run_cli("validate", str(path))
    assert "Traceback" not in err and "internal error" not in err, err
    if code == 0:
        TALLY[("trace", "valid")] += 1
        return
    assert code == 2
    assert err.startswith(f"{trace}: ") or err.startswith(f"{path}: "), err
    TALLY[("trace", "rejected")] += 1


def test_mutations_cover_every_bundled_kind() -> None:
    """Every ``kind:`` of a bundled file has a mutated sample here."""
    # libyaml when built in: the bundled fleet-10240 takes seconds with the pure-Python parser
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    kinds = {
        yaml.load(path.read_text(encoding="utf-8"), Loader=loader).get("kind", "serving")
        for path in sorted(INSTANCES.glob("**/*.yaml"))
    }
    covered = {"serving", "taskgraph", "colocation", "evaluate", "plans", "oppoints", *NEWER}
    assert kinds <= covered, kinds - covered
