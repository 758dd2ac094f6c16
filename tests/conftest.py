"""Shared fixtures: paths and small problems."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTANCES = ROOT / "instances"
REPO_DATA = ROOT / "data"
SHARED_DATA = ROOT.parent / "shared" / "data"


def measurement_data() -> Path | None:
    """The public measurement tables: the checkout's data/ (data/README.md), else the
    reference collection beside the checkout, else None."""
    for folder in (REPO_DATA, SHARED_DATA):
        if (folder / "profiles").is_dir():
            return folder
    return None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The public measurement tables (skip where neither folder is present)."""
    folder = measurement_data()
    if folder is None:
        pytest.skip(f"measurement data not found at {REPO_DATA} or {SHARED_DATA}")
    return folder


@pytest.fixture(autouse=True)
def _sim_state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated NVML keeps its state under $XDG_STATE_HOME unless
    ENERGYOPT_NVML_SIM_STATE says otherwise: point both away from the real home, one
    new place per test (a test that wants a state file sets the variable itself)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.delenv("ENERGYOPT_NVML_SIM_STATE", raising=False)
