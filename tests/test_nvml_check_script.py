"""benchmarks/nvml_check.py, run on the real backend over the fake NVML driver."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("pynvml")

from energyopt.catalog import builtin_catalog

from .nvml_fake import FakeDriver

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "nvml_check.py"


def load_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvml_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "nvml_check", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("gpu_type", ["H200-SXM-141GB", "A100-SXM4-80GB"])
def test_check_sets_reads_back_and_restores_everything(
    gpu_type: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = FakeDriver([builtin_catalog().gpu(gpu_type)])
    driver.install(monkeypatch)
    before = driver.snapshot()
    script = load_script(monkeypatch)
    monkeypatch.setattr(script, "_load", lambda index: (None, "none"))
    assert script.main(["--seconds", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "lock SM clocks at" in out and "set power limit to" in out
    assert "3g." in out and "at memory slice" in out and "MIG on: " in out
    assert "NO" not in out.split()
    assert driver.snapshot() == before
    assert {"nvmlDeviceCreateGpuInstanceWithPlacement", "nvmlGpuInstanceDestroy"} <= set(
        driver.writes
    )


def test_check_counts_a_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = FakeDriver([builtin_catalog().gpu("H100-SXM5-80GB")])
    driver.install(monkeypatch)
    driver.gpus[0].mig_needs_reset = True  # MIG cannot be switched on here
    before = driver.snapshot()
    script = load_script(monkeypatch)
    monkeypatch.setattr(script, "_load", lambda index: (None, "none"))
    assert script.main(["--seconds", "0.05"]) == 1
    assert driver.snapshot() == before


def test_no_driver_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import pynvml

    if pynvml.nvmlLib is not None:
        pytest.skip("an NVML library is loaded in this process")
    script = load_script(monkeypatch)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        assert script.main([]) == 2
        assert "cannot run here" in capsys.readouterr().err
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this host has an NVIDIA driver")
