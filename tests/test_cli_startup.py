"""The ``energyopt`` command starts without the solvers: ``--version``, ``--help``,
building the parser and ``lookup`` import no modeling layer, solver backend, family
or simulator (benchmarks/cli_startup.py measures the CPU time this saves).

Each check runs in a fresh interpreter and reads ``sys.modules`` there: what the
test process itself imported does not count."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from energyopt.tables import Axis, ColumnData, write_table

HEAVY = (
    "pyomo",
    "highspy",
    "ortools",
    "scipy",
    "networkx",
    "pandas",
    "energyopt.solvers",
    "energyopt.formulations",
    "energyopt.sim",
    "energyopt.perf",
    "energyopt.catalog",
    "energyopt.verify",
    "energyopt.nvml",
    "energyopt.agent",
    "energyopt.backends",
    "energyopt.api",
    "energyopt.families.",
)
"""Packages (with their submodules) that none of the checked paths may import; for
the families, their modules (the registry itself, which imports none, may load)."""

PARSER_HEAVY = (*HEAVY, "numpy", "energyopt.tables")
"""What building the parser, ``--version`` and ``--help`` may not import either."""

PROBE = """
import contextlib, io, json, sys
from energyopt.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exc:  # --version and --help exit from argparse
        code = exc.code
print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(),
                  "modules": sorted(sys.modules)}))
"""
"""Runs ``energyopt ARGS`` in-process and prints its exit code, output and modules."""


def probe(*argv: str) -> dict[str, object]:
    """Exit code, stdout, stderr and the loaded module names of ``energyopt ARGV``
    run in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def heavy_in(modules: object, heavy: tuple[str, ...] = PARSER_HEAVY) -> list[str]:
    """The names in ``modules`` that are one of ``heavy`` or under one (a name ending
    in a dot stands for the submodules only)."""
    assert isinstance(modules, list)
    return [
        m
        for m in modules
        if any(
            m.startswith(h) if h.endswith(".") else m == h or m.startswith(h + ".") for h in heavy
        )
    ]


def test_the_guard_sees_what_a_solve_imports() -> None:
    """The same probe on a command that does solve finds the solver stack (so an empty
    list above means the modules were not imported, not that the probe is blind)."""
    run = probe("solvers")
    assert run["code"] == 0 and "serving:" in str(run["out"])
    found = heavy_in(run["modules"])
    for name in ("energyopt.solvers", "energyopt.families.serving.family", "highspy"):
        assert name in found


@pytest.mark.parametrize(
    "argv",
    [("--version",), ("--help",), ("lookup", "--help"), ("solve", "--help"), ("schema", "--help")],
)
def test_version_and_help_import_nothing_heavy(argv: tuple[str, ...]) -> None:
    run = probe(*argv)
    assert run["code"] == 0
    assert heavy_in(run["modules"]) == []


def test_the_version_path_still_prints_the_version() -> None:
    from energyopt import __version__

    assert probe("--version")["out"] == f"energyopt {__version__}\n"


def test_building_the_parser_imports_nothing_heavy() -> None:
    code = (
        "import sys, json\n"
        "from energyopt.cli import build_parser\n"
        "build_parser()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert heavy_in(json.loads(done.stdout)) == []


def test_a_lookup_imports_only_the_table_reader(tmp_path: Path) -> None:
    table = tmp_path / "t.eot"
    axes = [Axis("wl", "category", ("a", "b")), Axis("load", "ceil", (1.0, 2.0, 4.0))]
    values = np.arange(6, dtype=float).reshape(2, 3)
    write_table(table, "test", axes, {"x": ColumnData(values, ("wl", "load"), "<f8", math.nan)})
    run = probe("lookup", str(table), "wl=b", "load=1.5")
    assert run["code"] == 0, run["err"]
    assert run["out"] == "x = 4.0\nin_grid = True\n"
    assert heavy_in(run["modules"], HEAVY) == []
    # a bad key is still named, through the same light path
    bad = probe("lookup", str(table), "load=fast")
    assert bad["code"] == 2 and "load='fast': expected a number" in str(bad["err"])
    assert heavy_in(bad["modules"], HEAVY) == []


def test_the_registry_names_every_kind_without_importing_it() -> None:
    """``kinds()`` (what ``schema`` offers and errors list) is the kinds of
    ``families()``, in the same order, and imports no family."""
    code = (
        "import sys, json\n"
        "from energyopt.families import kinds\n"
        "names = kinds()\n"
        "print(json.dumps([names, sorted(sys.modules)]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names, modules = json.loads(done.stdout)
    assert heavy_in(modules) == []
    from energyopt.families import families

    assert names == [f.kind for f in families()]
