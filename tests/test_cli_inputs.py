"""Command-line behaviour every kind shares, calibration input and export: bad
arguments and files are refused with a message naming the file (or the option) and
the field, output is written whole or not at all, and figures carry their units."""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from energyopt.catalog import builtin_catalog
from energyopt.cli import main
from energyopt.nvml.profile import COLUMNS
from energyopt.perf.clockfit import (
    fit_at_bounds,
    fit_clock_constants,
    read_sweep,
    with_constants,
)

from .calibration_helpers import write_model_sweep
from .cli_helpers import read_exported, read_yaml, run

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = ROOT / "instances"
QUICKSTART = INSTANCES / "quickstart.yaml"
SERVERLESS = INSTANCES / "serverless" / "azure-conv-small.yaml"
KEEPALIVE = INSTANCES / "keepalive" / "azure-llm-2nodes.yaml"
COLLECTIVE = INSTANCES / "collective" / "tiny-2x2.yaml"
MOE_EDGE = INSTANCES / "moe-edge" / "mixtral-l4-cs.yaml"
COLOCATION = INSTANCES / "colocation" / "colocation-64.yaml"
A100 = "A100-SXM4-80GB"

ONE_PER_KIND = [
    QUICKSTART,
    SERVERLESS,
    MOE_EDGE,
    KEEPALIVE,
    COLLECTIVE,
    COLOCATION,
    INSTANCES / "taskgraph" / "cholesky-4x4-l40s.yaml",
]


# --- solve: limits ------------------------------------------------------------------


@pytest.mark.parametrize("path", ONE_PER_KIND, ids=lambda p: p.parent.name)
@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--time-limit", "-1"),
        ("--time-limit", "nan"),
        ("--time-limit", "0"),
        ("--time-limit", "inf"),
        ("--gap", "-1"),
        ("--gap", "nan"),
        ("--gap", "1"),
        ("--gap", "x"),
    ],
)
def test_solve_refuses_a_limit_that_is_not_one(
    capsys: pytest.CaptureFixture[str], path: Path, option: str, value: str, tmp_path: Path
) -> None:
    """Every kind, serving included, exited 0 with a plan for --time-limit -1 or nan."""
    plan = tmp_path / "plan.json"
    code, out, err = run(capsys, "solve", str(path), option, value, "-q", "-o", str(plan))
    assert code == 2
    assert f"argument {option}: " in err and value in err.split(option)[-1]
    assert not plan.exists() and "objective" not in out


def test_solve_help_gives_the_default_limits(capsys: pytest.CaptureFixture[str]) -> None:
    """The help states the time limit and gap a solve uses without the options, and
    those are the ones the families and every serving preset use."""
    import re

    from energyopt.cli.problems import DEFAULT_GAPS, DEFAULT_LIMITS
    from energyopt.families.collective import family as collective
    from energyopt.families.colocation.solvers import solve as colocation_solve
    from energyopt.families.keepalive import family as keepalive
    from energyopt.families.moe_edge import family as moe_edge
    from energyopt.families.serverless import family as serverless
    from energyopt.families.taskgraph import family as taskgraph
    from energyopt.solvers.presets import load_preset

    code, out, _ = run(capsys, "solve", "--help")
    assert code == 0

    def squeeze(text: str) -> str:  # argparse wraps lines and breaks words at hyphens
        return "".join(text.split())

    assert squeeze(DEFAULT_LIMITS) in squeeze(out) and squeeze(DEFAULT_GAPS) in squeeze(out)
    for module in (collective, keepalive, moe_edge, serverless, taskgraph, colocation_solve):
        assert module.DEFAULT_TIME_LIMIT_S == 60.0
    for module in (keepalive, moe_edge, serverless, taskgraph):
        assert module.DEFAULT_GAP == 1e-4
    assert colocation_solve.DEFAULT_GAP == {"exact": 1e-4, "shadow-price": 1e-3}
    assert DEFAULT_LIMITS.startswith("60 s for every solver of every kind but serving")
    assert DEFAULT_GAPS.startswith("0.0001; colocation shadow-price 0.001;")
    stated: dict[str, float] = {}
    serving = DEFAULT_LIMITS.split("(solvers/*.toml: ")[1]
    for seconds, names in re.findall(r"(\d+) s for ([a-z, -]+?)[;)]", serving):
        for name in re.split(r", | and ", names):
            stated[name] = float(seconds)
    presets = sorted(p.stem for p in (ROOT / "solvers").glob("*.toml"))
    assert {name: load_preset(name).time_limit_s for name in presets} == stated
    gaps = DEFAULT_GAPS.split("serving: the preset's, ")[1]
    for gap, names in re.findall(r"([0-9.]+) for ([a-z, -]+?)(?:;|, [0-9])", gaps):
        for name in re.split(r", | and ", names):
            assert load_preset(name).rel_gap == float(gap), name
    others = {name for name in presets if load_preset(name).rel_gap != 1e-4}
    assert all(name in gaps for name in others)


