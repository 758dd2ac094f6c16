"""Running the ``energyopt`` command inside the test process, for the tests of what it
answers to bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import highspy
import pytest
import yaml

from energyopt.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``energyopt ARGV`` in this process: exit status, stdout, stderr (an argparse
    refusal exits through SystemExit). Fails the test on a traceback or an internal
    error in the output."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "internal error" not in err
    return code, out, err


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping a YAML file holds."""
    data: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data


def read_exported(path: Path) -> highspy.Highs:
    """A quiet HiGHS holding the model ``energyopt export`` wrote to ``path`` (MPS or
    LP); fails the test when HiGHS cannot read it."""
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    assert h.readModel(str(path)) == highspy.HighsStatus.kOk
    return h
