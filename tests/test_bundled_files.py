"""Every bundled file validates on a fresh clone: instances, solver presets and the
catalog, with every file they read inside the repository (the public data they need
ships in data/, whose README gives each file's source and licence)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from energyopt.cli import main

ROOT = Path(__file__).resolve().parents[1]
SPEC_SUFFIXES = {".yaml", ".yml", ".json", ".toml"}


def bundled_files() -> list[Path]:
    """instances/**, solvers/*.toml and models/** files that energyopt reads."""
    files = [p for p in (ROOT / "instances").rglob("*") if p.suffix in SPEC_SUFFIXES]
    files += (ROOT / "solvers").glob("*.toml")
    files += [p for p in (ROOT / "models").rglob("*") if p.suffix in SPEC_SUFFIXES]
    return sorted(files)


def test_every_bundled_file_validates(capsys: pytest.CaptureFixture[str]) -> None:
    files = bundled_files()
    assert len(files) > 60  # instances of every family, presets, GPU types and LLMs
    code = main(["validate", *map(str, files)])
    out, err = capsys.readouterr()
    assert err == ""
    assert code == 0
    assert [line.split(": ok (")[0] for line in out.splitlines()] == list(map(str, files))


RELATIVE = re.compile(r"(?:\.\./)+[\w.+\-/]*")


@pytest.mark.parametrize("path", bundled_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bundled_file_reaches_outside_the_repository(path: Path) -> None:
    """What a fresh clone without ../shared/data would meet: a path relative to the
    file (``../``) that leaves the checkout, or a citation of the data collection
    beside it instead of its copy in data/."""
    text = path.read_text(encoding="utf-8")
    assert "shared/data" not in text
    for ref in RELATIVE.findall(text):
        target = (path.parent / ref).resolve()
        assert target.is_relative_to(ROOT), f"{path}: {ref} leaves the repository"
        assert target.exists(), f"{path}: {ref} does not exist"


def test_the_evaluation_trace_ships_in_the_repository() -> None:
    from energyopt.spec.evaluation import load_evaluation, resolve_relative

    spec = ROOT / "instances" / "evaluate" / "fleet16-azure.yaml"
    ev = load_evaluation(spec)
    assert ev.load.kind == "trace"
    trace = resolve_relative(spec, ev.load.file).resolve()
    assert trace.is_relative_to(ROOT / "data") and trace.is_file()


def test_every_shipped_data_file_has_its_source_in_the_data_readme() -> None:
    data = ROOT / "data"
    readme = (data / "README.md").read_text(encoding="utf-8")
    own = {"SOURCES.md", "SOURCES-new-families.md"}
    shipped = [
        p.relative_to(data)
        for p in data.rglob("*")
        if p.is_file()
        and p.name not in own
        and not p.name.startswith(("README", "LICENSE"))  # a source's own, copied along
        and p.parts[len(data.parts)] != "LICENSES"
    ]
    assert shipped
    for rel in shipped:
        folder = "/".join(rel.parts[:2])
        assert f"`{folder}" in readme, f"data/{rel}: no source or licence in data/README.md"
    total = sum((data / rel).stat().st_size for rel in shipped)
    assert total < 20e6  # bytes: only what the bundled files, benchmarks and tests read