# --- files without kind: ----------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        (SERVERLESS, "serverless"),
        (MOE_EDGE, "moe-edge"),
        (KEEPALIVE, "keepalive"),
        (COLLECTIVE, "collective"),
    ],
)
def test_a_newer_kind_without_kind_is_named_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, source: Path, kind: str
) -> None:
    """Such a file was read as a serving instance and refused with ~15 errors, none
    naming ``kind``; now one line says it is missing, which kinds exist, and which
    one the file looks like."""
    data = read_yaml(source)
    del data["kind"]
    path = tmp_path / "nokind.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    for command in ("validate", "solve", "show"):
        code, _, err = run(capsys, command, str(path))
        assert code == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"{path}: kind: missing; a file with ")
        assert "kinds: serving, " in lines[0] and "collective" in lines[0]
        assert lines[0].endswith(f"add kind: {kind})")


def test_a_serving_file_with_a_typo_is_still_read_as_serving(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = read_yaml(QUICKSTART)
    data["workload"] = data.pop("workloads")
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, _, err = run(capsys, "validate", str(path))
    assert code == 2
    assert f"{path}: workloads: Field required" in err and "kind" not in err


# --- serverless: a prompt longer than the model's context ---------------------------


@pytest.mark.parametrize("tokens", [{"mean": 200_000}, {"mean": 1155, "max": 200_000}])
def test_a_serverless_prompt_past_the_context_is_blamed_on_the_prompt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tokens: dict[str, int]
) -> None:
    """A 200k-token prompt was reported as an SLO no option meets."""
    data = read_yaml(SERVERLESS)
    data["models"][0]["prompt_tokens"] = tokens
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, _, err = run(capsys, "validate", str(path))
    assert code == 2
    assert err.startswith(
        f"{path}: models[0](chat).prompt_tokens: prompt + output of up to 201000 tokens "
        "exceed Llama-3.1-8B's context of 131072 tokens"
    )
    assert "slo" not in err


# --- output paths -------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ("solve", str(COLLECTIVE), "-q"),
        ("export", str(SERVERLESS)),
        ("calibrate", "sweep.csv", "--gpu", A100),
        ("profile", "-q"),
        ("compile", str(INSTANCES / "compile-quickstart-oppoints.yaml"), "-q"),
    ],
    ids=lambda a: a[0],
)
def test_an_empty_output_name_is_refused_as_such(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...]
) -> None:
    """``-o ''`` said "Device or resource busy"."""
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    code, _, err = run(capsys, *argv, "-o", "")
    assert code == 2
    assert err.strip() == "-o: empty file name; give the file to write"


