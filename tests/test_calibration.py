"""The shipped constants reproduce the public measured tables within the stated error.

Bounds are the ones docs/performance-model.md states.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from energyopt.catalog import builtin_catalog
from energyopt.perf.calibration import ErrorStats, h100_nvl, predict_h100nvl, read_h100nvl
from energyopt.perf.fitting import (
    H100NVL_RUN,
    PERSEUS_BLOCKING_W,
    SweepErrors,
    Tables,
    h100nvl_errors,
    h100nvl_path,
    latency_errors,
    perseus_errors,
    perseus_pooled_errors,
    power_errors,
)
from energyopt.perf.forward import CLOCK_RESPONSE, ClockResponse
from energyopt.perf.power import gpu_on_power_w
from energyopt.spec.hardware import GpuType

CALIBRATED = ["A100-SXM4-80GB", "H100-SXM5-80GB"]


@pytest.mark.parametrize("gpu", CALIBRATED)
def test_latency_error_within_documented_bounds(shared_data: Path, gpu: str) -> None:
    catalog = builtin_catalog()
    stats = latency_errors(catalog, Tables(shared_data), catalog.gpu(gpu))
    assert len(stats) >= 5
    for s in stats:
        if s.table.startswith("vidur"):
            assert s.median_ape <= 0.12, s.line()
            assert s.p90_ape <= 0.25, s.line()
        else:
            assert s.median_ape <= 0.20, s.line()


@pytest.mark.parametrize("gpu", CALIBRATED)
def test_power_error_within_documented_bounds(shared_data: Path, gpu: str) -> None:
    catalog = builtin_catalog()
    stats = power_errors(catalog, Tables(shared_data), catalog.gpu(gpu))
    by_kind = {s.table.split(" ", 2)[-1]: s for s in stats}
    assert by_kind["token power"].median_ape <= 0.10
    assert by_kind["prompt power"].median_ape <= 0.20
    for name, s in by_kind.items():
        if name.endswith("average power"):
            assert s.median_ape <= 0.15, s.line()


def test_an_uncalibrated_model_would_fail_the_bounds(shared_data: Path) -> None:
    """The bounds are tight enough to catch wrong constants."""
    catalog = builtin_catalog()
    gpu = catalog.gpu("H100-SXM5-80GB")
    off = gpu.model_copy(update={"efficiency": gpu.efficiency.model_copy(update={"memory": 0.4})})
    worst = max(s.median_ape for s in latency_errors(catalog, Tables(shared_data), off))
    assert worst > 0.20


# --- the clock dimension: Perseus A100 and H100 NVL sweeps (../shared/data/dvfs) ---


def _calibrated() -> tuple[GpuType, GpuType]:
    catalog = builtin_catalog()
    return catalog.gpu("A100-SXM4-80GB"), catalog.gpu("H100-SXM5-80GB")


def _all_sweeps(
    tables: Tables, a100: GpuType, h100: GpuType, clock: ClockResponse = CLOCK_RESPONSE
) -> list[SweepErrors]:
    nvl = h100nvl_errors(tables, h100, H100NVL_RUN, clock)
    return [*perseus_errors(tables, a100, clock), nvl]


def _targets(
    tables: Tables, a100: GpuType, h100: GpuType, clock: ClockResponse
) -> list[ErrorStats]:
    """(time, power, energy) ratio errors of each sweep data set: Perseus (all passes
    pooled) and the H100 NVL run."""
    nvl = h100nvl_errors(tables, h100, H100NVL_RUN, clock)
    return [*perseus_pooled_errors(tables, a100, clock), nvl.time, nvl.power, nvl.energy]


def test_clock_sweep_ratio_targets_are_met(shared_data: Path) -> None:
    """Median APE of the t(f)/t(f_max), P and E ratios of each sweep: 3 %, 4 %, 3 %."""
    a100, h100 = _calibrated()
    stats = _targets(Tables(shared_data), a100, h100, CLOCK_RESPONSE)
    assert [s.rows for s in stats] == [1216, 1216, 1216, 86, 86, 86]
    for s in stats:
        bound = 0.04 if " power " in s.table else 0.03
        assert s.median_ape <= bound, s.line()
    # no single pass is far off either
    for s in _all_sweeps(Tables(shared_data), a100, h100):
        assert max(s.time.median_ape, s.power.median_ape, s.energy.median_ape) <= 0.04, s.name


def test_perseus_energy_optimal_clock_within_45_mhz(shared_data: Path) -> None:
    a100, _ = _calibrated()
    sweeps = perseus_errors(Tables(shared_data), a100)
    for s in sweeps:
        assert 1065 <= s.measured_opt_mhz <= 1080, s.name  # the data's U minimum
        assert s.opt_error_mhz <= 45, (s.name, s.model_opt_mhz, s.measured_opt_mhz)


def test_h100nvl_decode_is_flat_down_to_720_mhz_in_the_model(shared_data: Path) -> None:
    _, h100 = _calibrated()
    s = h100nvl_errors(Tables(shared_data), h100)
    assert s.time.median_ape <= 0.03, s.time.line()
    sweep = read_h100nvl(h100nvl_path(Tables(shared_data)))
    t, _, _ = predict_h100nvl(h100_nvl(h100), sweep, H100NVL_RUN)
    flat = sweep.clock_mhz >= 735
    assert np.all(np.abs(t[flat] - 1.0) <= 0.01)
    assert t[0] >= 1.15  # 510 MHz: the GPU time has overtaken the host time


@pytest.mark.parametrize(
    ("which", "change"),
    [
        ("a100", {"voltage_floor": 0.7}),  # the old default floor
        ("a100", {"knee_fraction": 0.55}),  # the old default knee
        ("a100", {"locked_clock_w": 100.0}),  # five times the Perseus static power
        ("h100", {"knee_fraction": 0.75}),
        ("clock", {"compute_fixed": 0.0}),  # all compute time follows the clock
        ("clock", {"overhead_fixed": 1.0}),  # overhead all host time
    ],
)
def test_a_wrong_clock_constant_fails_the_targets(
    shared_data: Path, which: str, change: dict[str, float]
) -> None:
    a100, h100 = _calibrated()
    clock = CLOCK_RESPONSE
    if which == "a100":
        a100 = a100.model_copy(update={"power": a100.power.model_copy(update=change)})
    elif which == "h100":
        h100 = h100.model_copy(update={"power": h100.power.model_copy(update=change)})
    else:
        clock = replace(clock, **change)
    tables = Tables(shared_data)
    missed = [
        s.line()
        for s in _targets(tables, a100, h100, clock)
        if s.median_ape > (0.04 if " power " in s.table else 0.03)
    ]
    worst_opt = max(s.opt_error_mhz for s in perseus_errors(tables, a100, clock))
    assert missed or worst_opt > 45


def test_static_power_is_the_perseus_blocking_power(shared_data: Path) -> None:
    a100, _ = _calibrated()
    assert gpu_on_power_w(a100, 1410) == pytest.approx(PERSEUS_BLOCKING_W, abs=0.01)
