"""The public API (``energyopt.load / solve / verify / compile / evaluate``): every
example of docs/api.md runs as written, every kind solves with and without a progress
callable and its plan passes ``energyopt.verify``, and bad input raises the documented
exceptions (InputError naming the field and the file or <dict>, MissingFileError)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import energyopt
from energyopt import api

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"

INSTANCES = {
    "serving": "instances/quickstart.yaml",
    "taskgraph": "instances/taskgraph/lu-3x3-l4.yaml",
    "colocation": "instances/colocation/colocation-64.yaml",
    "keepalive": "instances/keepalive/azure-llm-2nodes.yaml",
    "moe-edge": "instances/moe-edge/olmoe-l4-c4.yaml",
    "serverless": "instances/serverless/azure-conv-small.yaml",
    "collective": "instances/collective/tiny-2x2.yaml",
}
"""A small bundled instance of every kind."""


def doc_examples() -> list[tuple[str, str]]:
    """(heading, code) of every ```python block of docs/api.md, in order."""
    out: list[tuple[str, str]] = []
    heading = ""
    code: list[str] | None = None
    for line in DOC.read_text().splitlines():
        if code is not None:
            if line.startswith("```"):
                out.append((heading, "\n".join(code) + "\n"))
                code = None
            else:
                code.append(line)
        elif line.startswith("```python"):
            code = []
        elif line.startswith("#"):
            heading = line.lstrip("# ").strip()
    return out


EXAMPLES = doc_examples()


@pytest.fixture(autouse=True)
def _at_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the examples and INSTANCES name files from the root


@pytest.fixture(scope="module")
def problems() -> dict[str, Any]:
    """Every kind's instance, loaded once for the module."""
    return {kind: energyopt.load(ROOT / path) for kind, path in INSTANCES.items()}


def test_instances_cover_every_kind() -> None:
    assert sorted(INSTANCES) == sorted(energyopt.kinds())


def test_docs_have_an_example_per_kind() -> None:
    code = "\n".join(c for _, c in EXAMPLES)
    for kind in energyopt.kinds():
        assert f'print(f"{kind}:' in code, f"docs/api.md: no example prints a {kind} result"


@pytest.mark.parametrize(("heading", "code"), EXAMPLES, ids=[h for h, _ in EXAMPLES])
def test_docs_example_runs(heading: str, code: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"docs/api.md ({heading})", "exec"), {"__name__": "__doc_example__"})
    assert out.getvalue().strip(), f"the {heading} example printed nothing"


def test_import_is_light() -> None:
    code = (
        "import sys, energyopt\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('energyopt', 'pydantic', 'numpy', 'pyomo', 'highspy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['energyopt']"]


def test_public_names_resolve() -> None:
    assert sorted(energyopt.__all__) == sorted({"__version__", *energyopt._ERRORS, *energyopt._API})
    for name in energyopt.__all__:
        assert getattr(energyopt, name) is not None
        assert name in dir(energyopt)
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = energyopt.no_such_name


def test_verify_is_the_function_after_the_subpackage_is_imported() -> None:
    import energyopt.families.serving.verify
    from energyopt.verify import Violation

    assert energyopt.verify is api.verify
    from energyopt import verify

    assert verify is api.verify
    assert Violation is energyopt.Violation
    assert sys.modules["energyopt.verify"].__name__ == "energyopt.verify"


def test_exception_hierarchy() -> None:
    from energyopt.backends.cpsat import CpSatModelError
    from energyopt.families.serving.solvers.solve import PlanVerificationError
    from energyopt.formulations.errors import BackendFailure
    from energyopt.nvml.errors import BadCheckpoint, ExecutorError
    from energyopt.tables.format import TableError

    e = energyopt
    assert issubclass(e.InputError, e.EnergyoptError) and issubclass(e.InputError, ValueError)
    assert issubclass(e.SpecError, e.InputError) and issubclass(TableError, e.InputError)
    assert issubclass(e.MissingFileError, e.EnergyoptError)
    assert issubclass(e.MissingFileError, FileNotFoundError)
    assert not issubclass(e.MissingFileError, ValueError)
    for err in (BackendFailure, CpSatModelError, PlanVerificationError):
        assert issubclass(err, e.SolverError) and issubclass(err, RuntimeError)
    assert issubclass(ExecutorError, e.NvmlError) and issubclass(BadCheckpoint, e.NvmlError)
    assert issubclass(e.SolverError, e.EnergyoptError) and issubclass(e.NvmlError, e.EnergyoptError)