def test_evaluate_refuses_an_empty_output_folder_before_any_work(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``evaluate -o ''`` ran the whole evaluation and wrote into the spec's folder."""
    spec = INSTANCES / "evaluate" / "quickstart-bursty.yaml"
    code, out, err = run(capsys, "evaluate", str(spec), "-o", "", "-q")
    assert code == 2
    assert err.strip() == "-o: empty folder name; give the folder to write, or leave -o out"
    assert out == ""


def test_an_atomic_write_to_no_file_name_or_a_folder_is_refused(tmp_path: Path) -> None:
    from energyopt.spec.errors import SpecError
    from energyopt.spec.io import write_text_atomic

    with pytest.raises(SpecError) as exc:
        write_text_atomic("", "x")
    assert exc.value.problems == ["(empty file name): cannot write: give the file to write"]
    with pytest.raises(SpecError) as exc:
        write_text_atomic(tmp_path, "x")
    assert exc.value.problems == [f"{tmp_path}: cannot write: a folder; give the file to write"]
    assert list(tmp_path.iterdir()) == []
    if hasattr(os, "mkfifo"):  # a device (say /dev/null, as root) was replaced by the rename
        fifo = tmp_path / "out.csv"
        os.mkfifo(fifo)
        with pytest.raises(SpecError) as exc:
            write_text_atomic(fifo, "x")
        assert exc.value.problems == [
            f"{fifo}: cannot write: not a regular file (a device, FIFO or socket); "
            "give the file to write"
        ]
        assert fifo.is_fifo()


def test_output_lost_to_a_full_disk_is_not_an_internal_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """stdout on a full disk raised OSError out of the command."""

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("sys.stdout", Full())
    code = main(["catalog"])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.strip() == "energyopt: standard output: cannot write: No space left on device"


def no_space(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def no_space_for(name: str) -> Any:
    """``os.fsync`` that fails as on a full disk for the temporary file of ``name``
    (found through /proc), and syncs every other file."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(f".{name}."):
            no_space()
        real(fd)

    return fsync


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_profile_on_a_full_disk_writes_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_GPUS", A100)
    monkeypatch.delenv("ENERGYOPT_NVML_SIM_STATE", raising=False)
    monkeypatch.setattr(os, "fsync", no_space_for("sweep.csv"))
    out = tmp_path / "sweep.csv"
    code, _, err = run(capsys, "profile", "-o", str(out), "--clocks", "3", "--seconds", "1", "-q")
    assert code == 2
    assert err.strip() == f"{out}: cannot write: No space left on device"
    assert not [p for p in tmp_path.iterdir() if "sweep" in p.name]


# --- export -----------------------------------------------------------------------


def test_export_refuses_a_format_its_suffix_contradicts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """``--format lp -o x.mps`` wrote LP text HiGHS could not read as MPS."""
    out = tmp_path / "x.mps"
    code, _, err = run(capsys, "export", str(SERVERLESS), "--format", "lp", "-o", str(out))
    assert code == 2
    assert err.startswith(f"{out}: --format lp does not match the suffix .mps")
    assert not out.exists()


def test_export_reads_the_catalog_it_is_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A keep-alive file takes nothing from a catalog, and a garbage --catalog went
    unread; every kind now refuses it, naming the catalog file."""
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("foo: 1\n", encoding="utf-8")
    out = tmp_path / "k.mps"
    for path in (KEEPALIVE, COLLECTIVE):
        code, _, err = run(capsys, "export", str(path), "-o", str(out), "--catalog", str(garbage))
        assert code == 2
        assert (
            err.strip()
            == f"--catalog {garbage}: {garbage}: foo: unknown key (expected gpus, models)"
        )
        assert not out.exists()


@pytest.mark.parametrize("path", [QUICKSTART, SERVERLESS], ids=["pyomo", "highs"])
@pytest.mark.parametrize("fmt", ["mps", "lp"])
def test_export_writes_a_whole_model_without_warnings(
    capfd: pytest.CaptureFixture[str], tmp_path: Path, path: Path, fmt: str
) -> None:
    """The serving model (written by Pyomo) printed a warning about the temporary
    file name for LP; both writers' files read back into HiGHS."""
    out = tmp_path / f"model.{fmt}"
    assert main(["export", str(path), "-o", str(out)]) == 0
    _, err = capfd.readouterr()
    assert err == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
    h = read_exported(out)
    assert h.getNumCol() > 0


@pytest.mark.parametrize("path", [QUICKSTART, SERVERLESS], ids=["pyomo", "highs"])
def test_export_on_a_full_disk_leaves_no_file(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    path: Path,
) -> None:
    """A full disk exited 0 and left a truncated MPS file."""
    out = tmp_path / "model.mps"
    out.write_text("the old file\n")
    monkeypatch.setattr(os, "fsync", no_space)
    code, _, err = run(capsys, "export", str(path), "-o", str(out))
    assert code == 2
    assert err.strip() == f"{out}: cannot write: No space left on device"
    assert out.read_text() == "the old file\n"
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_export_refuses_a_model_the_writer_cut_short(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HiGHS reports no error when its own write fails (a full temporary folder): the
    file it leaves is checked to end as a whole model does."""
    import highspy

    real = highspy.Highs.writeModel

    def truncated(self: Any, name: str) -> Any:
        status = real(self, name)
        text = Path(name).read_text()
        Path(name).write_text(text[: len(text) // 2])
        return status

    monkeypatch.setattr(highspy.Highs, "writeModel", truncated)
    out = tmp_path / "model.lp"
    code, _, err = run(capsys, "export", str(SERVERLESS), "-o", str(out))
    assert code == 2
    assert err.startswith(f"{out}: cannot write: the LP writer stopped before the end")
    assert not out.exists()


# --- calibrate ----------------------------------------------------------------------


def calibrate(
    capsys: pytest.CaptureFixture[str], sweep: Path, out: Path
) -> tuple[int, str, str]:
    """``energyopt calibrate SWEEP --gpu A100-SXM4-80GB -o OUT``: exit status, stdout,
    stderr."""
    return run(capsys, "calibrate", str(sweep), "--gpu", A100, "-o", str(out))


@pytest.mark.parametrize("suffix", ["json", "yaml", "toml"])
def test_calibrate_writes_the_catalog_in_the_format_its_suffix_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str
) -> None:
    """``-o cat.json`` wrote YAML, so ``--catalog cat.json`` then failed."""
    sweep = tmp_path / "sweep.csv"
    write_model_sweep(sweep, A100)
    out = tmp_path / f"cat.{suffix}"
    code, _, err = calibrate(capsys, sweep, out)
    assert code == 0, err
    text = out.read_text()
    loads = {"json": json.loads, "yaml": yaml.safe_load, "toml": tomllib.loads}[suffix]
    entry = loads(text)["gpus"][0]
    gpu = builtin_catalog().gpu(A100)
    fitted = fit_clock_constants(gpu, read_sweep(sweep, gpu))
    assert entry["power"]["knee_fraction"] == fitted.power.knee_fraction
    assert entry["power"]["voltage_floor"] == fitted.power.voltage_floor
    code, _, err = run(capsys, "validate", str(QUICKSTART), "--catalog", str(out))
    assert code == 0, err


def test_calibrate_refuses_an_unknown_suffix_before_fitting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep.csv"
    write_model_sweep(sweep, A100)
    out = tmp_path / "cat.txt"
    code, stdout, err = calibrate(capsys, sweep, out)
    assert code == 2
    assert err.startswith(f"{out}: unknown file type '.txt'")
    assert stdout == "" and not out.exists()


def edit_row(source: Path, target: Path, row: int, column: str, value: str) -> None:
    with open(source, newline="") as f:
        rows = list(csv.reader(f))
    rows[row - 1][COLUMNS.index(column)] = value
    with open(target, "w", newline="") as f:
        csv.writer(f).writerows(rows)


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("energy_j", "1e308", "energy_j: 1e+308 J over"),
        ("energy_j", "0.001", "is a mean power of"),
        ("seconds", "1e-9", "seconds: 3e+14 flops in 1e-09 s"),
        ("clock_mhz", "5000", f"clock_mhz: 5000 MHz is outside {A100}'s 210-1410 MHz"),
    ],
)
def test_calibrate_refuses_implausible_measurements_by_file_and_row(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, column: str, value: str, message: str
) -> None:
    """An energy of 1e308 J fitted the constants at their bounds and wrote them; a
    clock off the GPU's range was refused without the file or the row."""
    good, bad = tmp_path / "good.csv", tmp_path / "bad.csv"
    write_model_sweep(good, A100)
    edit_row(good, bad, 3, column, value)
    out = tmp_path / "cat.yaml"
    code, _, err = calibrate(capsys, bad, out)
    assert code == 2
    assert err.startswith(f"{bad}: row 3: ")
    assert message in err
    assert not out.exists()


def test_calibrate_refuses_a_fit_that_ends_on_a_bound(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A sweep made with a voltage floor below the search's: the fit stops on the
    bound and the catalog is not written."""
    sweep = tmp_path / "sweep.csv"
    write_model_sweep(sweep, A100, floor=0.25)
    out = tmp_path / "cat.yaml"
    code, _, err = calibrate(capsys, sweep, out)
    assert code == 2
    assert err.startswith(f"{sweep}: the fit ended on the bound of its search for ")
    assert "power.voltage_floor = 0.3 (the bound of its search)" in err
    assert not out.exists()
    gpu = builtin_catalog().gpu(A100)
    assert fit_at_bounds(gpu) == []
    assert fit_at_bounds(with_constants(gpu, 0.0, 1.0, 0.6)) == []  # physical limits
    assert len(fit_at_bounds(with_constants(gpu, 0.95, 0.3, 0.2))) == 3


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (bytes(range(256)) * 4, "cannot read as UTF-8 text"),
        (b"kernel,clock_mhz,flops,bytes,seconds,energy_j\nmm\x00,1,1,1,1,1\n", "a NUL byte"),
        (b"kernel,clock_mhz\n" + b'"' + b"x" * 200_000 + b'"\n', "row "),
    ],
    ids=["binary", "nul", "huge-field"],
)
def test_calibrate_refuses_a_file_that_is_not_csv_text(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, payload: bytes, message: str
) -> None:
    """Binary garbage raised UnicodeDecodeError out of calibrate."""
    path = tmp_path / "sweep.csv"
    path.write_bytes(payload)
    code, _, err = calibrate(capsys, path, tmp_path / "c.yaml")
    assert code == 2
    assert err.startswith(f"{path}: ") and message in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_calibrate_refuses_a_fifo_instead_of_waiting_on_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """calibrate on a FIFO hung, waiting for a writer."""
    path = tmp_path / "sweep.csv"
    os.mkfifo(path)
    code, _, err = calibrate(capsys, path, tmp_path / "c.yaml")
    assert code == 2
    assert err.strip() == f"{path}: cannot read: a FIFO (named pipe), not a regular file"


# --- what show, verify and plan files print -----------------------------------------


def test_colocation_show_names_each_pool(capsys: pytest.CaptureFixture[str]) -> None:
    """An unnamed pool was shown as ``pool None``."""
    code, out, _ = run(capsys, "show", str(COLOCATION))
    assert code == 0
    assert "None" not in out
    assert "pool H100-SXM5-80GB: 32x H100-SXM5-80GB" in out.splitlines()


@pytest.mark.parametrize(
    ("path", "unit"),
    [(QUICKSTART, "W"), (COLLECTIVE, "us"), (MOE_EDGE, "J/token"), (SERVERLESS, "GPU-s")],
)
def test_verify_gives_the_objective_with_its_unit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, path: Path, unit: str
) -> None:
    """verify printed ``3.07626e+06`` with no unit."""
    plan = tmp_path / "plan.json"
    solver = {SERVERLESS: "fast", COLLECTIVE: "select", MOE_EDGE: "auto"}.get(path, "highs-exact")
    code, _, err = run(capsys, "solve", str(path), "--solver", solver, "-q", "-o", str(plan))
    assert code == 0, err
    stated = json.loads(plan.read_text())["objective"]
    code, out, _ = run(capsys, "verify", str(path), str(plan))
    assert code == 0
    line = out.splitlines()[-1]
    assert line.endswith(f" {unit} (recomputed from the plan)"), line
    figure = line.split()[1]
    assert "e" not in figure
    assert float(figure.replace(",", "")) == pytest.approx(stated, rel=1e-5)


def test_a_toml_plan_is_written_as_tables_and_verifies(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """TOML plans were one inline line (a hand-written writer)."""
    plan = tmp_path / "plan.toml"
    code, _, err = run(
        capsys, "solve", str(COLLECTIVE), "--solver", "select", "-q", "-o", str(plan)
    )
    assert code == 0, err
    text = plan.read_text()
    assert "[[choices]]" in text and "{" not in text
    assert max(len(line) for line in text.splitlines()) < 100
    assert tomllib.loads(text)["choices"]
    code, _, err = run(capsys, "verify", str(COLLECTIVE), str(plan))
    assert code == 0, err


def test_python_dash_m_energyopt_runs_the_command() -> None:
    """``python -m energyopt`` said there was no ``__main__`` module."""
    import subprocess
    import sys

    from energyopt import __version__

    done = subprocess.run(
        [sys.executable, "-m", "energyopt", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"energyopt {__version__}"
