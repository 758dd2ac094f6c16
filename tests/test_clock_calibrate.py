"""energyopt profile (on the simulated NVML) and energyopt calibrate: a clock sweep
CSV, the fit of a GPU type's clock constants, and the catalog file it writes."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from energyopt.catalog import builtin_catalog
from energyopt.catalog.loader import bind_catalog, load_catalog_file
from energyopt.cli import main
from energyopt.nvml.profile import (
    COLUMNS,
    SimRunner,
    kernels_for,
    run_sweep,
    sweep_clocks,
    write_csv,
)
from energyopt.nvml.sim import SimulatedNvml
from energyopt.perf.clockfit import fit_clock_constants, read_sweep
from energyopt.spec.errors import SpecError

from .calibration_helpers import write_model_sweep

H100 = "H100-SXM5-80GB"


def test_fit_recovers_the_constants_a_sweep_was_made_with(tmp_path: Path) -> None:
    gpu = builtin_catalog().gpu(H100)
    path = tmp_path / "sweep.csv"
    write_model_sweep(path, H100, kernels=(("matmul", 8e14, 1e9), ("memory", 0.0, 4e12)))
    fitted = fit_clock_constants(gpu, read_sweep(path))
    assert fitted.efficiency.compute_clock_fixed == pytest.approx(0.35, abs=2e-3)
    assert fitted.power.voltage_floor == pytest.approx(0.82, abs=2e-3)
    assert fitted.power.knee_fraction == pytest.approx(0.62, abs=2e-3)
    # everything else is the catalog entry's
    assert fitted.efficiency.compute == gpu.efficiency.compute
    assert fitted.power.locked_clock_w == gpu.power.locked_clock_w


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("kernel,clock_mhz,flops,bytes,seconds\n", "missing column(s) energy_j"),
        ("kernel,clock_mhz,flops,bytes,seconds,energy_j,x\n", "unknown column(s) x"),
        ("kernel,clock_mhz,flops,bytes,seconds,energy_j\nmm,1980,1,1,fast,2\n", "row 2: seconds"),
        ("kernel,clock_mhz,flops,bytes,seconds,energy_j\nmm,1980,1,1,1,-2\n", "row 2: energy_j"),
        (
            "kernel,clock_mhz,flops,bytes,seconds,energy_j\nmm,1980,0,0,1,2\n",
            "row 2: flops and bytes",
        ),
        (
            "kernel,clock_mhz,flops,bytes,seconds,energy_j\nmm,1980,1,1,1,2\nmm,1900,1,1,1,2\n",
            "a fit needs 3",
        ),
        ("kernel,clock_mhz,flops,bytes,seconds,energy_j\n", "no rows"),
    ],
)
def test_bad_sweeps_are_named_by_file_row_and_column(
    tmp_path: Path, body: str, message: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(SpecError) as exc:
        read_sweep(path)
    assert any(str(path) in p and message in p for p in exc.value.problems), exc.value.problems


@pytest.mark.parametrize("locked_before", [None, (1410, 1410)])
def test_profile_sweeps_locked_clocks_and_restores_them(locked_before) -> None:
    gpu = builtin_catalog().gpu(H100)
    sim = SimulatedNvml([gpu])
    if locked_before is not None:
        sim.set_locked_clocks(0, *locked_before)
    clocks = sweep_clocks(sim.supported_sm_clocks(0), 5)
    assert clocks[0] == gpu.max_sm_clock_mhz and len(clocks) == 5
    assert clocks == sorted(clocks, reverse=True)
    rows = run_sweep(sim, 0, SimRunner(sim, 0), kernels_for(gpu, 1.0), clocks)
    assert sim.get_locked_clocks(0) == locked_before
    assert [r.clock_mhz for r in rows] == [c for c in clocks for _ in range(2)]
    matmul = [r for r in rows if r.kernel == "matmul"]
    # compute-bound runs slow down and draw less power as the clock falls
    assert matmul[-1].seconds > 1.3 * matmul[0].seconds
    assert matmul[-1].energy_j / matmul[-1].seconds < matmul[0].energy_j / matmul[0].seconds


@pytest.mark.parametrize("name", ["A100-SXM4-80GB", H100])
def test_a_simulated_gpu_sweeps_to_its_own_catalog_constants(name: str, tmp_path: Path) -> None:
    """The simulated NVML draws the calibrated model's power (static power on V^2, the
    dynamic range net of it, memory power per byte), so profiling it and fitting the
    sweep gives back the catalog entry it simulates."""
    gpu = builtin_catalog().gpu(name)
    sim = SimulatedNvml([gpu])
    clocks = sweep_clocks(sim.supported_sm_clocks(0), 8)
    path = tmp_path / "sweep.csv"
    write_csv(run_sweep(sim, 0, SimRunner(sim, 0), kernels_for(gpu, 1.0), clocks), path)
    fitted = fit_clock_constants(gpu, read_sweep(path))
    assert fitted.efficiency.compute_clock_fixed == pytest.approx(
        gpu.efficiency.compute_clock_fixed, abs=2e-3
    )
    assert fitted.power.voltage_floor == pytest.approx(gpu.power.voltage_floor, abs=2e-3)
    assert fitted.power.knee_fraction == pytest.approx(gpu.power.knee_fraction, abs=2e-3)


def test_profile_then_calibrate_writes_a_catalog_other_commands_take(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENERGYOPT_NVML_BACKEND", "sim")
    monkeypatch.setenv("ENERGYOPT_NVML_SIM_GPUS", "A100-SXM4-80GB")
    monkeypatch.delenv("ENERGYOPT_NVML_SIM_STATE", raising=False)
    sweep = tmp_path / "sweep.csv"
    assert main(["profile", "-o", str(sweep), "--clocks", "6", "--seconds", "1", "-q"]) == 0
    with open(sweep, newline="") as f:
        header = next(csv.reader(f))
    assert tuple(header) == COLUMNS
    out = tmp_path / "catalog.yaml"
    assert main(["calibrate", str(sweep), "--gpu", "A100-SXM4-80GB", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "power.knee_fraction" in printed
    gpus, _ = load_catalog_file(out)
    assert [g.name for g in gpus] == ["A100-SXM4-80GB"]
    assert "energyopt calibrate" in gpus[0].sources["power.knee_fraction"]
    catalog, problems = bind_catalog(extra=[out])
    assert problems == []
    assert catalog.gpus["A100-SXM4-80GB"].power == gpus[0].power
    assert main(["calibrate", str(sweep), "--gpu", "B300", "-o", str(out)]) == 2