@pytest.mark.parametrize("kind", sorted(INSTANCES))
def test_dict_loads_as_the_file_does(kind: str, problems: dict[str, Any]) -> None:
    from energyopt.families import family

    document = yaml.safe_load((ROOT / INSTANCES[kind]).read_text())
    snapshot = json.dumps(document, sort_keys=True, default=str)
    from_dict = energyopt.load(document)
    fam = family(kind)
    assert type(from_dict) is type(problems[kind])
    assert fam.summary(from_dict) == fam.summary(problems[kind])
    assert json.dumps(document, sort_keys=True, default=str) == snapshot  # left as given
    # without kind:, the kind argument names it (moe_edge spelled as the module is)
    if kind != "serving":
        del document["kind"]
        again = energyopt.load(document, kind=kind.replace("-", "_"))
        assert fam.summary(again) == fam.summary(problems[kind])


def test_kind_argument_names_the_kind_of_a_file_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    document = yaml.safe_load((ROOT / INSTANCES["keepalive"]).read_text())
    del document["kind"]
    (tmp_path / "functions.yaml").write_text(yaml.safe_dump(document))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(energyopt.InputError, match=r"kind: missing"):
        energyopt.load("./functions.yaml")
    problem = energyopt.load("./functions.yaml", kind="keepalive")
    assert energyopt.verify(problem, energyopt.solve(problem, time_limit=1)).ok


def test_kind_argument_that_disagrees_names_kind() -> None:
    document = yaml.safe_load((ROOT / INSTANCES["keepalive"]).read_text())
    with pytest.raises(energyopt.InputError, match=r"<dict>: kind: .*'keepalive'.*'taskgraph'"):
        energyopt.load(document, kind="taskgraph")


def test_missing_file_is_file_not_found(tmp_path: Path, problems: dict[str, Any]) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(FileNotFoundError) as info:
        energyopt.load(missing)
    assert isinstance(info.value, energyopt.EnergyoptError)
    assert isinstance(info.value, energyopt.MissingFileError)
    assert info.value.filename == str(missing)
    assert str(info.value) == f"{missing}: no such file"
    with pytest.raises(energyopt.MissingFileError):
        energyopt.load(INSTANCES["serving"], catalogs=[tmp_path / "absent-catalog.yaml"])
    with pytest.raises(energyopt.MissingFileError):
        energyopt.verify(problems["serving"], str(tmp_path / "plan.json"))
    with pytest.raises(energyopt.MissingFileError):
        energyopt.compile(missing, tmp_path / "t.eot")
    with pytest.raises(energyopt.MissingFileError):
        energyopt.evaluate(missing)


def test_bad_field_is_value_error_naming_field_and_file(tmp_path: Path) -> None:
    document = yaml.safe_load((ROOT / INSTANCES["keepalive"]).read_text())
    document["window_s"] = "soon"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(document))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: window_s: ") as info:
        energyopt.load(bad)
    assert isinstance(info.value, energyopt.InputError)
    with pytest.raises(energyopt.InputError, match=r"^<dict>: window_s: ") as info:
        energyopt.load(document)
    assert info.value.problems[0].startswith("<dict>: window_s: ")
    serving = yaml.safe_load((ROOT / INSTANCES["serving"]).read_text())
    serving["workloads"][0]["rate_rps"] = -1
    with pytest.raises(ValueError, match=r"<dict>: workloads\[0\]\(chat-llama\)\.rate_rps: "):
        energyopt.load(serving)


def test_document_that_is_not_a_problem_is_refused(tmp_path: Path) -> None:
    with pytest.raises(energyopt.InputError, match="compile spec"):
        energyopt.load(ROOT / "instances/compile-quickstart-oppoints.yaml")
    with pytest.raises(energyopt.InputError, match=r"source: expected a file name or a dict"):
        energyopt.load(42)  # type: ignore[arg-type]
    with pytest.raises(energyopt.InputError, match=r"<dict>: file has no settings"):
        energyopt.load({})


