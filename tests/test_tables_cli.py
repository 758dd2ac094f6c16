"""Compile specs through the CLI: validate and solve dispatch on kind plans/oppoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from energyopt.cli import EXIT_BAD_INPUT, EXIT_OK, main

ROOT = Path(__file__).resolve().parents[1]


def test_validate_accepts_the_shipped_compile_specs(capsys: pytest.CaptureFixture[str]) -> None:
    specs = sorted(str(p) for p in (ROOT / "instances").glob("compile-*.yaml"))
    assert len(specs) >= 3
    assert main(["validate", *specs]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.count(": ok (") == len(specs) and "plans compile spec" in out


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ("base: missing.yaml", "base", "no such file"),
        ("base: {base}\ngpu_types: [NoSuchGPU]", "gpu_types[0]", "unknown GPU type"),
        ("base: {base}\nsolver: nope", "solver", "unknown solver"),
        ("base: {base}\nworkload_scale: {{nobody: [1.0]}}", "workload_scale.nobody", "no such"),
        ("base: {base}\nslo_tiers: [{{name: a}}, {{name: a}}]", "slo_tiers", "duplicate"),
        ("base: {base}\nslo_tiers: [{{name: a, tbt_scale: 0}}]", "slo_tiers[0]", "greater"),
        ("base: {base}\nload_scale: [1.0, 0.5]", "(top level)", "ascending"),
    ],
)
def test_validate_names_the_file_and_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, field: str, message: str
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("kind: plans\n" + body.format(base=ROOT / "instances" / "quickstart.yaml"))
    assert main(["validate", str(spec)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{spec}: {field}") and message in err[0]


def test_solve_of_a_compile_spec_points_to_compile(capsys: pytest.CaptureFixture[str]) -> None:
    spec = ROOT / "instances" / "compile-quickstart-oppoints.yaml"
    assert main(["solve", str(spec)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert str(spec) in err and "energyopt compile" in err and "Traceback" not in err


def test_compile_lookup_inspect_of_a_tiered_oppoints_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tmp_path / "ops.yaml"
    spec.write_text(
        f"kind: oppoints\nbase: {ROOT / 'instances' / 'quickstart.yaml'}\nload_points: 9\n"
        "slo_tiers: [{name: gold, tbt_scale: 0.8}, {name: bronze, ttft_scale: 2}]\n"
    )
    out = tmp_path / "ops.eot"
    assert main(["compile", str(spec), "-o", str(out), "-q"]) == EXIT_OK
    assert "table written" in capsys.readouterr().out

    def place_share(tier: str, share_used: int) -> int:
        key = [f"slo_tier={tier}", "workload=chat-llama", "gpu_type=H100-SXM5-80GB"]
        args = [*key, "clock_mhz=1980", f"share_used={share_used}", "load=2"]
        assert main(["lookup", str(out), *args]) == 0
        values = dict(line.split(" = ") for line in capsys.readouterr().out.splitlines())
        assert values["in_grid"] == "True"
        return int(values["place_share"])

    # 30 % in use rounds up to 50 %: at most 50 % is free for the new slice.
    assert 0 < place_share("bronze", 30) <= 50
    # Gold's tighter TBT needs more than half the GPU: it fits an idle GPU only.
    assert place_share("gold", 0) > 50
    assert place_share("gold", 30) == -1
    assert main(["inspect", str(out)]) == EXIT_OK
    assert "slo_tier" in capsys.readouterr().out