@pytest.mark.parametrize("kind", sorted(INSTANCES))
def test_every_kind_solves_certified_with_and_without_progress(
    kind: str, problems: dict[str, Any]
) -> None:
    problem = problems[kind]
    lines: list[str] = []
    for progress in (None, lines.append):
        result = energyopt.solve(problem, time_limit=1, progress=progress)
        assert isinstance(result, energyopt.Result)
        assert result.kind == kind and result.plan is not None and result.certified
        assert result.status in (energyopt.Status.OPTIMAL, energyopt.Status.FEASIBLE)
        check = energyopt.verify(problem, result)
        assert check.ok, str(check)
        assert check.kind == kind and check.unit == result.unit
        assert check.objective == pytest.approx(result.objective, rel=1e-9)
        assert energyopt.verify(problem, result.plan).ok
    assert lines and all(isinstance(line, str) for line in lines)


def test_verify_reports_figures_that_are_not_the_plans(problems: dict[str, Any]) -> None:
    problem = problems["moe-edge"]
    result = energyopt.solve(problem, time_limit=1)
    assert result.objective is not None
    wrong = dataclasses.replace(result, objective=result.objective * 1.5)
    check = energyopt.verify(problem, wrong)
    assert not check.ok
    assert "objective" in [v.kind for v in check.violations]  # and the gap it implies
    assert "violation" in str(check)


def test_verify_reads_plan_files(tmp_path: Path, problems: dict[str, Any]) -> None:
    from energyopt.families import family
    from energyopt.spec.io import dump

    problem = problems["keepalive"]
    result = energyopt.solve(problem, time_limit=1)
    path = tmp_path / "plan.json"
    dump(family("keepalive").to_file(problem, result), path)
    assert energyopt.verify(problem, path).ok
    data = json.loads(path.read_text())
    assert energyopt.verify(problem, data).ok
    data["objective"] = data["objective"] * 2
    check = energyopt.verify(problem, data)
    assert [v.kind for v in check.violations] == ["objective"]


def test_verify_refuses_another_kinds_plan(problems: dict[str, Any]) -> None:
    result = energyopt.solve(problems["moe-edge"], time_limit=1)
    with pytest.raises(energyopt.InputError, match=r"^plan: a MoeEdgePlan is not a keepalive plan"):
        energyopt.verify(problems["keepalive"], result.plan)


def test_solve_refuses_bad_arguments(problems: dict[str, Any]) -> None:
    problem = problems["moe-edge"]
    with pytest.raises(energyopt.InputError, match=r"^solver: no solver 'nope' for moe-edge"):
        energyopt.solve(problem, solver="nope")
    with pytest.raises(energyopt.InputError, match=r"^time_limit: "):
        energyopt.solve(problem, time_limit=0)
    with pytest.raises(energyopt.InputError, match=r"^gap: "):
        energyopt.solve(problem, gap=1.0)
    with pytest.raises(energyopt.InputError, match=r"^problem: a str is not a problem of any kind"):
        energyopt.solve(INSTANCES["serving"])


@pytest.mark.parametrize("kind", ["taskgraph", "collective", "serving"])
def test_compile_and_evaluate_name_the_kind_they_refuse(kind: str, tmp_path: Path) -> None:
    path = ROOT / INSTANCES[kind]
    with pytest.raises(energyopt.InputError, match=rf"kind: energyopt.compile takes .*{kind}"):
        energyopt.compile(path, tmp_path / "t.eot")
    with pytest.raises(energyopt.InputError, match=rf"kind: energyopt.evaluate takes .*{kind}"):
        energyopt.evaluate(path)
    assert not (tmp_path / "t.eot").exists()


def test_solve_hands_the_scheduler_to_serving_pricing_only(problems: dict[str, Any]) -> None:
    with pytest.raises(energyopt.InputError, match=r"^scheduler: a moe-edge problem"):
        energyopt.solve(problems["moe-edge"], scheduler="local:1")
    # the serving solve reaches the Dask pricing, which refuses a cluster of no workers
    # before it starts one, and the error names the argument as the API spells it
    with pytest.raises(energyopt.InputError, match=r"^scheduler local:0: local:N needs N"):
        energyopt.solve(problems["serving"], solver="colgen", scheduler="local:0")
